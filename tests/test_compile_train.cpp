// torch_compile end to end: a compiled run equals the eager run bit for bit (losses, gradient norms, final
// weights) across precisions, accumulation with an uneven last step, checkpointing, dropout, every optimizer,
// evaluation and resume in either direction; shapes re-plan; bad backends are refused; capture and replay
// of ops through the recording backend on their own.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "autograd/functions.h"
#include "compile/graph.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/half.h"
#include "ops/ops.h"
#include "models/causal_lm.h"
#include "optim/optimizer.h"
#include "train/train_step.h"
#include "train/trainer.h"
#include "train_scratch.h"

namespace tr {
namespace {

namespace fs = std::filesystem;

struct Case {
  const char* name;
  std::function<void(train::TrainingArguments&, train::TrainHooks&)> setup;
  double dropout = 0.0;
  bool llama = false;
  int64_t shapes = 1;  // the step shapes the compiled run captures: one plan each
};

void write_llama_config(const fs::path& dir) {
  std::ofstream(dir / "llama.json")
      << R"({"model_type": "llama", "vocab_size": 50257, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
    "tie_word_embeddings": true})";
}

// The eager and the compiled run of one configuration; both must give the same bits.
void expect_compiled_equals_eager(const Case& c) {
  Scratch s(std::string("compile_") + c.name, c.dropout);
  train::TrainingArguments a = s.args("eager");
  a.max_steps = 6;
  train::TrainHooks hooks;
  if (c.llama) {
    write_llama_config(s.dir);
    a.config_name = (s.dir / "llama.json").string();
  }
  c.setup(a, hooks);
  const auto eager = train::train(a, hooks);
  train::TrainingArguments b = a;
  b.output_dir = (s.dir / "compiled").string();
  b.torch_compile = true;
  const auto compiled = train::train(b, hooks);
  EXPECT_EQ(compiled.losses, eager.losses) << c.name;
  EXPECT_EQ(logged(b.output_dir, "grad_norm"), logged(a.output_dir, "grad_norm")) << c.name;
  EXPECT_EQ(logged(b.output_dir, "eval_loss"), logged(a.output_dir, "eval_loss")) << c.name;
  EXPECT_EQ(compiled.skipped_steps, eager.skipped_steps) << c.name;
  EXPECT_EQ(compiled.compiled_shapes, c.shapes) << c.name;
  EXPECT_EQ(eager.compiled_shapes, 0) << c.name;
  // The plan needs no more than eager's memory: the static inputs replace the loader's batch (freed once
  // copied), the masks and positions are made on the device inside the arena, and the arena is the live
  // peak of the recorded calls. The replayed steps take what was planned at their captures, to the byte.
  EXPECT_LE(compiled.peak_bytes, eager.peak_bytes)
      << c.name << ": " << compiled.peak_bytes - eager.peak_bytes << " bytes above eager";
  EXPECT_EQ(compiled.replayed_peak_bytes > 0, c.shapes > 0) << c.name;
  EXPECT_EQ(compiled.planned_peak_bytes, compiled.replayed_peak_bytes) << c.name;
  EXPECT_LE(compiled.planned_peak_bytes, eager.peak_bytes) << c.name;
  EXPECT_EQ(eager.planned_peak_bytes, 0) << c.name;
  EXPECT_TRUE(file_bytes(fs::path(b.output_dir) / "model.safetensors") ==
              file_bytes(fs::path(a.output_dir) / "model.safetensors"))
      << c.name << ": the final weights differ";
}

const std::vector<Case>& cases() {
  static const std::vector<Case> v = {
      {"gpt2_fp32", [](auto&, auto&) {}},
      {"gpt2_bf16", [](auto& a, auto&) { a.bf16 = true; }},
      {"gpt2_fp16_overflow",
       [](auto& a, auto& h) {
         a.fp16 = true;
         h.after_backward = [](int64_t step, const nn::ParamList& params) {
           if (step != 2) return;  // one inf gradient: the step is skipped and the scale halves (same plan)
           Tensor g = params[0].second->grad();
           g.data<Half>()[0] = Half(std::numeric_limits<float>::infinity());
         };
       }},
      {"gpt2_fp16_scale_changes_past_the_plan_cap",
       [](auto& a, auto& h) {
         a.fp16 = true;
         a.max_steps = 12;
         h.after_backward = [](int64_t step, const nn::ParamList& params) {
           if (step == 0 || step == 11) return;  // 10 skipped steps, 11 loss scales: past the cap of 8 plans,
           Tensor g = params[0].second->grad();  // which a plan per scale would have hit
           g.data<Half>()[0] = Half(std::numeric_limits<float>::infinity());
         };
       }},
      {"gpt2_accumulation_uneven_last_step",
       [](auto& a, auto&) {
         a.max_steps = -1;
         a.num_train_epochs = 1;
         a.per_device_train_batch_size = 8;
         a.gradient_accumulation_steps =
             4;  // the epoch's batches are not a multiple of 4: a shorter last step
       },
       0.0, false, 2},
      {"gpt2_gradient_checkpointing", [](auto& a, auto&) { a.gradient_checkpointing = true; }},
      {"gpt2_dropout", [](auto&, auto&) {}, 0.1},
      {"gpt2_dropout_eager_attention", [](auto& a, auto&) { a.attn_implementation = "eager"; }, 0.1},
      {"gpt2_eval_inside_training",
       [](auto& a, auto&) {
         a.eval_strategy = "steps";
         a.eval_steps = 2;
         a.validation_split_percentage = 20;
       }},
      {"gpt2_bf16_label_smoothing",  // the smoothing factor captured with the loss kernels
       [](auto& a, auto&) {
         a.bf16 = true;
         a.label_smoothing_factor = 0.1;
       }},
      {"llama_neftune",  // the noise drawn by the replayed plan from the step's own Philox offset
       [](auto& a, auto&) { a.neftune_noise_alpha = 5; }, 0.0, true},
      {"llama_fp32", [](auto&, auto&) {}, 0.0, true},
      {"llama_bf16_accumulation",
       [](auto& a, auto&) {
         a.bf16 = true;
         a.gradient_accumulation_steps = 2;
       },
       0.0, true},
  };
  return v;
}

class CompiledEqualsEager : public ::testing::TestWithParam<size_t> {};

TEST_P(CompiledEqualsEager, BitForBit) { expect_compiled_equals_eager(cases()[GetParam()]); }

INSTANTIATE_TEST_SUITE_P(Compile, CompiledEqualsEager, ::testing::Range(size_t{0}, cases().size()),
                         [](const auto& info) { return std::string(cases()[info.param].name); });

// The optimizers that update during backward run their steps eagerly (no shape captured), with eager's bits.
TEST(Compile, EveryOptimizerEqualsEager) {
  for (const auto& name : optim::optimizer_names()) {
    Case c{name.c_str(), [&](auto& a, auto&) {
             a.optim = name;
             a.weight_decay = 0.01;
             if (name == "sgd") a.optim_args = "momentum=0.9";
             if (name.starts_with("galore_") || name.starts_with("apollo_")) {
               a.optim_target_modules = "all-linear";
               a.optim_args = "rank=4,update_proj_gap=1";
             }
           }};
    c.shapes = optim::updates_in_backward(name) ? 0 : 1;
    expect_compiled_equals_eager(c);
  }
}

// A plan is valid for a shape, not for a label count: steps of one shape whose batches mask different
// numbers of labels (-100, as padding would) replay one plan, with the eager step's losses, norms and
// weights.
TEST(Compile, OnePlanServesEveryLabelCountOfAShape) {
  const auto config = models::ModelConfig::from_json({{"model_type", "gpt2"},
                                                      {"vocab_size", 96},
                                                      {"n_embd", 32},
                                                      {"n_layer", 2},
                                                      {"n_head", 4},
                                                      {"n_positions", 32},
                                                      {"embd_pdrop", 0.0},
                                                      {"resid_pdrop", 0.0},
                                                      {"attn_pdrop", 0.0}},
                                                     "config.json");
  struct Out {
    std::vector<double> losses, norms;
    std::vector<float> weights;
    int64_t shapes = 0;
  };
  auto run = [&](bool compiled) {
    Generator init(7), dropout(3), data(11);
    auto model = models::create_causal_lm(config, Device::cpu(), DType::f32, init, "sdpa");
    train::MixedPrecision mp(model->named_parameters(), DType::f32, false);
    auto opt = optim::make_optimizer("adamw_torch", mp.master_params(), {});
    train::StepOptions so;
    so.max_grad_norm = 1.0;
    so.fuse_elementwise = compiled;
    const train::StepState ss{*model, mp, *opt, dropout};
    auto step = compiled ? train::make_compiled_step(ss, so) : train::make_eager_step(ss, so);
    Out o;
    for (int64_t s = 0; s < 6; ++s) {
      data::Batch b;
      b.input_ids = ops::to_dtype(ops::rand({2, 16}, data, DType::f32, Device::cpu(), 0.0, 96.0), DType::i64);
      std::vector<int64_t> l = ops::to_vector<int64_t>(b.input_ids);
      for (int64_t i = 0; i < 5 * s; ++i) l[static_cast<size_t>(i * 3 % 32)] = -100;  // 30 to 12 labels
      b.labels = b.host_labels = ops::from_vector<int64_t>(l, {2, 16});
      const train::StepResult r = step->run(s, {b}, 1e-2);
      o.losses.push_back(r.loss);
      o.norms.push_back(r.grad_norm);
    }
    for (const auto& [name, p] : model->named_parameters()) {
      const std::vector<float> v = ops::to_vector<float>(*p);
      o.weights.insert(o.weights.end(), v.begin(), v.end());
    }
    o.shapes = step->captured_shapes();
    return o;
  };
  const Out eager = run(false), compiled = run(true);
  EXPECT_EQ(compiled.shapes, 1);
  EXPECT_EQ(compiled.losses, eager.losses);
  EXPECT_EQ(compiled.norms, eager.norms);
  EXPECT_TRUE(compiled.weights == eager.weights) << "the final weights differ";
}

// A checkpoint of an eager run continues compiled, and the reverse, to the same weights as one straight run.
TEST(Compile, ResumeAcrossEagerAndCompiledIsExact) {
  Scratch s("compile_resume", 0.1);  // dropout on: the generator's position goes through the checkpoint too
  train::TrainingArguments a = s.args("straight");
  a.max_steps = 6;
  train::train(a);
  const std::string want = file_bytes(fs::path(a.output_dir) / "model.safetensors");
  for (const bool first_compiled : {false, true}) {
    train::TrainingArguments b = a;
    b.output_dir = (s.dir / (first_compiled ? "compiled_then_eager" : "eager_then_compiled")).string();
    b.torch_compile = first_compiled;
    train::TrainHooks stop_at_3;
    int steps = 0;
    stop_at_3.should_stop = [&] { return ++steps == 3; };  // as a SIGTERM would: checkpoint-3, same schedule
    EXPECT_TRUE(train::train(b, stop_at_3).interrupted);
    b.torch_compile = !first_compiled;
    b.resume_from_checkpoint = "true";
    train::train(b);
    EXPECT_TRUE(file_bytes(fs::path(b.output_dir) / "model.safetensors") == want) << b.output_dir;
  }
}

TEST(Compile, BackendsAndModesAreCheckedBeforeAnyWork) {
  Scratch s("compile_flags");
  train::TrainingArguments a = s.args("out");
  a.torch_compile_backend = "nvfuser";
  try {
    a.validate();
    ADD_FAILURE() << "nvfuser accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("retired in PyTorch 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("inductor, cudagraphs, aot_cudagraphs, aot_eager, eager"),
              std::string::npos)
        << e.what();
  }
  a.torch_compile_backend = "onnxrt";
  EXPECT_THROW(a.validate(), Error);
  a.torch_compile_backend = "inductr";
  try {
    a.validate();
    ADD_FAILURE() << "inductr accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean"), std::string::npos) << e.what();
  }
  a.torch_compile_backend = "aot_eager";
  a.torch_compile_mode = "fastest";
  EXPECT_THROW(a.validate(), Error);
  a.torch_compile_mode = "reduce-overhead";
  EXPECT_NO_THROW(a.validate());
  // HF: a backend or a mode turns compile on; the backend defaults to inductor.
  train::TrainingArguments m;
  m.torch_compile_mode = "max-autotune";
  m.apply_compile_defaults();
  EXPECT_TRUE(m.torch_compile);
  EXPECT_EQ(m.torch_compile_backend, "inductor");
}

// The capture layer alone: ops recorded through the interposer, then replayed on new input values, give
// what running the ops again gives; buffers the region makes are planned, the input is read in place.
TEST(Compile, ARecordedRegionReplaysOnNewInputs) {
  Generator g1(1), g2(2), g3(3);
  const Tensor x = ops::randn({64, 48}, g1);
  const Tensor w = ops::randn({48, 32}, g2);
  auto region = [&] {
    Tensor h = ops::unary(backend::UnaryOp::gelu_tanh, ops::matmul(x, w));
    return ops::reduce(backend::ReduceOp::sum, ops::softmax(h, 1), {0}, false);
  };
  compile::Recorder rec(backend::backend_for(Device::cpu()));
  Tensor out;
  {
    const backend::InterposeScope scope(Device::cpu(), rec);
    out = region();
  }
  EXPECT_TRUE(rec.break_reason().empty());
  compile::Graph g(rec, {out}, Device::cpu());
  EXPECT_GE(g.num_calls(), 4u);
  EXPECT_EQ(g.external_bytes(), (64 * 48 + 48 * 32) * 4);  // x and w, read where they are
  ops::copy_(x, ops::randn({64, 48}, g3));                 // new input values
  g.replay(backend::backend_for(Device::cpu()), 0);        // the first replay allocates the arena, once
  EXPECT_EQ(ops::to_vector<float>(g.outputs()[0]), ops::to_vector<float>(region()));
  const int64_t allocs = cpu_allocator().stats().num_allocs;
  g.replay(backend::backend_for(Device::cpu()), 0);
  EXPECT_EQ(cpu_allocator().stats().num_allocs, allocs) << "a replay called the allocator";

  // The compiled step hands the arena's bytes back between steps: taken again elsewhere (a decoy holds the
  // old block), the replay binds to the new bytes.
  auto arena = std::make_shared<Storage>(static_cast<size_t>(g.arena_bytes()), cpu_allocator());
  g.replay(backend::backend_for(Device::cpu()), 0, arena);
  const void* before = arena->data();
  // Decoys hold the old block; malloc's bins may hand it to a decoy only after a few tries, depending on what
  // this process allocated before (a single decoy missed it when other suites ran first).
  std::vector<Tensor> decoys;
  for (int tries = 0; tries < 4 && arena->data() == before; ++tries) {
    arena->release();
    decoys.push_back(ops::full({g.arena_bytes()}, 7.0, DType::u8));
    arena->reacquire();
  }
  ASSERT_NE(arena->data(), before) << "the arena came back at the same address: nothing is tested";
  ops::copy_(x, ops::randn({64, 48}, g1));
  g.replay(backend::backend_for(Device::cpu()), 0, arena);
  EXPECT_EQ(ops::to_vector<float>(g.outputs()[0]), ops::to_vector<float>(region()));

  // A device graph asked of the CPU, which has none: the calls run one by one, the reason is kept.
  ops::copy_(x, ops::randn({64, 48}, g1));
  g.replay(backend::backend_for(Device::cpu()), 0, arena, /*device_graph=*/true);
  EXPECT_EQ(ops::to_vector<float>(g.outputs()[0]), ops::to_vector<float>(region()));
  EXPECT_EQ(g.device_graph_captures(), 0);
  EXPECT_EQ(g.device_graph_break(), "this backend replays without device graphs");
}

// On a GPU, inductor and cudagraphs replay each step as one CUDA graph (captured once, as the result says)
// with eager's bits; with dropout and NEFTune's noise too (the kernels add each launch's Philox shift, read
// on the device).
TEST(CompileGpu, CudaGraphReplaysEqualEagerBitForBit) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: CUDA graph replay NOT tested";
  for (const char* backend_name : {"inductor", "cudagraphs"})
    for (const double dropout : {0.0, 0.1}) {
      Scratch s(std::string("compile_gpu_") + backend_name, dropout);
      train::TrainingArguments a = s.args("eager");
      a.max_steps = 6;
      a.use_cpu = false;
      a.bf16 = true;
      a.gradient_accumulation_steps = 2;
      a.neftune_noise_alpha = dropout > 0 ? 5.0 : 0.0;
      const auto eager = train::train(a);
      train::TrainingArguments b = a;
      b.output_dir = (s.dir / "compiled").string();
      b.torch_compile_backend = backend_name;
      b.apply_compile_defaults();
      const auto compiled = train::train(b);
      EXPECT_EQ(compiled.losses, eager.losses) << backend_name << " dropout " << dropout;
      EXPECT_EQ(file_bytes(fs::path(b.output_dir) / "model.safetensors"),
                file_bytes(fs::path(a.output_dir) / "model.safetensors"))
          << backend_name << " dropout " << dropout;
      EXPECT_EQ(compiled.device_graph_captures, 1) << backend_name << " dropout " << dropout;
      EXPECT_EQ(compiled.compiled_shapes, 1);
    }
}

// Inductor's fusion: the chain dropout -> residual add -> GELU -> scale -> product, and the GELU backward
// into an in-place accumulation, run fused and unfused from one recording; every stored value equal bit for
// bit (f32, bf16, f64; 3001 elements, so chunks end mid-vector), with Philox shifts, and fewer calls and a
// smaller arena fused. On `dev`: the CPU's chunked stages, or the CUDA backend's one-kernel chain.
void expect_chains_fuse_bit_exactly(Device dev) {
  for (const DType dt : {DType::f32, DType::bf16, DType::f64}) {
    Generator g1(1), g2(2), g3(3);
    auto on = [&](const Tensor& t) { return ops::to_device(ops::to_dtype(t, dt), dev); };
    const Tensor a = on(ops::randn({3001}, g1)), b = on(ops::randn({3001}, g2));
    const Tensor acc = on(ops::zeros({3001}));
    auto region = [&] {
      const Tensor s = ops::binary(backend::BinaryOp::add, b, ops::dropout(a, 0.25, 7, 100));
      const Tensor u = ops::affine(ops::unary(backend::UnaryOp::gelu_tanh, s), 0.5, 1.0);
      const Tensor v = ops::binary(backend::BinaryOp::mul, u, s);
      const Tensor gs = ops::unary_backward(backend::UnaryOp::gelu_tanh, s, v);
      ops::binary_(backend::BinaryOp::add, acc, gs);  // in place, as gradients accumulate
      return v;
    };
    compile::Recorder rec(backend::backend_for(dev));
    Tensor out;
    {
      const backend::InterposeScope scope(dev, rec);
      out = region();
    }
    compile::Recorder copy_of_rec = rec;
    compile::Graph plain(rec, {out, acc}, dev, false);
    compile::Graph fused(copy_of_rec, {out, acc}, dev, true);
    EXPECT_EQ(fused.fusion().chains, 1) << dtype_name(dt);  // the whole region is one chain
    EXPECT_EQ(fused.fusion().calls_fused, static_cast<int64_t>(plain.num_calls())) << dtype_name(dt);
    EXPECT_GE(fused.fusion().buffers_elided, 4) << dtype_name(dt);  // dropout's, the GELU's, the affine's, gs
    EXPECT_EQ(fused.num_calls(), 1u);
    EXPECT_LT(fused.arena_bytes(), plain.arena_bytes());
    for (const uint64_t shift : {uint64_t{0}, uint64_t{12345}}) {
      ops::copy_(a, on(ops::randn({3001}, g3)));
      ops::copy_(acc, on(ops::ones({3001})));
      plain.replay(backend::backend_for(dev), shift);
      const Tensor plain_out = ops::clone(plain.outputs()[0]), plain_acc = ops::clone(acc);
      ops::copy_(acc, on(ops::ones({3001})));
      fused.replay(backend::backend_for(dev), shift);
      const auto bits = [](const Tensor& t) {
        return ops::to_vector<double>(ops::to_dtype(ops::to_device(t, Device::cpu()), DType::f64));
      };
      EXPECT_EQ(bits(fused.outputs()[0]), bits(plain_out)) << dtype_name(dt) << " shift " << shift;
      EXPECT_EQ(bits(acc), bits(plain_acc)) << dtype_name(dt) << " shift " << shift;
    }
  }
}

TEST(Compile, ElementwiseChainsFuseBitExactly) { expect_chains_fuse_bit_exactly(Device::cpu()); }

// The CUDA backend runs a chain as one kernel with the unfused kernels' element math: the same bits.
TEST(CompileGpu, ElementwiseChainsFuseBitExactlyOnTheGpu) {
  if (!backend::cuda_available()) GTEST_SKIP() << "no CUDA GPU here: the CUDA fused chain NOT tested";
  expect_chains_fuse_bit_exactly(Device::cuda(0));
}

// A run longer than a chain may be (Backend::kMaxFusedStages) is split into chains of at most that many
// stages; the values crossing a split are stored, and every result keeps the unfused bits.
TEST(Compile, LongRunsSplitIntoChainsOfAtMostTheCap) {
  Generator g(5);
  const Tensor x = ops::randn({1000}, g);
  const int calls = backend::Backend::kMaxFusedStages + 4;
  auto region = [&] {
    Tensor v = x;
    for (int k = 0; k < calls; ++k) v = ops::affine(v, 1.0 + 0.01 * k, 0.5);
    return v;
  };
  compile::Recorder rec(backend::backend_for(Device::cpu()));
  Tensor out;
  {
    const backend::InterposeScope scope(Device::cpu(), rec);
    out = region();
  }
  compile::Recorder copy_of_rec = rec;
  compile::Graph plain(rec, {out}, Device::cpu(), false);
  compile::Graph fused(copy_of_rec, {out}, Device::cpu(), true);
  EXPECT_EQ(fused.fusion().chains, 2);
  EXPECT_EQ(fused.fusion().calls_fused, calls);
  EXPECT_EQ(fused.num_calls(), 2u);
  plain.replay(backend::backend_for(Device::cpu()), 0);
  const Tensor want = ops::clone(plain.outputs()[0]);
  fused.replay(backend::backend_for(Device::cpu()), 0);
  EXPECT_EQ(ops::to_vector<float>(fused.outputs()[0]), ops::to_vector<float>(want));
}

// A call that sees a buffer of the run at another offset would read elements another chunk writes: the run
// stops before it.
TEST(Compile, FusionStopsAtAShiftedView) {
  using Stage = backend::Backend::FusedStage;
  auto arg = [](int32_t buffer, int64_t offset, compile::Access access) {
    return compile::Arg{buffer, {8}, {1}, offset, DType::f32, access};
  };
  auto call = [&](std::vector<compile::Arg> args) {
    compile::Call c{"binary", std::move(args), nullptr,
                    Stage{.kind = Stage::Kind::binary, .in = {0, 1}, .out = 2}};
    return c;
  };
  const auto R = compile::Access::read, W = compile::Access::write;
  std::vector<compile::Buffer> buffers(5);
  for (auto& b : buffers) b.bytes = 8 * 4;
  buffers[3].bytes = 12 * 4;
  buffers[0].external = buffers[1].external = true;
  buffers[2].first = 0, buffers[2].last = 1;
  buffers[3].first = 1, buffers[3].last = 2;
  buffers[4].first = 2, buffers[4].last = 3;  // read after the region
  std::vector<compile::Call> calls = {call({arg(0, 0, R), arg(1, 0, R), arg(2, 0, W)}),
                                      call({arg(2, 0, R), arg(1, 0, R), arg(3, 0, W)}),
                                      call({arg(3, 4, R), arg(1, 0, R), arg(4, 0, W)})};
  const compile::FuseResult r = compile::fuse_elementwise(calls, buffers);
  EXPECT_EQ(r.chains, 1);  // the first two calls; the third reads buffer 3 four elements on
  EXPECT_EQ(r.calls_fused, 2);
  EXPECT_EQ(r.buffers_elided, 1);  // buffer 2, read by the run only
  EXPECT_TRUE(buffers[2].elided);
  EXPECT_FALSE(buffers[3].elided);  // read after the run
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_STREQ(calls[0].name, "fused_elementwise");
  EXPECT_STREQ(calls[1].name, "binary");
  EXPECT_EQ(buffers[4].last, 2);  // lifetimes follow the new list; the output is still read after it

  // One call reading a buffer at two offsets (x[0:8] + x[8:16]) starts no run: the fused call would have one
  // tensor for both.
  std::vector<compile::Buffer> b2(4);
  for (auto& b : b2) b.bytes = 8 * 4;
  b2[0].bytes = 16 * 4;
  b2[0].external = b2[1].external = true;
  b2[2].first = 0, b2[2].last = 1;
  b2[3].first = 1, b2[3].last = 2;
  std::vector<compile::Call> c2 = {call({arg(0, 0, R), arg(0, 8, R), arg(2, 0, W)}),
                                   call({arg(2, 0, R), arg(1, 0, R), arg(3, 0, W)})};
  EXPECT_EQ(compile::fuse_elementwise(c2, b2).chains, 0);
  EXPECT_EQ(c2.size(), 2u);
}

TEST(Compile, TheOptimizerPassesEndACapture) {
  compile::Recorder rec(backend::backend_for(Device::cpu()));
  {
    const backend::InterposeScope scope(Device::cpu(), rec);
    ops::grad_stats({ops::ones({8})}, 1.0, Device::cpu());
  }
  EXPECT_NE(rec.break_reason().find("grad_stats"), std::string::npos) << rec.break_reason();
}

}  // namespace
}  // namespace tr
