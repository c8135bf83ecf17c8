// TrainingArguments on the command line: every flag of the argument table registered with CLI11 (booleans
// as `--bf16` or `--bf16 true`), an optional JSON args file (`trainer train args.json`, flags override it),
// and unknown flags answered with the nearest valid name.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "train/args.h"

namespace tr::cli {

struct TrainingFlags {
  train::TrainingArguments parsed;  // what the flags set (defaults elsewhere)
  std::map<std::string, CLI::Option*> options;
  std::string args_file;  // positional JSON file, or ""
  // `base` (HF's defaults, or the default run's), then the args file, then the flags given.
  train::TrainingArguments resolve(const train::TrainingArguments& base = {}) const;
  bool given(const std::string& name) const;
};

void add_training_flags(CLI::App* cmd, TrainingFlags& f);

// The first `--name` in args (after the subcommand) that is not in `known`, as one error message with a
// suggestion; "" when all are known. CLI11's own message does not suggest.
std::string unknown_flag_message(const std::vector<std::string>& args, const std::vector<std::string>& known);

}  // namespace tr::cli
