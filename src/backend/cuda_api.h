// Entry points the CUDA backend provides; backend/cuda implements them with CUDA and backend/no_cuda with
// clear errors, so no code outside the backends needs an #ifdef.
#pragma once
#include <string>

#include "backend/backend.h"

namespace tr::backend {

// True when compiled with CUDA support (whether or not a GPU is present).
bool cuda_compiled();
// The CUDA backend; throws when built without CUDA or when no GPU is present.
Backend& cuda_backend();
// Copies between host and a GPU (or two GPUs): both contiguous, same dtype and size.
void cuda_copy_between_devices(const Tensor& src, const Tensor& dst);
// cuda:0 when a GPU is usable, else the CPU (a CUDA build without a GPU says so once on stderr).
Device default_device();
// One line about the CUDA runtime, driver and devices (or why there is none).
std::string cuda_summary();

}  // namespace tr::backend
