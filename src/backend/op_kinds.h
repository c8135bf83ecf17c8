// Enumerations of the elementwise and reduction op kinds, shared by the backend interface and kernels
// (dependency-free so CUDA translation units can include it).
#pragma once

namespace tr::backend {

enum class UnaryOp {
  neg,
  exp,
  log,
  sqrt,
  rsqrt,
  tanh,
  sigmoid,
  relu,
  gelu_tanh,
  gelu_erf,
  silu,
  abs,
  square,
  reciprocal
};
// eq gives 1 where a == b and 0 elsewhere, in the operands' dtype (used for gradient masks).
enum class BinaryOp { add, sub, mul, div, maximum, minimum, eq };
enum class ReduceOp { sum, mean, max, min };

}  // namespace tr::backend
