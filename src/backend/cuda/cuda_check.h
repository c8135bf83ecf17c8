// TR_CUDA_CHECK: a CUDA runtime call whose error becomes a tr::Error naming the call, file and line; shared
// by the host (.cpp) and device (.cu) sources of the CUDA backend.
#pragma once
#include <cuda_runtime.h>

namespace tr::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t e, const char* what, const char* file, int line);

}  // namespace tr::cuda

#define TR_CUDA_CHECK(call)                                                             \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) ::tr::cuda::throw_cuda_error(e_, #call, __FILE__, __LINE__); \
  } while (0)
