// libFuzzer target: data files as documents (data/documents.h) - JSON lines, JSON arrays, CSV and TSV with
// RFC 4180 quoting, plain text - chosen by the input's first byte, with and without a named column. Parsing
// throws tr::Error or returns documents that are valid UTF-8 and no longer than the input.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"
#include "data/documents.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const char* const names[] = {"f.jsonl", "f.json", "f.csv", "f.tsv", "f.txt"};
  const std::string name = names[data[0] % 5];
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  for (const char* column : {"", "text", "b"}) {
    try {
      const auto docs = tr::data::parse_documents(bytes, name, tr::data::DocumentOptions{column});
      size_t total = 0;
      for (const auto& d : docs) total += d.size();
      if (total > bytes.size()) __builtin_trap();  // a document is cut from the input, never grown
    } catch (const tr::Error&) {
    }
  }
  return 0;
}
