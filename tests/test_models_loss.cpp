// The loss end to end through the models: the chunked LM head against the full-logits loss (memory, half
// gradients rounded once, the one-call loss and gradient), accumulation normalized by the step's label
// tokens, and HF's label smoothing in every head (the golden PyTorch parity: test_models.cpp).
#include <cstring>
#include <filesystem>

#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "test_util.h"

namespace tr {
namespace {

const std::string kGolden = TRAINER_GOLDEN_DIR;

TEST(ChunkedLoss, EqualsTheFullLogitsLossWithAFractionOfThePeakMemory) {
  // Values: chunked vs full on the CPU.
  Tensor x = test::randn({37, 16}, 1), w = test::randn({50, 16}, 2);
  std::vector<int64_t> lab(37);
  for (int i = 0; i < 37; ++i) lab[i] = i % 5 == 0 ? -100 : (i * 7) % 50;
  Tensor labels = ops::from_vector<int64_t>(lab, {37});
  Tensor a = linear_cross_entropy_sum(x, w, labels, 8);
  Tensor b = cross_entropy(linear(x, w), labels, -100, Reduction::sum);
  EXPECT_NEAR(a.item(), b.item(), 1e-5 * std::abs(b.item()));
  // Memory: a dry run on the meta device with a GPT-2-sized head (4096 tokens, 50257 vocab).
  auto peak = [](bool chunked) {
    Tensor h = ops::empty({4096, 768}, DType::f32, Device::meta()),
           hw = ops::empty({50257, 768}, DType::f32, Device::meta());
    autograd::set_requires_grad(h, true);
    autograd::set_requires_grad(hw, true);
    Tensor lab = ops::empty({4096}, DType::i64, Device::meta());
    Allocator& m = meta_allocator();
    const int64_t base = m.stats().current_bytes;
    m.reset_peak();
    Tensor loss = chunked ? linear_cross_entropy_sum(h, hw, lab, 1024)
                          : cross_entropy(linear(h, hw), lab, -100, Reduction::sum);
    autograd::backward({loss});
    return m.stats().peak_bytes - base;
  };
  const int64_t full = peak(false), chunked = peak(true);
  std::printf("head+loss peak, 4096 tokens x 50257 vocab: full logits %.1f MiB, chunked %.1f MiB\n",
              full / 1048576.0, chunked / 1048576.0);
  EXPECT_LT(chunked * 3, full);
}

TEST(ChunkedLoss, ABf16HeadGradientIsRoundedOnceNotOncePerChunk) {
  // 256 rows in 64 chunks of 4 against one chunk of 256. The head's gradients are held in f32 across chunks
  // and rounded to bf16 once, as HF's single f32-accumulated GEMM is, so both agree up to f32 summation
  // order: a bf16 ulp in a few entries. Rounded once per chunk, dw would differ in most of its entries.
  const int64_t N = 256, D = 32, V = 48;
  Tensor x0 = ops::to_dtype(test::randn({N, D}, 11), DType::bf16);
  Tensor w0 = ops::to_dtype(test::randn({V, D}, 12), DType::bf16);
  std::vector<int64_t> lab(N);
  for (int64_t i = 0; i < N; ++i) lab[i] = i % 9 == 0 ? -100 : (i * 13) % V;
  Tensor labels = ops::from_vector<int64_t>(lab, {N});
  auto grads = [&](int64_t chunk) {
    Tensor x = ops::clone(x0), w = ops::clone(w0);
    autograd::set_requires_grad(x, true);
    autograd::set_requires_grad(w, true);
    autograd::backward({mul_scalar(linear_cross_entropy_sum(x, w, labels, chunk), 1.0 / N)});
    EXPECT_EQ(x.grad().dtype(), DType::bf16);
    EXPECT_EQ(w.grad().dtype(), DType::bf16);
    return std::pair{test::values(x.grad()), test::values(w.grad())};
  };
  const auto [dx64, dw64] = grads(4);
  const auto [dx1, dw1] = grads(N);
  auto compare = [](const std::vector<double>& a, const std::vector<double>& b, const char* what) {
    ASSERT_EQ(a.size(), b.size());
    size_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i] == b[i]) continue;
      ++differ;
      // One bf16 ulp of the larger magnitude (8 significant bits).
      EXPECT_LE(std::abs(a[i] - b[i]), std::ldexp(std::max(std::abs(a[i]), std::abs(b[i])), -7)) << what << i;
    }
    EXPECT_LE(differ * 50, a.size()) << what << ": " << differ << " of " << a.size() << " entries differ";
  };
  compare(dx64, dx1, "dx");
  compare(dw64, dw1, "dw");
  // Against f32 from the same bf16 values (the f32 head keeps dl^T x; the CPU's bf16 one accumulates x^T dl
  // and turns it back when rounding): within the bf16 logit gradients' rounding, an error that orientation
  // or an accumulation mix-up would make is of the size of the entries themselves.
  Tensor xf = ops::to_dtype(x0, DType::f32), wf = ops::to_dtype(w0, DType::f32);
  autograd::set_requires_grad(xf, true);
  autograd::set_requires_grad(wf, true);
  autograd::backward({mul_scalar(linear_cross_entropy_sum(xf, wf, labels, 4), 1.0 / N)});
  const std::vector<double> dwf = test::values(wf.grad());
  ASSERT_EQ(dwf.size(), dw1.size());
  double top = 0;
  for (double v : dwf) top = std::max(top, std::abs(v));
  for (size_t i = 0; i < dwf.size(); ++i) EXPECT_NEAR(dw64[i], dwf[i], top / 64) << "dw vs f32, entry " << i;
}

TEST(ChunkedLoss, Fp16LogitGradientsOfTinyProbabilitiesSurvive) {
  // Under fp16 the logit gradients are rounded before the head's GEMMs. Probabilities of e^-20 (2e-9) are
  // below fp16's smallest subnormal (6e-8) at unit scale and would vanish; the head rounds them at 2^12
  // times their size and takes the factor back out with the loss's gradient (here a GradScaler-like 65536 /
  // N), so every vocabulary row's dw is there and close to the f64 one.
  const int64_t N = 16, D = 4, V = 64;
  Tensor noise_x = test::randn({N, D}, 31), noise_w = test::randn({V, D}, 32);
  std::vector<double> xs = test::values(noise_x), ws = test::values(noise_w);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) xs[n * D + d] = (d == 0 ? 5.0 : 0.0) + 0.1 * xs[n * D + d];
  for (int64_t v = 0; v < V; ++v)
    for (int64_t d = 0; d < D; ++d) ws[v * D + d] = v == 0 ? (d == 0 ? 4.0 : 0.0) : 0.1 * ws[v * D + d];
  std::vector<int64_t> lab(N, 0);
  lab[3] = -100;
  const Tensor labels = ops::from_vector<int64_t>(lab, {N});
  auto grads = [&](DType dt) {
    Tensor x = ops::to_dtype(ops::from_vector<double>(xs, {N, D}), dt),
           w = ops::to_dtype(ops::from_vector<double>(ws, {V, D}), dt);
    autograd::set_requires_grad(x, true);
    autograd::set_requires_grad(w, true);
    const double scale = 65536.0 / N;
    autograd::backward({mul_scalar(linear_cross_entropy_sum(x, w, labels, 8), scale)});
    std::vector<double> dw = test::values(w.grad());
    for (double& g : dw) g /= scale;
    return dw;
  };
  // The reference sees the same fp16-rounded inputs.
  for (double& v : xs) v = static_cast<double>(static_cast<float>(Half(static_cast<float>(v))));
  for (double& v : ws) v = static_cast<double>(static_cast<float>(Half(static_cast<float>(v))));
  const std::vector<double> ref = grads(DType::f64), half = grads(DType::f16);
  for (int64_t i = D; i < V * D; ++i) {  // rows v > 0: made of the tiny probabilities only
    if (std::abs(ref[i]) < 1e-9) continue;
    EXPECT_NEAR(half[i], ref[i], 0.03 * std::abs(ref[i])) << "dw entry " << i;
  }
}

// The chunked head's half logit gradient comes straight from the loss kernel: each value the f32 kernel's,
// rounded once - the bits of to_dtype(cross_entropy_backward(...)) - with ignored rows zero, a vocabulary
// that ends mid-vector (50257) and a tiny one (7), gradients at GradScaler's and the fp16 pre-scale's sizes.
TEST(ChunkedLoss, TheHalfLogitGradientIsTheF32OneRoundedOnce) {
  for (const int64_t V : {int64_t{50257}, int64_t{7}}) {
    const int64_t N = 5;
    const Tensor logits = ops::affine(test::randn({N, V}, 41), 4.0, 0.0);
    const Tensor labels = ops::from_vector<int64_t>({3, -100, 0, V - 1, 2}, {N});
    const Tensor grad = ops::from_vector<float>({1.0f, 1.0f, 4096.0f, 2.5e-4f, 65536.0f}, {N});
    const ops::CrossEntropyOut ce = ops::cross_entropy(logits, labels, -100);
    const Tensor want = ops::cross_entropy_backward(logits, labels, ce.lse, grad, -100);
    for (const DType dt : {DType::bf16, DType::f16}) {
      const Tensor got = ops::empty({N, V}, dt);
      ops::cross_entropy_backward_into(logits, labels, ce.lse, grad, -100, got);
      const Tensor ref = ops::to_dtype(want, dt);  // bits compared: +0 and -0, NaN payloads
      EXPECT_EQ(std::memcmp(got.data_ptr(), ref.data_ptr(), got.nbytes()), 0) << dtype_name(dt) << " V " << V;
      const auto* bits = static_cast<const uint16_t*>(got.data_ptr());
      for (int64_t i = V; i < 2 * V; ++i) ASSERT_EQ(bits[i], 0) << "ignored row: +0";
    }
  }
  EXPECT_THROW(ops::cross_entropy_backward_into(ops::zeros({2, 3}, DType::f64), ops::zeros({2}, DType::i64),
                                                ops::zeros({2}, DType::f64), ops::zeros({2}, DType::f64),
                                                -100, ops::empty({2, 3}, DType::bf16)),
               Error);
}

// The chunked head's loss and logit gradient come from one call (cross_entropy_with_grad_; on the CPU each
// row's gradient is made while the row is in cache, from the exps of its sum scaled by grad / sum): the loss
// and lse have cross_entropy's bits; the gradient is cross_entropy_backward_'s (in place) or _into's (half)
// up to f32 rounding - f32 values within 2^-15 (lse's rounding carried by exp(x - lse), the vector exp's
// error) and as close to f64's, half ones the same but in a few ties - and exactly it for f64 and bf16 logits
// (which run the two ops). Ignored rows are +0. So with label smoothing (e = 0.1), the gradient's tolerance
// taken from its softmax part (the smoothing's e / V is subtracted exactly on both sides).
TEST(ChunkedLoss, TheLossAndGradientFromOneCallAreTheTwoOps) {
  for (const auto& [V, e] :
       {std::pair{int64_t{50257}, 0.0}, {int64_t{7}, 0.0}, {int64_t{50257}, 0.1}, {int64_t{7}, 0.1}}) {
    const int64_t N = 6;
    const Tensor labels = ops::from_vector<int64_t>({3, -100, 0, V - 1, 2, -100}, {N});
    for (const auto& [ldt, gdt] : {std::pair{DType::f32, DType::f32},
                                   {DType::f32, DType::bf16},
                                   {DType::f32, DType::f16},
                                   {DType::f64, DType::f64},
                                   {DType::bf16, DType::bf16}}) {
      const Tensor logits = ops::to_dtype(ops::affine(test::randn({N, V}, 43), 4.0, 0.0), ldt);
      const DType sd = ldt == DType::f64 ? DType::f64 : DType::f32;
      const Tensor grad =
          ops::to_dtype(ops::from_vector<float>({1.0f, 1.0f, 4096.0f, 2.5e-4f, 65536.0f, 3.0f}, {N}), sd);
      const ops::CrossEntropyOut want = ops::cross_entropy(logits, labels, -100, e);
      Tensor want_g = ops::clone(logits);
      if (gdt == ldt) {
        ops::cross_entropy_backward_(want_g, labels, want.lse, grad, -100, e);
      } else {
        want_g = ops::empty({N, V}, gdt);
        ops::cross_entropy_backward_into(logits, labels, want.lse, grad, -100, want_g, e);
      }
      const Tensor x = ops::clone(logits), g = gdt == ldt ? x : ops::empty({N, V}, gdt);
      const ops::CrossEntropyOut got = ops::cross_entropy_with_grad_(x, labels, -100, grad, g, e);
      const std::string what = fmt::format("V {} e {} {} -> {}", V, e, dtype_name(ldt), dtype_name(gdt));
      EXPECT_EQ(std::memcmp(got.loss.data_ptr(), want.loss.data_ptr(), want.loss.nbytes()), 0) << what;
      EXPECT_EQ(std::memcmp(got.lse.data_ptr(), want.lse.data_ptr(), want.lse.nbytes()), 0) << what;
      const std::vector<double> a = test::values(g), b = test::values(want_g);
      if (ldt != DType::f32) {
        EXPECT_EQ(std::memcmp(g.data_ptr(), want_g.data_ptr(), want_g.nbytes()), 0) << what;
        continue;
      }
      // f32: the fused gradient is as close to the f64 one as the two ops' (mean relative error within 25%:
      // the vector exp's error dominates both).
      const ops::CrossEntropyOut w64 = ops::cross_entropy(ops::to_dtype(logits, DType::f64), labels, -100, e);
      const std::vector<double> c = test::values(ops::cross_entropy_backward(
          ops::to_dtype(logits, DType::f64), labels, w64.lse, ops::to_dtype(grad, DType::f64), -100, e));
      const std::vector<double> gv = test::values(grad);
      double err_fused = 0, err_two = 0;
      size_t differ = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        const int64_t row = static_cast<int64_t>(i) / V;
        if (row == 1 || row == 5) {
          ASSERT_TRUE(a[i] == 0 && !std::signbit(a[i])) << what << ": ignored row";
        }
        err_fused += std::abs(a[i] - c[i]) / (std::abs(c[i]) + 1e-30);
        err_two += std::abs(b[i] - c[i]) / (std::abs(c[i]) + 1e-30);
        if (a[i] == b[i]) continue;
        ++differ;
        const int bits = gdt == DType::f32 ? 15 : gdt == DType::bf16 ? 7 : 10;  // f32: see above
        const double floor = gdt == DType::f16 ? std::ldexp(1.0, -24) : 0.0;    // f16's subnormal step
        const double off = std::abs(gv[static_cast<size_t>(row)]) * e / static_cast<double>(V);
        EXPECT_LE(std::abs(a[i] - b[i]), std::ldexp(std::abs(b[i]) + off, -bits) + floor)
            << what << " entry " << i;
      }
      if (gdt != DType::f32) {
        EXPECT_LE(differ * 200, a.size()) << what << ": " << differ << " differ";
      } else if (e ==
                 0) {  // (relative errors near smoothing's cancellation of softmax and e / V say nothing)
        EXPECT_LE(err_fused, 1.25 * err_two) << what;
      }
    }
  }
  // A gradient neither in place nor half: refused with the op's name.
  EXPECT_THROW(ops::cross_entropy_with_grad_(ops::zeros({2, 3}), ops::zeros({2}, DType::i64), -100,
                                             ops::zeros({2}), ops::zeros({2, 3})),
               Error);
}

// The half gradient of one call is its f32 gradient rounded once (RNE), bit for bit: the CPU's 16-lane
// scale-and-round with streamed stores (rows of every alignment: V odd), the label's entry, ignored rows,
// and gradients small enough to round into bf16's subnormals.
TEST(ChunkedLoss, AHalfGradientFromOneCallIsItsF32GradientRoundedOnce) {
  for (const int64_t V : {int64_t{50257}, int64_t{33}, int64_t{7}}) {
    // Rows 5 and 6 are flat, so every entry is grad / V exactly: 1 + 2^-8 and 1 + 2^-7 + 2^-8, ties that
    // round to even down and up.
    const int64_t N = 7;
    const Tensor labels = ops::from_vector<int64_t>({3, -100, 0, V - 1, 2, 1, 1}, {N});
    const Tensor logits = ops::cat({ops::affine(test::randn({5, V}, 44), 6.0, 0.0), ops::zeros({2, V})}, 0);
    const float vf = static_cast<float>(V);
    const Tensor grad = ops::from_vector<float>(
        {1.0f, 1.0f, 3e-37f, 2.5e-4f, 7e-39f, vf * 1.00390625f, vf * 1.01171875f}, {N});
    const Tensor x = ops::clone(logits);
    const ops::CrossEntropyOut f = ops::cross_entropy_with_grad_(x, labels, -100, grad, x);
    for (const DType gdt : {DType::bf16, DType::f16}) {
      const Tensor g = ops::empty({N, V}, gdt);
      const ops::CrossEntropyOut h = ops::cross_entropy_with_grad_(logits, labels, -100, grad, g);
      const std::string what = fmt::format("V {} f32 -> {}", V, dtype_name(gdt));
      const Tensor want = ops::to_dtype(x, gdt);
      EXPECT_EQ(std::memcmp(g.data_ptr(), want.data_ptr(), want.nbytes()), 0) << what;
      EXPECT_EQ(std::memcmp(h.loss.data_ptr(), f.loss.data_ptr(), f.loss.nbytes()), 0) << what;
      size_t subnormal = 0;
      for (const double v : test::values(g)) subnormal += v != 0 && std::abs(v) < 1.1754944e-38;
      if (gdt == DType::bf16) {
        EXPECT_GT(subnormal, 0u) << what << ": no subnormal was rounded";
      }
    }
  }
}

TEST(Loss, AccumulationWithNumItemsEqualsTheOneBigBatchGradient) {
  const std::string dir = kGolden + "/llama_gqa_llama3rope";
  auto g = io::SafetensorsFile::open(dir + "/golden.safetensors");
  Tensor ids = g.load("input_ids"), labels = g.load("labels");  // row 1 has 3 ignored labels: unequal counts
  auto big = models::from_pretrained(dir);
  models::ForwardOptions o;
  o.labels = labels;
  autograd::backward({big->forward(ids, o).loss});
  auto acc = models::from_pretrained(dir);
  double items = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 1; t < ids.size(1); ++t) items += labels.item_at(b * ids.size(1) + t) != -100;
  for (int64_t b = 0; b < 2; ++b) {
    models::ForwardOptions m;
    m.labels = ops::contiguous(ops::narrow(labels, 0, b, 1));
    m.num_items_in_batch = items;
    m.return_logits = false;
    autograd::backward({acc->forward(ops::contiguous(ops::narrow(ids, 0, b, 1)), m).loss});
  }
  auto pa = big->named_parameters(), pb = acc->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(test::all_close(pb[i].second->grad(), pa[i].second->grad(), 1e-5, 1e-7)) << pa[i].first;
}

// label_smoothing_factor: HF's LabelSmoother (shift_labels, -100 ignored, (1 - e) * nll + e * the mean over
// the vocabulary of -log p) computed here in f64 from the model's own logits (which the golden test holds to
// PyTorch's); the chunked head gives the same loss and gradients as the full-logits one, and two
// micro-batches normalized by the step's label count give the one big batch's gradients.
TEST(Loss, LabelSmoothingIsHfsLabelSmootherInEveryHeadAndAcrossMicroBatches) {
  const std::string dir = kGolden + "/llama_gqa_llama3rope";
  auto g = io::SafetensorsFile::open(dir + "/golden.safetensors");
  const Tensor ids = g.load("input_ids"), labels = g.load("labels");
  const double e = 0.1;
  const int64_t B = ids.size(0), T = ids.size(1);
  auto full = models::from_pretrained(dir);
  models::ForwardOptions o;
  o.labels = labels;
  o.label_smoothing = e;
  const models::CausalLMOutput out = full->forward(ids, o);
  const int64_t V = out.logits.size(2);
  const std::vector<double> x = test::values(out.logits);
  double nll = 0, smooth = 0, active = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t + 1 < T; ++t) {
      const auto y = static_cast<int64_t>(labels.item_at(b * T + t + 1));
      if (y == -100) continue;
      const double* r = x.data() + (b * T + t) * V;
      double mx = r[0], s = 0;
      for (int64_t i = 1; i < V; ++i) mx = std::max(mx, r[i]);
      for (int64_t i = 0; i < V; ++i) s += std::exp(r[i] - mx);
      const double lse = mx + std::log(s);
      nll += lse - r[y];
      for (int64_t i = 0; i < V; ++i) smooth += lse - r[i];
      ++active;
    }
  }
  const double plain = nll / active;
  const double want = (1 - e) * nll / active + e * smooth / (active * static_cast<double>(V));
  EXPECT_NEAR(out.loss.item(), want, 1e-5 * want);
  EXPECT_GT(std::abs(want - plain), 100 * 1e-5 * want)
      << "smoothing must change the loss beyond the tolerance";
  autograd::backward({out.loss});
  // The chunked head.
  auto chunked = models::from_pretrained(dir);
  o.return_logits = false;
  const Tensor lc = chunked->forward(ids, o).loss;
  EXPECT_NEAR(lc.item(), out.loss.item(), 1e-5 * want);
  autograd::backward({lc});
  // Two micro-batches of one row, each normalized by the step's label count.
  auto acc = models::from_pretrained(dir);
  for (int64_t b = 0; b < B; ++b) {
    models::ForwardOptions m;
    m.labels = ops::contiguous(ops::narrow(labels, 0, b, 1));
    m.num_items_in_batch = active;
    m.label_smoothing = e;
    m.return_logits = false;
    autograd::backward({acc->forward(ops::contiguous(ops::narrow(ids, 0, b, 1)), m).loss});
  }
  auto pf = full->named_parameters(), pc = chunked->named_parameters(), pa = acc->named_parameters();
  for (size_t i = 0; i < pf.size(); ++i) {
    EXPECT_TRUE(test::all_close(pc[i].second->grad(), pf[i].second->grad(), 1e-5, 1e-7)) << pf[i].first;
    EXPECT_TRUE(test::all_close(pa[i].second->grad(), pf[i].second->grad(), 1e-5, 1e-7)) << pf[i].first;
  }
}

}  // namespace
}  // namespace tr
