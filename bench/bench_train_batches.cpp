// Writes the token ids of the first N batches that `trainer train` draws for the given flags, so a PyTorch
// peer (bench/train_peer.py) can train on the very same batches in the same order (train_side_by_side.py).
//
//   bench_train_batches --model_name_or_path DIR --tokenizer_name TOK --train_file FILE --block_size T
//       --per_device_train_batch_size B --seed S --num_batches N --output batches.bin
//
// Output (little-endian): 8 bytes "trbatch1", then int64 num_batches, batch_size, block_size, stream_tokens,
// num_samples, then num_batches x batch_size x block_size int32 ids in the order the loader hands them out.
// It builds the dataset and loader exactly as `trainer train` does (same classes, same options); keep the
// two in step when the Trainer's data setup changes. It refuses (exit 1) whenever it could not stand for
// the Trainer's batches: a flag it does not know, fewer full batches in epoch 0 than asked for, or a batch
// that is out of order.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/loader.h"
#include "data/shards.h"
#include "data/tokenize.h"
#include "tokenizers/tokenizer.h"

namespace fs = std::filesystem;
using namespace tr;

namespace {

int run(std::map<std::string, std::string> flags) {
  auto need = [&](const std::string& k) -> std::string {
    auto it = flags.find(k);
    TR_CHECK(it != flags.end(), "bench_train_batches: --{} is required", k);
    return it->second;
  };
  const std::string model_dir = need("model_name_or_path"), train_file = need("train_file");
  const std::string tok_path = flags.count("tokenizer_name") ? flags["tokenizer_name"] : model_dir;
  // Defaults as TrainingArguments' (src/train/args.h).
  const int64_t block_size = flags.count("block_size") ? std::stoll(flags["block_size"]) : 256;
  const int64_t batch_size =
      flags.count("per_device_train_batch_size") ? std::stoll(flags["per_device_train_batch_size"]) : 8;
  const uint64_t seed = flags.count("seed") ? std::stoull(flags["seed"]) : 42;
  const int64_t num_batches = std::stoll(need("num_batches"));
  const std::string out_path = need("output");

  // The model's vocabulary size, which the Trainer hands the dataset for its id check.
  std::ifstream cf(fs::path(model_dir) / "config.json");
  const auto config = nlohmann::json::parse(cf, nullptr, false);
  TR_CHECK(!config.is_discarded() && config.contains("vocab_size"),
           "{}/config.json: unreadable or no vocab_size", model_dir);
  const int64_t vocab = config["vocab_size"].get<int64_t>();

  // From here on: the Trainer's data setup, line for line (src/train/setup.cpp load_streams without an
  // evaluation split, then the dataset and loader in src/train/trainer.cpp).
  auto tok = tokenizers::Tokenizer::from_pretrained(tok_path);
  const bool shards = train_file.size() > 4 && train_file.substr(train_file.size() - 4) == ".bin";
  auto stream = shards ? std::make_shared<data::TokenStream>(data::expand_inputs({train_file}), vocab)
                       : std::make_shared<data::TokenStream>(data::tokenize_text_files(tok, {train_file}));
  data::DatasetOptions dopt;
  dopt.block_size = block_size;
  dopt.seed = seed;
  dopt.vocab_size = vocab;
  auto ds = std::make_shared<data::SequenceDataset>(stream, dopt);
  data::DataLoaderOptions lopt;
  lopt.batch_size = batch_size;
  data::DataLoader loader(ds, lopt);

  // The peer has no epoch-end logic (HF's shorter last step): stay inside epoch 0 with full batches only.
  const int64_t full = ds->num_samples() / batch_size;
  TR_CHECK(
      num_batches > 0 && num_batches <= full,
      "bench_train_batches: {} batches asked for, but epoch 0 has only {} full batches of {} ({} blocks of "
      "{} tokens from {} tokens)",
      num_batches, full, batch_size, ds->num_samples(), block_size, stream->size());

  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(num_batches * batch_size * block_size));
  for (int64_t i = 0; i < num_batches; ++i) {
    auto b = loader.next();
    TR_CHECK(b.has_value(), "bench_train_batches: the loader ended after {} batches", i);
    TR_CHECK(b->epoch == 0 && b->index == i, "bench_train_batches: batch {} came back as epoch {} batch {}",
             i, b->epoch, b->index);
    TR_CHECK(b->input_ids.size(0) == batch_size && b->input_ids.size(1) == block_size,
             "bench_train_batches: batch {} has shape [{}, {}], expected [{}, {}]", i, b->input_ids.size(0),
             b->input_ids.size(1), batch_size, block_size);
    const int64_t* p = b->input_ids.data<int64_t>();
    for (int64_t k = 0; k < batch_size * block_size; ++k) ids.push_back(static_cast<int32_t>(p[k]));
  }
  TR_CHECK(static_cast<int64_t>(ids.size()) == num_batches * batch_size * block_size,
           "bench_train_batches: collected {} ids", ids.size());

  std::ofstream out(out_path, std::ios::binary);
  TR_CHECK(out.good(), "bench_train_batches: cannot write {}", out_path);
  out.write("trbatch1", 8);
  const int64_t header[5] = {num_batches, batch_size, block_size, stream->size(), ds->num_samples()};
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  out.write(reinterpret_cast<const char*>(ids.data()),
            static_cast<std::streamsize>(ids.size() * sizeof(int32_t)));
  TR_CHECK(out.good(), "bench_train_batches: writing {} failed", out_path);
  std::printf(
      "{\"num_batches\": %lld, \"batch_size\": %lld, \"block_size\": %lld, \"stream_tokens\": %lld, "
      "\"num_samples\": %lld}\n",
      static_cast<long long>(num_batches), static_cast<long long>(batch_size),
      static_cast<long long>(block_size), static_cast<long long>(stream->size()),
      static_cast<long long>(ds->num_samples()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  static const char* known[] = {"model_name_or_path",          "tokenizer_name", "train_file",  "block_size",
                                "per_device_train_batch_size", "seed",           "num_batches", "output"};
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    bool ok = a.rfind("--", 0) == 0 && i + 1 < argc;
    if (ok) {
      ok = false;
      for (const char* k : known) ok = ok || a.substr(2) == k;
    }
    if (!ok) {
      // An unknown flag may change the Trainer's batches (e.g. a future sampling option): refuse to guess.
      std::fprintf(stderr, "bench_train_batches: unknown flag or missing value: %s\n", a.c_str());
      return 1;
    }
    flags[a.substr(2)] = argv[++i];
  }
  try {
    return run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
