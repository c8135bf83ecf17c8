#!/usr/bin/env bash
# Packs the CUDA build (test and benchmark binaries plus the Debian libraries the GPU machine lacks) into
# .device/pkg.tar.xz, which the device tool carries and scripts/device_check.sh unpacks there.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset release >/dev/null
cmake --build --preset release --target trainer_tests bench_block bench_attention bench_kernels trainer kernel_trace
rm -rf .device && mkdir -p .device/stage/bin .device/stage/lib
cp build/release/tests/trainer_tests build/release/bench/bench_block build/release/bench/bench_attention \
  build/release/bench/bench_kernels \
  build/release/trainer .device/stage/bin/
# The kernel tracer (LD_PRELOAD) and the CUPTI it was built against (the wheels' CUPTI may be another)
cp build/release/bench/libkernel_trace.so .device/stage/lib/
cp -L "$(ldd build/release/bench/libkernel_trace.so | awk '/libcupti/{print $3}')" .device/stage/lib/
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
