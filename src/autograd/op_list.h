// The list of differentiable ops. record() accepts only these names, and the gradient-check test suite
// fails when any of them lacks a finite-difference check.
#pragma once
#include <string_view>

namespace tr::autograd {

inline constexpr std::string_view kDifferentiableOps[] = {
    // elementwise
    "add", "sub", "mul", "div", "maximum", "minimum", "neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid",
    "relu", "gelu_tanh", "gelu_erf", "silu", "abs", "square", "reciprocal", "affine", "pow", "masked_fill",
    "dropout", "cast",
    // reductions and softmax
    "sum", "mean", "amax", "softmax", "log_softmax",
    // linear algebra and nn
    "matmul", "linear", "linear_gelu", "layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm",
    "cross_entropy", "embedding", "rope", "attention", "linear_cross_entropy",
    // shape
    "view", "reshape", "transpose", "permute", "narrow", "expand", "contiguous", "cat", "split", "to_device",
    // recomputation and hooks
    "checkpoint", "backward_hook"};

}  // namespace tr::autograd
