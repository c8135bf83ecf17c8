// Rows in a wider buffer (GemmArgs::ldc, backend::row_stride): GEMMs write a matrix whose rows are padded,
// the cross-entropy kernels read logits and write their gradient there, and the chunked LM head keeps its
// [rows, vocab] logits that way, so no head GEMM sees GPT-2's odd vocabulary as a leading dimension. Also:
// half rows on the CPU go through the f32 row kernels (HalfRows).
#include <cstring>
#include <set>

#include "backend/backend.h"
#include "compile/recorder.h"
#include "test_util.h"

namespace tr {
namespace {

constexpr double kSentinel = 7.0;

// A [rows, cols] view of a [rows, ld] buffer whose padding holds kSentinel.
Tensor padded_view(int64_t rows, int64_t cols, int64_t ld, DType dt) {
  return ops::narrow(ops::full({rows, ld}, kSentinel, dt), 1, 0, cols);
}

// The padding columns of `view`'s buffer still hold kSentinel.
::testing::AssertionResult padding_kept(const Tensor& view, int64_t ld) {
  const Tensor whole = view.as_strided({view.size(0), ld}, {ld, 1}, view.offset());
  const std::vector<double> v = test::values(whole);
  for (int64_t r = 0; r < view.size(0); ++r)
    for (int64_t c = view.size(1); c < ld; ++c)
      if (v[static_cast<size_t>(r * ld + c)] != kSentinel)
        return ::testing::AssertionFailure() << "padding written at row " << r << ", column " << c;
  return ::testing::AssertionSuccess();
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ca = ops::contiguous(a), cb = ops::contiguous(b);
  return ca.nbytes() == cb.nbytes() && std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

// Every CPU GEMM path (f32 sgemm, f64 OpenBLAS, bf16 into an f32 product and into bf16, native or widened,
// with beta 0 and 1, transposed operands): the padded target gets the dense target's bits, the padding
// stays as it was.
TEST(PaddedRows, AMatmulWritesTheRowsOfAWiderBufferAndNothingElse) {
  const int64_t m = 37, n = 53, k = 24, ld = 64;
  for (const auto& [in, out] : {std::pair{DType::f32, DType::f32},
                                {DType::f64, DType::f64},
                                {DType::bf16, DType::f32},
                                {DType::bf16, DType::bf16},
                                {DType::f16, DType::f16}}) {
    for (const bool ta : {false, true})
      for (const double beta : {0.0, 1.0}) {
        const Tensor a = ops::to_dtype(test::randn(ta ? Shape{k, m} : Shape{m, k}, 1), in);
        const Tensor b = ops::to_dtype(test::randn({n, k}, 2), in);
        const Tensor start = ops::to_dtype(test::randn({m, n}, 3), out);
        const Tensor dense = ops::clone(start), padded = padded_view(m, n, ld, out);
        ops::copy_(padded, start);
        ops::matmul_into(dense, a, b, ta, true, 0.5, beta);
        ops::matmul_into(padded, a, b, ta, true, 0.5, beta);
        const std::string what =
            fmt::format("{} -> {}, ta {}, beta {}", dtype_name(in), dtype_name(out), ta, beta);
        EXPECT_TRUE(same_bits(padded, dense)) << what;
        EXPECT_TRUE(padding_kept(padded, ld)) << what;
      }
  }
  // Nothing to multiply (k = 0): the rows scaled by beta, or zeroed, and the padding kept.
  for (const double beta : {0.0, 2.0}) {
    const Tensor start = test::randn({3, 5}, 8), padded = padded_view(3, 5, 8, DType::f32);
    ops::copy_(padded, start);
    ops::matmul_into(padded, ops::empty({3, 0}), ops::empty({0, 5}), false, false, 1.0, beta);
    EXPECT_TRUE(same_bits(padded, ops::affine(start, beta, 0.0))) << "k = 0, beta " << beta;
    EXPECT_TRUE(padding_kept(padded, 8)) << "k = 0, beta " << beta;
  }
  // Batched targets stay dense, and rows may not overlap.
  const Tensor a3 = test::randn({2, 4, 3}, 4), b3 = test::randn({2, 3, 5}, 5);
  const Tensor wide3 = ops::narrow(ops::empty({2, 4, 8}), 2, 0, 5);
  EXPECT_THROW(ops::matmul_into(wide3, a3, b3, false, false, 1.0, 0.0), Error);
  const Tensor overlapping = ops::empty({4 * 5}).as_strided({4, 5}, {3, 1}, 0);
  EXPECT_THROW(
      ops::matmul_into(overlapping, test::randn({4, 3}, 6), test::randn({3, 5}, 7), false, false, 1.0, 0.0),
      Error);
}

// The loss kernels on padded rows: the loss, lse and gradient bits of the contiguous call, the padding of
// both buffers untouched; for GPT-2's vocabulary (rows of 50257 in 50304) and a tiny one (7 in 64), every
// logit/gradient dtype pair the chunked head uses.
TEST(PaddedRows, TheLossKernelsReadAndWriteRowsOfAWiderBuffer) {
  for (const int64_t V : {int64_t{50257}, int64_t{7}}) {
    const int64_t N = 5, ld = (V + 63) / 64 * 64;
    const Tensor labels = ops::from_vector<int64_t>({3, -100, 0, V - 1, 2}, {N});
    for (const auto& [ldt, gdt] : {std::pair{DType::f32, DType::f32},
                                   {DType::f32, DType::bf16},
                                   {DType::f32, DType::f16},
                                   {DType::f64, DType::f64},
                                   {DType::bf16, DType::bf16}}) {
      const std::string what = fmt::format("V {} {} -> {}", V, dtype_name(ldt), dtype_name(gdt));
      const Tensor logits = ops::to_dtype(ops::affine(test::randn({N, V}, 8), 4.0, 0.0), ldt);
      const DType sd = ldt == DType::f64 ? DType::f64 : DType::f32;
      const Tensor grad =
          ops::to_dtype(ops::from_vector<float>({1.0f, 1.0f, 4096.0f, 2.5e-4f, 3.0f}, {N}), sd);
      // No gradient (evaluation): the padded logits are read where they are.
      const Tensor px = padded_view(N, V, ld, ldt);
      ops::copy_(px, logits);
      const ops::CrossEntropyOut want = ops::cross_entropy(logits, labels, -100);
      const ops::CrossEntropyOut got = ops::cross_entropy(px, labels, -100);
      EXPECT_TRUE(same_bits(got.loss, want.loss) && same_bits(got.lse, want.lse)) << what;
      // With the gradient, in place or into a padded half buffer.
      const Tensor x = ops::clone(logits), g = gdt == ldt ? x : ops::empty({N, V}, gdt);
      const ops::CrossEntropyOut w2 = ops::cross_entropy_with_grad_(x, labels, -100, grad, g);
      const Tensor pg = gdt == ldt ? px : padded_view(N, V, ld, gdt);
      const ops::CrossEntropyOut g2 = ops::cross_entropy_with_grad_(px, labels, -100, grad, pg);
      EXPECT_TRUE(same_bits(g2.loss, w2.loss) && same_bits(g2.lse, w2.lse)) << what;
      EXPECT_TRUE(same_bits(pg, g)) << what;
      EXPECT_TRUE(padding_kept(pg, ld)) << what;
      if (gdt != ldt) {
        EXPECT_TRUE(padding_kept(px, ld)) << what;
      }
    }
  }
  // In place means the same view: a gradient over the logits' storage with other strides is refused.
  const Tensor buf = ops::zeros({2, 8});
  EXPECT_THROW(ops::cross_entropy_with_grad_(ops::narrow(buf, 1, 0, 3), ops::zeros({2}, DType::i64), -100,
                                             ops::zeros({2}), buf.as_strided({2, 3}, {3, 1}, 0)),
               Error);
}

// The chunked head records its GEMMs and loss kernels on rows padded to 64 columns: the f32 logits GEMM's
// target, the loss kernel's logits and gradient, and the bf16 gradient both dx and dw GEMMs read - never the
// vocabulary (50257) as a leading dimension. The loss is the unpadded head's.
TEST(PaddedRows, TheChunkedHeadKeepsItsLogitsInPaddedRows) {
  const int64_t N = 24, D = 12, V = 50257;  // chunks of 16 and 8 rows
  for (const DType dt : {DType::f32, DType::bf16}) {
    Tensor x = ops::to_dtype(test::randn({N, D}, 9), dt),
           w = ops::to_dtype(test::randn({V, D}, 10, DType::f32, Device::cpu(), 0.05), dt);
    autograd::set_requires_grad(x, true);
    autograd::set_requires_grad(w, true);
    std::vector<int64_t> lab(N);
    for (int64_t i = 0; i < N; ++i) lab[static_cast<size_t>(i)] = i % 7 == 0 ? -100 : (i * 4099) % V;
    const Tensor labels = ops::from_vector<int64_t>(lab, {N});
    compile::Recorder rec(backend::backend_for(Device::cpu()));
    Tensor loss;
    {
      const backend::InterposeScope scope(Device::cpu(), rec);
      loss = linear_cross_entropy_sum(x, w, labels, 16);
    }
    // The logits' buffers (each chunk's logits GEMM target) and the half gradients' (the loss kernel's
    // glogits): every view any call takes of them has rows 64-aligned apart.
    const std::vector<compile::Call> calls = rec.take_calls();
    std::set<int32_t> head;
    int gemms = 0, losses = 0;
    for (const compile::Call& c : calls) {
      const std::string name = c.name;
      const Shape& out = c.args[2].shape;
      if (name == "gemm" && out.size() == 2 && out[1] == V && out[0] != D) head.insert(c.args[2].buffer);
      if (name == "cross_entropy_with_grad") head.insert(c.args[5].buffer), ++losses;
      gemms += name == "gemm";
    }
    for (const compile::Call& c : calls)
      for (const compile::Arg& a : c.args) {
        if (!head.count(a.buffer)) continue;
        ASSERT_EQ(a.shape.size(), 2u) << c.name;
        const int64_t row = a.strides[1] == 1 ? a.strides[0] : a.strides[1];
        EXPECT_EQ(row % 64, 0) << c.name << ": rows " << row << " apart";
        EXPECT_GE(row, V) << c.name;
      }
    EXPECT_EQ(head.size(), dt == DType::f32 ? 2u : 4u) << "the logits (and half gradients) of two chunks";
    EXPECT_EQ(gemms, 2 * 3) << "two chunks of three head GEMMs";
    EXPECT_EQ(losses, 2);
    const Tensor xf = ops::to_dtype(x, DType::f32), wf = ops::to_dtype(w, DType::f32);
    const double ref = cross_entropy(linear(xf, wf), labels, -100, Reduction::sum).item();
    EXPECT_NEAR(loss.item(), ref, 1e-5 * std::abs(ref)) << dtype_name(dt);
  }
}

// Half rows on the CPU (softmax, log-softmax, cross-entropy and its gradient over bf16/f16 logits) run the
// f32 kernels on the widened row: the f32 kernel's bits for the same values, rounded once where the output is
// half - not a slower scalar path of their own.
TEST(HalfRows, TheCpuRunsHalfRowsThroughItsF32Kernels) {
  const int64_t N = 5, V = 1031;  // an odd width: vector tails
  const Tensor labels = ops::from_vector<int64_t>({3, -100, 0, V - 1, 2}, {N});
  const Tensor grad = ops::from_vector<float>({1.0f, 1.0f, 4096.0f, 2.5e-4f, 3.0f}, {N});
  for (const DType dt : {DType::bf16, DType::f16}) {
    const Tensor x = ops::to_dtype(ops::affine(test::randn({N, V}, 21), 3.0, 0.0), dt);
    const Tensor wide = ops::to_dtype(x, DType::f32);
    for (const bool log : {false, true}) {
      const Tensor got = ops::softmax(x, -1, log);
      const Tensor want = ops::to_dtype(ops::softmax(wide, -1, log), dt);
      EXPECT_TRUE(same_bits(got, want)) << dtype_name(dt) << (log ? " log_softmax" : " softmax");
    }
    const ops::CrossEntropyOut ce = ops::cross_entropy(x, labels, -100);
    const ops::CrossEntropyOut cw = ops::cross_entropy(wide, labels, -100);
    EXPECT_TRUE(same_bits(ce.loss, cw.loss) && same_bits(ce.lse, cw.lse)) << dtype_name(dt);
    const Tensor g = ops::cross_entropy_backward(x, labels, ce.lse, grad, -100);
    const Tensor gw = ops::to_dtype(ops::cross_entropy_backward(wide, labels, cw.lse, grad, -100), dt);
    EXPECT_TRUE(same_bits(g, gw)) << dtype_name(dt) << " gradient";
  }
}

// The CUDA twins: a padded GEMM target and padded loss buffers on the GPU equal the CPU's within the
// devices' rounding, the padding untouched; the chunked head's loss and gradients too (bf16, f32).
TEST(PaddedRows, OnTheGpuPaddedRowsMatchTheCpu) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: padded rows on the GPU NOT tested";
  const Device gpu = Device::cuda(0);
  const int64_t m = 37, n = 50257, k = 64, ld = 50304;
  for (const DType in : {DType::bf16, DType::f32}) {
    const Tensor a = ops::to_dtype(test::randn({m, k}, 11), in),
                 b = ops::to_dtype(test::randn({n, k}, 12), in);
    const Tensor cpu = ops::empty({m, n});
    ops::matmul_into(cpu, a, b, false, true, 1.0, 0.0);
    const Tensor dev = ops::narrow(ops::full({m, ld}, kSentinel, DType::f32, gpu), 1, 0, n);
    ops::matmul_into(dev, ops::to_device(a, gpu), ops::to_device(b, gpu), false, true, 1.0, 0.0);
    // The whole padded buffer back (a copy across devices makes a view dense: padding_kept needs the rows).
    const Tensor whole = ops::to_device(dev.as_strided({m, ld}, {ld, 1}, dev.offset()), Device::cpu());
    const Tensor back = ops::narrow(whole, 1, 0, n);
    EXPECT_TRUE(test::all_close(ops::contiguous(back), cpu, 1e-4, 1e-4)) << dtype_name(in);
    EXPECT_TRUE(padding_kept(back, ld)) << dtype_name(in);
  }
  const int64_t N = 40, D = 64, V = 50257;
  for (const DType dt : {DType::f32, DType::bf16}) {
    const Tensor x0 = ops::to_dtype(test::randn({N, D}, 13), dt);
    const Tensor w0 = ops::to_dtype(test::randn({V, D}, 14, DType::f32, Device::cpu(), 0.05), dt);
    std::vector<int64_t> lab(N);
    for (int64_t i = 0; i < N; ++i) lab[static_cast<size_t>(i)] = i % 9 == 0 ? -100 : (i * 4099) % V;
    const Tensor labels = ops::from_vector<int64_t>(lab, {N});
    auto run = [&](Device d) {
      Tensor x = ops::to_device(x0, d), w = ops::to_device(w0, d);
      autograd::set_requires_grad(x, true);
      autograd::set_requires_grad(w, true);
      const Tensor loss = linear_cross_entropy_sum(x, w, ops::to_device(labels, d), 16);
      autograd::backward({loss});
      return std::tuple{ops::to_device(loss, Device::cpu()).item(), ops::to_device(x.grad(), Device::cpu()),
                        ops::to_device(w.grad(), Device::cpu())};
    };
    const auto [lc, dxc, dwc] = run(Device::cpu());
    const auto [lg, dxg, dwg] = run(gpu);
    const double tol = dt == DType::bf16 ? 2e-2 : 1e-4;
    EXPECT_NEAR(lg, lc, 1e-4 * std::abs(lc)) << dtype_name(dt);
    EXPECT_TRUE(test::all_close(dxg, dxc, tol, tol * 1e-2)) << dtype_name(dt) << " dx";
    EXPECT_TRUE(test::all_close(dwg, dwc, tol, tol * 1e-2)) << dtype_name(dt) << " dw";
  }
}

}  // namespace
}  // namespace tr
