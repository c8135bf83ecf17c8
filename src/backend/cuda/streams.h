// The compute stream of a device (cuda_backend.cpp owns it), for the CUDA backend's own files that queue work
// outside a launcher: NCCL's collectives (nccl_comm.cpp).
#pragma once
#include <cuda_runtime_api.h>

namespace tr::cuda {

cudaStream_t compute_stream(int device);

}  // namespace tr::cuda
