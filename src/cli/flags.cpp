// Registration of the TrainingArguments table with CLI11 and the args-file merge; see flags.h.
#include "cli/flags.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <limits>

#include "core/suggest.h"

namespace tr::cli {

namespace {

// CLI11 converts leniently (an integer out of range clamps, "" becomes 0, "010" is octal, a bad word gets
// "Could not convert"): the text of a typed flag is checked first, refused with what the flag expects, and
// an integer handed on in decimal (argparse's int()).
template <class T>
std::string check_flag_text(std::string& v) {
  if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::optional<bool>>) {
    std::string l = v;
    for (auto& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    // HF's string_to_bool words, and CLI11's
    for (const char* ok :
         {"true", "false", "t", "f", "yes", "no", "y", "n", "1", "0", "on", "off", "enable", "disable"})
      if (l == ok) return "";
    return "'" + v + "': expected true or false";
  } else if constexpr (std::is_integral_v<T>) {
    errno = 0;
    char* end = nullptr;
    const bool negative = v.find('-') != std::string::npos;
    std::string decimal;
    if constexpr (std::is_unsigned_v<T>)
      decimal = std::to_string(std::strtoull(v.c_str(), &end, 10));
    else
      decimal = std::to_string(std::strtoll(v.c_str(), &end, 10));
    if (v.empty() || end == v.c_str() || *end != '\0') return "'" + v + "': expected an integer";
    if (std::is_unsigned_v<T> && negative) return "'" + v + "': expected an integer >= 0";
    if (errno == ERANGE)
      return fmt::format("'{}': out of range (an integer from {} to {})", v, std::numeric_limits<T>::min(),
                         std::numeric_limits<T>::max());
    v = decimal;
    return "";
  } else if constexpr (std::is_floating_point_v<T>) {
    char* end = nullptr;
    (void)std::strtod(v.c_str(), &end);
    if (v.empty() || end == v.c_str() || *end != '\0') return "'" + v + "': expected a number";
    return "";  // out of range: inf or 0, which validate() judges per flag
  } else {
    return "";
  }
}

}  // namespace

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
            opt->transform(CLI::Validator([](std::string& v) { return check_flag_text<T>(v); }, ""));
            return opt;
          }
          auto* opt = cmd->add_option("--" + s.name, f.parsed.*m, s.help);
          opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // argparse: the last one wins
          if constexpr (std::is_same_v<T, bool>)  // `--bf16` alone means true; the help shows the choice
            opt->expected(0, 1)->default_str("true")->option_text("[true|false]");
          // One transform (CLI11 runs a flag's transforms last-added first): `auto` for the batch (ours:
          // chosen by the memory estimate), then the text checked.
          const bool batch = s.name == "per_device_train_batch_size";
          opt->transform(CLI::Validator(
              [batch](std::string& v) {
                if (batch && v == "auto") v = std::to_string(train::kAutoBatch);
                return check_flag_text<T>(v);
              },
              ""));
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
    if (const auto* u = tr::train::unsupported_hf_argument(name))
      return "--" + name + ": HF's argument is not supported here: " + u->why;
    std::string msg = "unknown flag --" + name;
    const std::string near = nearest_name(name, known);
    if (!near.empty()) msg += " (did you mean --" + near + "?)";
    return msg;
  }
  return "";
}

}  // namespace tr::cli
