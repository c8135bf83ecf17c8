// Registration of the TrainingArguments table with CLI11 and the args-file merge; see flags.h.
#include "cli/flags.h"

#include "core/suggest.h"

namespace tr::cli {

void add_training_flags(CLI::App* cmd, TrainingFlags& f) {
  cmd->add_option("args_file", f.args_file, "a JSON file of arguments (HF's `train.py args.json`)");
  for (const auto& s : train::argument_specs()) {
    CLI::Option* o = std::visit(
        [&](auto m) -> CLI::Option* {
          using T = std::decay_t<decltype(f.parsed.*m)>;
          if constexpr (std::is_same_v<T, std::optional<bool>>) {  // HF's Optional[bool]: unset unless given
            auto* opt = cmd->add_option_function<bool>(
                "--" + s.name, [&f, m](const bool& v) { f.parsed.*m = v; }, s.help);
            opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
            opt->expected(0, 1)->default_str("true")->option_text("[true|false]");
            return opt;
          }
          auto* opt = cmd->add_option("--" + s.name, f.parsed.*m, s.help);
          opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // argparse: the last one wins
          if constexpr (std::is_same_v<T, bool>)  // `--bf16` alone means true; the help shows the choice
            opt->expected(0, 1)->default_str("true")->option_text("[true|false]");
          if (s.name == "per_device_train_batch_size")  // `auto` (ours): chosen by the memory estimate
            opt->transform([](std::string v) { return v == "auto" ? std::to_string(train::kAutoBatch) : v; });
          return opt;
        },
        s.member);
    f.options[s.name] = o;
  }
}

bool TrainingFlags::given(const std::string& name) const {
  const auto it = options.find(name);
  return it != options.end() && it->second->count() > 0;
}

train::TrainingArguments TrainingFlags::resolve(const train::TrainingArguments& base) const {
  train::TrainingArguments a = base;
  if (!args_file.empty()) a.update_from_file(args_file);
  for (const auto& s : train::argument_specs()) {
    const auto it = options.find(s.name);
    if (it == options.end() || it->second->count() == 0) continue;
    std::visit([&](auto m) { a.*m = parsed.*m; }, s.member);
  }
  return a;
}

std::string unknown_flag_message(const std::vector<std::string>& args,
                                 const std::vector<std::string>& known) {
  for (const auto& arg : args) {
    if (arg.rfind("--", 0) != 0 || arg == "--") continue;
    const std::string name =
        arg.substr(2, arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 2);
    if (name == "help" || std::find(known.begin(), known.end(), name) != known.end()) continue;
    std::string msg = "unknown flag --" + name;
    const std::string near = nearest_name(name, known);
    if (!near.empty()) msg += " (did you mean --" + near + "?)";
    return msg;
  }
  return "";
}

}  // namespace tr::cli
