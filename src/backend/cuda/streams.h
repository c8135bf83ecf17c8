// What cuda_backend.cpp owns that the CUDA backend's other host files need: a device's compute stream (NCCL's
// collectives, the copies of host_entry.cpp), the backend instance, the kernels' error reports.
#pragma once
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda_api.h"

namespace tr::cuda {

cudaStream_t compute_stream(int device);
// The backend (cuda_api.h's cuda_backend() checks first that a GPU is present).
backend::Backend& backend_instance();
// Throws for what kernels flagged since the last report (call after a synchronization).
void report_device_errors();
// cuDNN's attention on every GPU (cuda_api.h's cuda_use_cudnn_attention / cuda_cudnn_attention_counts).
void use_cudnn_attention(bool on);
backend::CudnnAttentionCounts cudnn_attention_counts();

}  // namespace tr::cuda
