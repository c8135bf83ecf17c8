#!/usr/bin/env bash
# `trainer tokenize` streams JSON lines, JSON arrays and CSV tables through bounded memory: a generated JSONL of SIZE_MB (many 8 MB read
# chunks, lines crossing their edges) gives byte-identical shards as .jsonl, .jsonl.gz, .jsonl.zst, a .json of
# lines, a .json array and a .csv of the same rows, and the process's peak RSS exceeds that of tokenizing a
# one-line file (the binary, its libraries - CUDA's in a GPU build - and the tokenizer) by less than GROWTH_MB
# whatever the file's size (JSON lines, the array and the table alike). Usage: tokenize_stream.sh TRAINER TOKENIZER_DIR TEXT WORK_DIR SIZE_MB GROWTH_MB
set -euo pipefail
trainer=$1 tok=$2 text=$3 work=$4 size_mb=$5 growth_mb=$6
rm -rf "$work" && mkdir -p "$work" && cd "$work"
fail() { echo "tokenize_stream: FAIL: $*" >&2; exit 1; }
# Rows of 1-40 lines of the book with an id and a note around the text (the first string column is not it).
/usr/bin/python3 - "$text" "$size_mb" <<'PY'
import json, sys
lines = open(sys.argv[1], encoding="utf-8").read().splitlines()
target, n, at, out = int(sys.argv[2]) << 20, 0, 0, open("big.jsonl", "w", encoding="utf-8")
while out.tell() < target:
    k = 1 + (n * 7919) % 40
    row = {"id": n, "note": f"row {n}", "text": "\n".join(lines[at:at + k])}
    out.write(json.dumps(row, ensure_ascii=n % 2 == 0) + "\n")
    at = (at + k) % max(1, len(lines) - 40)
    n += 1
out.close()
print(f"tokenize_stream: big.jsonl {target >> 20} MB, {n} rows")
PY
# Peak RSS of one command (its ru_maxrss), in MB, printed; the command's own exit status kept.
peak() {
  /usr/bin/python3 - "$@" <<'PY'
import os, subprocess, sys
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=open("tokenize.err", "w"))
_, status, usage = os.wait4(p.pid, 0)
print(usage.ru_maxrss // 1024)
sys.exit(os.waitstatus_to_exitcode(status))
PY
}
tokenize() {  # INPUT OUTPUT_DIR: prints the peak RSS in MB
  peak "$trainer" tokenize --tokenizer_name_or_path "$tok" --input "$1" --output_dir "$2" \
    --validation_split_percentage 1 --text_column_name text || { cat tokenize.err >&2; fail "tokenize $1"; }
}
echo '{"text": "one line"}' >one.jsonl
base=$(tokenize one.jsonl out_one)
rss=$(tokenize big.jsonl out_jsonl)
echo "tokenize_stream: $(du -m big.jsonl | cut -f1) MB of JSON lines tokenized in a peak RSS of $rss MB;" \
  "a one-line file takes $base MB (bound: $growth_mb MB more)"
(( rss < base + growth_mb )) || fail "peak RSS $rss MB, more than $growth_mb MB over the one-line file's $base MB"
gzip -k -1 big.jsonl && zstd -q -1 big.jsonl -o big.jsonl.zst
cp big.jsonl lines.json  # a .json of JSON lines (HF's Dataset.to_json) streams too
for f in big.jsonl.gz big.jsonl.zst lines.json; do
  tokenize "$f" "out_${f//./_}" >/dev/null
  for s in out_jsonl/*.bin; do
    cmp -s "$s" "out_${f//./_}/$(basename "$s")" || fail "$f: $(basename "$s") differs from the plain file's"
  done
done
# The same rows as one JSON array and as a CSV table: streamed element by element and record by record,
# within the same bound.
/usr/bin/python3 - <<'PY'
import csv, json
with open("big.jsonl", encoding="utf-8") as src, open("big.json", "w", encoding="utf-8") as js, \
     open("big.csv", "w", encoding="utf-8", newline="") as cs:
    w = csv.writer(cs)
    w.writerow(["id", "note", "text"])
    js.write("[")
    for i, line in enumerate(src):
        row = json.loads(line)
        js.write(("," if i else "") + json.dumps(row))
        w.writerow([row["id"], row["note"], row["text"]])
    js.write("]")
PY
for f in big.json big.csv; do
  rss=$(tokenize "$f" "out_${f//./_}")
  echo "tokenize_stream: $f ($(du -m "$f" | cut -f1) MB) in a peak RSS of $rss MB"
  (( rss < base + growth_mb )) || fail "$f: peak RSS $rss MB, more than $growth_mb MB over the one-line file's $base MB"
  for s in out_jsonl/*.bin; do
    cmp -s "$s" "out_${f//./_}/$(basename "$s")" || fail "$f: $(basename "$s") differs from the JSON lines'"
  done
done
[[ -f out_jsonl/train_000000.bin && -f out_jsonl/val_000000.bin ]] || fail "shards missing"
[[ ! -e out_jsonl/.tokens.tmp ]] || fail "the temporary token stream was left behind"
echo "tokenize_stream: OK"
