// Table-driven op tests: every op on every available backend and float dtype against a straightforward
// double-precision reference written here with plain loops (the rest of the op tests: test_ops_edges.cpp).
#include <algorithm>
#include <functional>
#include <numeric>

#include "backend/unary_math.h"
#include "test_util.h"

namespace tr {
namespace {

using ops::BinaryOp;
using ops::UnaryOp;

struct Ref {
  Shape shape;
  std::vector<double> v;
  Tensor tensor() const { return ops::from_vector<double>(v, shape); }
};

using Inputs = std::vector<Tensor>;

struct OpCase {
  std::string name;
  std::function<Inputs()> make;                           // f64 inputs on the CPU
  std::function<Tensor(const Inputs&)> run;               // the op under test
  std::function<Ref(const std::vector<Ref>&)> reference;  // plain loops in double
  double tol_scale = 1.0;
};

Ref ref_of(const Tensor& t) { return {t.shape(), test::values(t)}; }

// Row-major index helpers for the references.
int64_t flat(const Shape& s, const std::vector<int64_t>& idx) {
  int64_t f = 0;
  for (size_t i = 0; i < s.size(); ++i) f = f * s[i] + idx[i];
  return f;
}
std::vector<int64_t> unflat(const Shape& s, int64_t f) {
  std::vector<int64_t> idx(s.size());
  for (int64_t i = static_cast<int64_t>(s.size()) - 1; i >= 0; --i) {
    idx[i] = f % s[i];
    f /= s[i];
  }
  return idx;
}
// Value of a broadcast operand at the output index.
double bcast(const Ref& r, const Shape& out, const std::vector<int64_t>& idx) {
  std::vector<int64_t> j(r.shape.size());
  const size_t lead = out.size() - r.shape.size();
  for (size_t i = 0; i < r.shape.size(); ++i) j[i] = r.shape[i] == 1 ? 0 : idx[i + lead];
  return r.v[static_cast<size_t>(flat(r.shape, j))];
}

Tensor rnd(const Shape& s, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  return test::rand(s, seed, lo, hi, DType::f64);
}

Ref matmul_ref(const Ref& a, const Ref& b, bool ta, bool tb) {
  const int64_t m = ta ? a.shape[1] : a.shape[0], k = ta ? a.shape[0] : a.shape[1];
  const int64_t n = tb ? b.shape[0] : b.shape[1];
  Ref o{{m, n}, std::vector<double>(static_cast<size_t>(m * n))};
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += a.v[ta ? p * m + i : i * k + p] * b.v[tb ? j * k + p : p * n + j];
      o.v[i * n + j] = s;
    }
  return o;
}

std::vector<OpCase> cases() {
  std::vector<OpCase> c;
  const UnaryOp unaries[] = {UnaryOp::neg,       UnaryOp::exp,       UnaryOp::log,     UnaryOp::sqrt,
                             UnaryOp::rsqrt,     UnaryOp::tanh,      UnaryOp::sigmoid, UnaryOp::relu,
                             UnaryOp::gelu_tanh, UnaryOp::gelu_erf,  UnaryOp::silu,    UnaryOp::abs,
                             UnaryOp::square,    UnaryOp::reciprocal};
  for (UnaryOp op : unaries) {
    const bool positive =
        op == UnaryOp::log || op == UnaryOp::sqrt || op == UnaryOp::rsqrt || op == UnaryOp::reciprocal;
    c.push_back({std::string("unary_") + backend::unary_name(op),
                 [positive] {
                   return Inputs{positive ? rnd({7, 33}, 1, 0.2, 3.0) : rnd({7, 33}, 1, -4.0, 4.0)};
                 },
                 [op](const Inputs& x) { return ops::unary(op, ops::transpose(x[0], 0, 1)); },
                 [op](const std::vector<Ref>& r) {
                   Ref o{{r[0].shape[1], r[0].shape[0]}, {}};
                   for (int64_t j = 0; j < r[0].shape[1]; ++j)
                     for (int64_t i = 0; i < r[0].shape[0]; ++i)
                       o.v.push_back(backend::unary_fn<double>(op, r[0].v[i * r[0].shape[1] + j]));
                   return o;
                 }});
    c.push_back(
        {std::string("unary_backward_") + backend::unary_name(op),
         [positive] {
           return Inputs{positive ? rnd({5, 9}, 2, 0.2, 3.0) : rnd({5, 9}, 2, -4.0, 4.0), rnd({5, 9}, 3)};
         },
         [op](const Inputs& x) { return ops::unary_backward(op, x[0], x[1]); },
         [op](const std::vector<Ref>& r) {
           Ref o{r[0].shape, {}};
           for (size_t i = 0; i < r[0].v.size(); ++i) {
             // central difference of the scalar formula in double as the independent reference
             double x = r[0].v[i], h = 1e-6;
             double d =
                 (backend::unary_fn<double>(op, x + h) - backend::unary_fn<double>(op, x - h)) / (2 * h);
             o.v.push_back(r[1].v[i] * d);
           }
           return o;
         },
         20.0});
  }
  const BinaryOp binaries[] = {BinaryOp::add, BinaryOp::sub,     BinaryOp::mul,
                               BinaryOp::div, BinaryOp::maximum, BinaryOp::minimum};
  for (BinaryOp op : binaries) {
    c.push_back({std::string("binary_broadcast_") + backend::binary_name(op),
                 [] {
                   return Inputs{rnd({3, 1, 5}, 4), rnd({4, 1}, 5, 0.5, 2.0)};
                 },
                 [op](const Inputs& x) { return ops::binary(op, x[0], x[1]); },
                 [op](const std::vector<Ref>& r) {
                   Ref o{{3, 4, 5}, {}};
                   for (int64_t f = 0; f < 60; ++f) {
                     auto idx = unflat(o.shape, f);
                     o.v.push_back(backend::binary_fn<double>(op, bcast(r[0], o.shape, idx),
                                                              bcast(r[1], o.shape, idx)));
                   }
                   return o;
                 }});
  }
  c.push_back({"affine", [] { return Inputs{rnd({100}, 6)}; },
               [](const Inputs& x) { return ops::affine(x[0], 2.5, -1.0); },
               [](const std::vector<Ref>& r) {
                 Ref o = r[0];
                 for (auto& v : o.v) v = 2.5 * v - 1.0;
                 return o;
               }});
  c.push_back({"pow", [] { return Inputs{rnd({50}, 7, 0.1, 3.0)}; },
               [](const Inputs& x) { return ops::pow_scalar(x[0], 1.7); },
               [](const std::vector<Ref>& r) {
                 Ref o = r[0];
                 for (auto& v : o.v) v = std::pow(v, 1.7);
                 return o;
               }});
  c.push_back({"masked_fill_causal",
               [] {
                 return Inputs{rnd({2, 6, 6}, 8)};
               },
               [](const Inputs& x) {
                 std::vector<uint8_t> m(36);
                 for (int i = 0; i < 6; ++i)
                   for (int j = 0; j < 6; ++j) m[i * 6 + j] = j > i;
                 Tensor mask = ops::to_dtype(ops::from_vector<uint8_t>(m, {6, 6}), DType::boolean);
                 return ops::masked_fill(x[0], ops::to_device(mask, x[0].device()), -7.0);
               },
               [](const std::vector<Ref>& r) {
                 Ref o = r[0];
                 for (int64_t f = 0; f < 72; ++f) {
                   auto idx = unflat(o.shape, f);
                   if (idx[2] > idx[1]) o.v[f] = -7.0;
                 }
                 return o;
               }});
  auto reduce_case = [&](std::string name, ops::ReduceOp op, std::vector<int64_t> dims, bool keep) {
    c.push_back({name,
                 [] {
                   return Inputs{rnd({3, 4, 5}, 9)};
                 },
                 [op, dims, keep](const Inputs& x) { return ops::reduce(op, x[0], dims, keep); },
                 [op, dims, keep](const std::vector<Ref>& r) {
                   std::vector<bool> red(3, dims.empty());
                   for (auto d : dims) red[(d + 3) % 3] = true;
                   Shape os;
                   for (int i = 0; i < 3; ++i) os.push_back(red[i] ? 1 : r[0].shape[i]);
                   int64_t on = shape_numel(os);
                   std::vector<double> acc(static_cast<size_t>(on), op == ops::ReduceOp::max   ? -1e300
                                                                    : op == ops::ReduceOp::min ? 1e300
                                                                                               : 0.0);
                   std::vector<int> cnt(static_cast<size_t>(on), 0);
                   for (int64_t f = 0; f < 60; ++f) {
                     auto idx = unflat(r[0].shape, f);
                     for (int i = 0; i < 3; ++i)
                       if (red[i]) idx[i] = 0;
                     auto& a = acc[flat(os, idx)];
                     double v = r[0].v[f];
                     if (op == ops::ReduceOp::max)
                       a = std::max(a, v);
                     else if (op == ops::ReduceOp::min)
                       a = std::min(a, v);
                     else
                       a += v;
                     cnt[flat(os, idx)]++;
                   }
                   if (op == ops::ReduceOp::mean)
                     for (size_t i = 0; i < acc.size(); ++i) acc[i] /= cnt[i];
                   Shape fs;
                   for (int i = 0; i < 3; ++i)
                     if (!red[i] || keep) fs.push_back(os[i]);
                   return Ref{fs, acc};
                 }});
  };
  reduce_case("sum_dim1_keepdim", ops::ReduceOp::sum, {1}, true);
  reduce_case("sum_dims02", ops::ReduceOp::sum, {0, 2}, false);
  reduce_case("sum_all", ops::ReduceOp::sum, {}, false);
  reduce_case("mean_last", ops::ReduceOp::mean, {-1}, false);
  reduce_case("max_dim0", ops::ReduceOp::max, {0}, false);
  reduce_case("min_dims12_keepdim", ops::ReduceOp::min, {1, 2}, true);
  c.push_back({"argmax_dim1",
               [] {
                 return Inputs{rnd({4, 7, 3}, 10)};
               },
               [](const Inputs& x) { return ops::to_dtype(ops::argmax(x[0], 1), DType::f64); },
               [](const std::vector<Ref>& r) {
                 Ref o{{4, 3}, {}};
                 for (int a = 0; a < 4; ++a)
                   for (int b = 0; b < 3; ++b) {
                     int best = 0;
                     for (int i = 1; i < 7; ++i)
                       if (r[0].v[(a * 7 + i) * 3 + b] > r[0].v[(a * 7 + best) * 3 + b]) best = i;
                     o.v.push_back(best);
                   }
                 return o;
               }});
  c.push_back({"topk_values",
               [] {
                 return Inputs{rnd({3, 20}, 11)};
               },
               [](const Inputs& x) { return ops::topk(x[0], 4).values; },
               [](const std::vector<Ref>& r) {
                 Ref o{{3, 4}, {}};
                 for (int a = 0; a < 3; ++a) {
                   std::vector<double> row(r[0].v.begin() + a * 20, r[0].v.begin() + a * 20 + 20);
                   std::sort(row.rbegin(), row.rend());
                   o.v.insert(o.v.end(), row.begin(), row.begin() + 4);
                 }
                 return o;
               }});
  for (bool lg : {false, true}) {
    for (int64_t dim : {-1, 0}) {
      c.push_back({std::string(lg ? "log_softmax" : "softmax") + (dim == 0 ? "_dim0" : "_last"),
                   [] {
                     return Inputs{rnd({6, 37}, 12, -5.0, 5.0)};
                   },
                   [lg, dim](const Inputs& x) { return ops::softmax(x[0], dim, lg); },
                   [lg, dim](const std::vector<Ref>& r) {
                     Ref o = r[0];
                     const int64_t R = 6, N = 37;
                     const int64_t outer = dim == 0 ? N : R, len = dim == 0 ? R : N;
                     for (int64_t a = 0; a < outer; ++a) {
                       auto at = [&](int64_t i) -> int64_t { return dim == 0 ? i * N + a : a * N + i; };
                       double mx = -1e300, s = 0;
                       for (int64_t i = 0; i < len; ++i) mx = std::max(mx, r[0].v[at(i)]);
                       for (int64_t i = 0; i < len; ++i) s += std::exp(r[0].v[at(i)] - mx);
                       for (int64_t i = 0; i < len; ++i)
                         o.v[at(i)] =
                             lg ? r[0].v[at(i)] - mx - std::log(s) : std::exp(r[0].v[at(i)] - mx) / s;
                     }
                     return o;
                   }});
    }
  }
  c.push_back({"softmax_backward",
               [] {
                 return Inputs{rnd({4, 9}, 13), rnd({4, 9}, 14)};
               },
               [](const Inputs& x) { return ops::softmax_backward(ops::softmax(x[0], -1), x[1], -1); },
               [](const std::vector<Ref>& r) {
                 Ref o = r[0];
                 for (int a = 0; a < 4; ++a) {
                   double mx = -1e300, s = 0, dot = 0;
                   std::vector<double> y(9);
                   for (int i = 0; i < 9; ++i) mx = std::max(mx, r[0].v[a * 9 + i]);
                   for (int i = 0; i < 9; ++i) s += std::exp(r[0].v[a * 9 + i] - mx);
                   for (int i = 0; i < 9; ++i) y[i] = std::exp(r[0].v[a * 9 + i] - mx) / s;
                   for (int i = 0; i < 9; ++i) dot += y[i] * r[1].v[a * 9 + i];
                   for (int i = 0; i < 9; ++i) o.v[a * 9 + i] = y[i] * (r[1].v[a * 9 + i] - dot);
                 }
                 return o;
               }});
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    c.push_back({fmt::format("matmul_ta{}_tb{}", ta, tb),
                 [ta, tb] {
                   return Inputs{rnd(ta ? Shape{13, 17} : Shape{17, 13}, 15),
                                 rnd(tb ? Shape{11, 13} : Shape{13, 11}, 16)};
                 },
                 [ta, tb](const Inputs& x) { return ops::matmul(x[0], x[1], ta, tb); },
                 [ta, tb](const std::vector<Ref>& r) { return matmul_ref(r[0], r[1], ta, tb); }});
  }
  c.push_back(
      {"matmul_batched_broadcast",
       [] {
         return Inputs{rnd({2, 3, 5, 4}, 17), rnd({3, 4, 6}, 18)};
       },
       [](const Inputs& x) { return ops::matmul(x[0], x[1]); },
       [](const std::vector<Ref>& r) {
         Ref o{{2, 3, 5, 6}, {}};
         for (int b0 = 0; b0 < 2; ++b0)
           for (int b1 = 0; b1 < 3; ++b1) {
             Ref a{{5, 4},
                   std::vector<double>(r[0].v.begin() + (b0 * 3 + b1) * 20,
                                       r[0].v.begin() + (b0 * 3 + b1 + 1) * 20)};
             Ref b{{4, 6}, std::vector<double>(r[1].v.begin() + b1 * 24, r[1].v.begin() + (b1 + 1) * 24)};
             Ref m = matmul_ref(a, b, false, false);
             o.v.insert(o.v.end(), m.v.begin(), m.v.end());
           }
         return o;
       }});
  c.push_back(
      {"matmul_noncontiguous_heads",
       // [B, T, H, D] -> [B, H, T, D] views, as attention uses them
       [] {
         return Inputs{rnd({2, 5, 3, 4}, 19), rnd({2, 5, 3, 4}, 20)};
       },
       [](const Inputs& x) {
         return ops::matmul(ops::permute(x[0], {0, 2, 1, 3}), ops::permute(x[1], {0, 2, 1, 3}), false, true);
       },
       [](const std::vector<Ref>& r) {
         Ref o{{2, 3, 5, 5}, {}};
         for (int b = 0; b < 2; ++b)
           for (int h = 0; h < 3; ++h)
             for (int i = 0; i < 5; ++i)
               for (int j = 0; j < 5; ++j) {
                 double s = 0;
                 for (int d = 0; d < 4; ++d)
                   s += r[0].v[((b * 5 + i) * 3 + h) * 4 + d] * r[1].v[((b * 5 + j) * 3 + h) * 4 + d];
                 o.v.push_back(s);
               }
         return o;
       }});
  c.push_back({"linear_bias",
               [] {
                 return Inputs{rnd({2, 3, 8}, 21), rnd({5, 8}, 22), rnd({5}, 23)};
               },
               [](const Inputs& x) { return ops::linear(x[0], x[1], x[2]); },
               [](const std::vector<Ref>& r) {
                 Ref x2{{6, 8}, r[0].v};
                 Ref o = matmul_ref(x2, r[1], false, true);
                 for (int i = 0; i < 6; ++i)
                   for (int j = 0; j < 5; ++j) o.v[i * 5 + j] += r[2].v[j];
                 o.shape = {2, 3, 5};
                 return o;
               }});
  // The bias + GELU epilogue (cuBLASLt's GELU_AUX_BIAS on a GPU), at a tensor-core-friendly shape.
  c.push_back({"linear_gelu",
               [] {
                 return Inputs{rnd({4, 16, 64}, 24), rnd({96, 64}, 25), rnd({96}, 26)};
               },
               [](const Inputs& x) { return ops::linear_gelu(x[0], x[1], x[2]).y; },
               [](const std::vector<Ref>& r) {
                 Ref x2{{64, 64}, r[0].v};
                 Ref o = matmul_ref(x2, r[1], false, true);
                 for (int i = 0; i < 64; ++i)
                   for (int j = 0; j < 96; ++j) {
                     const double v = o.v[i * 96 + j] + r[2].v[j];
                     o.v[i * 96 + j] =
                         0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
                   }
                 o.shape = {4, 16, 96};
                 return o;
               }});
  c.push_back({"layer_norm",
               [] {
                 return Inputs{rnd({4, 3, 24}, 24, -3, 3), rnd({24}, 25), rnd({24}, 26)};
               },
               [](const Inputs& x) { return ops::layer_norm(x[0], x[1], x[2], 1e-5).y; },
               [](const std::vector<Ref>& r) {
                 Ref o = r[0];
                 for (int row = 0; row < 12; ++row) {
                   double m = 0, v = 0;
                   for (int i = 0; i < 24; ++i) m += r[0].v[row * 24 + i] / 24;
                   for (int i = 0; i < 24; ++i) v += std::pow(r[0].v[row * 24 + i] - m, 2) / 24;
                   for (int i = 0; i < 24; ++i)
                     o.v[row * 24 + i] =
                         (r[0].v[row * 24 + i] - m) / std::sqrt(v + 1e-5) * r[1].v[i] + r[2].v[i];
                 }
                 return o;
               }});
  // The fused residual add: y normalizes x + r; the sum itself is the second case.
  c.push_back({"add_layer_norm",
               [] {
                 return Inputs{rnd({4, 3, 24}, 124, -3, 3), rnd({4, 3, 24}, 125, -1, 1), rnd({24}, 126),
                               rnd({24}, 127)};
               },
               [](const Inputs& x) { return ops::add_layer_norm(x[0], x[1], x[2], x[3], 1e-5).y; },
               [](const std::vector<Ref>& r) {
                 Ref o = r[0];
                 for (int row = 0; row < 12; ++row) {
                   double m = 0, v = 0;
                   auto at = [&](int i) { return r[0].v[row * 24 + i] + r[1].v[row * 24 + i]; };
                   for (int i = 0; i < 24; ++i) m += at(i) / 24;
                   for (int i = 0; i < 24; ++i) v += std::pow(at(i) - m, 2) / 24;
                   for (int i = 0; i < 24; ++i)
                     o.v[row * 24 + i] = (at(i) - m) / std::sqrt(v + 1e-5) * r[2].v[i] + r[3].v[i];
                 }
                 return o;
               }});
  c.push_back({"add_rms_norm_sum",
               [] {
                 return Inputs{rnd({5, 16}, 128, -3, 3), rnd({5, 16}, 129, -1, 1), rnd({16}, 130)};
               },
               [](const Inputs& x) { return ops::add_rms_norm(x[0], x[1], x[2], 1e-6).sum; },
               [](const std::vector<Ref>& r) {
                 Ref o = r[0];
                 for (size_t i = 0; i < o.v.size(); ++i) o.v[i] += r[1].v[i];
                 return o;
               }});
  c.push_back({"rms_norm",
               [] {
                 return Inputs{rnd({5, 16}, 27, -3, 3), rnd({16}, 28)};
               },
               [](const Inputs& x) { return ops::rms_norm(x[0], x[1], 1e-6).y; },
               [](const std::vector<Ref>& r) {
                 Ref o = r[0];
                 for (int row = 0; row < 5; ++row) {
                   double ss = 0;
                   for (int i = 0; i < 16; ++i) ss += r[0].v[row * 16 + i] * r[0].v[row * 16 + i] / 16;
                   for (int i = 0; i < 16; ++i)
                     o.v[row * 16 + i] = r[0].v[row * 16 + i] / std::sqrt(ss + 1e-6) * r[1].v[i];
                 }
                 return o;
               }});
  c.push_back({"cross_entropy_ignore",
               [] {
                 return Inputs{rnd({6, 11}, 29, -4, 4)};
               },
               [](const Inputs& x) {
                 Tensor labels =
                     ops::to_device(ops::from_vector<int64_t>({3, -100, 0, 10, 5, -100}, {6}), x[0].device());
                 return ops::cross_entropy(x[0], labels, -100).loss;
               },
               [](const std::vector<Ref>& r) {
                 std::vector<int64_t> lab = {3, -100, 0, 10, 5, -100};
                 Ref o{{6}, {}};
                 for (int row = 0; row < 6; ++row) {
                   if (lab[row] < 0) {
                     o.v.push_back(0);
                     continue;
                   }
                   double s = 0;
                   for (int i = 0; i < 11; ++i) s += std::exp(r[0].v[row * 11 + i]);
                   o.v.push_back(std::log(s) - r[0].v[row * 11 + lab[row]]);
                 }
                 return o;
               }});
  c.push_back(
      {"cross_entropy_backward",
       [] {
         return Inputs{rnd({4, 7}, 30, -4, 4), rnd({4}, 31)};
       },
       [](const Inputs& x) {
         Tensor labels = ops::to_device(ops::from_vector<int64_t>({6, 0, -100, 2}, {4}), x[0].device());
         auto o = ops::cross_entropy(x[0], labels, -100);
         return ops::cross_entropy_backward(x[0], labels, o.lse, ops::to_dtype(x[1], o.lse.dtype()), -100);
       },
       [](const std::vector<Ref>& r) {
         std::vector<int64_t> lab = {6, 0, -100, 2};
         Ref o = r[0];
         for (int row = 0; row < 4; ++row) {
           double s = 0;
           for (int i = 0; i < 7; ++i) s += std::exp(r[0].v[row * 7 + i]);
           for (int i = 0; i < 7; ++i)
             o.v[row * 7 + i] =
                 lab[row] < 0 ? 0 : r[1].v[row] * (std::exp(r[0].v[row * 7 + i]) / s - (i == lab[row]));
         }
         return o;
       }});
  // Label smoothing (torch's label_smoothing = 0.3): the target (1 - e) * onehot + e / V, against the f64
  // definition -sum_i target_i * log softmax_i, ignored rows 0; the gradient softmax - target.
  c.push_back({"cross_entropy_smoothed",
               [] {
                 return Inputs{rnd({6, 37}, 131, -4, 4)};
               },
               [](const Inputs& x) {
                 Tensor labels =
                     ops::to_device(ops::from_vector<int64_t>({3, -100, 0, 36, 5, 17}, {6}), x[0].device());
                 return ops::cross_entropy(x[0], labels, -100, 0.3).loss;
               },
               [](const std::vector<Ref>& r) {
                 const std::vector<int64_t> lab = {3, -100, 0, 36, 5, 17};
                 Ref o{{6}, {}};
                 for (int row = 0; row < 6; ++row) {
                   double s = 0, loss = 0;
                   for (int i = 0; i < 37; ++i) s += std::exp(r[0].v[row * 37 + i]);
                   for (int i = 0; i < 37; ++i)
                     loss -= (0.7 * (i == lab[row]) + 0.3 / 37) * (r[0].v[row * 37 + i] - std::log(s));
                   o.v.push_back(lab[row] < 0 ? 0 : loss);
                 }
                 return o;
               }});
  c.push_back(
      {"cross_entropy_backward_smoothed",
       [] {
         return Inputs{rnd({4, 19}, 132, -4, 4), rnd({4}, 133)};
       },
       [](const Inputs& x) {
         Tensor labels = ops::to_device(ops::from_vector<int64_t>({18, 0, -100, 2}, {4}), x[0].device());
         auto o = ops::cross_entropy(x[0], labels, -100, 0.25);
         return ops::cross_entropy_backward(x[0], labels, o.lse, ops::to_dtype(x[1], o.lse.dtype()), -100,
                                            0.25);
       },
       [](const std::vector<Ref>& r) {
         const std::vector<int64_t> lab = {18, 0, -100, 2};
         Ref o = r[0];
         for (int row = 0; row < 4; ++row) {
           double s = 0;
           for (int i = 0; i < 19; ++i) s += std::exp(r[0].v[row * 19 + i]);
           for (int i = 0; i < 19; ++i)
             o.v[row * 19 + i] = lab[row] < 0 ? 0
                                              : r[1].v[row] * (std::exp(r[0].v[row * 19 + i]) / s -
                                                               0.75 * (i == lab[row]) - 0.25 / 19);
         }
         return o;
       }});
  c.push_back({"embedding",
               [] {
                 return Inputs{rnd({10, 6}, 32)};
               },
               [](const Inputs& x) {
                 return ops::embedding(
                     x[0], ops::to_device(ops::from_vector<int64_t>({9, 0, 3, 3}, {2, 2}), x[0].device()));
               },
               [](const std::vector<Ref>& r) {
                 Ref o{{2, 2, 6}, {}};
                 for (int id : {9, 0, 3, 3})
                   o.v.insert(o.v.end(), r[0].v.begin() + id * 6, r[0].v.begin() + id * 6 + 6);
                 return o;
               }});
  c.push_back({"embedding_backward",
               [] {
                 return Inputs{rnd({5, 4}, 33)};
               },
               [](const Inputs& x) {
                 return ops::embedding_backward(
                     x[0], ops::to_device(ops::from_vector<int64_t>({2, 0, 2, 6, 2}, {5}), x[0].device()), 7);
               },
               [](const std::vector<Ref>& r) {
                 Ref o{{7, 4}, std::vector<double>(28, 0.0)};
                 int ids[] = {2, 0, 2, 6, 2};
                 for (int i = 0; i < 5; ++i)
                   for (int j = 0; j < 4; ++j) o.v[ids[i] * 4 + j] += r[0].v[i * 4 + j];
                 return o;
               }});
  for (bool seq_major : {false, true}) {
    c.push_back({seq_major ? "rope_seq_major" : "rope_heads_first",
                 [] {
                   return Inputs{rnd({2, 3, 4, 8}, 34)};
                 },
                 [seq_major](const Inputs& x) {
                   auto tables = ops::rope_tables(16, 8, 10000.0, x[0].device());
                   Tensor pos = ops::to_device(
                       ops::from_vector<int64_t>(seq_major ? std::vector<int64_t>{0, 1, 2, 5, 6, 7}
                                                           : std::vector<int64_t>{0, 1, 2, 3, 9, 10, 11, 12},
                                                 seq_major ? Shape{2, 3} : Shape{2, 4}),
                       x[0].device());
                   return ops::rope(x[0], tables, pos, seq_major, false);
                 },
                 [seq_major](const std::vector<Ref>& r) {
                   Ref o = r[0];
                   const int B = 2, S1 = 3, S2 = 4, D = 8;
                   const int T = seq_major ? S1 : S2;
                   std::vector<int> pos = seq_major ? std::vector<int>{0, 1, 2, 5, 6, 7}
                                                    : std::vector<int>{0, 1, 2, 3, 9, 10, 11, 12};
                   for (int b = 0; b < B; ++b)
                     for (int a = 0; a < S1; ++a)
                       for (int c2 = 0; c2 < S2; ++c2) {
                         int t = seq_major ? a : c2;
                         double p = pos[b * T + t];
                         int base = ((b * S1 + a) * S2 + c2) * D;
                         for (int i = 0; i < D / 2; ++i) {
                           // angles in f32, as HF (and our tables) compute them
                           float inv =
                               1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / static_cast<float>(D));
                           float ang = static_cast<float>(p) * inv;
                           double cs = std::cos(ang), sn = std::sin(ang);
                           double x1 = r[0].v[base + i], x2 = r[0].v[base + i + D / 2];
                           o.v[base + i] = x1 * cs - x2 * sn;
                           o.v[base + i + D / 2] = x2 * cs + x1 * sn;
                         }
                       }
                   return o;
                 },
                 10.0});
  }
  for (bool causal : {true, false}) {
    c.push_back(
        {causal ? "attention_gqa_causal_padded" : "attention_gqa_full",
         [] {
           return Inputs{rnd({2, 4, 5, 8}, 40), rnd({2, 2, 7, 8}, 41), rnd({2, 2, 7, 8}, 42)};
         },
         [causal](const Inputs& x) {
           std::vector<uint8_t> keep = {1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1};
           Tensor kk = ops::to_device(ops::to_dtype(ops::from_vector<uint8_t>(keep, {2, 7}), DType::boolean),
                                      x[0].device());
           return ops::attention(x[0], x[1], x[2], kk, causal, 0.35).out;
         },
         [causal](const std::vector<Ref>& r) {
           // softmax over visible keys, in double; a query that sees nothing outputs 0
           const int B = 2, H = 4, KV = 2, T = 5, S = 7, D = 8;
           const int keep[] = {1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1};
           Ref o{{B, H, T, D}, std::vector<double>(B * H * T * D, 0.0)};
           for (int b = 0; b < B; ++b)
             for (int h = 0; h < H; ++h)
               for (int t = 0; t < T; ++t) {
                 const int kvh = h / (H / KV);
                 std::vector<double> sc(S, -INFINITY);
                 double mx = -INFINITY;
                 for (int s = 0; s < S; ++s) {
                   if ((causal && s > t + (S - T)) || !keep[b * S + s]) continue;
                   double d = 0;
                   for (int c = 0; c < D; ++c)
                     d += r[0].v[((b * H + h) * T + t) * D + c] * r[1].v[((b * KV + kvh) * S + s) * D + c];
                   sc[s] = d * 0.35;
                   mx = std::max(mx, sc[s]);
                 }
                 if (mx == -INFINITY) continue;
                 double z = 0;
                 for (int s = 0; s < S; ++s) z += std::exp(sc[s] - mx);
                 for (int s = 0; s < S; ++s) {
                   const double p = std::exp(sc[s] - mx) / z;
                   for (int c = 0; c < D; ++c)
                     o.v[((b * H + h) * T + t) * D + c] += p * r[2].v[((b * KV + kvh) * S + s) * D + c];
                 }
               }
           return o;
         }});
  }
  c.push_back({"cat_dim1",
               [] {
                 return Inputs{rnd({2, 3, 2}, 35), rnd({2, 1, 2}, 36)};
               },
               [](const Inputs& x) {
                 return ops::cat({x[0], x[1]}, 1);
               },
               [](const std::vector<Ref>& r) {
                 Ref o{{2, 4, 2}, {}};
                 for (int b = 0; b < 2; ++b) {
                   o.v.insert(o.v.end(), r[0].v.begin() + b * 6, r[0].v.begin() + b * 6 + 6);
                   o.v.insert(o.v.end(), r[1].v.begin() + b * 2, r[1].v.begin() + b * 2 + 2);
                 }
                 return o;
               }});
  // Strided copies (a head split's transpose): an inner extent the GPU moves as 16/8/4-byte packs, one it
  // cannot (7), and a fully strided one (the inner dimension transposed); a sliced source (offset base).
  for (int64_t inner : {16, 7}) {
    c.push_back({"permute_heads_" + std::to_string(inner),
                 [inner] {
                   return Inputs{rnd({2, 5, 3, inner}, 37)};
                 },
                 [](const Inputs& x) { return ops::contiguous(ops::transpose(x[0], 1, 2)); },
                 [inner](const std::vector<Ref>& r) {
                   Ref o{{2, 3, 5, inner}, {}};
                   for (int64_t b = 0; b < 2; ++b)
                     for (int64_t h = 0; h < 3; ++h)
                       for (int64_t t = 0; t < 5; ++t)
                         for (int64_t d = 0; d < inner; ++d)
                           o.v.push_back(r[0].v[static_cast<size_t>(((b * 5 + t) * 3 + h) * inner + d)]);
                   return o;
                 }});
  }
  c.push_back({"transpose_inner",
               [] {
                 return Inputs{rnd({3, 9, 8}, 38)};
               },
               [](const Inputs& x) { return ops::contiguous(ops::transpose(x[0], 1, 2)); },
               [](const std::vector<Ref>& r) {
                 Ref o{{3, 8, 9}, {}};
                 for (int b = 0; b < 3; ++b)
                   for (int j = 0; j < 8; ++j)
                     for (int i = 0; i < 9; ++i)
                       o.v.push_back(r[0].v[static_cast<size_t>((b * 9 + i) * 8 + j)]);
                 return o;
               }});
  c.push_back({"narrow_rows",
               [] {
                 return Inputs{rnd({4, 6, 16}, 39)};
               },
               [](const Inputs& x) { return ops::contiguous(ops::narrow(x[0], 1, 2, 3)); },
               [](const std::vector<Ref>& r) {
                 Ref o{{4, 3, 16}, {}};
                 for (int b = 0; b < 4; ++b)
                   for (int i = 2; i < 5; ++i)
                     for (int d = 0; d < 16; ++d)
                       o.v.push_back(r[0].v[static_cast<size_t>((b * 6 + i) * 16 + d)]);
                 return o;
               }});
  return c;
}

struct Config {
  DType dtype;
  double rtol, atol;
};

class OpTest : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

// Runs one case on `dev` and compares with the double reference. Outputs are allocated poisoned (NaN bytes),
// so an element a kernel forgets to write fails.
void check_case(const std::string& name, DType dtype, Device dev) {
  static const auto all = cases();
  auto it = std::find_if(all.begin(), all.end(), [&](const OpCase& c) { return c.name == name; });
  ASSERT_NE(it, all.end());
  Inputs in64 = it->make();
  // Round inputs to the dtype under test so the reference sees exactly what the kernel sees.
  Inputs rounded;
  for (auto& t : in64) rounded.push_back(ops::to_dtype(ops::to_dtype(t, dtype), DType::f64));
  std::vector<Ref> refs;
  for (auto& t : rounded) refs.push_back(ref_of(t));
  Ref want = it->reference(refs);
  const double tol = dtype == DType::f64 ? 1e-10 : dtype == DType::f32 ? 2e-5 : 2e-2;
  Inputs dev_in;
  for (auto& t : rounded) dev_in.push_back(ops::to_device(ops::to_dtype(t, dtype), dev));
  Allocator& alloc = ops::allocator_for(dev);
  alloc.set_poison(true);
  Tensor got;
  try {
    got = it->run(dev_in);
  } catch (...) {
    alloc.set_poison(false);
    throw;
  }
  alloc.set_poison(false);
  EXPECT_TRUE(test::all_close(ops::to_dtype(ops::to_device(got, Device::cpu()), DType::f64), want.tensor(),
                              tol * it->tol_scale, tol * it->tol_scale))
      << name << " on " << dev.str() << " in " << dtype_name(dtype);
}

TEST_P(OpTest, CpuMatchesReference) {
  const auto& [name, dtype] = GetParam();
  check_case(name, dtype, Device::cpu());
}

// The CUDA twin of every op against the same reference (and so against the CPU kernel).
class CudaOpTest : public OpTest {};

TEST_P(CudaOpTest, CudaMatchesReference) {
  if (!backend::cuda_available())
    GTEST_SKIP() << "no CUDA GPU here: GPU parity NOT tested (" << backend::cuda_summary() << ")";
  const auto& [name, dtype] = GetParam();
  check_case(name, dtype, Device::cuda(0));
}

std::vector<std::tuple<std::string, DType>> params() {
  std::vector<std::tuple<std::string, DType>> p;
  for (const auto& c : cases())
    for (DType d : {DType::f64, DType::f32, DType::bf16}) {
      if (d == DType::bf16 && c.name.rfind("unary_backward_", 0) == 0)
        continue;  // finite-difference ref is f64-only
      p.emplace_back(c.name, d);
    }
  return p;
}

auto param_name = [](const auto& info) {
  return std::get<0>(info.param) + "_" + std::string(dtype_name(std::get<1>(info.param)));
};
INSTANTIATE_TEST_SUITE_P(Ops, OpTest, ::testing::ValuesIn(params()), param_name);
INSTANTIATE_TEST_SUITE_P(Ops, CudaOpTest, ::testing::ValuesIn(params()), param_name);

}  // namespace
}  // namespace tr
