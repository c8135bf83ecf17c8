// Scalar formulas of the unary ops and their derivatives, shared by the CPU and CUDA kernels so both
// backends compute the same function.
#pragma once
#include <cmath>

#include "backend/op_kinds.h"
#ifndef __CUDACC__
#include "backend/cpu/vec_math.h"
#endif

#include "core/hd.h"

namespace tr::backend {

// exp and tanh used by the formulas: vectorizable f32 versions on the CPU, libm/CUDA math otherwise.
TR_HD double exp_(double x) { return std::exp(x); }
TR_HD double tanh_(double x) { return std::tanh(x); }
#ifdef __CUDACC__
TR_HD float exp_(float x) { return expf(x); }
TR_HD float tanh_(float x) { return tanhf(x); }
#else
inline float exp_(float x) { return cpu::fast_expf(x); }
inline float tanh_(float x) { return cpu::fast_tanhf(x); }
#endif

template <typename A>
TR_HD A unary_fn(UnaryOp op, A x) {
  const A kSqrt2OverPi = A(0.7978845608028654), kCoef = A(0.044715), kInvSqrt2 = A(0.7071067811865476);
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::exp: return exp_(x);
    case UnaryOp::log: return std::log(x);
    case UnaryOp::sqrt: return std::sqrt(x);
    case UnaryOp::rsqrt: return A(1) / std::sqrt(x);
    case UnaryOp::tanh: return tanh_(x);
    case UnaryOp::sigmoid: return A(1) / (A(1) + exp_(-x));
    case UnaryOp::relu: return x > A(0) ? x : A(0);
    case UnaryOp::gelu_tanh: return A(0.5) * x * (A(1) + tanh_(kSqrt2OverPi * (x + kCoef * x * x * x)));
    case UnaryOp::gelu_erf: return A(0.5) * x * (A(1) + std::erf(x * kInvSqrt2));
    case UnaryOp::silu: return x / (A(1) + exp_(-x));
    case UnaryOp::abs: return x < A(0) ? -x : x;
    case UnaryOp::square: return x * x;
    case UnaryOp::reciprocal: return A(1) / x;
  }
  return x;
}

// d f(x) / dx
template <typename A>
TR_HD A unary_grad(UnaryOp op, A x) {
  const A kSqrt2OverPi = A(0.7978845608028654), kCoef = A(0.044715), kInvSqrt2 = A(0.7071067811865476);
  const A kInvSqrt2Pi = A(0.3989422804014327);
  switch (op) {
    case UnaryOp::neg: return A(-1);
    case UnaryOp::exp: return exp_(x);
    case UnaryOp::log: return A(1) / x;
    case UnaryOp::sqrt: return A(0.5) / std::sqrt(x);
    case UnaryOp::rsqrt: return A(-0.5) / (x * std::sqrt(x));
    case UnaryOp::tanh: {
      A t = tanh_(x);
      return A(1) - t * t;
    }
    case UnaryOp::sigmoid: {
      A s = A(1) / (A(1) + exp_(-x));
      return s * (A(1) - s);
    }
    case UnaryOp::relu: return x > A(0) ? A(1) : A(0);
    case UnaryOp::gelu_tanh: {
      A x2 = x * x;
      A t = tanh_(kSqrt2OverPi * (x + kCoef * x2 * x));
      return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * kSqrt2OverPi * (A(1) + A(3) * kCoef * x2);
    }
    case UnaryOp::gelu_erf:
      return A(0.5) * (A(1) + std::erf(x * kInvSqrt2)) + x * kInvSqrt2Pi * exp_(A(-0.5) * x * x);
    case UnaryOp::silu: {
      A s = A(1) / (A(1) + exp_(-x));
      return s * (A(1) + x * (A(1) - s));
    }
    case UnaryOp::abs: return x < A(0) ? A(-1) : (x > A(0) ? A(1) : A(0));
    case UnaryOp::square: return A(2) * x;
    case UnaryOp::reciprocal: return A(-1) / (x * x);
  }
  return A(0);
}

template <typename A>
TR_HD A binary_fn(BinaryOp op, A a, A b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::maximum: return (a != a || a > b) ? a : b;  // NaN propagates like torch.maximum
    case BinaryOp::minimum: return (a != a || a < b) ? a : b;
    case BinaryOp::eq: return a == b ? A(1) : A(0);
  }
  return a;
}

}  // namespace tr::backend
