// Ops beyond the reference table (test_ops.cpp): dropout's keep fraction, the errors that name the op, edge
// cases (NaN ranking, empty and overlapping operands), the CPU's strided walks, and cross-entropy with label
// smoothing against torch's numbers.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "backend/unary_math.h"
#include "test_util.h"

namespace tr {
namespace {

using ops::BinaryOp;
using ops::UnaryOp;

TEST(Dropout, KeepsFractionAndIsReproducible) {
  Tensor x = ops::ones({100000});
  Tensor y = ops::dropout(x, 0.25, 99, 0);
  auto v = test::values(y);
  int64_t kept = 0;
  for (double e : v) {
    ASSERT_TRUE(e == 0.0 || std::abs(e - 1.0 / 0.75) < 1e-6);
    kept += e != 0.0;
  }
  EXPECT_NEAR(kept / 100000.0, 0.75, 0.01);
  EXPECT_EQ(test::values(ops::dropout(x, 0.25, 99, 0)), v);
  EXPECT_NE(test::values(ops::dropout(x, 0.25, 99, 1000)), v);
}

TEST(Errors, ShapeDtypeAndIndexMistakesNameTheOp) {
  auto expect_msg = [](auto fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  Tensor a = ops::zeros({2, 3}), b = ops::zeros({4, 5});
  expect_msg([&] { ops::binary(BinaryOp::add, a, b); }, "add: shapes [2, 3] and [4, 5]");
  expect_msg([&] { ops::matmul(a, b); }, "matmul: inner dims differ");
  expect_msg([&] { ops::binary(BinaryOp::mul, a, ops::zeros({2, 3}, DType::f64)); }, "mul: dtypes differ");
  expect_msg([&] { ops::embedding(b, ops::from_vector<int64_t>({0, 4}, {2})); }, "embedding: index 4");
  expect_msg([&] { ops::embedding(b, ops::from_vector<int64_t>({-1}, {1})); }, "embedding: index -1");
  expect_msg(
      [&] {
        ops::cross_entropy(a, ops::from_vector<int64_t>({0, 3}, {2}), -100);
      },
      "cross_entropy: label 3");
  expect_msg([&] { ops::cross_entropy(a, ops::from_vector<int64_t>({0}, {1}), -100); },
             "cross_entropy: 1 labels");
  expect_msg([&] { ops::layer_norm(a, ops::zeros({4}), Tensor(), 1e-5); }, "layer_norm: weight");
  expect_msg([&] { ops::linear(a, b, Tensor()); }, "linear: input");
  expect_msg([&] { ops::unary(ops::UnaryOp::exp, ops::zeros({2}, DType::i64)); }, "exp: expected a floating");
  expect_msg([&] { ops::reduce(ops::ReduceOp::sum, a, {2}, false); }, "reduce: dim 2 out of range");
  expect_msg([&] { ops::cat({a, b}, 0); }, "cat:");
  expect_msg([&] { ops::topk(a, 4); }, "topk: k=4");
  expect_msg([&] { ops::dropout(a, 1.0, 0, 0); }, "dropout: probability 1");
  expect_msg([&] { ops::to_device(a, Device::meta()).data_ptr(); }, "meta");
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

TEST(EdgeCases, TopkRanksNanFirstOnEveryBackend) {
  for (Device dev : test::test_devices()) {
    Tensor x = ops::to_device(ops::from_vector<float>({1.0f, NAN, 3.0f, 3.0f, -1.0f}, {1, 5}), dev);
    auto r = ops::topk(x, 4);
    EXPECT_EQ(test::values(r.indices), (std::vector<double>{1, 2, 3, 0})) << dev.str();
    auto v = test::values(r.values);
    EXPECT_TRUE(std::isnan(v[0]));
    EXPECT_EQ(v[1], 3.0);
  }
}

TEST(EdgeCases, EmptyInnerDimMatmulIsZeroEvenInPoisonedMemory) {
  for (Device dev : test::test_devices()) {
    ops::allocator_for(dev).set_poison(true);
    Tensor y = ops::matmul(ops::zeros({4, 0}, DType::f32, dev), ops::zeros({0, 3}, DType::f32, dev));
    ops::allocator_for(dev).set_poison(false);
    EXPECT_EQ(test::values(y), std::vector<double>(12, 0.0)) << dev.str();
  }
}

// No queries: keys and values get zero gradients, not whatever the (poisoned) memory held.
TEST(EdgeCases, AttentionBackwardWithoutQueriesGivesZeroKeyGradients) {
  for (Device dev : test::test_devices()) {
    Allocator& alloc = ops::allocator_for(dev);
    alloc.set_poison(true);
    Tensor q = ops::to_device(test::randn({1, 2, 0, 8}, 1), dev),
           k = ops::to_device(test::randn({1, 2, 5, 8}, 2), dev),
           v = ops::to_device(test::randn({1, 2, 5, 8}, 3), dev);
    auto o = ops::attention(q, k, v, Tensor(), true, 0.35);
    auto g = ops::attention_backward(q, k, v, Tensor(), true, 0.35, o.out, o.lse, o.out);
    alloc.set_poison(false);
    for (double x : test::values(ops::to_device(g.dk, Device::cpu()))) ASSERT_EQ(x, 0.0) << dev.str();
    for (double x : test::values(ops::to_device(g.dv, Device::cpu()))) ASSERT_EQ(x, 0.0) << dev.str();
  }
}

// The in-place forms (what an optimizer's step uses to allocate nothing) give the allocating forms' bits,
// and a wrong output is an error naming it.
TEST(EdgeCases, ReduceIntoAndUnaryInPlaceEqualTheAllocatingForms) {
  const Tensor x = test::randn({5, 7}, 3);
  for (const std::vector<int64_t>& dims :
       {std::vector<int64_t>{0}, std::vector<int64_t>{1}, std::vector<int64_t>{}}) {
    const Tensor want = ops::reduce(ops::ReduceOp::sum, x, dims, false);
    const Tensor out = ops::empty({want.numel()}, DType::f32, Device::cpu());
    ops::reduce_into(ops::ReduceOp::sum, x, dims, out);
    EXPECT_EQ(test::values(out), test::values(ops::reshape(want, {want.numel()})));
  }
  EXPECT_NE(test::error_of([&] {
              ops::reduce_into(ops::ReduceOp::sum, x, {0}, ops::empty({5}, DType::f32, Device::cpu()));
            }).find("reduce_into: the output"),
            std::string::npos);
  const Tensor y = ops::affine(ops::unary(ops::UnaryOp::exp, x), 1.0, 0.5);
  const Tensor z = ops::clone(y);
  ops::unary_(ops::UnaryOp::sqrt, z);
  EXPECT_EQ(test::values(z), test::values(ops::unary(ops::UnaryOp::sqrt, y)));
}

TEST(EdgeCases, InPlaceAddWithAnOverlappingTransposedOperand) {
  Tensor x = ops::from_vector<float>({1, 2, 3, 4}, {2, 2});
  ops::binary_(BinaryOp::add, x, ops::transpose(x, 0, 1));
  EXPECT_EQ(test::values(x), (std::vector<double>{2, 5, 5, 8}));
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

// The CPU's strided walk (loops.h: each thread's first run found by division, the rest by an odometer) and
// its column sums (reduce.cpp: narrower column chunks when there is one block, added in vectors) against a
// scalar walk: permuted copies of 5-d views small and past the threading threshold (threads' row ranges
// ending mid-dimension), and sums down columns in double in row order - the same bits, not merely close.
TEST(CpuKernels, StridedCopiesAndColumnSumsMatchAScalarWalk) {
  Generator g(11);
  for (const Shape& s : {Shape{2, 3, 4, 5, 6}, Shape{3, 5, 7, 40, 17}}) {
    const Tensor x = ops::randn(s, g);
    const std::vector<int64_t> perm = {0, 3, 1, 4, 2};
    const Tensor y = ops::contiguous(ops::permute(x, perm));
    const std::vector<float> xv = ops::to_vector<float>(x), yv = ops::to_vector<float>(y);
    std::vector<int64_t> idx(5, 0);
    for (size_t k = 0; k < yv.size(); ++k) {  // idx: y's index, odometer order
      int64_t src = 0;
      for (int d = 0; d < 5; ++d)
        src += idx[static_cast<size_t>(d)] * x.strides()[static_cast<size_t>(perm[d])];
      ASSERT_EQ(std::bit_cast<uint32_t>(yv[k]), std::bit_cast<uint32_t>(xv[static_cast<size_t>(src)]))
          << shape_str(s) << " element " << k;
      for (int d = 4; d >= 0; --d) {
        if (++idx[static_cast<size_t>(d)] < y.shape()[static_cast<size_t>(d)]) break;
        idx[static_cast<size_t>(d)] = 0;
      }
    }
  }
  for (const Shape& s : {Shape{37, 70}, Shape{300, 1000}, Shape{5, 300, 40}}) {
    const Tensor x = ops::randn(s, g);
    const int64_t dim = s.size() == 2 ? 0 : 1;
    const Tensor sum = ops::reduce(ops::ReduceOp::sum, x, {dim}, false);
    const std::vector<float> xv = ops::to_vector<float>(x), sv = ops::to_vector<float>(sum);
    const int64_t outer = s.size() == 2 ? 1 : s[0], r = s[static_cast<size_t>(dim)], inner = s.back();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < inner; ++j) {
        double acc = 0;
        for (int64_t i = 0; i < r; ++i)
          acc += static_cast<double>(xv[static_cast<size_t>((o * r + i) * inner + j)]);
        ASSERT_EQ(std::bit_cast<uint32_t>(sv[static_cast<size_t>(o * inner + j)]),
                  std::bit_cast<uint32_t>(static_cast<float>(acc)))
            << shape_str(s) << " column " << o << ", " << j;
      }
  }
}

// torch.nn.functional.cross_entropy(label_smoothing=e, reduction="none") and its gradient for per-row
// weights, from Debian's torch 1.13 (tests/label_smoothing_golden.py): logits 3 sin(7r + 3i), an ignored row.
// f64 to torch's loss bits' neighbourhood (its f64 gradient carries an f32 rounding of e / V: 1e-7), f32
// within 1e-5.
TEST(CrossEntropyGolden, LabelSmoothingIsTorchs) {
  struct Golden {
    double e;
    std::vector<double> loss, grad;
  };
  const std::vector<Golden> golden = {
      {0.1,
       {2.6792551727763732, 0, 1.3149450735759509, 2.6559728948066312, 6.8222187407670418},
       {0.0068736560253725744,
        0.012892486320705674,
        0.00039294758317032685,
        -0.4152289743860258,
        -0.0022622737334145188,
        0.075785243365837612,
        -0.0033454485206947247,
        0.13596125372591825,
        -0.0037907634573515884,
        0.19667801976498939,
        -0.0039561466885073256,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        -1.1046517612757762,
        -0.016139245729869082,
        0.54705130143116976,
        -0.015296193850857643,
        0.34180875532025951,
        -0.013191494157875235,
        0.1728963379347688,
        -0.0080684868589006187,
        0.070717834091878595,
        0.0045220312484834189,
        0.020350921846717992,
        -0.12968069415821004,
        0.0083455376168895309,
        -0.18964767417648903,
        0.0085088785450228351,
        -0.21737583395272003,
        0.0085153849110666761,
        -0.19412087017318166,
        0.0083696105192858864,
        -0.1357408950359012,
        0.0079655540925008816,
        0.82486100181173627,
        0.06791120237207901,
        -0.014706902360844232,
        0.17923582248567138,
        -0.021147111067525842,
        0.3675485649645176,
        -0.023790160750022302,
        0.60445519537764758,
        -2.7248573975761849,
        0.78755485265940617,
        -0.025168752643824573,
        0.80296468653908082}},
      {0.3,
       {2.9518368683944027, 0, 1.8834794257170531, 3.0195082294984283, 6.2175926831883954},
       {-0.0022172530655365156,
        0.003801577229796585,
        -0.0086979615077387631,
        -0.32431988347693486,
        -0.011353182824323607,
        0.066694334274928532,
        -0.012436357611603815,
        0.12687034463500918,
        -0.012881672548260678,
        0.18758711067408029,
        -0.013047055779416415,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        -0.74101539763941238,
        -0.05250288209350544,
        0.51068766506753338,
        -0.051659830214494003,
        0.30544511895662313,
        -0.049555130521511594,
        0.13653270157113243,
        -0.044432123222536979,
        0.034354197728242233,
        -0.031841605115152938,
        -0.016012714516918367,
        -0.11149887597639185,
        0.02652735579870771,
        -0.17146585599467085,
        0.026690696726841014,
        -0.19919401577090182,
        0.026697203092884855,
        -0.17593905199136348,
        0.026551428701104066,
        -0.11755907685408301,
        0.026147372274319059,
        0.64304281999355439,
        0.013365747826624447,
        -0.069252356906298773,
        0.1246903679402168,
        -0.075692565612980392,
        0.31300311041906304,
        -0.078335615295476849,
        0.54990974083219291,
        -2.1794028521216391,
        0.73300939811395149,
        -0.079714207189279115,
        0.74841923199362614}},
  };
  const int64_t R = 5, V = 11;
  std::vector<double> x;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < V; ++i) x.push_back(3.0 * std::sin(static_cast<double>(7 * r + 3 * i)));
  const Tensor labels = ops::from_vector<int64_t>({3, -100, 0, 10, 7}, {R});
  const Tensor weights = ops::from_vector<double>({0.5, 1.0, 2.0, -1.0, 3.0}, {R});
  for (const Golden& g : golden) {
    for (const DType dt : {DType::f64, DType::f32}) {
      const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
      const Tensor logits = ops::to_dtype(ops::from_vector<double>(x, {R, V}), dt);
      const ops::CrossEntropyOut o = ops::cross_entropy(logits, labels, -100, g.e);
      const std::vector<double> loss = test::values(o.loss);
      for (int64_t r = 0; r < R; ++r) EXPECT_NEAR(loss[r], g.loss[r], tol * 10) << g.e << " row " << r;
      const std::vector<double> grad = test::values(ops::cross_entropy_backward(
          logits, labels, o.lse, ops::to_dtype(weights, o.lse.dtype()), -100, g.e));
      for (size_t i = 0; i < grad.size(); ++i)
        EXPECT_NEAR(grad[i], g.grad[i], std::max(tol, 1e-6)) << g.e << " element " << i;
    }
  }
}

}  // namespace
}  // namespace tr
