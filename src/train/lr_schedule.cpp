// HF's learning-rate schedules: each factor as transformers.optimization's lambdas compute it (LambdaLR
// multiplies the base rate by it), ReduceLROnPlateau as torch.optim.lr_scheduler steps it.
#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "core/error.h"
#include "core/suggest.h"

namespace tr::train {

const std::vector<std::string>& scheduler_names() {
  static const std::vector<std::string> n = {"linear",
                                             "cosine",
                                             "cosine_with_restarts",
                                             "polynomial",
                                             "constant",
                                             "constant_with_warmup",
                                             "inverse_sqrt",
                                             "reduce_lr_on_plateau",
                                             "cosine_with_min_lr",
                                             "cosine_warmup_with_min_lr",
                                             "warmup_stable_decay"};
  return n;
}

namespace {

// HF's _convert_str_dict on a string value: "true"/"false" (any case) a bool, digits an int, digits with one
// '.' a float; anything else stays a string.
nlohmann::json from_string(const nlohmann::json& v) {
  if (!v.is_string()) return v;
  const std::string s = v.get<std::string>();
  std::string lower = s;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "true" || lower == "false") return lower == "true";
  const auto digits = [](const std::string& t) {
    return !t.empty() && std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (digits(s) && s.size() <= 15) return std::stoll(s);
  const size_t dot = s.find('.');
  if (dot != std::string::npos && s.size() <= 30 && digits(s.substr(0, dot) + s.substr(dot + 1)))
    return std::stod(s);
  return v;
}

// The arguments of one schedule (HF passes lr_scheduler_kwargs to its function: an unknown name is an
// error there too), read with their types and ranges checked.
class Kwargs {
 public:
  Kwargs(const std::string& text, const std::string& schedule) : schedule_(schedule) {
    if (text.empty()) return;
    j_ = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    TR_CHECK(j_.is_object(),
             "--lr_scheduler_kwargs '{}': expected a JSON object, e.g. '{{\"num_cycles\": 2}}'", text);
    for (auto& [k, v] : j_.items()) v = from_string(v);
  }
  // Every key must be one of `names` (the schedule's arguments).
  void allow(const std::vector<std::string>& names) const {
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (std::find(names.begin(), names.end(), it.key()) != names.end()) continue;
      const std::string list = fmt::format("{}", fmt::join(names, ", "));
      fail("--lr_scheduler_kwargs: '{}' is not an argument of the {} schedule ({}){}", it.key(), schedule_,
           list.empty() ? "it takes none" : "it takes " + list, did_you_mean(it.key(), names));
    }
  }
  std::optional<double> number(const std::string& key, double lo, double hi, const char* range) const {
    const auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return std::nullopt;
    TR_CHECK(it->is_number() && it->get<double>() >= lo && it->get<double>() <= hi,
             "--lr_scheduler_kwargs: '{}' of {} is {}: expected {}", key, schedule_, it->dump(), range);
    return it->get<double>();
  }
  std::optional<int64_t> integer(const std::string& key, int64_t lo, const char* range) const {
    const auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return std::nullopt;
    // Python takes an integral float where an int goes (patience 5.0); steps stay far from overflow (2^53).
    const bool integral =
        it->is_number_integer() || (it->is_number_float() && std::isfinite(it->get<double>()) &&
                                    it->get<double>() == std::floor(it->get<double>()));
    TR_CHECK(
        integral && it->get<double>() >= static_cast<double>(lo) && it->get<double>() <= 9007199254740992.0,
        "--lr_scheduler_kwargs: '{}' of {} is {}: expected {}", key, schedule_, it->dump(), range);
    return static_cast<int64_t>(it->get<double>());
  }
  std::optional<std::string> word(const std::string& key, const std::vector<std::string>& valid) const {
    const auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return std::nullopt;
    const std::string list = fmt::format("{}", fmt::join(valid, ", "));
    TR_CHECK(it->is_string() && std::find(valid.begin(), valid.end(), it->get<std::string>()) != valid.end(),
             "--lr_scheduler_kwargs: '{}' of {} is {}: expected one of {}", key, schedule_, it->dump(), list);
    return it->get<std::string>();
  }

 private:
  nlohmann::json j_ = nlohmann::json::object();
  std::string schedule_;
};

constexpr double kHuge = std::numeric_limits<double>::max();

WsdCurve wsd_curve(const std::string& name) {
  if (name == "linear") return WsdCurve::linear;
  if (name == "cosine") return WsdCurve::cosine;
  return WsdCurve::one_minus_sqrt;
}

double warmup_factor(int64_t step, int64_t warmup) {
  return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
}

}  // namespace

LrSchedule::LrSchedule(const std::string& type, const std::string& kwargs, double base_lr) : base_(base_lr) {
  const auto& names = scheduler_names();
  const auto it = std::find(names.begin(), names.end(), type);
  if (it == names.end()) {
    const std::string list = fmt::format("{}", fmt::join(names, ", "));
    fail("--lr_scheduler_type '{}' is not one of {}{}", type, list, did_you_mean(type, names));
  }
  kind_ = static_cast<LrScheduleKind>(it - names.begin());
  const Kwargs k(kwargs, type);
  switch (kind_) {
    case LrScheduleKind::constant:
    case LrScheduleKind::constant_with_warmup:
    case LrScheduleKind::inverse_sqrt: break;  // HF's get_scheduler passes them no kwargs (ignored there too)
    case LrScheduleKind::linear: k.allow({}); break;
    case LrScheduleKind::cosine:
      k.allow({"num_cycles"});
      num_cycles_ = k.number("num_cycles", 0, kHuge, "a number >= 0").value_or(0.5);
      break;
    case LrScheduleKind::cosine_with_restarts:
      k.allow({"num_cycles"});
      num_cycles_ = static_cast<double>(k.integer("num_cycles", 1, "an integer >= 1").value_or(1));
      break;
    case LrScheduleKind::polynomial:
      k.allow({"lr_end", "power"});
      lr_end_ = k.number("lr_end", 0, kHuge, "a number >= 0").value_or(1e-7);
      power_ = k.number("power", 0, kHuge, "a number >= 0").value_or(1.0);
      TR_CHECK(base_lr > lr_end_,
               "--lr_scheduler_kwargs: polynomial's lr_end ({}) must be smaller than "
               "--learning_rate ({})",
               lr_end_, base_lr);
      break;
    case LrScheduleKind::cosine_with_min_lr:
    case LrScheduleKind::cosine_warmup_with_min_lr: {
      if (kind_ == LrScheduleKind::cosine_with_min_lr)
        k.allow({"num_cycles", "min_lr", "min_lr_rate"});
      else
        k.allow({"num_cycles", "min_lr", "min_lr_rate", "warmup_lr_rate"});
      warmup_lr_rate_ = k.number("warmup_lr_rate", 0, 1, "a number in [0, 1]").value_or(-1);
      num_cycles_ = k.number("num_cycles", 0, kHuge, "a number >= 0").value_or(0.5);
      const auto min_lr = k.number("min_lr", 0, kHuge, "a number >= 0");
      const auto rate = k.number("min_lr_rate", 0, 1, "a number in [0, 1]");
      TR_CHECK(!(min_lr && rate), "--lr_scheduler_kwargs: {} takes one of min_lr and min_lr_rate, not both",
               type);
      TR_CHECK(min_lr || rate,
               "--lr_scheduler_type {} needs min_lr or min_lr_rate in --lr_scheduler_kwargs, e.g. "
               "'{{\"min_lr_rate\": 0.1}}'",
               type);
      TR_CHECK(!min_lr || base_lr > 0, "--lr_scheduler_kwargs: min_lr needs a --learning_rate above 0");
      min_lr_rate_ = min_lr ? *min_lr / base_lr : *rate;
      break;
    }
    case LrScheduleKind::warmup_stable_decay: {
      k.allow(
          {"num_stable_steps", "num_decay_steps", "warmup_type", "decay_type", "min_lr_ratio", "num_cycles"});
      const auto decay = k.integer("num_decay_steps", 0, "an integer >= 0");
      TR_CHECK(decay.has_value(),
               "--lr_scheduler_type warmup_stable_decay needs num_decay_steps in "
               "--lr_scheduler_kwargs, e.g. '{{\"num_decay_steps\": 100}}'");
      num_decay_steps_ = *decay;
      num_stable_steps_ = k.integer("num_stable_steps", 0, "an integer >= 0").value_or(-1);
      const std::vector<std::string> curves = {"linear", "cosine", "1-sqrt"};
      warmup_curve_ = wsd_curve(k.word("warmup_type", curves).value_or("linear"));
      decay_curve_ = wsd_curve(k.word("decay_type", curves).value_or("cosine"));
      min_lr_rate_ = k.number("min_lr_ratio", 0, 1, "a number in [0, 1]").value_or(0.0);
      num_cycles_ = k.number("num_cycles", 0, kHuge, "a number >= 0").value_or(0.5);
      break;
    }
    case LrScheduleKind::deepspeed: break;  // not a --lr_scheduler_type name
    case LrScheduleKind::reduce_lr_on_plateau: {
      k.allow({"mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "min_lr", "eps"});
      PlateauState& p = plateau_;
      p.maximize = k.word("mode", {"min", "max"}).value_or("min") == "max";
      p.factor =
          k.number("factor", 0, 1 - 1e-12, "a number below 1 (torch: Factor should be < 1.0)").value_or(0.1);
      p.patience = k.integer("patience", 0, "an integer >= 0").value_or(10);
      p.threshold = k.number("threshold", 0, kHuge, "a number >= 0").value_or(1e-4);
      p.relative = k.word("threshold_mode", {"rel", "abs"}).value_or("rel") == "rel";
      p.cooldown = k.integer("cooldown", 0, "an integer >= 0").value_or(0);
      p.min_lr = k.number("min_lr", 0, kHuge, "a number >= 0").value_or(0.0);
      p.eps = k.number("eps", 0, kHuge, "a number >= 0").value_or(1e-8);
      p.lr = base_lr;
      break;
    }
  }
}

LrSchedule::LrSchedule(const DeepSpeedSchedule& ds, double base_lr)
    : kind_(LrScheduleKind::deepspeed), base_(base_lr), ds_(ds) {}

double LrSchedule::at(int64_t step, int64_t warmup, int64_t total) const {
  if (kind_ == LrScheduleKind::reduce_lr_on_plateau) return plateau_.lr;
  if (kind_ == LrScheduleKind::deepspeed) return deepspeed_at(step, warmup, total);
  return base_ * factor(step, warmup, total);
}

// DeepSpeed's schedules in its own arithmetic (Python floats): W = max(2, warmup_num_steps); the warmup's
// gamma is log(i + 1) / log(W) or i / W at scheduler iteration i; WarmupDecayLR then falls linearly to 0 at
// total_num_steps, WarmupCosineLR follows a cosine from 1 to cos_min_ratio. The engine steps the scheduler
// after every applied optimizer step, from iteration -1 (the rate set at construction), so applied step
// `step` runs at iteration step - 1.
double LrSchedule::deepspeed_at(int64_t step, int64_t warmup, int64_t total) const {
  const int64_t it = step - 1;
  const bool cosine = ds_.kind == DeepSpeedSchedule::Kind::warmup_cosine_lr;
  if (it < 0) return cosine ? 0.0 : ds_.warmup_min_lr;  // before the first scheduler step
  const int64_t w = std::max<int64_t>(2, ds_.warmup_num_steps.value_or(warmup));
  const double max_lr = ds_.warmup_max_lr.value_or(base_);
  const double i = static_cast<double>(it), W = static_cast<double>(w), T = static_cast<double>(total);
  double gamma = 1.0;
  if (it < w) gamma = ds_.log_warmup ? (1.0 / std::log(W)) * std::log(i + 1.0) : i / W;
  if (cosine) {
    double ratio = ds_.warmup_min_ratio + gamma * (1.0 - ds_.warmup_min_ratio);
    if (it >= w) {
      const double c = (1.0 + std::cos(M_PI * (i - W + 1.0) / (T - W))) / 2.0;
      ratio = std::max(0.0, ds_.cos_min_ratio + (1.0 - ds_.cos_min_ratio) * c);
    }
    return base_ * ratio;
  }
  if (ds_.kind == DeepSpeedSchedule::Kind::warmup_decay_lr && it >= w)
    gamma = std::max(0.0, (T - i) / std::max(1.0, T - W));
  return ds_.warmup_min_lr + (max_lr - ds_.warmup_min_lr) * gamma;
}

// Each branch is HF's lambda for that schedule (transformers/optimization.py), in doubles as Python's floats.
double LrSchedule::factor(int64_t step, int64_t warmup, int64_t total) const {
  const double t = static_cast<double>(step), w = static_cast<double>(warmup), T = static_cast<double>(total);
  const double progress = (t - w) / std::max(1.0, T - w);
  switch (kind_) {
    case LrScheduleKind::constant: return 1.0;
    case LrScheduleKind::deepspeed: return base_ > 0 ? deepspeed_at(step, warmup, total) / base_ : 0.0;
    case LrScheduleKind::reduce_lr_on_plateau: return plateau_.lr / base_;
    case LrScheduleKind::warmup_stable_decay: break;
    case LrScheduleKind::cosine_warmup_with_min_lr:  // its own warmup: +1 shifted, or from warmup_lr_rate
      if (step < warmup)
        return warmup_lr_rate_ < 0 ? (t + 1.0) / std::max(1.0, w)
                                   : warmup_lr_rate_ + (1.0 - warmup_lr_rate_) * t / std::max(1.0, w - 1.0);
      break;
    default:
      if (step < warmup) return warmup_factor(step, warmup);
  }
  switch (kind_) {
    case LrScheduleKind::constant_with_warmup: return 1.0;
    case LrScheduleKind::cosine:
      return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * num_cycles_ * 2.0 * progress)));
    case LrScheduleKind::cosine_with_restarts:
      if (progress >= 1.0) return 0.0;
      return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * std::fmod(num_cycles_ * progress, 1.0))));
    case LrScheduleKind::polynomial: {
      if (step > total) return lr_end_ / base_;
      const double pct_remaining = 1.0 - (t - w) / std::max(1.0, T - w);
      return ((base_ - lr_end_) * std::pow(pct_remaining, power_) + lr_end_) / base_;
    }
    case LrScheduleKind::inverse_sqrt: {
      const double scale = warmup > 0 ? w : 10000.0;  // HF's timescale: num_warmup_steps or 10,000
      return 1.0 / std::sqrt((t + (scale - w)) / scale);
    }
    case LrScheduleKind::cosine_with_min_lr:
    case LrScheduleKind::cosine_warmup_with_min_lr: {
      const double p =
          kind_ == LrScheduleKind::cosine_with_min_lr ? progress : (t - w + 1.0) / std::max(1.0, T - w);
      const double f = 0.5 * (1.0 + std::cos(M_PI * num_cycles_ * 2.0 * p));
      return std::max(0.0, f * (1.0 - min_lr_rate_) + min_lr_rate_);
    }
    case LrScheduleKind::warmup_stable_decay: {
      const int64_t stable = num_stable_steps_ >= 0 ? num_stable_steps_ : total - warmup - num_decay_steps_;
      const auto shaped = [this](WsdCurve c, double p, bool rising) {
        double f = 0;
        if (c == WsdCurve::linear) f = rising ? p : 1.0 - p;
        if (c == WsdCurve::cosine)
          f = rising ? 0.5 * (1.0 - std::cos(M_PI * p))
                     : 0.5 * (1.0 + std::cos(M_PI * num_cycles_ * 2.0 * p));
        if (c == WsdCurve::one_minus_sqrt) f = rising ? 1.0 - std::sqrt(1.0 - p) : 1.0 - std::sqrt(p);
        return std::max(0.0, f * (1.0 - min_lr_rate_) + min_lr_rate_);
      };
      if (step < warmup) return shaped(warmup_curve_, warmup_factor(step, warmup), true);
      if (step < warmup + stable) return 1.0;
      if (step < warmup + stable + num_decay_steps_)
        return shaped(decay_curve_,
                      static_cast<double>(step - warmup - stable) /
                          static_cast<double>(std::max<int64_t>(1, num_decay_steps_)),
                      false);
      return min_lr_rate_;
    }
    default:  // linear
      return std::max(0.0, (T - t) / std::max(1.0, T - w));
  }
}

bool PlateauState::step(double metric) {
  const double init =
      maximize ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  const double b = has_best ? best : init;
  const bool better = maximize ? (relative ? metric > b * (1.0 + threshold) : metric > b + threshold)
                               : (relative ? metric < b * (1.0 - threshold) : metric < b - threshold);
  if (better) {
    best = metric;
    has_best = true;
    num_bad_epochs = 0;
  } else {
    ++num_bad_epochs;
  }
  if (cooldown_counter > 0) {
    --cooldown_counter;
    num_bad_epochs = 0;
  }
  if (num_bad_epochs <= patience) return false;
  cooldown_counter = cooldown;
  num_bad_epochs = 0;
  const double reduced = std::max(lr * factor, min_lr);
  if (lr - reduced <= eps) return false;
  lr = reduced;
  return true;
}

nlohmann::json PlateauState::to_json() const {
  return {{"best", has_best ? nlohmann::json(best) : nlohmann::json(nullptr)},
          {"num_bad_epochs", num_bad_epochs},
          {"cooldown_counter", cooldown_counter},
          {"lr", lr}};
}

void PlateauState::read_json(const nlohmann::json& j, const std::string& source) {
  const auto num = [&](const char* key) {
    TR_CHECK(j.contains(key) && j[key].is_number() && std::isfinite(j[key].get<double>()),
             "{}: 'reduce_lr_on_plateau.{}': expected a finite number", source, key);
    return j[key].get<double>();
  };
  const auto count = [&](const char* key) {
    TR_CHECK(j.contains(key) && j[key].is_number_integer() && j[key].get<int64_t>() >= 0,
             "{}: 'reduce_lr_on_plateau.{}': expected an integer >= 0", source, key);
    return j[key].get<int64_t>();
  };
  TR_CHECK(j.is_object(), "{}: 'reduce_lr_on_plateau': expected an object", source);
  has_best = j.contains("best") && !j["best"].is_null();
  if (has_best) best = num("best");
  num_bad_epochs = count("num_bad_epochs");
  cooldown_counter = count("cooldown_counter");
  lr = num("lr");
  TR_CHECK(lr >= 0, "{}: 'reduce_lr_on_plateau.lr' {}: expected a rate >= 0", source, lr);
}

}  // namespace tr::train
