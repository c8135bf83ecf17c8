#!/usr/bin/env bash
# run_clm's data files end to end: the same paragraphs as .jsonl, .json (array), .csv, .tsv and .jsonl.gz
# train to the same losses (one EOS between rows, the same token stream), `trainer tokenize` reads a table,
# --text_column_name picks a column, token shards train and evaluate without tokenizer files, a fresh model's
# vocabulary grows to the tokenizer and pads to --pad_vocab_to_multiple_of, and bad files fail with one
# message naming the file and line.
# Usage: data_files.sh TRAINER TOKENIZER_DIR TEXT WORK_DIR
set -euo pipefail
trainer=$1 tok=$2 text=$3 work=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work"
fail() { echo "data_files: FAIL: $*"; exit 1; }
echo '{"model_type": "gpt2", "vocab_size": 50257, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64}' >tiny.json
/usr/bin/python3 - "$text" <<'PY'
import csv, gzip, json, sys
paras = [p for p in open(sys.argv[1], encoding="utf-8").read()[:40000].split("\n\n") if p.strip()]
rows = [{"id": i, "text": p, "note": "n" + str(i)} for i, p in enumerate(paras)]
with open("rows.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
json.dump(rows, open("rows.json", "w"))
with gzip.open("rows.jsonl.gz", "wt") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
for name, delim in (("rows.csv", ","), ("rows.tsv", "\t")):
    with open(name, "w", newline="") as f:
        w = csv.writer(f, delimiter=delim)
        w.writerow(["id", "text", "note"])
        w.writerows([r["id"], r["text"], r["note"]] for r in rows)
PY
train() {  # NAME FILE [ARGS...]: 4 steps, prints the losses
  local name=$1 file=$2; shift 2
  "$trainer" train --config_name tiny.json --tokenizer_name "$tok" --train_file "$file" --block_size 16 \
    --per_device_train_batch_size 4 --max_steps 4 --logging_steps 1 --save_strategy no --use_cpu \
    --output_dir "$name" "$@" >"$name.log" 2>&1 || { tail "$name.log"; fail "train on $file"; }
  grep -o '"loss":[0-9.e-]*' "$name/metrics.jsonl" | tr '\n' ' '
}
ref=$(train jsonl rows.jsonl)
for f in rows.json rows.csv rows.tsv rows.jsonl.gz; do
  got=$(train "${f//./_}" "$f")
  [[ $got == "$ref" ]] || fail "$f trains to other losses than rows.jsonl: $got vs $ref"
done
[[ $(train note rows.csv --text_column_name note) != "$ref" ]] || fail "--text_column_name note changed nothing"
"$trainer" tokenize --tokenizer_name_or_path "$tok" --input rows.csv --output_dir shards >tokenize.log 2>&1 ||
  { cat tokenize.log; fail "tokenize rows.csv"; }
rows=$(($(wc -l <rows.jsonl)))
grep -q "documents $rows," tokenize.log || { cat tokenize.log; fail "tokenize did not read $rows rows"; }
# Token shards need no tokenizer: train (with a checkpoint and a resume) and evaluate on .bin files alone.
"$trainer" train --config_name tiny.json --train_file 'shards/train_*.bin' --block_size 16 --per_device_train_batch_size 4 \
  --max_steps 4 --save_steps 2 --output_dir notok --use_cpu >notok.log 2>&1 || { tail notok.log; fail "train on shards"; }
[[ ! -e notok/tokenizer.json && ! -e notok/checkpoint-2/tokenizer.json ]] || fail "tokenizer files without a tokenizer"
"$trainer" train --config_name tiny.json --train_file 'shards/train_*.bin' --block_size 16 --per_device_train_batch_size 4 \
  --max_steps 6 --save_steps 2 --output_dir notok --use_cpu --resume_from_checkpoint true >notok2.log 2>&1 ||
  { tail notok2.log; fail "resume on shards"; }
grep -q "resumed from notok/checkpoint-4" notok2.log || fail "the tokenizer-less resume"
"$trainer" eval --model_name_or_path notok --validation_file shards/train_000000.bin --block_size 16 --use_cpu \
  --output_dir notok_eval >notok_eval.log 2>&1 || { cat notok_eval.log; fail "eval on shards without a tokenizer"; }
rc=0; "$trainer" train --config_name tiny.json --train_file rows.csv --block_size 16 --output_dir notok_text --use_cpu \
  >notok_text.log 2>&1 || rc=$?
[[ $rc == 1 ]] && grep -q "tokenizer_name is required when training from --config_name" notok_text.log ||
  { cat notok_text.log; fail "text without a tokenizer"; }

# A fresh model grows to the tokenizer's size and pads to --pad_vocab_to_multiple_of (config.json says so).
echo '{"model_type": "llama", "vocab_size": 1000, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}' >small_vocab.json
"$trainer" train --config_name small_vocab.json --tokenizer_name "$tok" --train_file rows.jsonl --block_size 16 \
  --max_steps 1 --output_dir resized --use_cpu --pad_vocab_to_multiple_of 64 >resized.log 2>&1 ||
  { tail resized.log; fail "training a resized model"; }
grep -q "vocab_size 1000 -> 50257, the tokenizer's size" resized.log || fail "no resize notice"
grep -q "vocab_size 50257 -> 50304, a multiple of 64" resized.log || fail "no padding notice"
grep -q '"vocab_size": 50304' resized/config.json || fail "config.json does not hold the padded vocab_size"

# Bad files: one message naming file and line, exit 1.
printf '{"text": "ok"}\n{"text": "cut\n' >bad.jsonl
printf 'id,text\n1,"never closed\n' >bad.csv
printf '{"id": 1}\n' >notext.jsonl
printf 'text\nbad \xff byte\n' >badutf8.csv
for pair in "bad.jsonl|bad.jsonl:2: not a JSON value" "bad.csv|bad.csv: a quoted field opened on line 2 is never closed" \
            "notext.jsonl|notext.jsonl:1: no column 'missing' (--text_column_name); the columns are id" \
            "badutf8.csv|badutf8.csv:2: invalid UTF-8"; do
  file=${pair%%|*} want=${pair#*|}
  [[ $file == notext.jsonl ]] && extra=(--text_column_name missing) || extra=()
  rc=0
  "$trainer" train --config_name tiny.json --tokenizer_name "$tok" --train_file "$file" --output_dir "out_$file" --block_size 16 \
    --use_cpu --max_steps 1 "${extra[@]}" >"$file.log" 2>&1 || rc=$?
  [[ $rc == 1 ]] || fail "$file: exit $rc"
  grep -qF "$want" "$file.log" || { cat "$file.log"; fail "$file: expected '$want'"; }
done
echo "data_files: OK"
