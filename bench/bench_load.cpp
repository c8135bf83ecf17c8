// from_pretrained time for a ~500M-parameter fp32 Llama checkpoint against simply reading the file once.
// Writes the checkpoint to a temporary folder first (about 2.2 GB). Page cache: warm for both (the sandbox
// cannot drop caches); the "touch" column forces every parameter byte into memory after from_pretrained.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "models/causal_lm.h"

namespace fs = std::filesystem;

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  using namespace tr;
  const std::string dir = argc > 1 ? argv[1] : (fs::temp_directory_path() / "trainer_bench_500m").string();
  nlohmann::json j = {
      {"model_type", "llama"},           {"vocab_size", 32000},         {"hidden_size", 1280},
      {"intermediate_size", 3456},       {"num_hidden_layers", 24},     {"num_attention_heads", 20},
      {"max_position_embeddings", 2048}, {"tie_word_embeddings", false}};
  auto config = models::ModelConfig::from_json(j, "bench");
  if (!fs::exists(fs::path(dir) / "model.safetensors")) {
    Generator g(0);
    double t0 = now();
    auto m = models::create_causal_lm(config, Device::cpu(), DType::f32, g);
    double t1 = now();
    models::save_pretrained(*m, dir);
    std::printf("created %.1fM-parameter model in %.2f s, saved in %.2f s\n", m->num_parameters() / 1e6,
                t1 - t0, now() - t1);
  }
  const std::string file = (fs::path(dir) / "model.safetensors").string();
  const auto bytes = fs::file_size(file);
  for (int rep = 0; rep < 2; ++rep) {
    // 1. read the file once into memory
    double t0 = now();
    {
      std::unique_ptr<char[]> buf(new char[bytes]);  // no zero fill: only the read itself is timed
      int fd = ::open(file.c_str(), O_RDONLY);
      size_t at = 0;
      while (at < bytes) {
        ssize_t r = ::read(fd, buf.get() + at, bytes - at);
        if (r <= 0) break;
        at += static_cast<size_t>(r);
      }
      ::close(fd);
    }
    const double read_s = now() - t0;
    // 2. from_pretrained, then touch every parameter
    t0 = now();
    auto m = models::from_pretrained(dir);
    const double load_s = now() - t0;
    double sum = 0;
    for (auto& [name, p] : m->named_parameters()) {
      const float* d = p->data<float>();
      float s = 0;
      for (int64_t i = 0; i < p->numel(); i += 1024) s += d[i];  // one read per page and then some
      sum += s;
    }
    const double touch_s = now() - t0;
    std::printf(
        "file %.2f GB: read once %.3f s (%.2f GB/s) | from_pretrained %.3f s, + touching every page %.3f s "
        "(ratio to read %.2f)  [checksum %.3g]\n",
        bytes / 1e9, read_s, bytes / 1e9 / read_s, load_s, touch_s, touch_s / read_s, sum);
  }
  return 0;
}
