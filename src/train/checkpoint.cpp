// Saving, validating and loading checkpoint-N folders; see checkpoint.h.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>

#include "core/file_writer.h"
#include "core/json_fields.h"
#include "io/safetensors.h"
#include "train/zero.h"

namespace tr::train {

namespace fs = std::filesystem;

namespace {

constexpr double kMaxFinite = std::numeric_limits<double>::max();
constexpr int64_t kMaxBatchField = (int64_t{1} << 31) - 1;

void write_json(const fs::path& p, const nlohmann::json& j) { write_file(p.string(), j.dump(2) + "\n"); }

// Besides the optimizer state (optimizer.safetensors, or one file per rank of a sharded run).
const char* const kCheckpointFiles[] = {"config.json",        "scheduler.json",     "rng_state.json",
                                        "trainer_state.json", "training_args.json", "tokenizer.json"};

// Flushes a file or folder to the disk: a checkpoint survives power loss, not only a killed process.
void sync_to_disk(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Deleting a folder is not atomic: rename it out of the checkpoint-N namespace first, so a kill mid-delete
// never leaves a half-deleted checkpoint-N behind.
void remove_atomically(const fs::path& dir) {
  const fs::path trash = dir.parent_path() / (".trash-" + dir.filename().string());
  fs::remove_all(trash);
  fs::rename(dir, trash);
  fs::remove_all(trash);
}

}  // namespace

std::optional<models::SavedWeights> saved_weights(const MixedPrecision& mp, ShardedOptimizer* gathered) {
  if (gathered)
    return models::SavedWeights{DType::f32, [gathered](size_t i) { return gathered->gather_master(i); }};
  if (!mp.enabled()) return std::nullopt;
  TR_CHECK(!mp.masters_sharded(), "save: the fp32 masters are sharded across the ranks; gather them");
  return models::SavedWeights{DType::f32, [&mp](size_t i) { return *mp.master_params()[i].second; }};
}

void take_part_in_save(ShardedOptimizer& gathered) {
  for (size_t i = 0; i < gathered.layout().numel.size(); ++i) gathered.gather_master(i);
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TR_CHECK(in.good(), "{}: missing or unreadable", path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = parse_json(text.view(), path, "corrupt: not valid JSON");
  TR_CHECK(j.is_object(), "{}: corrupt (not a JSON object)", path);
  return j;
}

std::string checkpoint_staging_dir(const std::string& output_dir, int64_t global_step) {
  return (fs::path(output_dir) / (".tmp-checkpoint-" + std::to_string(global_step))).string();
}

// N of a checkpoint-N folder name, or -1 (also for a number too long to be a step: no stoll overflow).
int64_t checkpoint_step(const std::string& name) {
  if (name.rfind("checkpoint-", 0) != 0 || name.size() == 11 || name.size() > 11 + 18) return -1;
  int64_t n = 0;
  for (size_t i = 11; i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
    n = n * 10 + (name[i] - '0');
  }
  return n;
}

std::string latest_checkpoint(const std::string& dir) {
  int64_t best = -1;
  std::string path;
  if (!fs::is_directory(dir)) return path;
  for (const auto& e : fs::directory_iterator(dir)) {
    const int64_t s = checkpoint_step(e.path().filename().string());
    if (s > best && e.is_directory()) {
      best = s;
      path = e.path().string();
    }
  }
  return path;
}

void keep_only_checkpoint(const std::string& output_dir, const std::string& kept) {
  std::vector<fs::path> others;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(output_dir))
    if (checkpoint_step(e.path().filename().string()) >= 0 && e.is_directory() &&
        !fs::equivalent(e.path(), kept, ec))
      others.push_back(e.path());
  for (const auto& p : others) remove_atomically(p);
}

// The final model's files of load_best_model_at_end: the best checkpoint's config and weights (written by
// the same save_pretrained as a final save), copied in place of any earlier ones.
void copy_model_files(const std::string& from, const std::string& to) {
  const auto is_model_file = [](const std::string& n) {
    return n == "config.json" || n == "generation_config.json" ||
           (n.rfind("model", 0) == 0 &&
            (n.ends_with(".safetensors") || n.ends_with(".safetensors.index.json")));
  };
  try {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(from))
      if (e.is_regular_file() && is_model_file(e.path().filename().string())) files.push_back(e.path());
    TR_CHECK(std::any_of(files.begin(), files.end(),
                         [](const fs::path& p) { return p.filename() == "config.json"; }),
             "{}: no config.json", from);
    for (const auto& e : fs::directory_iterator(to))  // an earlier model's weights (other shard names)
      if (e.is_regular_file() && is_model_file(e.path().filename().string()) &&
          e.path().filename() != "config.json")
        fs::remove(e.path());
    for (const auto& f : files) {
      const fs::path tmp = fs::path(to) / fmt::format(".{}.partial", f.filename().string());
      fs::copy_file(f, tmp, fs::copy_options::overwrite_existing);
      sync_to_disk(tmp);
      fs::rename(tmp, fs::path(to) / f.filename());
    }
    sync_to_disk(to);
  } catch (const fs::filesystem_error& e) {
    fail("load_best_model_at_end: copying the best model from {} to {} failed: {}: {}", from, to,
         e.path1().string(), e.code().message());
  }
}

namespace {

// Every file of checkpoint-N into its temporary folder `tmp`.
void write_checkpoint_files(const fs::path& tmp, models::CausalLM& model, const models::SavedWeights* weights,
                            MixedPrecision& mp, const optim::Optimizer& opt, const tokenizers::Tokenizer* tok,
                            const TrainerState& st, const TrainingArguments& a, const SaveProbe& probe,
                            const std::function<void()>& others) {
  fs::remove_all(tmp);
  make_directories(tmp.string(), "checkpoint");
  models::save_pretrained(model, tmp.string(), "5GB", weights);
  if (probe) probe("model");
  if (!a.save_only_model) {  // HF's save_only_model: the model and tokenizer only (no resume from it)
    save_optimizer_state(tmp.string(), opt);  // a sharded run: rank 0's file; `others` adds the other ranks'
    if (probe) probe("optimizer");
    nlohmann::json sch = {{"last_epoch", st.scheduler_step}, {"_last_lr", {opt.lr()}}};
    if (!st.plateau.is_null()) sch["reduce_lr_on_plateau"] = st.plateau;
    write_json(tmp / "scheduler.json", sch);
    if (mp.loss_scaling()) write_json(tmp / "scaler.json", mp.scaler().to_json());
    write_json(tmp / "rng_state.json",
               {{"dropout", {{"seed", st.dropout_rng.seed}, {"offset", st.dropout_rng.offset}}}});
  }
  write_json(
      tmp / "trainer_state.json",
      {{"global_step", st.global_step},
       {"epoch", static_cast<double>(st.position.epoch)},
       {"data_position", {{"epoch", st.position.epoch}, {"batch", st.position.batch}}},
       {"skipped_steps", st.skipped_steps},
       {"train_batch_size", st.train_batch_size},
       {"gradient_accumulation_steps", st.gradient_accumulation_steps},
       {"world_size", st.world_size},
       {"train_tokens", st.train_tokens},
       {"num_input_tokens_seen", st.num_input_tokens_seen},
       {"best_metric", st.has_best ? nlohmann::json(st.best_metric) : nlohmann::json(nullptr)},
       {"best_global_step",
        st.best_global_step > 0 ? nlohmann::json(st.best_global_step) : nlohmann::json(nullptr)},
       {"best_model_checkpoint", st.best_model_checkpoint.empty() ? nlohmann::json(nullptr)
                                                                  : nlohmann::json(st.best_model_checkpoint)},
       {"log_history", st.log_history}});
  write_json(tmp / "training_args.json", a.to_json());
  if (tok) tok->save_pretrained(tmp.string());
  if (others) others();
  if (probe) probe("rename");
  for (const auto& e : fs::directory_iterator(tmp)) sync_to_disk(e.path());
  sync_to_disk(tmp);
}

// save_total_limit, as HF's _rotate_checkpoints: checkpoints by step, the best moved to second-newest so
// that it is kept, the oldest deleted down to the limit - which is 2 when it is 1 and the best is not the
// newest (the newest is always kept: it is where a resume starts).
void rotate_checkpoints(const std::string& output_dir, int64_t limit, const std::string& best) {
  std::vector<std::pair<int64_t, fs::path>> all;
  for (const auto& e : fs::directory_iterator(output_dir)) {
    const int64_t s = checkpoint_step(e.path().filename().string());
    if (s >= 0 && e.is_directory()) all.emplace_back(s, e.path());
  }
  std::sort(all.begin(), all.end());
  std::error_code ec;
  size_t b = all.size();
  for (size_t i = 0; i < all.size() && !best.empty(); ++i)
    if (fs::equivalent(all[i].second, best, ec)) b = i;
  for (size_t i = b; i + 2 < all.size(); ++i) std::swap(all[i], all[i + 1]);
  size_t keep = static_cast<size_t>(limit);
  if (keep == 1 && b < all.size() && b + 1 != all.size()) keep = 2;
  for (size_t i = 0; i + keep < all.size(); ++i) remove_atomically(all[i].second);
}

// Why a save failed, in one line naming the path ("...: write failed: No space left on device").
std::string save_failure(const std::exception& e) {
  if (const auto* fe = dynamic_cast<const fs::filesystem_error*>(&e))
    return fmt::format("{}: {}", fe->path1().string(), fe->code().message());
  return e.what();
}

}  // namespace

std::string save_checkpoint(models::CausalLM& model, const models::SavedWeights* weights, MixedPrecision& mp,
                            const optim::Optimizer& opt, const tokenizers::Tokenizer* tok,
                            const TrainerState& st, const TrainingArguments& a, const SaveProbe& probe,
                            const std::function<void()>& others) {
  const std::string name = "checkpoint-" + std::to_string(st.global_step);
  const fs::path final_dir = fs::path(a.output_dir) / name;
  const fs::path tmp = checkpoint_staging_dir(a.output_dir, st.global_step);
  try {
    write_checkpoint_files(tmp, model, weights, mp, opt, tok, st, a, probe, others);
  } catch (const std::exception& e) {
    // A partial save is worth nothing and, on a full disk, holds the space the next try needs.
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fs::remove_all(tmp.string() + ".tmp-save", ec);
    if (dynamic_cast<const OutOfMemoryError*>(&e)) throw;
    const std::string prev = latest_checkpoint(a.output_dir);
    fail("saving {} failed: {}; {}", final_dir.string(), save_failure(e),
         prev.empty() ? "no earlier checkpoint exists" : "the previous checkpoint " + prev + " is intact");
  }
  // An existing checkpoint-N (the same step saved again) is renamed away, not deleted, until the new one is
  // in.
  const fs::path old = fs::path(a.output_dir) / (".trash-" + name);
  fs::remove_all(old);
  if (fs::exists(final_dir)) fs::rename(final_dir, old);
  fs::rename(tmp, final_dir);
  sync_to_disk(a.output_dir);
  fs::remove_all(old);
  if (a.save_total_limit > 0) rotate_checkpoints(a.output_dir, a.save_total_limit, st.best_model_checkpoint);
  return final_dir.string();
}

namespace {

// trainer_state.json's fields into `st`; errors name the file and the field.
void read_trainer_state(const nlohmann::json& ts, const std::string& path, TrainerState& st) {
  const JsonField f(ts, path);
  st.global_step = f["global_step"].integer(0, kMaxJsonCounter);
  st.position = {f["data_position"]["epoch"].integer(0, kMaxJsonCounter),
                 f["data_position"]["batch"].integer(0, kMaxJsonCounter)};
  // The trainer reads the entries' "step" and looks for "eval_loss": objects, with an integer step if any.
  f["log_history"].each_element([](const JsonField& e) {
    if (e.object()["step"].exists()) e["step"].integer(0, kMaxJsonCounter);
  });
  st.log_history = ts["log_history"];
  st.skipped_steps = f["skipped_steps"].integer_or(0, 0, kMaxJsonCounter);
  std::tie(st.train_batch_size, st.gradient_accumulation_steps) = read_batch_split(ts, path);
  st.train_tokens = f["train_tokens"].integer_or(0, 0, kMaxJsonCounter);
  st.world_size = f["world_size"].integer_or(1, 1, kMaxBatchField);
  st.has_best = f["best_metric"].present();
  if (st.has_best) st.best_metric = f["best_metric"].number(-kMaxFinite, kMaxFinite);
  st.best_model_checkpoint = f["best_model_checkpoint"].string_or("");
  st.best_global_step =
      f["best_global_step"].present() ? f["best_global_step"].integer(0, kMaxJsonCounter) : 0;
  st.num_input_tokens_seen = f["num_input_tokens_seen"].integer_or(0, 0, kMaxJsonCounter);
}

}  // namespace

std::pair<int64_t, int64_t> read_batch_split(const nlohmann::json& ts, const std::string& path) {
  const JsonField f(ts, path);
  f.object();
  // Required: resume compares them with this run's. Bounded so that their product (the effective batch)
  // cannot overflow.
  return {f["train_batch_size"].integer(1, kMaxBatchField),
          f["gradient_accumulation_steps"].integer(1, kMaxBatchField)};
}

namespace {

// A checkpoint saved under --save_only_model holds no optimizer, scheduler or RNG state: resuming from it
// would not continue the run. (Its training_args.json says so; damage there is the later checks' to report.)
void check_not_model_only(const std::string& dir) {
  const fs::path args = fs::path(dir) / "training_args.json";
  if (has_optimizer_state(dir) || !fs::exists(args)) return;
  const auto j = nlohmann::json::parse(std::ifstream(args), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("save_only_model") || j["save_only_model"] != true) return;
  fail(
      "--resume_from_checkpoint {}: saved with --save_only_model, so it holds the model but no optimizer, "
      "scheduler or RNG state to resume; start a new run from it with --model_name_or_path {}",
      dir, dir);
}

}  // namespace

bool metrics_line_kept(const std::string& line, int64_t global_step) {
  const auto j = nlohmann::json::parse(line, nullptr, false);
  if (!j.is_object()) return false;  // cut short by a kill, or not ours
  const auto it = j.find("step");
  if (it == j.end()) return true;
  if (it->is_number_unsigned()) return it->get<uint64_t>() <= static_cast<uint64_t>(global_step);
  return false;  // a negative or non-integer step is no step of this run
}

TrainerState load_checkpoint_state(const std::string& dir, optim::Optimizer& opt, MixedPrecision& mp,
                                   bool with_tokenizer) {
  TR_CHECK(fs::is_directory(dir), "--resume_from_checkpoint {}: no such folder", dir);
  check_not_model_only(dir);
  for (const char* f : kCheckpointFiles)
    TR_CHECK(fs::exists(fs::path(dir) / f) || (!with_tokenizer && std::string_view(f) == "tokenizer.json"),
             "checkpoint {}: missing {}", dir, f);
  TR_CHECK(has_optimizer_state(dir), "checkpoint {}: missing optimizer.safetensors", dir);
  TrainerState st;
  {
    const std::map<std::string, Tensor> state = load_optimizer_state(dir, opt, mp.master_params());
    try {
      opt.load_state_dict(state);
    } catch (const Error& e) {
      fail("{}/optimizer{}.safetensors: {}", dir,
           fs::exists(fs::path(dir) / "optimizer.safetensors") ? "" : ".rank-*", e.what());
    }
  }
  const std::string ts_path = (fs::path(dir) / "trainer_state.json").string();
  read_trainer_state(read_json_file(ts_path), ts_path, st);
  const std::string sch_path = (fs::path(dir) / "scheduler.json").string();
  const nlohmann::json sch = read_json_file(sch_path);
  st.scheduler_step = JsonField(sch, sch_path)["last_epoch"].integer(0, kMaxJsonCounter);
  if (sch.contains("reduce_lr_on_plateau")) st.plateau = sch["reduce_lr_on_plateau"];
  const std::string rng_path = (fs::path(dir) / "rng_state.json").string();
  const nlohmann::json rng = read_json_file(rng_path);
  const JsonField dropout = JsonField(rng, rng_path)["dropout"];
  st.dropout_rng = {dropout["seed"].unsigned_integer(), dropout["offset"].unsigned_integer()};
  if (mp.loss_scaling()) {
    const std::string sc = (fs::path(dir) / "scaler.json").string();
    TR_CHECK(fs::exists(sc), "checkpoint {}: missing scaler.json (was it saved by an fp16 run?)", dir);
    mp.scaler().load_json(read_json_file(sc), sc);
  }
  return st;
}

}  // namespace tr::train
