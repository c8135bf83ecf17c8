// GEMMs through cuBLASLt for the CUDA backend: bf16/f16 with f32 accumulation, f32 (TF32 when asked), f64;
// batched and strided; bias and bias + GELU epilogues; descriptors and the chosen algorithm cached per shape,
// with an explicit workspace per device (what CUDA-graph capture needs).
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <cublasLt.h>
#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda_api.h"

namespace tr::cuda {

// cuBLAS data and compute types of a GEMM on `dt` (bf16/f16 accumulate in f32; f32 uses TF32 tensor cores
// when tf32). False for a dtype cuBLAS does not multiply.
bool gemm_types(DType dt, bool tf32, cudaDataType_t* data, cublasComputeType_t* compute);

class LtGemm {
 public:
  LtGemm();
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;
  // Queues g (row-major, as backend.h documents) on `stream` of the current device. Returns false, having
  // done nothing, when cuBLASLt has no algorithm for it (the backend then takes cublasGemmStridedBatchedEx).
  // With g.autotune, a new shape's plan times up to kAutotuneCandidates of the heuristic's algorithms on
  // these operands (into `scratch` outputs: c may be accumulated into) and keeps the fastest; not while the
  // stream is being captured into a graph (the timing waits on the host), where the first is kept.
  bool run(const backend::GemmArgs& g, cudaStream_t stream, Scratch& scratch);
  // Plans built so far (each is a heuristic query; the cache keeps it for the rest of the run).
  size_t plans() const;
  // max-autotune so far: shapes timed, and of those, how many kept an algorithm other than the heuristic's
  // first.
  size_t tuned() const;
  size_t tuned_away() const;

  static constexpr int kAutotuneCandidates = 8;

  static constexpr size_t kWorkspaceBytes = backend::kCublasLtWorkspaceBytes;

 private:
  struct Key;
  struct Plan;
  void* workspace(int device);
  void* handle_ = nullptr;  // cublasLtHandle_t
  void autotune(Plan& p, const backend::GemmArgs& g, const cublasLtMatmulHeuristicResult_t* found, int n,
                void* ws, cudaStream_t stream, Scratch& scratch);
  std::map<Key, std::unique_ptr<Plan>> plans_;
  size_t tuned_ = 0, tuned_away_ = 0;
  std::vector<void*> workspaces_;
  bool warned_ = false;
  mutable std::mutex mu_;
};

}  // namespace tr::cuda
