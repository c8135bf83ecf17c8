// libFuzzer target: the JSON args file (`trainer train args.json`). Reading it and validating the result
// throw tr::Error or succeed; what was read must survive training_args.json's round trip unchanged.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "fuzz_util.h"
#include "train/args.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tr::train::TrainingArguments a;
  try {
    a.update_from_file(tr::fuzz::write_scratch("args.json", data, size));
  } catch (const tr::Error&) {
    return 0;
  }
  // A checkpoint's training_args.json is to_json(); reading it back must give the same arguments, and
  // throwing tr::Error there is a finding too.
  const auto j = a.to_json();
  tr::train::TrainingArguments b;
  b.update_from_json(j, "training_args.json");
  if (b.to_json() != j) __builtin_trap();
  try {
    a.validate();
  } catch (const tr::Error&) {
  }
  return 0;
}
