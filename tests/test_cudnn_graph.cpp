// cuDNN's attention graphs (backend/cuda/cudnn_sdpa.cpp) built on any machine with libcudnn.so.9, GPU or
// not: each tensor and operation descriptor finalized, so cuDNN itself checks their dims, types and strides
// before a GPU ever plans them (planning and running need one: tests/test_cuda.cpp).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdio>

#include <stdexcept>
#include <string>

#include "backend/attention_geometry.h"
#include "backend/cuda/cudnn_sdpa.h"

namespace tr {
namespace {

struct GraphCase {
  const char* name;
  int64_t B, H, KV, T, D;
  bool causal, seq_major;
  int64_t forward_ops, backward_ops;  // cudnn_frontend's counts for the case
  double dropout = 0.0;
};

// The forward: QK^T, scale, (GEN_INDEX x2, CMP_GE, BINARY_SELECT), max, sub, exp, sum, log, add, div, PV.
// The backward: dO*O, sum, *1, QK^T, scale, -stats, (mask x4), exp, reshape, P^T dO (+ head sum), dO V^T,
// -delta, *P, scale, reshape, dS^T Q (+ head sum), reshape, dS K, identity. Attention dropout (our keep
// mask as a tensor) adds 2 to the forward (* 1 / (1 - p), * keep) and 4 to the backward (P * keep, * 1 /
// (1 - p), dP * keep, dS * 1 / (1 - p)).
const GraphCase kGraphs[] = {
    {"causal_mha_dense", 2, 4, 4, 128, 64, true, false, 14, 22},
    {"causal_gqa_seq_major", 2, 8, 2, 256, 128, true, true, 14, 24},
    {"full_mha_seq_major", 1, 2, 2, 96, 32, false, true, 10, 18},
    {"causal_mha_dropout", 2, 4, 4, 128, 64, true, false, 16, 26, 0.1},
    {"causal_gqa_dropout_seq_major", 2, 8, 2, 256, 128, true, true, 16, 28, 0.1},
};

TEST(CudnnGraph, AttentionGraphsPassCudnnsDescriptorChecks) {
  for (const GraphCase& c : kGraphs) {
    SCOPED_TRACE(c.name);
    backend::AttentionGeometry g{c.B, c.H, c.KV, c.T, c.T, c.D, c.causal, 0.125, nullptr};
    g.with_dropout(c.dropout, 1, 0);
    if (c.seq_major) {
      const backend::HeadRows q{c.T * c.H * c.D, c.D, c.H * c.D}, kv{c.T * c.KV * c.D, c.D, c.KV * c.D};
      g.rows = {q, kv, kv, q, q, q, kv, kv};
    } else {
      g.dense_rows();
    }
    for (const DType dt : {DType::bf16, DType::f16}) {
      try {
        EXPECT_EQ(cuda::CudnnSdpa::graph_operations(dt, g, false), c.forward_ops);
        EXPECT_EQ(cuda::CudnnSdpa::graph_operations(dt, g, true), c.backward_ops);
      } catch (const std::runtime_error& e) {
        const std::string what = e.what();
        if (what.find("libcudnn.so.9") != std::string::npos) GTEST_SKIP() << "no cuDNN here: " << what;
        ADD_FAILURE() << what;
      }
    }
  }
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

// An H100 SXM as cuDNN's device-properties JSON names its fields (the data sheet's numbers: 132 SMs, 227 KiB
// of shared memory a block may opt into, sm_90 as deviceVer 900), and an A100 SXM (108 SMs, 163 KiB, sm_80).
const char* kH100 =
    R"({"maxGridSize": [2147483647, 65535, 65535], "maxBlockSize": [1024, 1024, 64], "regsPerBlock": 65536,
 "multiProcessorCount": 132, "warpSize": 32, "maxSharedMemoryPerBlock": 49152,
 "maxSharedMemoryPerBlockOptin": 232448, "reservedSharedMemoryPerBlock": 1024, "maxRegistersPerSM": 65536,
 "maxCtasPerSM": 32, "maxThreadsPerBlock": 1024, "maxThreadsPerSM": 2048, "pciDeviceId": 9008,
 "isTccDriver": 0, "supportCoopLaunch": 1, "smClockRateKHz": 1980000, "memClockRateKHz": 2619000,
 "l2CacheSize": 52428800, "deviceName": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85017018368,
 "cudaDeviceId": 0, "deviceVer": 900, "driverVer": 13000})";
const char* kA100 =
    R"({"maxGridSize": [2147483647, 65535, 65535], "maxBlockSize": [1024, 1024, 64], "regsPerBlock": 65536,
 "multiProcessorCount": 108, "warpSize": 32, "maxSharedMemoryPerBlock": 49152,
 "maxSharedMemoryPerBlockOptin": 166912, "reservedSharedMemoryPerBlock": 1024, "maxRegistersPerSM": 65536,
 "maxCtasPerSM": 32, "maxThreadsPerBlock": 1024, "maxThreadsPerSM": 2048, "pciDeviceId": 8368,
 "isTccDriver": 0, "supportCoopLaunch": 1, "smClockRateKHz": 1410000, "memClockRateKHz": 1593000,
 "l2CacheSize": 41943040, "deviceName": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85089058816,
 "cudaDeviceId": 0, "deviceVer": 800, "driverVer": 13000})";

// Whether a CUDA driver is present; without one, the toolkit's stub libcuda.so is loaded in its place (its
// soname is libcuda.so.1, so cuDNN's engines find it): enough for their support checks and NVRTC
// compilation, while loading the compiled kernels fails with CUDA_ERROR_STUB_LIBRARY.
bool driver_or_stub() {
  if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) != nullptr) return true;
  if (dlopen(TRAINER_CUDA_STUBS_DIR "/libcuda.so", RTLD_NOW | RTLD_GLOBAL) == nullptr)
    std::printf("no CUDA driver and no stub at %s\n", TRAINER_CUDA_STUBS_DIR);
  return false;
}

// cuDNN 9.8's deviceless planning on an H100 and an A100 that are not here - what a GPU run does first (a
// refusal there falls back to our kernels, so only this test shows a graph cuDNN's engines do not take).
// With a driver every graph gets a plan. Without one (the stub) a graph passes when an engine took it and
// compiled its kernels and only loading them failed; a graph no engine takes (a wrong type, a missing
// operation) gets no config at all - checked: the forward's probabilities in f32 instead of the inputs'
// type fail here.
TEST(CudnnGraph, AttentionGraphsGetEnginesOnAnH100AndAnA100WithoutOne) {
  const bool driver = driver_or_stub();
  // Head dim 256, which backend/cudnn_attention_rule.h gives cuDNN on sm_90 only.
  const GraphCase d256{"causal_mha_d256", 1, 2, 2, 128, 256, true, false, 14, 22};
  for (const auto& [gpu, json] : {std::pair{"H100", kH100}, std::pair{"A100", kA100}})
    for (const GraphCase& c : {kGraphs[0], kGraphs[1], kGraphs[2], kGraphs[3], kGraphs[4], d256}) {
      if (c.D > 128 && std::string(gpu) == "A100") continue;
      SCOPED_TRACE(std::string(gpu) + " " + c.name);
      backend::AttentionGeometry g{c.B, c.H, c.KV, c.T, c.T, c.D, c.causal, 0.125, nullptr};
      g.with_dropout(c.dropout, 1, 0).dense_rows();
      for (const bool backward : {false, true}) {
        try {
          const auto p = cuda::CudnnSdpa::plan_offline(DType::bf16, g, backward, json);
          std::printf("%s %s %s: engine %lld, workspace %lld bytes\n", gpu, c.name,
                      backward ? "backward" : "forward", static_cast<long long>(p.engine),
                      static_cast<long long>(p.workspace));
          EXPECT_GE(p.engine, 0);
        } catch (const std::runtime_error& e) {
          const std::string what = e.what();
          if (what.find("libcudnn.so.9") != std::string::npos) GTEST_SKIP() << "no cuDNN here: " << what;
          const bool compiled_then_stubbed =
              !driver && what.find("CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER") != std::string::npos;
          if (compiled_then_stubbed)
            std::printf("%s %s %s: %s\n", gpu, c.name, backward ? "backward" : "forward", what.c_str());
          if (!compiled_then_stubbed) ADD_FAILURE() << (backward ? "backward: " : "forward: ") << what;
        }
      }
    }
}

}  // namespace
}  // namespace tr
