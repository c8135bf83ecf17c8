#!/usr/bin/env bash
# Builds the safetensors-header fuzzer with clang (libFuzzer + ASan + UBSan) and runs it.
# Usage: scripts/fuzz.sh [seconds=600]. Crashes land in build/fuzz/crash-*; the corpus in build/fuzz/corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}
out=build/fuzz && mkdir -p "$out/corpus"
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Isrc \
  fuzz/fuzz_safetensors_header.cpp src/io/safetensors_header.cpp src/core/tensor.cpp src/core/core_misc.cpp \
  src/core/allocator.cpp -lfmt -o "$out/fuzz_safetensors_header"
# Seeds: a valid file and a few near misses.
python3 - "$out/corpus" <<'PY'
import json, struct, sys, os
d = sys.argv[1]
def put(name, header, data=b""):
    h = json.dumps(header).encode()
    open(os.path.join(d, name), "wb").write(struct.pack("<Q", len(h)) + h + data)
put("ok", {"__metadata__": {"format": "pt"}, "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, bytes(16))
put("two", {"a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}, "b": {"dtype": "I64", "shape": [1], "data_offsets": [6, 14]}}, bytes(14))
put("empty", {})
PY
"$out/fuzz_safetensors_header" -max_total_time="$secs" -max_len=4096 -timeout=5 -artifact_prefix="$out/" \
  "$out/corpus" 2>&1 | tail -n 5
