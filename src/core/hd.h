// TR_HD marks small functions that both host code and CUDA kernels call (one formula, two backends).
#pragma once
#ifdef __CUDACC__
#define TR_HD __host__ __device__ __forceinline__
#else
#define TR_HD inline
#endif
