// libFuzzer target: a token file (llm.c shard with magic 20240520 / 20240801, or raw uint16 nanoGPT). Opening
// it throws tr::Error or gives a stream whose every token reads back inside the bounds it claims.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "data/shards.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = tr::fuzz::write_scratch("train_000000.bin", data, size);
  // Without a vocabulary check, then with GPT-2's (every id is checked on open).
  for (int64_t vocab : {int64_t{0}, int64_t{50257}}) {
    try {
      tr::data::TokenStream s({path, path}, vocab);
      if (s.size() <= 0 || static_cast<size_t>(s.size()) > size)
        __builtin_trap();  // two files, >= 2 bytes each
      std::vector<int64_t> out(static_cast<size_t>(s.size()));
      s.read(0, s.size(), out.data());
      for (int64_t id : out)
        if (id < 0 || (vocab > 0 && id >= vocab)) __builtin_trap();
    } catch (const tr::Error&) {
    }
  }
  return 0;
}
