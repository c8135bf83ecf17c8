// libFuzzer target: tokenizer.json. An accepted tokenizer encodes and decodes a short text and every id, and
// survives its own writer: the saved file loads again and encodes the text to the same ids.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "tokenizers/tokenizer.h"

namespace {

// Words, digits, spaces of both kinds, multi-byte UTF-8 and GPT-2's end-of-text marker.
constexpr std::string_view kText =
    "Hello world!  It's 2024:\n\tcaf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac<|endoftext|> x";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tr::tokenizers::Tokenizer;
  std::optional<Tokenizer> tok;
  std::vector<int32_t> ids;
  try {
    tok = Tokenizer::from_tokenizer_json(tr::fuzz::write_scratch("tokenizer.json", data, size));
    ids = tok->encode(kText);
    const auto plain = tok->encode_ordinary(kText);
    for (int32_t id : ids)
      if (id < 0 || id >= tok->vocab_size()) __builtin_trap();
    tok->decode(plain);
    // Every id decodes on its own or is refused with tr::Error (holes in the vocabulary).
    for (int32_t id = 0; id < tok->vocab_size(); ++id) {
      try {
        tok->decode({id});
      } catch (const tr::Error&) {
      }
    }
  } catch (const tr::Error&) {
    return 0;
  }
  // What the reader accepted, the writer must write so that the reader accepts it again, unchanged: a
  // tr::Error here is a finding too.
  const std::string saved = (tr::fuzz::scratch_dir() / "saved.json").string();
  tok->save(saved);
  const auto again = Tokenizer::from_tokenizer_json(saved);
  if (again.vocab_size() != tok->vocab_size() || again.encode(kText) != ids) __builtin_trap();
  return 0;
}
