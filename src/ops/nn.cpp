// Matmul/linear, layer and RMS norm, cross-entropy, embedding, rotary embedding, dropout and cat:
// checks, output allocation and dispatch.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "backend/cudnn_attention_rule.h"
#include "ops/ops.h"

namespace tr::ops {

namespace {

backend::Backend& be(const Tensor& t) { return backend::backend_for(t.device()); }
bool runs(const Tensor& t) { return !t.device().is_meta() && t.numel() > 0; }

// Contiguous, or a matrix whose rows sit in a wider buffer (unit column stride): the padded rows the LM
// head's logits and their gradient use, which GEMMs write and the cross-entropy kernels read as they are.
bool padded_rows(const Tensor& t) {
  return t.is_contiguous() || (t.dim() == 2 && t.strides()[1] == 1 && t.strides()[0] >= t.size(1));
}

void check_same(const char* op, const Tensor& a, const Tensor& b) {
  TR_CHECK(a.device() == b.device(), "{}: tensors on different devices: {} and {}", op, a.describe(),
           b.describe());
  TR_CHECK(a.dtype() == b.dtype(), "{}: dtypes differ: {} and {}", op, a.describe(), b.describe());
}

// A GEMM operand: base tensor (its data pointer is the matrix origin), transposed flag, leading dim and
// batch stride, for logical matrices X[b] of shape [rows, cols].
struct Operand {
  Tensor base;
  bool trans = false;
  int64_t ld = 0, batch_stride = 0;
};

// Tries to express the batch dims of `x` (all but the last two) as a single stride.
bool uniform_batch_stride(const Tensor& x, int64_t* stride) {
  int64_t st = 0;
  bool any = false;
  int64_t expect_next = -1;
  for (int64_t d = x.dim() - 3; d >= 0; --d) {
    if (x.shape()[d] == 1) continue;
    if (!any) {
      st = x.strides()[d];
      expect_next = st * x.shape()[d];
      any = true;
    } else {
      if (st == 0 && x.strides()[d] == 0) continue;
      if (x.strides()[d] != expect_next) return false;
      expect_next = x.strides()[d] * x.shape()[d];
    }
  }
  *stride = st;
  return true;
}

Operand prepare(Tensor x, int64_t rows, int64_t cols) {
  const int64_t nd = x.dim();
  const int64_t s_r = x.strides()[nd - 2], s_c = x.strides()[nd - 1];
  Operand op;
  int64_t bs = 0;
  if (uniform_batch_stride(x, &bs)) {
    if ((s_c == 1 || cols == 1) && (s_r >= std::max<int64_t>(cols, 1) || rows == 1)) {
      op = {x, false, rows == 1 ? std::max<int64_t>(cols, 1) : s_r, bs};
      return op;
    }
    if ((s_r == 1 || rows == 1) && (s_c >= std::max<int64_t>(rows, 1) || cols == 1)) {
      op = {x, true, cols == 1 ? std::max<int64_t>(rows, 1) : s_c, bs};
      return op;
    }
  }
  Tensor c = contiguous(x);
  int64_t cbs = 0;
  uniform_batch_stride(c, &cbs);
  return {c, false, std::max<int64_t>(cols, 1), cbs};
}

// Runs c = alpha * A B + beta * c for prepared operands (batch stride of c: m * n), with an optional
// epilogue (backend.h GemmEpilogue: bias, bias + GELU keeping the pre-activation in aux).
void run_gemm(const Operand& pa, const Operand& pb, const Tensor& c, int64_t batch, int64_t m, int64_t n,
              int64_t k, double alpha, double beta,
              backend::GemmEpilogue epilogue = backend::GemmEpilogue::none, const Tensor& bias = Tensor(),
              const Tensor& aux = Tensor()) {
  backend::GemmArgs g;
  if (!c.is_contiguous()) g.ldc = c.strides()[0];  // rows of a padded buffer (padded_rows)
  g.epilogue = epilogue;
  g.bias = bias;
  g.aux = aux;
  g.a = pa.base;
  g.b = pb.base;
  g.c = c;
  g.trans_a = pa.trans;
  g.trans_b = pb.trans;
  g.batch = batch;
  g.m = m;
  g.n = n;
  g.k = k;
  g.lda = pa.ld;
  g.ldb = pb.ld;
  g.stride_a = pa.batch_stride;
  g.stride_b = pb.batch_stride;
  g.alpha = alpha;
  g.beta = beta;
  g.tf32 = pa.base.dtype() == DType::f32 && backend::allow_tf32();
  g.autotune = backend::gemm_autotune();
  be(c).gemm(g);
}

}  // namespace

namespace {

// The product's dtype: a's, or f32 for bf16/f16 operands when f32_out (the accumulator kept unrounded).
DType product_dtype(DType operands, bool f32_out) {
  return f32_out && (operands == DType::bf16 || operands == DType::f16) ? DType::f32 : operands;
}

// Shapes and prepared operands of a batched matmul (batch dims broadcast).
struct MatmulPlan {
  Operand pa, pb;
  Shape out_shape;
  int64_t batch, m, n, k;
};

MatmulPlan plan_matmul(const char* op, const Tensor& a_in, const Tensor& b_in, bool trans_a, bool trans_b) {
  check_same(op, a_in, b_in);
  TR_CHECK(is_floating(a_in.dtype()), "{}: expected floating tensors, got {}", op, a_in.describe());
  TR_CHECK(a_in.dim() >= 2 && b_in.dim() >= 2, "{}: operands need at least 2 dims, got {} and {}", op,
           a_in.describe(), b_in.describe());
  Tensor a = trans_a ? transpose(a_in, -1, -2) : a_in;
  Tensor b = trans_b ? transpose(b_in, -1, -2) : b_in;
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  TR_CHECK(b.size(-2) == k, "{}: inner dims differ: {}{} @ {}{}", op, shape_str(a_in.shape()),
           trans_a ? "^T" : "", shape_str(b_in.shape()), trans_b ? "^T" : "");
  Shape ab(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  Shape batch = broadcast_shapes(ab, bb, op);
  Shape ea = batch, eb = batch, out_shape = batch;
  ea.insert(ea.end(), {m, k});
  eb.insert(eb.end(), {k, n});
  out_shape.insert(out_shape.end(), {m, n});
  // Operands are prepared (possibly copied) before the meta check so dry runs count those bytes too.
  return {prepare(expand(a, ea), m, k), prepare(expand(b, eb), k, n), out_shape, shape_numel(batch), m, n, k};
}

Tensor matmul_impl(const char* op, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                   bool f32_out) {
  MatmulPlan p = plan_matmul(op, a, b, trans_a, trans_b);
  Tensor out = empty(p.out_shape, product_dtype(a.dtype(), f32_out), a.device());
  if (!runs(out)) return out;
  run_gemm(p.pa, p.pb, out, p.batch, p.m, p.n, p.k, 1.0, 0.0);
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  return matmul_impl("matmul", a, b, trans_a, trans_b, false);
}

Tensor matmul_f32(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  return matmul_impl("matmul_f32", a, b, trans_a, trans_b, true);
}

void matmul_into(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                 double alpha, double beta) {
  MatmulPlan p = plan_matmul("matmul_into", a, b, trans_a, trans_b);
  TR_CHECK(out.device() == a.device(), "matmul_into: target {} is not on {}'s device", out.describe(),
           a.describe());
  TR_CHECK(out.shape() == p.out_shape && (out.is_contiguous() || (p.batch == 1 && padded_rows(out))) &&
               (out.dtype() == a.dtype() || out.dtype() == product_dtype(a.dtype(), true)),
           "matmul_into: target {} does not fit {} @ {} (contiguous, or a matrix's rows in a wider buffer)",
           out.describe(), a.describe(), b.describe());
  if (!runs(out)) return;
  run_gemm(p.pa, p.pb, out, p.batch, p.m, p.n, p.k, alpha, beta);
}

std::string gemm_precision_note(Device device, DType operands) {
  if (device.is_meta()) return "";
  return backend::backend_for(device).gemm_precision_note(operands);
}

backend::NativeHalf native_half_matmul(Device device, DType operands) {
  return device.is_meta() ? backend::NativeHalf::none
                          : backend::backend_for(device).native_half_matmul(operands);
}

void addmm_(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha,
            double beta) {
  check_same("addmm_", out, a);
  check_same("addmm_", out, b);
  TR_CHECK(out.dim() == 2 && a.dim() == 2 && b.dim() == 2 && out.is_contiguous(),
           "addmm_: expects 2-D operands and a contiguous target, got {}, {}, {}", out.describe(),
           a.describe(), b.describe());
  Tensor av = trans_a ? transpose(a, 0, 1) : a, bv = trans_b ? transpose(b, 0, 1) : b;
  const int64_t m = av.size(0), k = av.size(1), n = bv.size(1);
  TR_CHECK(bv.size(0) == k && out.size(0) == m && out.size(1) == n, "addmm_: {} += {} @ {} does not fit",
           out.describe(), av.describe(), bv.describe());
  Operand pa = prepare(av, m, k), pb = prepare(bv, k, n);
  if (!runs(out)) return;
  run_gemm(pa, pb, out, 1, m, n, k, alpha, beta);
}

namespace {

// x [..., in] @ w[out, in]^T (+ bias) with the bias (and the tanh GELU) applied by the GEMM's epilogue.
// aux: where bias_gelu keeps the pre-activation.
Tensor linear_impl(const char* op, const Tensor& x, const Tensor& w, const Tensor& bias,
                   backend::GemmEpilogue epilogue, Tensor* aux) {
  check_same(op, x, w);
  TR_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1),
           "{}: input {} does not match weight {} (expected [..., {}])", op, x.describe(), w.describe(),
           w.dim() == 2 ? w.size(1) : -1);
  const int64_t in = w.size(1), outf = w.size(0);
  Shape out_shape = x.shape();
  out_shape.back() = outf;
  Tensor x2 = reshape(x, {-1, in});
  const int64_t rows = x2.size(0);
  Operand pa = prepare(x2, rows, in);
  Operand pb = prepare(transpose(w, 0, 1), in, outf);
  Tensor out = empty({rows, outf}, x.dtype(), x.device());
  Tensor bc;
  if (bias.defined()) {
    check_same(op, x, bias);
    TR_CHECK(bias.dim() == 1 && bias.size(0) == outf, "{}: bias {} does not match {} outputs", op,
             bias.describe(), outf);
    bc = contiguous(bias);
  }
  Tensor aux2 = aux ? empty({rows, outf}, x.dtype(), x.device()) : Tensor();
  if (aux) *aux = view(aux2, out_shape);
  if (runs(out))
    run_gemm(pa, pb, out, 1, rows, outf, in, 1.0, 0.0, bc.defined() ? epilogue : backend::GemmEpilogue::none,
             bc, aux2);
  return view(out, out_shape);
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  return linear_impl("linear", x, w, bias, backend::GemmEpilogue::bias, nullptr);
}

LinearGelu linear_gelu(const Tensor& x, const Tensor& w, const Tensor& bias) {
  TR_CHECK(bias.defined(), "linear_gelu: needs a bias (the fused epilogue is bias + GELU)");
  LinearGelu r;
  r.y = linear_impl("linear_gelu", x, w, bias, backend::GemmEpilogue::bias_gelu, &r.pre);
  return r;
}

namespace {

DType stat_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

void check_norm(const char* op, const Tensor& x, const Tensor& p, const char* what) {
  if (!p.defined()) return;
  check_same(op, x, p);
  TR_CHECK(p.dim() == 1 && p.size(0) == x.size(-1), "{}: {} {} does not match the last dim of input {}", op,
           what, p.describe(), x.describe());
}

Shape rows_shape(const Tensor& x) {
  Shape s(x.shape().begin(), x.shape().end() - 1);
  return s;
}

}  // namespace

namespace {

// The residual operand of the add_* norms: like x, made contiguous.
Tensor residual_of(const char* op, const Tensor& x, const Tensor& r) {
  if (!r.defined()) return r;
  check_same(op, x, r);
  TR_CHECK(r.shape() == x.shape(), "{}: residual {} does not match input {}", op, r.describe(), x.describe());
  return contiguous(r);
}

// gx_add of the backward forms, checked against gy.
Tensor grad_add_of(const char* op, const Tensor& gy, const Tensor& ga) {
  if (!ga.defined()) return ga;
  check_same(op, gy, ga);
  TR_CHECK(ga.shape() == gy.shape(), "{}: gx_add {} does not match grad {}", op, ga.describe(),
           gy.describe());
  return contiguous(ga);
}

NormOut layer_norm_impl(const char* op, const Tensor& x, const Tensor& residual, const Tensor& w,
                        const Tensor& b, double eps) {
  TR_CHECK(is_floating(x.dtype()) && x.dim() >= 1, "{}: expected a floating tensor, got {}", op,
           x.describe());
  check_norm(op, x, w, "weight");
  check_norm(op, x, b, "bias");
  Tensor xc = contiguous(x), wc = w.defined() ? contiguous(w) : w, bc = b.defined() ? contiguous(b) : b;
  Tensor rc = residual_of(op, x, residual);
  NormOut o{empty(x.shape(), x.dtype(), x.device()), empty(rows_shape(x), stat_dtype(x.dtype()), x.device()),
            empty(rows_shape(x), stat_dtype(x.dtype()), x.device()),
            rc.defined() ? empty(x.shape(), x.dtype(), x.device()) : Tensor()};
  if (runs(o.y)) be(x).layer_norm(xc, wc, bc, eps, o.y, o.mean, o.rstd, rc, o.sum);
  return o;
}

NormOut rms_norm_impl(const char* op, const Tensor& x, const Tensor& residual, const Tensor& w, double eps) {
  TR_CHECK(is_floating(x.dtype()) && x.dim() >= 1, "{}: expected a floating tensor, got {}", op,
           x.describe());
  check_norm(op, x, w, "weight");
  Tensor xc = contiguous(x), wc = w.defined() ? contiguous(w) : w;
  Tensor rc = residual_of(op, x, residual);
  NormOut o{empty(x.shape(), x.dtype(), x.device()), Tensor(),
            empty(rows_shape(x), stat_dtype(x.dtype()), x.device()),
            rc.defined() ? empty(x.shape(), x.dtype(), x.device()) : Tensor()};
  if (runs(o.y)) be(x).rms_norm(xc, wc, eps, o.y, o.rstd, rc, o.sum);
  return o;
}

}  // namespace

NormOut layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  return layer_norm_impl("layer_norm", x, Tensor(), w, b, eps);
}

NormOut add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b,
                       double eps) {
  TR_CHECK(residual.defined(), "add_layer_norm: needs a residual");
  return layer_norm_impl("add_layer_norm", x, residual, w, b, eps);
}

NormGrads layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                              const Tensor& gy, bool need_gx, bool need_gw, bool need_gb,
                              const Tensor& gx_add) {
  check_same("layer_norm_backward", x, gy);
  TR_CHECK(gy.shape() == x.shape(), "layer_norm_backward: grad {} does not match input {}", gy.describe(),
           x.describe());
  const int64_t n = x.size(-1);
  Tensor xc = contiguous(x), wc = w.defined() ? contiguous(w) : w, gc = contiguous(gy);
  Tensor ga = need_gx ? grad_add_of("layer_norm_backward", gy, gx_add) : Tensor();
  NormGrads g;
  if (need_gx) g.gx = empty(x.shape(), x.dtype(), x.device());
  if (need_gw) g.gw = empty({n}, x.dtype(), x.device());
  if (need_gb) g.gb = empty({n}, x.dtype(), x.device());
  if (runs(gy))
    be(x).layer_norm_backward(xc, wc, mean, rstd, gc, g.gx, g.gw, g.gb, ga);
  else if (!x.device().is_meta()) {
    if (need_gw) g.gw = zeros({n}, x.dtype(), x.device());
    if (need_gb) g.gb = zeros({n}, x.dtype(), x.device());
  }
  return g;
}

NormOut rms_norm(const Tensor& x, const Tensor& w, double eps) {
  return rms_norm_impl("rms_norm", x, Tensor(), w, eps);
}

NormOut add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, double eps) {
  TR_CHECK(residual.defined(), "add_rms_norm: needs a residual");
  return rms_norm_impl("add_rms_norm", x, residual, w, eps);
}

NormGrads rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& gy,
                            bool need_gx, bool need_gw, const Tensor& gx_add) {
  check_same("rms_norm_backward", x, gy);
  TR_CHECK(gy.shape() == x.shape(), "rms_norm_backward: grad {} does not match input {}", gy.describe(),
           x.describe());
  const int64_t n = x.size(-1);
  Tensor xc = contiguous(x), wc = w.defined() ? contiguous(w) : w, gc = contiguous(gy);
  Tensor ga = need_gx ? grad_add_of("rms_norm_backward", gy, gx_add) : Tensor();
  NormGrads g;
  if (need_gx) g.gx = empty(x.shape(), x.dtype(), x.device());
  if (need_gw) g.gw = empty({n}, x.dtype(), x.device());
  if (runs(gy))
    be(x).rms_norm_backward(xc, wc, rstd, gc, g.gx, g.gw, ga);
  else if (need_gw && !x.device().is_meta())
    g.gw = zeros({n}, x.dtype(), x.device());
  return g;
}

namespace {

// The checks of a cross-entropy's logits and labels, and its empty per-row loss and logsumexp.
CrossEntropyOut cross_entropy_outputs(const Tensor& logits, const Tensor& labels, const char* op) {
  TR_CHECK(is_floating(logits.dtype()) && logits.dim() >= 1, "{}: logits must be floating, got {}", op,
           logits.describe());
  TR_CHECK(labels.dtype() == DType::i64, "{}: labels must be int64, got {}", op, labels.describe());
  TR_CHECK(labels.device() == logits.device(), "{}: labels {} and logits {} are on different devices", op,
           labels.describe(), logits.describe());
  const int64_t v = logits.size(-1);
  const int64_t rows = logits.numel() / std::max<int64_t>(v, 1);
  TR_CHECK(labels.numel() == rows, "{}: {} labels for {} rows of logits {}", op, labels.numel(), rows,
           logits.describe());
  const DType sd = stat_dtype(logits.dtype());
  return {empty(labels.shape(), sd, logits.device()), empty(labels.shape(), sd, logits.device())};
}

void check_smoothing(double smoothing, const char* op) {
  TR_CHECK(smoothing >= 0.0 && smoothing <= 1.0, "{}: label_smoothing {} must be between 0.0 and 1.0", op,
           smoothing);
}

}  // namespace

CrossEntropyOut cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index,
                              double label_smoothing) {
  check_smoothing(label_smoothing, "cross_entropy");
  CrossEntropyOut o = cross_entropy_outputs(logits, labels, "cross_entropy");
  Tensor lc = padded_rows(logits) ? logits : contiguous(logits), yc = contiguous(labels);
  if (runs(o.loss)) be(logits).cross_entropy(lc, yc, ignore_index, label_smoothing, o.loss, o.lse);
  return o;
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                              const Tensor& grad_loss, int64_t ignore_index, double label_smoothing) {
  check_smoothing(label_smoothing, "cross_entropy_backward");
  TR_CHECK(grad_loss.numel() == labels.numel() && grad_loss.dtype() == lse.dtype(),
           "cross_entropy_backward: grad {} does not match labels {}", grad_loss.describe(),
           labels.describe());
  TR_CHECK(labels.device() == logits.device() && lse.device() == logits.device() &&
               grad_loss.device() == logits.device(),
           "cross_entropy_backward: logits {}, labels {} and grad {} must be on one device",
           logits.describe(), labels.describe(), grad_loss.describe());
  Tensor lc = contiguous(logits), yc = contiguous(labels), gc = contiguous(grad_loss);
  Tensor g = empty(logits.shape(), logits.dtype(), logits.device());
  if (runs(g)) be(logits).cross_entropy_backward(lc, yc, lse, gc, ignore_index, label_smoothing, g);
  return g;
}

void cross_entropy_backward_(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                             const Tensor& grad_loss, int64_t ignore_index, double label_smoothing) {
  check_smoothing(label_smoothing, "cross_entropy_backward_");
  TR_CHECK(logits.is_contiguous(), "cross_entropy_backward_: logits {} must be contiguous",
           logits.describe());
  TR_CHECK(grad_loss.numel() == labels.numel() && grad_loss.dtype() == lse.dtype() &&
               labels.device() == logits.device() && grad_loss.device() == logits.device(),
           "cross_entropy_backward_: grad {} / labels {} do not match logits {}", grad_loss.describe(),
           labels.describe(), logits.describe());
  Tensor yc = contiguous(labels), gc = contiguous(grad_loss);
  // Each element is read before it is written, so the kernels run in place.
  if (runs(logits))
    be(logits).cross_entropy_backward(logits, yc, lse, gc, ignore_index, label_smoothing, logits);
}

void cross_entropy_backward_into(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                                 const Tensor& grad_loss, int64_t ignore_index, const Tensor& out,
                                 double label_smoothing) {
  check_smoothing(label_smoothing, "cross_entropy_backward_into");
  TR_CHECK(
      logits.dim() >= 1 && logits.is_contiguous() && logits.dtype() == DType::f32 && out.is_contiguous() &&
          out.shape() == logits.shape() && (out.dtype() == DType::bf16 || out.dtype() == DType::f16) &&
          out.device() == logits.device(),
      "cross_entropy_backward_into: f32 logits {} into a contiguous bf16/f16 gradient of their shape, got {}",
      logits.describe(), out.describe());
  TR_CHECK(
      grad_loss.numel() == labels.numel() &&
          labels.numel() == logits.numel() / std::max<int64_t>(1, logits.shape().back()) &&
          lse.numel() == labels.numel() && grad_loss.dtype() == DType::f32 && lse.dtype() == DType::f32 &&
          lse.is_contiguous() && labels.device() == logits.device() &&
          grad_loss.device() == logits.device() && lse.device() == logits.device(),
      "cross_entropy_backward_into: grad {} / lse {} / labels {} do not match logits {} (f32, one per row)",
      grad_loss.describe(), lse.describe(), labels.describe(), logits.describe());
  Tensor yc = contiguous(labels), gc = contiguous(grad_loss);
  if (runs(out)) be(logits).cross_entropy_backward(logits, yc, lse, gc, ignore_index, label_smoothing, out);
}

CrossEntropyOut cross_entropy_with_grad_(const Tensor& logits, const Tensor& labels, int64_t ignore_index,
                                         const Tensor& grad_loss, const Tensor& glogits,
                                         double label_smoothing) {
  check_smoothing(label_smoothing, "cross_entropy_with_grad_");
  const bool in_place = glogits.storage() == logits.storage() && glogits.offset() == logits.offset() &&
                        glogits.dtype() == logits.dtype();
  TR_CHECK(logits.dim() >= 1 && padded_rows(logits) && padded_rows(glogits) &&
               glogits.shape() == logits.shape() && glogits.device() == logits.device() &&
               (in_place ? glogits.strides() == logits.strides()
                         : (logits.dtype() == DType::f32 &&
                            (glogits.dtype() == DType::bf16 || glogits.dtype() == DType::f16))),
           "cross_entropy_with_grad_: logits {} and their gradient {} (contiguous, or rows in a wider "
           "buffer) in their place or, for f32 logits, in bf16/f16",
           logits.describe(), glogits.describe());
  CrossEntropyOut o = cross_entropy_outputs(logits, labels, "cross_entropy_with_grad_");
  TR_CHECK(grad_loss.numel() == labels.numel() && grad_loss.dtype() == o.lse.dtype() &&
               grad_loss.device() == logits.device(),
           "cross_entropy_with_grad_: grad {} does not match labels {} ({} per row)", grad_loss.describe(),
           labels.describe(), dtype_name(o.lse.dtype()));
  const Tensor yc = contiguous(labels), gc = contiguous(grad_loss);
  if (runs(o.loss))
    be(logits).cross_entropy_with_grad(logits, yc, ignore_index, label_smoothing, o.loss, o.lse, gc, glogits);
  return o;
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  TR_CHECK(weight.dim() == 2, "embedding: weight must be [num, dim], got {}", weight.describe());
  TR_CHECK(ids.dtype() == DType::i64, "embedding: indices must be int64, got {}", ids.describe());
  TR_CHECK(ids.device() == weight.device(), "embedding: indices {} and weight {} are on different devices",
           ids.describe(), weight.describe());
  Shape s = ids.shape();
  s.push_back(weight.size(1));
  Tensor wc = contiguous(weight), ic = contiguous(ids);
  Tensor out = empty(s, weight.dtype(), weight.device());
  if (runs(out)) be(weight).embedding(wc, ic, out);
  return out;
}

Tensor embedding_backward(const Tensor& gy, const Tensor& ids, int64_t num_rows) {
  const int64_t d = gy.size(-1);
  TR_CHECK(gy.numel() == ids.numel() * d, "embedding_backward: grad {} does not match indices {}",
           gy.describe(), ids.describe());
  TR_CHECK(ids.dtype() == DType::i64 && ids.device() == gy.device(),
           "embedding_backward: indices {} must be int64 on the grad's device ({})", ids.describe(),
           gy.describe());
  Tensor gc = contiguous(gy), ic = contiguous(ids);
  Tensor gw = empty({num_rows, d}, gy.dtype(), gy.device());
  if (runs(gw)) {
    if (gy.numel() == 0)
      be(gy).fill(gw, 0.0);
    else
      be(gy).embedding_backward(gc, ic, gw);
  }
  return gw;
}

RopeTables rope_tables(int64_t max_positions, int64_t head_dim, double theta, Device device) {
  TR_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope_tables: head_dim {} must be even and positive", head_dim);
  std::vector<float> inv(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i)  // as HF: 1 / theta^(2i/d) in f32
    inv[static_cast<size_t>(i)] =
        1.0f / std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(head_dim));
  return rope_tables_from_inv_freq(max_positions, inv, device);
}

RopeTables rope_tables_from_inv_freq(int64_t max_positions, const std::vector<float>& inv_freq,
                                     Device device) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  TR_CHECK(half > 0 && max_positions > 0, "rope_tables: need positions and frequencies");
  if (device.is_meta())
    return {empty({max_positions, half}, DType::f32, device),
            empty({max_positions, half}, DType::f32, device)};
  std::vector<float> c(static_cast<size_t>(max_positions * half)), s(c.size());
  for (int64_t p = 0; p < max_positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const float a = static_cast<float>(p) * inv_freq[static_cast<size_t>(i)];
      c[static_cast<size_t>(p * half + i)] = std::cos(a);
      s[static_cast<size_t>(p * half + i)] = std::sin(a);
    }
  return {from_vector(c, {max_positions, half}, device), from_vector(s, {max_positions, half}, device)};
}

Tensor rope(const Tensor& x, const RopeTables& t, const Tensor& positions, bool seq_major, bool inverse) {
  TR_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, "rope: expected x [B, H, T, D] with even D, got {}",
           x.describe());
  const int64_t B = x.size(0), T = seq_major ? x.size(1) : x.size(2);
  TR_CHECK(positions.dtype() == DType::i64 && positions.numel() == B * T,
           "rope: positions {} do not match batch {} x sequence {}", positions.describe(), B, T);
  TR_CHECK(t.cos.dim() == 2 && t.cos.size(1) == x.size(3) / 2, "rope: tables {} do not match head dim {}",
           t.cos.describe(), x.size(3));
  TR_CHECK(positions.device() == x.device() && t.cos.device() == x.device() && t.sin.device() == x.device(),
           "rope: input {}, positions {} and tables {} must be on one device", x.describe(),
           positions.describe(), t.cos.describe());
  Tensor xc = contiguous(x), pc = contiguous(positions);
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  if (runs(y)) be(x).rope(xc, t.cos, t.sin, pc, seq_major, inverse, y);
  return y;
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset) {
  TR_CHECK(p >= 0.0 && p < 1.0, "dropout: probability {} must be in [0, 1)", p);
  Tensor xc = contiguous(x);
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  if (runs(y)) be(x).dropout(xc, p, seed, offset, y);
  return y;
}

namespace {

AttentionForm resolve(AttentionForm form, const Tensor& q, const Tensor& k, const AttentionDropout& d) {
  return form == AttentionForm::automatic ? attention_form(q, k, d.p > 0) : form;
}

void check_dropout(const AttentionDropout& d) {
  TR_CHECK(d.p >= 0 && d.p < 1, "attention: dropout {} must be in [0, 1)", d.p);
}

// An attention operand as the fused kernels read it (Backend::attention: any strides with the head dim
// contiguous and rows at least a head dim apart, sgemm's leading-dimension rule): a model's q/k/v views of
// its projections serve in place; anything else (an expanded sequence, say) is copied.
Tensor rows_of(const Tensor& x) {
  const bool unit = x.size(3) <= 1 || x.stride(3) == 1, apart = x.size(2) <= 1 || x.stride(2) >= x.size(3);
  return unit && apart ? x : contiguous(x);
}

// Whether (size, stride) pairs tile one dense block without overlap, in some order of the dims.
bool dense_layout(std::vector<std::pair<int64_t, int64_t>> dims) {
  std::sort(dims.begin(), dims.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  int64_t expect = 1;
  for (const auto& [n, st] : dims) {
    if (n == 1) continue;
    if (st != expect) return false;
    expect *= n;
  }
  return true;
}

std::vector<std::pair<int64_t, int64_t>> dims_of(const Tensor& x) {
  std::vector<std::pair<int64_t, int64_t>> d;
  for (int64_t i = 0; i < x.dim(); ++i) d.emplace_back(x.size(i), x.stride(i));
  return d;
}

// Gradient buffers laid out as their inputs, so the gradients flow back through the inputs' views with no
// copies: inputs that are views of one buffer at equally spaced offsets (a packed qkv projection read in
// place) get views of one fresh buffer laid out alike, a permuted dense input the same permutation, anything
// else a contiguous tensor.
std::vector<Tensor> grads_like(const std::vector<const Tensor*>& xs) {
  const Tensor& f = *xs[0];
  std::vector<int64_t> offs;
  bool joint = xs.size() > 1;
  for (const Tensor* x : xs) {
    joint = joint && x->storage() == f.storage() && x->shape() == f.shape() && x->strides() == f.strides();
    offs.push_back(x->offset());
  }
  std::vector<int64_t> sorted = offs;
  std::sort(sorted.begin(), sorted.end());
  const int64_t step = sorted.size() > 1 ? sorted[1] - sorted[0] : 0;
  for (size_t i = 1; joint && i < sorted.size(); ++i) joint = step > 0 && sorted[i] - sorted[i - 1] == step;
  std::vector<Tensor> out;
  if (joint) {
    auto dims = dims_of(f);
    dims.emplace_back(static_cast<int64_t>(xs.size()), step);
    if (dense_layout(dims)) {
      const Tensor buf = empty({f.numel() * static_cast<int64_t>(xs.size())}, f.dtype(), f.device());
      for (const Tensor* x : xs)
        out.push_back(buf.as_strided(f.shape(), f.strides(), x->offset() - sorted[0]));
      return out;
    }
  }
  for (const Tensor* x : xs) {
    if (dense_layout(dims_of(*x))) {
      out.push_back(empty({x->numel()}, x->dtype(), x->device()).as_strided(x->shape(), x->strides(), 0));
    } else {
      out.push_back(empty(x->shape(), x->dtype(), x->device()));
    }
  }
  return out;
}

// A dry run standing in for a GPU: the workspace cuDNN's attention would take from the caching allocator
// there, taken and given back as the GPU's backend does around the call (the sm_90 rule) - the dropout's keep
// mask, and in the backward the dQ accumulator and row sums ahead of it.
void cudnn_workspace_on_meta(const Tensor& q, const Tensor& k, bool masked, bool causal, double scale,
                             int64_t window, const AttentionDropout& dropout, bool backward) {
  backend::AttentionGeometry g{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2),
                               q.size(3), causal,    scale,     nullptr,   window};
  g.with_dropout(dropout.p, 0, 0);
  if (masked || backend::cudnn_attention_declines(is_half(q.dtype()), g, 9, backward) != nullptr) return;
  int64_t bytes = backend::cudnn_attention_dropout_mask_bytes(g);
  if (backward)
    bytes += backend::cudnn_attention_dq_accumulator_bytes(g) + backend::cudnn_attention_row_sum_bytes(g);
  if (bytes > 0) (void)empty({bytes}, DType::u8, q.device());
}

}  // namespace

AttentionForm attention_form_for(DeviceType device, DType dtype, int64_t head_dim, bool dropout) {
  if (device != DeviceType::cuda) return AttentionForm::fused;  // every dtype, dropout included
  if (dtype == DType::bf16 || dtype == DType::f16) {  // tensor cores: cuDNN or the flash kernel, or the GEMMs
    if (head_dim % 8 != 0 || head_dim > 128) return AttentionForm::blocked;
    return AttentionForm::fused_cudnn;  // dropout included (cuDNN through our mask, or the flash kernel)
  }
  return dropout ? AttentionForm::blocked : AttentionForm::fused;
}

AttentionForm attention_form(const Tensor& q, const Tensor& k, bool dropout) {
  (void)k;
  return attention_form_for(q.device().type, q.dtype(), q.size(3), dropout);
}

AttentionOut attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep, bool causal,
                       double scale, int64_t window, AttentionForm form, AttentionDropout dropout) {
  TR_CHECK(window >= 0 && (window == 0 || causal), "attention: a sliding window of {} needs causal attention",
           window);
  TR_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
           "attention: q, k, v must be [B, H, T, D], got {}, {}, {}", q.describe(), k.describe(),
           v.describe());
  check_same("attention", q, k);
  check_same("attention", q, v);
  check_dropout(dropout);
  TR_CHECK(is_floating(q.dtype()), "attention: expected floating tensors, got {}", q.describe());
  TR_CHECK(k.shape() == v.shape() && k.size(0) == q.size(0) && k.size(3) == q.size(3) && k.size(1) > 0 &&
               q.size(1) % k.size(1) == 0,
           "attention: q {} does not fit k {} / v {} (heads must be a multiple of kv heads)", q.describe(),
           k.describe(), v.describe());
  if (key_keep.defined())
    TR_CHECK(key_keep.dtype() == DType::boolean && key_keep.shape() == Shape({k.size(0), k.size(2)}) &&
                 key_keep.device() == q.device(),
             "attention: key mask {} must be bool [B, S] = [{}, {}] on {}", key_keep.describe(), k.size(0),
             k.size(2), q.device().str());
  if (resolve(form, q, k, dropout) == AttentionForm::blocked)
    return attention_blocked(q, k, v, key_keep, causal, scale, 0, dropout, window);
  Tensor qc = rows_of(q), kc = rows_of(k), vc = rows_of(v),
         mc = key_keep.defined() ? contiguous(key_keep) : key_keep;
  // out in the [B, T, H, D] layout a model merges heads from, so its merge is a view.
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  AttentionOut o{transpose(empty({B, T, H, D}, q.dtype(), q.device()), 1, 2),
                 empty({B, H, T}, stat_dtype(q.dtype()), q.device())};
  if (runs(o.out))
    be(q).attention(qc, kc, vc, mc, causal, window, scale, dropout, o.out, o.lse);
  else if (q.device().is_meta() && resolve(form, q, k, dropout) == AttentionForm::fused_cudnn)
    cudnn_workspace_on_meta(q, k, key_keep.defined(), causal, scale, window, dropout, false);
  return o;
}

AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_keep,
                                  bool causal, double scale, const Tensor& out, const Tensor& lse,
                                  const Tensor& dout, int64_t window, AttentionForm form,
                                  AttentionDropout dropout) {
  TR_CHECK(dout.shape() == q.shape(), "attention_backward: grad {} does not match q {}", dout.describe(),
           q.describe());
  check_dropout(dropout);
  if (resolve(form, q, k, dropout) == AttentionForm::blocked)
    return attention_blocked_backward(q, k, v, key_keep, causal, scale, out, lse, dout, 0, dropout, window);
  if (q.numel() == 0)  // no queries: the keys and values get no gradient
    return {empty(q.shape(), q.dtype(), q.device()), zeros(k.shape(), k.dtype(), k.device()),
            zeros(v.shape(), v.dtype(), v.device())};
  Tensor qc = rows_of(q), kc = rows_of(k), vc = rows_of(v), oc = rows_of(out), dc = rows_of(dout);
  Tensor mc = key_keep.defined() ? contiguous(key_keep) : key_keep;
  AttentionGrads g;
  if (q.shape() == k.shape()) {  // q, k, v possibly one packed projection
    const auto r = grads_like({&qc, &kc, &vc});
    g = {r[0], r[1], r[2]};
  } else {
    const auto rq = grads_like({&qc}), rkv = grads_like({&kc, &vc});
    g = {rq[0], rkv[0], rkv[1]};
  }
  if (runs(g.dq))
    be(q).attention_backward(qc, kc, vc, mc, causal, window, scale, dropout, oc, lse, dc, g.dq, g.dk, g.dv);
  else if (q.device().is_meta() && resolve(form, q, k, dropout) == AttentionForm::fused_cudnn)
    cudnn_workspace_on_meta(q, k, key_keep.defined(), causal, scale, window, dropout, true);
  return g;
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  TR_CHECK(!xs.empty(), "cat: no tensors given");
  const Tensor& f = xs[0];
  dim = wrap_dim(dim, f.dim(), "cat");
  int64_t total = 0;
  for (const auto& x : xs) {
    check_same("cat", f, x);
    TR_CHECK(x.dim() == f.dim(), "cat: ranks differ: {} and {}", f.describe(), x.describe());
    for (int64_t d = 0; d < f.dim(); ++d)
      TR_CHECK(d == dim || x.size(d) == f.size(d), "cat: {} and {} differ in dim {}", f.describe(),
               x.describe(), d);
    total += x.size(dim);
  }
  Shape s = f.shape();
  s[dim] = total;
  Tensor out = empty(s, f.dtype(), f.device());
  int64_t at = 0;
  for (const auto& x : xs) {
    copy_(narrow(out, dim, at, x.size(dim)), x);
    at += x.size(dim);
  }
  return out;
}

}  // namespace tr::ops
