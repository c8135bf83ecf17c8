// Saving, validating and loading checkpoint-N folders; see checkpoint.h.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "io/safetensors.h"

namespace tr::train {

namespace fs = std::filesystem;

namespace {

void write_json(const fs::path& p, const nlohmann::json& j) {
  std::ofstream out(p);
  out << j.dump(2) << "\n";
  out.flush();
  TR_CHECK(out.good(), "{}: write failed", p.string());
}

int64_t checkpoint_step(const std::string& name) {
  if (name.rfind("checkpoint-", 0) != 0 || name.size() == 11) return -1;
  for (size_t i = 11; i < name.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
  return std::stoll(name.substr(11));
}

const char* const kCheckpointFiles[] = {"config.json",    "optimizer.safetensors", "scheduler.json",
                                        "rng_state.json", "trainer_state.json",    "training_args.json",
                                        "tokenizer.json"};

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

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  TR_CHECK(in.good(), "{}: missing or unreadable", path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  TR_CHECK(!j.is_discarded() && j.is_object(), "{}: corrupt (not a JSON object)", path);
  return j;
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

std::string save_checkpoint(models::CausalLM& model, MixedPrecision& mp, const optim::Optimizer& opt,
                            const tokenizers::Tokenizer& tok, const TrainerState& st,
                            const TrainingArguments& a, const SaveProbe& probe) {
  const std::string name = "checkpoint-" + std::to_string(st.global_step);
  const fs::path final_dir = fs::path(a.output_dir) / name;
  const fs::path tmp = fs::path(a.output_dir) / (".tmp-" + name);
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  mp.swap_masters();  // fp32 weights on disk, as HF saves under autocast
  try {
    const DType compute = model.dtype();
    model.set_dtype(DType::f32);
    models::save_pretrained(model, tmp.string());
    model.set_dtype(compute);
  } catch (...) {
    mp.swap_masters();
    throw;
  }
  mp.swap_masters();
  if (probe) probe("model");
  io::save_safetensors((tmp / "optimizer.safetensors").string(), opt.state_dict());
  if (probe) probe("optimizer");
  write_json(tmp / "scheduler.json", {{"last_epoch", st.scheduler_step}, {"_last_lr", {opt.lr()}}});
  if (mp.loss_scaling()) write_json(tmp / "scaler.json", mp.scaler().to_json());
  write_json(tmp / "rng_state.json",
             {{"dropout", {{"seed", st.dropout_rng.seed}, {"offset", st.dropout_rng.offset}}}});
  write_json(
      tmp / "trainer_state.json",
      {{"global_step", st.global_step},
       {"epoch", static_cast<double>(st.position.epoch)},
       {"data_position", {{"epoch", st.position.epoch}, {"batch", st.position.batch}}},
       {"skipped_steps", st.skipped_steps},
       {"train_batch_size", st.train_batch_size},
       {"gradient_accumulation_steps", st.gradient_accumulation_steps},
       {"train_tokens", st.train_tokens},
       {"best_metric", st.has_best ? nlohmann::json(st.best_metric) : nlohmann::json(nullptr)},
       {"best_model_checkpoint", st.best_model_checkpoint.empty() ? nlohmann::json(nullptr)
                                                                  : nlohmann::json(st.best_model_checkpoint)},
       {"log_history", st.log_history}});
  write_json(tmp / "training_args.json", a.to_json());
  tok.save((tmp / "tokenizer.json").string());
  if (probe) probe("rename");
  for (const auto& e : fs::directory_iterator(tmp)) sync_to_disk(e.path());
  sync_to_disk(tmp);
  // An existing checkpoint-N (the same step saved again) is renamed away, not deleted, until the new one is
  // in.
  const fs::path old = fs::path(a.output_dir) / (".trash-" + name);
  fs::remove_all(old);
  if (fs::exists(final_dir)) fs::rename(final_dir, old);
  fs::rename(tmp, final_dir);
  sync_to_disk(a.output_dir);
  fs::remove_all(old);
  if (a.save_total_limit > 0) {  // keep the newest save_total_limit checkpoints, and the best one
    std::vector<std::pair<int64_t, fs::path>> all;
    for (const auto& e : fs::directory_iterator(a.output_dir)) {
      const int64_t s = checkpoint_step(e.path().filename().string());
      if (s >= 0 && e.is_directory()) all.emplace_back(s, e.path());
    }
    std::sort(all.begin(), all.end());
    const size_t keep = static_cast<size_t>(a.save_total_limit);
    for (size_t i = 0; i + keep < all.size(); ++i) {
      if (!st.best_model_checkpoint.empty() && fs::equivalent(all[i].second, st.best_model_checkpoint))
        continue;
      remove_atomically(all[i].second);
    }
  }
  return final_dir.string();
}

TrainerState load_checkpoint_state(const std::string& dir, optim::Optimizer& opt, MixedPrecision& mp) {
  TR_CHECK(fs::is_directory(dir), "--resume_from_checkpoint {}: no such folder", dir);
  for (const char* f : kCheckpointFiles)
    TR_CHECK(fs::exists(fs::path(dir) / f), "checkpoint {}: missing {}", dir, f);
  TrainerState st;
  {
    auto f = io::SafetensorsFile::open((fs::path(dir) / "optimizer.safetensors").string());
    std::map<std::string, Tensor> state;
    for (const auto& t : f.header().tensors) state[t.name] = f.load(t.name);
    try {
      opt.load_state_dict(state);
    } catch (const Error& e) {
      fail("{}/optimizer.safetensors: {}", dir, e.what());
    }
  }
  const std::string ts_path = (fs::path(dir) / "trainer_state.json").string();
  auto ts = read_json_file(ts_path);
  for (const char* k : {"global_step", "data_position", "log_history"})
    TR_CHECK(ts.contains(k), "{}: missing '{}'", ts_path, k);
  TR_CHECK(ts["data_position"].contains("epoch") && ts["data_position"].contains("batch"),
           "{}: data_position needs epoch and batch", ts_path);
  st.global_step = ts["global_step"].get<int64_t>();
  st.position = {ts["data_position"]["epoch"].get<int64_t>(), ts["data_position"]["batch"].get<int64_t>()};
  st.log_history = ts["log_history"];
  st.skipped_steps = ts.value("skipped_steps", int64_t{0});
  st.train_batch_size = ts.value("train_batch_size", int64_t{0});
  st.gradient_accumulation_steps = ts.value("gradient_accumulation_steps", int64_t{0});
  st.train_tokens = ts.value("train_tokens", int64_t{0});
  if (ts.contains("best_metric") && ts["best_metric"].is_number()) {
    st.has_best = true;
    st.best_metric = ts["best_metric"].get<double>();
  }
  if (ts.contains("best_model_checkpoint") && ts["best_model_checkpoint"].is_string())
    st.best_model_checkpoint = ts["best_model_checkpoint"].get<std::string>();
  const std::string sch_path = (fs::path(dir) / "scheduler.json").string();
  auto sch = read_json_file(sch_path);
  TR_CHECK(sch.contains("last_epoch") && sch["last_epoch"].is_number_integer(), "{}: missing 'last_epoch'",
           sch_path);
  st.scheduler_step = sch["last_epoch"].get<int64_t>();
  const std::string rng_path = (fs::path(dir) / "rng_state.json").string();
  auto rng = read_json_file(rng_path);
  TR_CHECK(rng.contains("dropout") && rng["dropout"].contains("seed") && rng["dropout"].contains("offset"),
           "{}: missing 'dropout' seed/offset", rng_path);
  st.dropout_rng = {rng["dropout"]["seed"].get<uint64_t>(), rng["dropout"]["offset"].get<uint64_t>()};
  if (mp.loss_scaling()) {
    const std::string sc = (fs::path(dir) / "scaler.json").string();
    TR_CHECK(fs::exists(sc), "checkpoint {}: missing scaler.json (was it saved by an fp16 run?)", dir);
    mp.scaler().load_json(read_json_file(sc), sc);
  }
  return st;
}

}  // namespace tr::train
