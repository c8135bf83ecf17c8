#!/usr/bin/env bash
# The benchmark models of compile_bench.sh and ab_bench.sh, written into a work folder: WORK/bytes.json (a
# byte-level BPE without merges: one token per byte, GPT-2's byte-to-character map, and <|endoftext|>),
# WORK/tiny.json (an overhead-bound GPT-2: n_embd 64, 2 layers, no dropout, 257 tokens), WORK/side.json (the
# side-by-side model: n_embd 256, 4 layers, GPT-2's vocabulary and its dropout 0.1) and WORK/corpus.txt (the
# first 400 KB of CORPUS).
# Usage: source bench/bench_models.sh; write_bench_models WORK CORPUS
write_bench_models() {
  local work=$1 corpus=$2
  head -c 400000 "$corpus" >"$work/corpus.txt"
  python3 - "$work/bytes.json" <<'PY'
import json, sys
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}
eot = {"id": 256, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
       "normalized": False, "special": True}
json.dump({"version": "1.0", "added_tokens": [eot], "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "vocab": vocab, "merges": []}}, open(sys.argv[1], "w"))
PY
  echo '{"model_type": "gpt2", "vocab_size": 257, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64, "embd_pdrop": 0, "resid_pdrop": 0, "attn_pdrop": 0}' \
    >"$work/tiny.json"
  echo '{"model_type": "gpt2", "vocab_size": 50257, "n_embd": 256, "n_layer": 4, "n_head": 4, "n_positions": 128}' \
    >"$work/side.json"
}
