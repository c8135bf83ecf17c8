// What cuda_backend.cpp owns that the CUDA backend's other host files need: a device's compute stream (NCCL's
// collectives, the copies of host_entry.cpp), the backend instance, the kernels' error reports.
#pragma once
#include <cuda_runtime_api.h>

#include "backend/backend.h"

namespace tr::cuda {

cudaStream_t compute_stream(int device);
// The backend (cuda_api.h's cuda_backend() checks first that a GPU is present).
backend::Backend& backend_instance();
// Throws for what kernels flagged since the last report (call after a synchronization).
void report_device_errors();

}  // namespace tr::cuda
