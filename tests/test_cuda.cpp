// The CUDA build on any machine: what it reports, the CPU fallback without a GPU, and (with a GPU) device
// tensors, copies and the dropout/RNG bits matching the CPU exactly.
#include <fmt/format.h>

#include <thread>

#include "backend/cuda_api.h"

#include "test_util.h"

namespace tr {
namespace {

TEST(CudaBuild, ReportsItselfAndFallsBackToTheCpu) {
  const std::string summary = backend::cuda_summary();
  std::printf("%s\n", summary.c_str());
  if (!backend::cuda_compiled()) {
    EXPECT_NE(summary.find("not compiled"), std::string::npos);
    EXPECT_THROW(ops::zeros({2}, DType::f32, Device::cuda(0)), Error);
    return;
  }
  EXPECT_NE(summary.find("CUDA runtime"), std::string::npos);
  if (!backend::cuda_available()) {
    EXPECT_EQ(backend::default_device(), Device::cpu());
    try {
      ops::zeros({2}, DType::f32, Device::cuda(0));
      FAIL() << "a cuda tensor without a GPU must throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no CUDA GPU"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_EQ(backend::default_device(), Device::cuda(0));
  }
}

TEST(CudaDevice, CopiesRoundTripAndRandomBitsMatchTheCpu) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: device tests NOT run";
  Tensor h = test::randn({3, 5}, 1);
  Tensor d = ops::to_device(h, Device::cuda(0));
  EXPECT_EQ(test::values(ops::to_device(d, Device::cpu())), test::values(h));
  EXPECT_EQ(test::values(ops::transpose(d, 0, 1)), test::values(ops::transpose(h, 0, 1)));
  Tensor x = ops::ones({4099});
  EXPECT_EQ(test::values(ops::dropout(ops::to_device(x, Device::cuda(0)), 0.3, 5, 17)),
            test::values(ops::dropout(x, 0.3, 5, 17)));
  Generator g1(9), g2(9);
  Tensor u_cpu = ops::rand({1000}, g1), u_gpu = ops::rand({1000}, g2, DType::f32, Device::cuda(0));
  EXPECT_EQ(test::values(u_cpu), test::values(u_gpu));
  // A bad id is flagged by the kernel and reported at the next synchronization (reading the result), not at
  // the call; reading it here also clears the flag, so the next test does not meet it at an unrelated sync.
  EXPECT_THROW(
      ops::to_device(ops::embedding(ops::zeros({4, 2}, DType::f32, Device::cuda(0)),
                                    ops::to_device(ops::from_vector<int64_t>({0, 9}, {2}), Device::cuda(0))),
                     Device::cpu()),
      Error);
  int64_t before = ops::allocator_for(Device::cuda(0)).stats().current_bytes;
  {
    Tensor t = ops::empty({1024}, DType::f32, Device::cuda(0));
    EXPECT_EQ(ops::allocator_for(Device::cuda(0)).stats().current_bytes - before, 4096);
  }
  EXPECT_EQ(ops::allocator_for(Device::cuda(0)).stats().current_bytes, before);
}

}  // namespace
}  // namespace tr

#include "transformer_block.h"

namespace tr {
namespace {

// A transformer block forward+backward on the GPU against the same block on the CPU (fp32, every gradient).
TEST(CudaDevice, TransformerBlockGradientsMatchTheCpu) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: GPU block parity NOT tested";
  std::vector<std::vector<double>> grads[2];
  std::vector<double> outs[2];
  const Device devs[2] = {Device::cpu(), Device::cuda(0)};
  for (int k = 0; k < 2; ++k) {
    Generator gen(21);
    test::BlockParams p = test::make_block(64, 4, gen, devs[k]);
    Tensor x = ops::randn({2, 32, 64}, gen, DType::f32, devs[k]);
    autograd::set_requires_grad(x, true);
    Tensor y = test::block_forward(p, x, test::causal_mask_on(32, devs[k]));
    outs[k] = test::values(y);
    autograd::backward({mean(square(y))});
    for (Tensor* t : p.all()) grads[k].push_back(test::values(t->grad()));
    grads[k].push_back(test::values(x.grad()));
  }
  auto close = [](const std::vector<double>& a, const std::vector<double>& b, double tol) {
    double scale = 0, worst = 0;
    for (size_t i = 0; i < a.size(); ++i) scale = std::max(scale, std::abs(b[i]));
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
    return worst <= tol * std::max(scale, 1e-30);
  };
  EXPECT_TRUE(close(outs[1], outs[0], 1e-5));
  for (size_t i = 0; i < grads[0].size(); ++i)
    EXPECT_TRUE(close(grads[1][i], grads[0][i], 1e-4)) << "gradient " << i;
}

}  // namespace
}  // namespace tr

#include "models/causal_lm.h"

namespace tr {
namespace {

TEST(CudaDevice, AttentionBackwardMatchesTheCpu) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: GPU attention backward NOT tested";
  Tensor q = test::randn({2, 4, 9, 16}, 1), k = test::randn({2, 2, 11, 16}, 2),
         v = test::randn({2, 2, 11, 16}, 3);
  Tensor dout = test::randn({2, 4, 9, 16}, 4);
  std::vector<uint8_t> keep(22, 1);
  keep[3] = 0;
  Tensor kk = ops::to_dtype(ops::from_vector<uint8_t>(keep, {2, 11}), DType::boolean);
  auto cpu = ops::attention(q, k, v, kk, true, 0.25);
  auto gc = ops::attention_backward(q, k, v, kk, true, 0.25, cpu.out, cpu.lse, dout);
  auto d = [](const Tensor& t) { return ops::to_device(t, Device::cuda(0)); };
  auto gpu = ops::attention(d(q), d(k), d(v), d(kk), true, 0.25);
  auto gg = ops::attention_backward(d(q), d(k), d(v), d(kk), true, 0.25, gpu.out, gpu.lse, d(dout));
  EXPECT_TRUE(test::all_close(gpu.out, cpu.out, 1e-5, 1e-6));
  EXPECT_TRUE(test::all_close(gpu.lse, cpu.lse, 1e-5, 1e-6));
  EXPECT_TRUE(test::all_close(gg.dq, gc.dq, 1e-4, 1e-6));
  EXPECT_TRUE(test::all_close(gg.dk, gc.dk, 1e-4, 1e-6));
  EXPECT_TRUE(test::all_close(gg.dv, gc.dv, 1e-4, 1e-6));
}

// The golden Llama (GQA, llama3 rope) on the GPU: logits, loss and every gradient against the CPU run.
TEST(CudaDevice, GoldenModelMatchesTheCpu) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: GPU model parity NOT tested";
  for (const char* impl : {"eager", "sdpa"}) {
    std::vector<std::vector<double>> grads[2];
    std::vector<double> logits[2], loss(2);
    for (int k = 0; k < 2; ++k) {
      models::PretrainedOptions po;
      po.attn_implementation = impl;
      po.device_map = k == 0 ? "cpu" : "cuda:0";
      auto m = models::from_pretrained(std::string(TRAINER_GOLDEN_DIR) + "/llama_gqa_llama3rope", po);
      EXPECT_EQ(m->device(), k == 0 ? Device::cpu() : Device::cuda(0));
      Tensor ids = ops::to_device(ops::from_vector<int64_t>({3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}, {2, 6}),
                                  m->device());
      models::ForwardOptions o;
      o.labels = ids;
      auto out = m->forward(ids, o);
      logits[k] = test::values(out.logits);
      loss[k] = ops::to_device(out.loss, Device::cpu()).item_at(0);
      autograd::backward({out.loss});
      for (auto& [n, p] : m->named_parameters()) grads[k].push_back(test::values(p->grad()));
    }
    EXPECT_NEAR(loss[1], loss[0], 1e-5 * std::abs(loss[0])) << impl;
    for (size_t i = 0; i < logits[0].size(); ++i) ASSERT_NEAR(logits[1][i], logits[0][i], 1e-4) << impl;
    for (size_t g = 0; g < grads[0].size(); ++g)
      for (size_t i = 0; i < grads[0][g].size(); ++i)
        ASSERT_NEAR(grads[1][g][i], grads[0][g][i], 1e-4 + 1e-3 * std::abs(grads[0][g][i]))
            << impl << " grad " << g;
  }
}

}  // namespace
}  // namespace tr

#include "optim/adamw.h"

namespace tr {
namespace {

// The fused multi-tensor AdamW kernel against the CPU optimizer: same element math (backend/optim_math.h,
// no extra contraction), so the parameters and moments agree bit for bit after several steps.
TEST(CudaDevice, FusedAdamWMatchesTheCpuBitForBit) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: fused AdamW kernel NOT tested";
  const std::vector<std::pair<std::string, Shape>> shapes = {
      {"h.0.mlp.c_fc.weight", {300, 517}}, {"h.0.ln_1.bias", {517}}, {"wte.weight", {70000, 3}}};
  for (bool multi : {false, true}) {
    std::vector<Tensor> cpu, gpu;
    for (size_t i = 0; i < shapes.size(); ++i) {
      cpu.push_back(test::randn(shapes[i].second, 10 + i));
      gpu.push_back(ops::to_device(cpu.back(), Device::cuda(0)));
      autograd::set_requires_grad(cpu.back(), true);
      autograd::set_requires_grad(gpu.back(), true);
    }
    nn::ParamList pc, pg;
    for (size_t i = 0; i < shapes.size(); ++i) {
      pc.emplace_back(shapes[i].first, &cpu[i]);
      pg.emplace_back(shapes[i].first, &gpu[i]);
    }
    optim::AdamWOptions o;
    o.lr = 1e-2;
    o.weight_decay = 0.1;
    optim::AdamW oc(pc, o, multi), og(pg, o, multi);
    for (int step = 0; step < 4; ++step) {
      for (size_t i = 0; i < shapes.size(); ++i) {
        Tensor g = test::randn(shapes[i].second, 100 * step + i);
        autograd::set_grad(cpu[i], g);
        autograd::set_grad(gpu[i], ops::to_device(g, Device::cuda(0)));
      }
      oc.step();
      og.step();
    }
    for (size_t i = 0; i < shapes.size(); ++i)
      EXPECT_EQ(test::values(ops::to_device(gpu[i], Device::cpu())), test::values(cpu[i]))
          << shapes[i].first << (multi ? " (fused)" : " (per tensor)");
    auto sc = oc.state_dict(), sg = og.state_dict();
    for (size_t k = 1; k < sc.size(); ++k)
      EXPECT_EQ(test::values(ops::to_device(sg[k].second, Device::cpu())), test::values(sc[k].second))
          << sc[k].first;
  }
}

// Index errors found on the GPU (a rope position beyond the tables, an embedding id beyond the vocabulary, a
// label beyond the logits): the kernels write zeros instead of reading out of range, and the error surfaces
// at the next synchronization (here: reading a result), naming the op and the value; the report clears it.
TEST(CudaDevice, IndexErrorsAreReportedAtTheNextSync) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: deferred index checks NOT tested";
  const Device gpu = Device::cuda(0);
  auto expect_report = [](auto fn, const std::string& needle) {
    try {
      ops::to_device(fn(), Device::cpu());
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto tables = ops::rope_tables(4, 8, 10000.0, gpu);
  Tensor x = ops::to_device(test::randn({1, 2, 3, 8}, 5), gpu);
  expect_report(
      [&] {
        return ops::rope(x, tables, ops::from_vector<int64_t>({0, 1, 9}, {1, 3}, gpu), false, false);
      },
      "rope: position 9");
  Tensor w = ops::to_device(test::randn({5, 4}, 6), gpu);
  expect_report(
      [&] {
        return ops::embedding(w, ops::from_vector<int64_t>({0, 7}, {2}, gpu));
      },
      "embedding: index 7");
  Tensor logits = ops::to_device(test::randn({2, 3}, 7), gpu);
  expect_report(
      [&] {
        return ops::cross_entropy(logits, ops::from_vector<int64_t>({0, 3}, {2}, gpu), -100).loss;
      },
      "cross_entropy: label 3");
  Tensor ok = ops::rope(x, tables, ops::from_vector<int64_t>({0, 1, 2}, {1, 3}, gpu), false, false);
  EXPECT_NO_THROW(ops::to_device(ok, Device::cpu()));  // each report cleared the flag
}

// The fused classifier's half logit gradient (f32 logits in, bf16/f16 out, one rounding) on the GPU: the CPU
// twin's values, but for the few where the two exps' last f32 bit moves a rounding.
TEST(CudaDevice, HalfLogitGradientMatchesTheCpu) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: fused half logit gradient NOT tested";
  const Device gpu = Device::cuda(0);
  const int64_t N = 4, V = 50257;
  const Tensor logits = ops::affine(test::randn({N, V}, 41), 4.0, 0.0);
  const Tensor labels = ops::from_vector<int64_t>({3, -100, 0, V - 1}, {N});
  const Tensor grad = ops::from_vector<float>({1.0f, 1.0f, 4096.0f, 2.5e-4f}, {N});
  const ops::CrossEntropyOut ce = ops::cross_entropy(logits, labels, -100);
  for (const DType dt : {DType::bf16, DType::f16}) {
    const Tensor cpu = ops::empty({N, V}, dt), dev = ops::empty({N, V}, dt, gpu);
    ops::cross_entropy_backward_into(logits, labels, ce.lse, grad, -100, cpu);
    ops::cross_entropy_backward_into(ops::to_device(logits, gpu), ops::to_device(labels, gpu),
                                     ops::to_device(ce.lse, gpu), ops::to_device(grad, gpu), -100, dev);
    const std::vector<double> a = test::values(dev), b = test::values(cpu);
    size_t differ = 0;  // exp may differ in the last f32 bit between the GPU's and the CPU's vector code
    for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
    EXPECT_LE(differ * 1000, a.size()) << dtype_name(dt) << ": " << differ << " values differ";
    // The loss and the gradient from one call (the chunked head's): fused on both devices (the GPU's from its
    // own online logsumexp); the same values but for a rounding moved by a last bit.
    const Tensor logits_dev = ops::to_device(logits, gpu), fused = ops::empty({N, V}, dt, gpu);
    const ops::CrossEntropyOut fce = ops::cross_entropy_with_grad_(logits_dev, ops::to_device(labels, gpu),
                                                                   -100, ops::to_device(grad, gpu), fused);
    const std::vector<double> c = test::values(fused);
    differ = 0;
    for (size_t i = 0; i < c.size(); ++i) differ += c[i] != b[i];
    EXPECT_LE(differ * 1000, c.size()) << dtype_name(dt) << " fused: " << differ << " values differ";
    const std::vector<double> la = test::values(fce.loss), lb = test::values(ce.loss);
    for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(la[i], lb[i], 1e-4 * std::abs(lb[i])) << "loss " << i;
  }
}

// The embedding backward groups ids on the device (radix sort + runs, no host copy of the ids): each row of
// the weight gradient equals the CPU twin's f32 sum bit for bit (one id's rows summed in row order on both;
// bf16 rounded once from it), with
// repeated ids, ids never used, a vocabulary past 2^16 (a multi-pass sort) and more runs than a grid holds in
// one pass of its block rows.
TEST(CudaDevice, EmbeddingBackwardGroupsIdsOnTheDevice) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: device embedding backward NOT tested";
  const Device gpu = Device::cuda(0);
  for (const auto& [n, v, d] :
       {std::tuple<int64_t, int64_t, int64_t>{37, 11, 5}, {4096, 70000, 24}, {100000, 80000, 3}}) {
    std::vector<int64_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = (i * 7919 + i / 3) % v;
    const Tensor id_cpu = ops::from_vector<int64_t>(ids, {n});
    for (const DType dt : {DType::f32, DType::bf16}) {
      const Tensor gy = ops::to_dtype(test::randn({n, d}, 3), dt);
      // The GPU sums in f32 and rounds once: for bf16 that is the f32 twin's sum of the same values, rounded.
      const Tensor want =
          ops::to_dtype(ops::embedding_backward(ops::to_dtype(gy, DType::f32), id_cpu, v), dt);
      const Tensor got = ops::embedding_backward(ops::to_device(gy, gpu), ops::to_device(id_cpu, gpu), v);
      EXPECT_EQ(test::values(got), test::values(want)) << "n " << n << " v " << v << " " << dtype_name(dt);
    }
  }
  // Ids outside [0, v) (which the forward flags) add nothing: the other rows are the CPU's over the good ids.
  const int64_t n = 9, v = 4, d = 3;
  const std::vector<int64_t> ids = {-1, 2, 0, 4, 2, 3, 1, -7, 0};
  const Tensor gy = test::randn({n, d}, 5);
  std::vector<int64_t> good_ids;
  std::vector<double> good_rows;
  const std::vector<double> all = test::values(gy);
  for (int64_t i = 0; i < n; ++i) {
    if (ids[static_cast<size_t>(i)] < 0 || ids[static_cast<size_t>(i)] >= v) continue;
    good_ids.push_back(ids[static_cast<size_t>(i)]);
    good_rows.insert(good_rows.end(), all.begin() + i * d, all.begin() + (i + 1) * d);
  }
  const int64_t g = static_cast<int64_t>(good_ids.size());
  const Tensor want =
      ops::embedding_backward(ops::to_dtype(ops::from_vector<double>(good_rows, {g, d}), DType::f32),
                              ops::from_vector<int64_t>(good_ids, {g}), v);
  const Tensor got = ops::embedding_backward(ops::to_device(gy, gpu),
                                             ops::to_device(ops::from_vector<int64_t>(ids, {n}), gpu), v);
  EXPECT_EQ(test::values(got), test::values(want)) << "bad ids";
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

// NCCL on one GPU, a world of one rank (all a single-GPU machine can form: NCCL takes one GPU per rank):
// every collective the process group uses, through the host staging, and a split. Skipped without a GPU;
// without CUDA support, asking for a communicator says so.
TEST(CudaNccl, AWorldOfOneRunsEveryCollective) {
  if (!backend::cuda_available()) {
    EXPECT_THROW(backend::NcclComm::unique_id(), Error);
    GTEST_SKIP() << "no CUDA GPU here: NCCL NOT tested";
  }
  backend::NcclComm c(0, 0, 1, backend::NcclComm::unique_id(), std::chrono::milliseconds(30000));
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  std::vector<float> f = {1.5f, -2.0f, 3.25f};
  c.all_reduce_sum(f.data(), f.size(), DType::f32);
  EXPECT_EQ(f, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  // In the GPU's own memory (DDP's device buckets): in place, nothing through the host.
  Tensor g = ops::from_vector<float>(f, {3}, Device::cuda(0));
  c.all_reduce_sum_device(g.data_ptr(), 3, DType::f32);
  EXPECT_EQ(ops::to_vector<float>(g), f);
  double d[2] = {1e300, -0.5};
  c.all_reduce_sum(d, 2, DType::f64);
  EXPECT_EQ(d[0], 1e300);
  int64_t v = 4242;
  c.broadcast(&v, sizeof v, 0);
  EXPECT_EQ(v, 4242);
  int32_t mine = 7, all = 0;
  c.all_gather(&mine, &all, sizeof mine);
  EXPECT_EQ(all, 7);
  const char in[5] = "abcd";
  char out[5] = {};
  c.exchange(in, {4}, out, {4});  // to and from itself
  EXPECT_EQ(std::string(out, 4), "abcd");
  // A fenced reduction (ZeRO's buckets): the input written on the compute stream, the fence recorded after
  // it on this thread, the collective issued from another thread and waiting for that point on the GPU.
  const Tensor bucket = ops::full({3}, 0.0, DType::f32, Device::cuda(0)),
               sum = ops::empty({3}, DType::f32, Device::cuda(0));
  ops::fill_(bucket, 2.5);
  backend::ComputeFence packed(Device::cuda(0));
  EXPECT_EQ(packed.event(), nullptr);  // nothing recorded yet
  packed.record();
  std::thread([&] {
    c.reduce_blocks_device(bucket.data<float>(), {3}, sum.data<float>(), packed.event());
  }).join();
  EXPECT_EQ(ops::to_vector<float>(sum), std::vector<float>(3, 2.5f));
  auto sub = c.split(3, 0);
  EXPECT_EQ(sub->size(), 1);
  float one = 2.0f;
  sub->all_reduce_sum(&one, 1, DType::f32);
  EXPECT_EQ(one, 2.0f);
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

// The row kernels (backend/cuda/row_kernels.cuh; emulated on the CPU by RowKernelsEmulated.*) at model
// widths, on both launch paths: the warp-per-row norms (768, and 4096 in bf16: 16 packs a lane) and the block
// kernels they decline (770: not whole packs; 4096 in f32: past 16 packs a lane), residual and gradient adds
// included; then cross-entropy's loss, gradient and fused kernels over GPT-2's vocabulary in dense and padded
// rows, in place and into a half gradient. Against the CPU within each dtype's rounding; the residual sums
// (one f32 add rounded once on both) bit for bit.
TEST(CudaDevice, RowKernelsMatchTheCpuAtModelWidths) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: the row kernels NOT tested on a GPU";
  const Device gpu = Device::cuda(0);
  auto dev = [&](const Tensor& t) { return ops::to_device(t, gpu); };
  auto host = [](const Tensor& t) { return ops::to_device(t, Device::cpu()); };
  for (const DType dt : {DType::f32, DType::bf16}) {
    const double tol = dt == DType::bf16 ? 2e-2 : 2e-5;
    for (const int64_t n : {int64_t{768}, int64_t{770}, int64_t{4096}}) {
      const std::string what = fmt::format("{} n {}", dtype_name(dt), n);
      const int64_t rows = 37;
      const Tensor x = ops::to_dtype(test::randn({rows, n}, 1), dt),
                   r = ops::to_dtype(test::randn({rows, n}, 2), dt);
      const Tensor w = ops::to_dtype(test::randn({n}, 3), dt), b = ops::to_dtype(test::randn({n}, 4), dt);
      const Tensor gy = ops::to_dtype(test::randn({rows, n}, 5), dt),
                   ga = ops::to_dtype(test::randn({rows, n}, 6), dt);
      const ops::NormOut lc = ops::add_layer_norm(x, r, w, b, 1e-5);
      const ops::NormOut lg = ops::add_layer_norm(dev(x), dev(r), dev(w), dev(b), 1e-5);
      EXPECT_EQ(test::values(host(lg.sum)), test::values(lc.sum)) << what;
      EXPECT_TRUE(test::all_close(host(lg.y), lc.y, tol, tol)) << what << " layer_norm y";
      EXPECT_TRUE(test::all_close(host(lg.mean), lc.mean, 1e-5, 1e-5)) << what << " mean";
      EXPECT_TRUE(test::all_close(host(lg.rstd), lc.rstd, 1e-5, 1e-5)) << what << " rstd";
      // The backward from the same statistics on both sides.
      const ops::NormGrads bc =
          ops::layer_norm_backward(lc.sum, w, lc.mean, lc.rstd, gy, true, true, true, ga);
      const ops::NormGrads bg = ops::layer_norm_backward(dev(lc.sum), dev(w), dev(lc.mean), dev(lc.rstd),
                                                         dev(gy), true, true, true, dev(ga));
      EXPECT_TRUE(test::all_close(host(bg.gx), bc.gx, tol, tol)) << what << " layer_norm gx";
      EXPECT_TRUE(test::all_close(host(bg.gw), bc.gw, tol, tol * 10)) << what << " layer_norm gw";
      const ops::NormOut rc = ops::add_rms_norm(x, r, w, 1e-6);
      const ops::NormOut rg = ops::add_rms_norm(dev(x), dev(r), dev(w), 1e-6);
      EXPECT_TRUE(test::all_close(host(rg.y), rc.y, tol, tol)) << what << " rms_norm y";
      const ops::NormGrads sc = ops::rms_norm_backward(rc.sum, w, rc.rstd, gy, true, true);
      const ops::NormGrads sg =
          ops::rms_norm_backward(dev(rc.sum), dev(w), dev(rc.rstd), dev(gy), true, true);
      EXPECT_TRUE(test::all_close(host(sg.gx), sc.gx, tol, tol)) << what << " rms_norm gx";
    }
  }
  const int64_t N = 6, V = 50257, ld = 50304;
  const Tensor labels = ops::from_vector<int64_t>({3, -100, 0, V - 1, 17, 50000}, {N});
  const Tensor grad = ops::from_vector<float>({1.0f, 1.0f, 4096.0f, 2.5e-4f, 3.0f, 0.5f}, {N});
  for (const DType dt : {DType::f32, DType::bf16}) {
    const Tensor logits = ops::to_dtype(ops::affine(test::randn({N, V}, 9), 4.0, 0.0), dt);
    const ops::CrossEntropyOut ce = ops::cross_entropy(logits, labels, -100);
    const Tensor want = ops::cross_entropy_backward(logits, labels, ce.lse, grad, -100);
    for (const bool padded : {false, true}) {
      const std::string what = fmt::format("{} padded {}", dtype_name(dt), padded);
      Tensor x = padded ? ops::narrow(ops::zeros({N, ld}, dt, gpu), 1, 0, V) : ops::empty({N, V}, dt, gpu);
      ops::copy_(x, dev(logits));
      const ops::CrossEntropyOut loss_only = ops::cross_entropy(x, dev(labels), -100);
      EXPECT_TRUE(test::all_close(host(loss_only.loss), ce.loss, 1e-5, 1e-5)) << what;
      const Tensor g_only = ops::cross_entropy_backward(x, dev(labels), loss_only.lse, dev(grad), -100);
      const ops::CrossEntropyOut both =
          ops::cross_entropy_with_grad_(x, dev(labels), -100, dev(grad), x);  // in place
      // The fused kernel's loss is the loss kernel's, its gradient the gradient kernel's, bit for bit.
      EXPECT_EQ(test::values(host(both.loss)), test::values(host(loss_only.loss))) << what;
      EXPECT_EQ(test::values(host(ops::contiguous(x))), test::values(host(g_only))) << what;
      EXPECT_TRUE(test::all_close(host(ops::contiguous(x)), want, dt == DType::bf16 ? 1e-2 : 1e-4, 1e-6))
          << what;
    }
  }
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

// Largest |a - b| over b's largest magnitude (host f32 values of equal shape).
double relative_error(const Tensor& a, const Tensor& b) {
  const auto va = test::values(a), vb = test::values(b);
  double worst = 0, scale = 1e-30;
  for (size_t i = 0; i < va.size(); ++i) {
    worst = std::max(worst, std::abs(va[i] - vb[i]));
    scale = std::max(scale, std::abs(vb[i]));
  }
  return worst / scale;
}

// cuDNN's fused attention (bf16/f16; causal and not; multi-head and grouped-query; dense and [B, T, H, D]
// operands; attention dropout through our keep mask, which the CPU reference draws alike) against the f32
// CPU reference of the same half values, next to our flash kernels: out, lse and
// every gradient within half-precision bounds, and no farther from the reference than twice our kernels'
// error. Asserts that cuDNN ran each call (its counts), so a refusal fails here with cuDNN's reason instead
// of passing on our kernels.
TEST(CudnnDevice, AttentionMatchesTheReferenceAndOurKernels) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: cuDNN attention NOT tested";
  struct Case {
    DType dt;
    bool causal;
    int64_t H, KV, T, D;
    bool seq_major;
    double dropout = 0.0;
  };
  const Case cases[] = {
      {DType::bf16, true, 4, 4, 128, 64, false},   {DType::bf16, true, 4, 2, 96, 64, true},
      {DType::bf16, false, 4, 4, 128, 128, true},  {DType::f16, true, 4, 1, 64, 64, false},
      {DType::f16, false, 2, 2, 200, 32, true},    {DType::bf16, true, 4, 4, 128, 64, false, 0.1},
      {DType::f16, true, 4, 2, 96, 64, true, 0.25}};
  const Device gpu = Device::cuda(0);
  for (const Case& c : cases) {
    const std::string what =
        fmt::format("{} causal={} H={} KV={} T={} D={} {} dropout={}", dtype_name(c.dt), c.causal, c.H, c.KV,
                    c.T, c.D, c.seq_major ? "seq-major" : "dense", c.dropout);
    const backend::AttentionDropout drop{c.dropout, 17, 4};
    using Form = ops::AttentionForm;
    Generator gen(31);
    const int64_t B = 2;
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    auto half = [&](const Shape& s) { return ops::to_dtype(ops::randn(s, gen), c.dt); };
    const Tensor q = half({B, c.H, c.T, c.D}), k = half({B, c.KV, c.T, c.D}), v = half({B, c.KV, c.T, c.D}),
                 dout = half({B, c.H, c.T, c.D});
    auto f32 = [](const Tensor& t) { return ops::to_dtype(ops::to_device(t, Device::cpu()), DType::f32); };
    const auto ref = ops::attention(f32(q), f32(k), f32(v), {}, c.causal, scale, 0, Form::automatic, drop);
    const auto rg = ops::attention_backward(f32(q), f32(k), f32(v), {}, c.causal, scale, ref.out, ref.lse,
                                            f32(dout), 0, Form::automatic, drop);
    // The GPU's out, lse, dq, dk, dv as host f32.
    auto run = [&](bool cudnn) {
      backend::cuda_use_cudnn_attention(cudnn);
      auto dev = [&](const Tensor& t) {
        const Tensor d = ops::to_device(t, gpu);  // [B, T, H, D] memory read through [B, H, T, D] views
        return c.seq_major ? ops::transpose(ops::contiguous(ops::transpose(d, 1, 2)), 1, 2) : d;
      };
      const Tensor dq_in = dev(q), dk_in = dev(k), dv_in = dev(v);
      const auto o = ops::attention(dq_in, dk_in, dv_in, {}, c.causal, scale, 0, Form::automatic, drop);
      const auto g = ops::attention_backward(dq_in, dk_in, dv_in, {}, c.causal, scale, o.out, o.lse,
                                             dev(dout), 0, Form::automatic, drop);
      return std::vector<Tensor>{f32(o.out), f32(o.lse), f32(g.dq), f32(g.dk), f32(g.dv)};
    };
    const auto before = backend::cuda_cudnn_attention_counts();
    const auto dnn = run(true);
    const auto after = backend::cuda_cudnn_attention_counts();
    const auto ours = run(false);
    backend::cuda_use_cudnn_attention(true);
    EXPECT_EQ(after.forward - before.forward, 1) << what << ": " << after.last_refusal;
    EXPECT_EQ(after.backward - before.backward, 1) << what << ": " << after.last_refusal;
    const std::vector<Tensor> want = {ref.out, ref.lse, rg.dq, rg.dk, rg.dv};
    const char* names[] = {"out", "lse", "dq", "dk", "dv"};
    const double bound = c.dt == DType::bf16 ? 3e-2 : 6e-3;
    for (size_t i = 0; i < want.size(); ++i) {
      const double e_dnn = relative_error(dnn[i], want[i]), e_ours = relative_error(ours[i], want[i]);
      std::printf("%s %s: cuDNN %.2e, ours %.2e\n", what.c_str(), names[i], e_dnn, e_ours);
      EXPECT_LE(e_dnn, bound) << what << " " << names[i];
      EXPECT_LE(e_dnn, std::max(2 * e_ours, bound / 4)) << what << " " << names[i];
    }
  }
}

// cuDNN's attention inside a captured CUDA graph (torch_compile's replay on a GPU): a shape planned by an
// eager call is captured as cuDNN's kernels and replays the eager call's bits; a shape first met during the
// capture is not planned there (planning compiles and loads kernels) and runs our kernels in the graph.
TEST(CudnnDevice, AttentionReplaysInACapturedGraph) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: cuDNN attention NOT tested";
  const Device gpu = Device::cuda(0);
  backend::Backend& be = backend::backend_for(gpu);
  Generator gen(11);
  for (const int64_t T : {128, 192}) {  // 128: planned eagerly first; 192: first met while capturing
    SCOPED_TRACE(T);
    auto make = [&] {
      return ops::to_device(ops::to_dtype(ops::randn({2, 4, T, 64}, gen), DType::bf16), gpu);
    };
    const Tensor q = make(), k = make(), v = make();
    const Tensor out = ops::empty({2, 4, T, 64}, DType::bf16, gpu),
                 lse = ops::empty({2, 4, T}, DType::f32, gpu);
    Tensor want_out, want_lse;
    if (T == 128) {
      be.attention(q, k, v, {}, true, 0, 0.125, {}, out, lse);
      want_out = ops::to_device(out, Device::cpu()), want_lse = ops::to_device(lse, Device::cpu());
      ops::fill_(out, 0.0);
    }
    const auto before = backend::cuda_cudnn_attention_counts();
    auto graph = be.capture_graph(0, [&] { be.attention(q, k, v, {}, true, 0, 0.125, {}, out, lse); });
    const auto after = backend::cuda_cudnn_attention_counts();
    ASSERT_TRUE(graph);
    graph->launch();
    be.synchronize();
    EXPECT_EQ(after.forward - before.forward, T == 128 ? 1 : 0) << after.last_refusal;
    if (T == 128) {
      EXPECT_EQ(test::values(ops::to_device(out, Device::cpu())), test::values(want_out));
      EXPECT_EQ(test::values(ops::to_device(lse, Device::cpu())), test::values(want_lse));
    } else {
      auto f32 = [](const Tensor& t) { return ops::to_dtype(ops::to_device(t, Device::cpu()), DType::f32); };
      const auto ref = ops::attention(f32(q), f32(k), f32(v), {}, true, 0.125);
      EXPECT_TRUE(test::all_close(f32(out), ref.out, 3e-2, 3e-2));
    }
  }
}

// Attention dropout under cuDNN in a captured graph: the keep mask is drawn inside the graph, so a launch
// after set_philox_shift(s) draws what an eager call at offset + s draws, bit for bit (torch_compile's
// replay gets each step's own mask).
TEST(CudnnDevice, DropoutInACapturedGraphFollowsThePhiloxShift) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: cuDNN attention NOT tested";
  const Device gpu = Device::cuda(0);
  backend::Backend& be = backend::backend_for(gpu);
  Generator gen(13);
  auto make = [&] {
    return ops::to_device(ops::to_dtype(ops::randn({2, 4, 128, 64}, gen), DType::bf16), gpu);
  };
  const Tensor q = make(), k = make(), v = make();
  const Tensor out = ops::empty({2, 4, 128, 64}, DType::bf16, gpu),
               lse = ops::empty({2, 4, 128}, DType::f32, gpu);
  auto eager = [&](uint64_t offset) {
    be.attention(q, k, v, {}, true, 0, 0.125, {0.1, 5, offset}, out, lse);
    return test::values(ops::to_device(out, Device::cpu()));
  };
  const auto before = backend::cuda_cudnn_attention_counts();
  const auto at0 = eager(0), at7 = eager(7);
  EXPECT_NE(at0, at7);
  auto graph = be.capture_graph(0, [&] { be.attention(q, k, v, {}, true, 0, 0.125, {0.1, 5, 0}, out, lse); });
  ASSERT_TRUE(graph);
  EXPECT_EQ(backend::cuda_cudnn_attention_counts().forward - before.forward, 3) << before.last_refusal;
  for (const auto& [shift, want] : {std::pair{uint64_t{7}, at7}, std::pair{uint64_t{0}, at0}}) {
    ops::fill_(out, 0.0);
    be.set_philox_shift(0, shift);
    graph->launch();
    be.synchronize();
    EXPECT_EQ(test::values(ops::to_device(out, Device::cpu())), want) << "shift " << shift;
  }
}

// Calls cuDNN's attention does not take (a padding mask, f32, dropout over keys not a multiple of 8) run
// our kernels: its counts stay, and the results are the reference's.
TEST(CudnnDevice, AttentionDeclinesWhatItDoesNotCompute) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: cuDNN attention NOT tested";
  const Device gpu = Device::cuda(0);
  Generator gen(5);
  const Tensor q = ops::randn({1, 2, 64, 64}, gen), k = ops::randn({1, 2, 64, 64}, gen),
               v = ops::randn({1, 2, 64, 64}, gen);
  std::vector<uint8_t> keep(64, 1);
  keep[7] = 0;
  const Tensor kk = ops::to_dtype(ops::from_vector<uint8_t>(keep, {1, 64}), DType::boolean);
  const auto before = backend::cuda_cudnn_attention_counts();
  auto d = [&](const Tensor& t, DType dt) { return ops::to_device(ops::to_dtype(t, dt), gpu); };
  const auto masked = ops::attention(d(q, DType::bf16), d(k, DType::bf16), d(v, DType::bf16),
                                     ops::to_device(kk, gpu), true, 0.125);
  ops::attention(d(q, DType::f32), d(k, DType::f32), d(v, DType::f32), {}, true, 0.125);
  // Dropout over 60 keys: the keep mask's rows would not be 16-byte aligned.
  const Tensor q60 = d(ops::randn({1, 2, 60, 64}, gen), DType::bf16);
  ops::attention(q60, q60, q60, {}, true, 0.125, 0, ops::AttentionForm::automatic, {0.1, 3, 0});
  const auto after = backend::cuda_cudnn_attention_counts();
  EXPECT_EQ(after.forward, before.forward);
  const auto ref = ops::attention(ops::to_dtype(ops::to_dtype(q, DType::bf16), DType::f32),
                                  ops::to_dtype(ops::to_dtype(k, DType::bf16), DType::f32),
                                  ops::to_dtype(ops::to_dtype(v, DType::bf16), DType::f32), kk, true, 0.125);
  EXPECT_TRUE(test::all_close(ops::to_dtype(ops::to_device(masked.out, Device::cpu()), DType::f32), ref.out,
                              3e-2, 3e-2));
}

}  // namespace
}  // namespace tr
