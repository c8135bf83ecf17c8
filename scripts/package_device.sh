#!/usr/bin/env bash
# Packs the CUDA build (test and benchmark binaries plus the Debian libraries the GPU machine lacks) into
# .device/pkg.tar.xz, which the device tool carries and scripts/device_check.sh unpacks there.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset release >/dev/null
cmake --build --preset release
rm -rf .device && mkdir -p .device/stage/bin .device/stage/lib
cp build/release/tests/trainer_tests build/release/bench/bench_block build/release/trainer .device/stage/bin/
# Libraries outside glibc/libstdc++ and CUDA (the GPU machine has its own CUDA libraries as pip wheels).
for f in $(ldd build/release/tests/trainer_tests | awk '/=> \//{print $3}'); do
  case "$(basename "$f")" in
    libc.so*|libm.so*|libstdc++*|libgcc_s*|libpthread*|libdl.so*|librt.so*|libcublas*|libcudart*) ;;
    *) cp -L "$f" .device/stage/lib/ ;;
  esac
done
tar -C .device/stage -cJf .device/pkg.tar.xz .
rm -rf .device/stage
ls -la .device/pkg.tar.xz
