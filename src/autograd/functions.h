// The differentiable tensor API (namespace tr): each op runs its forward through the ops layer and, when a
// gradient is needed, records its backward on the tape. Forward and backward sit side by side in
// functions_*.cpp.
#pragma once
#include <functional>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "ops/ops.h"

namespace tr {

using autograd::NoGradGuard;

// ---- elementwise
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor unary(ops::UnaryOp op, const Tensor& x);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
// approximate=true is HF's "gelu_new" / PyTorch's gelu(approximate="tanh"); false is the exact erf form.
Tensor gelu(const Tensor& x, bool approximate = true);
Tensor silu(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor square(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor affine(const Tensor& x, double alpha, double beta);  // alpha * x + beta
Tensor mul_scalar(const Tensor& x, double s);
Tensor add_scalar(const Tensor& x, double s);
Tensor pow(const Tensor& x, double exponent);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// Inverted dropout; the mask is never stored: backward regenerates it from the generator's (seed, offset).
Tensor dropout(const Tensor& x, double p, Generator& gen, bool training = true);
Tensor cast(const Tensor& x, DType dtype);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator*(const Tensor& a, double s);
Tensor operator*(double s, const Tensor& a);
Tensor operator+(const Tensor& a, double s);

// ---- reductions and softmax
Tensor sum(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor amax(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);

// ---- linear algebra and nn
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());
// gelu(linear(x, w, bias), approximate=true) as one GEMM with a bias + GELU epilogue (GPT-2's MLP).
Tensor linear_gelu(const Tensor& x, const Tensor& w, const Tensor& bias);
// (x + r, layer_norm(x + r)) in one pass: the residual add before a pre-norm, fused (GPT-2, Llama blocks).
std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& r, const Tensor& w, const Tensor& b,
                                         double eps);
std::pair<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& r, const Tensor& w, double eps);
Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps = 1e-6);
enum class Reduction { mean, sum, none };
// Cross-entropy of logits [..., V] against int64 labels [...]; rows whose label is ignore_index count as 0.
// mean divides by the number of non-ignored labels; for accumulation-exact training use sum and divide by
// num_items_in_batch. The result is f32 (f64 for f64 logits) whatever the logits dtype. label_smoothing as
// torch's (ops::cross_entropy).
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index = -100,
                     Reduction reduction = Reduction::mean, double label_smoothing = 0.0);
// sum over rows of cross_entropy(x @ w^T, labels) computed `chunk_rows` rows at a time: the [rows, V] logits
// never exist in full. With gradients wanted, each chunk's gradients are computed in the forward itself (no
// recompute) and held in f32 ([N, D] and [V, D]) until backward scales and rounds them once.
// x [N, D], w [V, D], labels int64 [N] (-100 ignored). Logits are computed in x's dtype and upcast to f32 for
// the loss (f64 stays f64). Returns the scalar sum; divide by the label count yourself.
Tensor linear_cross_entropy_sum(const Tensor& x, const Tensor& w, const Tensor& labels,
                                int64_t chunk_rows = 1024, int64_t ignore_index = -100,
                                double label_smoothing = 0.0);
Tensor embedding(const Tensor& weight, const Tensor& ids);
Tensor rope(const Tensor& x, const ops::RopeTables& tables, const Tensor& positions, bool seq_major = false);
// Fused memory-efficient attention: q [B, H, T, D], k/v [B, Hkv, S, D] (grouped-query heads share k/v),
// key_keep bool [B, S] (false = padding) or undefined. Saves only q, k, v, out and the row logsumexp.
// dropout_p > 0 (training): attention dropout drawn from `gen` (ops::AttentionDropout, either form). window
// > 0 (causal): each query sees its last `window` keys, itself included (Mistral's sliding_window). `form`
// forces the fused or blocked form (default: ops::attention_form's pick).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep,
                                    bool causal, double scale, double dropout_p = 0.0,
                                    Generator* gen = nullptr, int64_t window = 0,
                                    ops::AttentionForm form = ops::AttentionForm::automatic);

// ---- shape
Tensor view(const Tensor& x, const Shape& shape);
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor contiguous(const Tensor& x);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);

// ---- leaves and gradients
Tensor detach(const Tensor& x);  // same storage, no history
// `x` on `device` (a copy; `x` itself when already there); the gradient goes back to x's device. A model
// split across devices (device_map) moves its activations with it.
Tensor to_device(const Tensor& x, Device device);
// x itself in forward (an alias); in backward, `hook()` runs when the gradient arrives, before anything
// upstream of x: ZeRO-3 gathers a layer's parameters there. The gradient passes through unchanged.
Tensor backward_hook(const Tensor& x, std::function<void()> hook);
Tensor& requires_grad_(Tensor& x, bool requires_grad = true);

}  // namespace tr
