// JSON files read with every field's type and range checked; see json_fields.h.
#include "core/json_fields.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "core/suggest.h"

namespace tr {

namespace {

constexpr size_t kShownChars = 40;  // of a string value or key in a message

// At most kShownChars bytes of s, cut on a UTF-8 character boundary, with "..." when shortened.
std::string shorten(std::string_view s) {
  if (s.size() <= kShownChars) return std::string(s);
  size_t n = kShownChars;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n)) + "...";
}

// A JSON string literal (quotes, escapes: a message stays on one line).
std::string json_literal(std::string_view s) {
  return nlohmann::json(shorten(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Range ends as people read them: 2^24 rather than 16777216.
std::string bound_str(uint64_t n, bool negative = false) {
  const char* sign = negative ? "-" : "";
  if (n >= (uint64_t{1} << 20)) {
    if ((n & (n - 1)) == 0) return fmt::format("{}2^{}", sign, std::countr_zero(n));
    if (!negative && ((n + 1) & n) == 0) return fmt::format("2^{} - 1", std::countr_zero(n + 1));
    if (!negative && n == std::numeric_limits<uint64_t>::max()) return "2^64 - 1";
  }
  return fmt::format("{}{}", sign, n);
}

std::string bound_str(int64_t n) {
  return n < 0 ? bound_str(0 - static_cast<uint64_t>(n), true) : bound_str(static_cast<uint64_t>(n));
}

// The value as an int64 when it is an integer (or an integral float up to 2^53) that fits one.
std::optional<int64_t> exact_int(const nlohmann::json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return static_cast<int64_t>(u);
    return std::nullopt;
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) <= static_cast<double>(kMaxJsonCounter))
      return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

bool identifier(std::string_view key) {
  if (key.empty()) return false;
  for (char c : key)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  return true;
}

// "a.b", or a["b c"] for a key that is not a plain name (vocabulary tokens, tensor names).
std::string child_path(const std::string& path, std::string_view key) {
  if (!identifier(key)) return path + "[" + json_literal(key) + "]";
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

std::string join(std::initializer_list<std::string_view> names) {
  std::string out;
  for (auto n : names) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

// Nesting depth of `j`, walked without recursion; stops counting past `limit`.
size_t nesting_depth(const nlohmann::json& j, size_t limit) {
  std::vector<std::pair<const nlohmann::json*, size_t>> stack = {{&j, 1}};
  size_t deepest = 0;
  while (!stack.empty()) {
    const auto [v, depth] = stack.back();
    stack.pop_back();
    deepest = std::max(deepest, depth);
    if (deepest > limit) break;
    if (v->is_structured())
      for (const auto& child : *v)
        if (child.is_structured()) stack.emplace_back(&child, depth + 1);
  }
  return deepest;
}

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& source, std::string_view what) {
  try {
    nlohmann::json j = nlohmann::json::parse(text.begin(), text.end());
    // The parser is iterative, but writing a value back (checkpoints re-save configs, tokenizers and logs)
    // recurses: refuse nesting that no file of ours needs before it can overflow the stack.
    TR_CHECK(nesting_depth(j, kMaxJsonDepth) <= kMaxJsonDepth, "{}: {} (nested deeper than {} levels)",
             source, what, kMaxJsonDepth);
    return j;
  } catch (const nlohmann::json::exception& e) {
    // Only the position is kept: the library's wording is not a message for users.
    size_t byte = 0;
    if (const auto* pe = dynamic_cast<const nlohmann::json::parse_error*>(&e)) byte = pe->byte;
    byte = std::min(byte, text.size());
    const std::string_view before = text.substr(0, byte > 0 ? byte - 1 : 0);
    const size_t line = 1 + static_cast<size_t>(std::count(before.begin(), before.end(), '\n'));
    const size_t nl = before.rfind('\n');
    const size_t column = nl == std::string_view::npos ? before.size() + 1 : before.size() - nl;
    fail("{}: {} (syntax error at line {}, column {})", source, what, line, column);
  }
}

nlohmann::json read_json(const std::string& path) {
  TR_CHECK(!std::filesystem::is_directory(path), "{}: is a folder, not a JSON file", path);
  std::ifstream in(path, std::ios::binary);
  TR_CHECK(in.is_open(), "{}: cannot open", path);
  std::stringstream ss;
  ss << in.rdbuf();
  TR_CHECK(!in.bad(), "{}: read failed", path);
  return parse_json(ss.view(), path);
}

std::string describe_json(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return v.get<bool>() ? "true" : "false";
    case nlohmann::json::value_t::number_integer: return fmt::format("{}", v.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: return fmt::format("{}", v.get<uint64_t>());
    case nlohmann::json::value_t::number_float: return fmt::format("{}", v.get<double>());
    case nlohmann::json::value_t::string: return "a string " + json_literal(v.get_ref<const std::string&>());
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::object: return "an object";
    default: return "a value of another kind";
  }
}

JsonField::JsonField(const nlohmann::json& document, const std::string& file) : v_(&document), file_(&file) {}

const nlohmann::json& JsonField::raw() const {
  if (!v_) fail_expected("a value");
  return *v_;
}

void JsonField::fail_expected(std::string_view expected) const {
  if (!v_) ::tr::fail("{}: missing field '{}' ({})", *file_, path_, expected);
  if (path_.empty()) ::tr::fail("{}: must be {}, got {}", *file_, expected, describe_json(*v_));
  ::tr::fail("{}: field '{}' must be {}, got {}", *file_, path_, expected, describe_json(*v_));
}

void JsonField::fail_message(const std::string& message) const {
  if (path_.empty()) ::tr::fail("{}: {}", *file_, message);
  ::tr::fail("{}: field '{}' {}", *file_, path_, message);
}

JsonField JsonField::operator[](std::string_view key) const {
  object();
  const auto it = v_->find(std::string(key));
  return JsonField(it == v_->end() ? nullptr : &*it, file_, child_path(path_, key));
}

JsonField JsonField::operator[](size_t index) const {
  array();
  return JsonField(index < v_->size() ? &(*v_)[index] : nullptr, file_, fmt::format("{}[{}]", path_, index));
}

size_t JsonField::size() const {
  if (!v_ || !(v_->is_object() || v_->is_array())) fail_expected("an object or an array");
  return v_->size();
}

void JsonField::each_member(const std::function<void(const std::string&, const JsonField&)>& fn) const {
  object();
  for (auto it = v_->begin(); it != v_->end(); ++it)
    fn(it.key(), JsonField(&it.value(), file_, child_path(path_, it.key())));
}

void JsonField::each_element(const std::function<void(const JsonField&)>& fn) const {
  array();
  for (size_t i = 0; i < v_->size(); ++i) fn(JsonField(&(*v_)[i], file_, fmt::format("{}[{}]", path_, i)));
}

int64_t JsonField::integer(int64_t lo, int64_t hi) const {
  const std::string expected = fmt::format("an integer in [{}, {}]", bound_str(lo), bound_str(hi));
  const auto x = v_ ? exact_int(*v_) : std::nullopt;
  if (!x) fail_expected(expected);
  if (*x >= lo && *x <= hi) return *x;
  if (lo == 1 && *x < 1) fail("must be positive ({}), got {}", expected, *x);
  if (lo == 0 && *x < 0) fail("must not be negative ({}), got {}", expected, *x);
  fail_expected(expected);
}

uint64_t JsonField::unsigned_integer(uint64_t hi) const {
  const std::string expected = fmt::format("an integer in [0, {}]", bound_str(hi));
  if (v_ && v_->is_number_unsigned() && v_->get<uint64_t>() <= hi) return v_->get<uint64_t>();
  const auto x = v_ && !v_->is_number_unsigned() ? exact_int(*v_) : std::nullopt;
  if (x && *x >= 0 && static_cast<uint64_t>(*x) <= hi) return static_cast<uint64_t>(*x);
  if (x && *x < 0) fail("must not be negative ({}), got {}", expected, *x);
  fail_expected(expected);
}

double JsonField::number(double lo, double hi, Bounds b) const {
  const bool open_lo = b == Bounds::open_low || b == Bounds::open;
  const bool open_hi = b == Bounds::open_high || b == Bounds::open;
  std::string expected;
  if (std::isinf(hi) && std::isinf(lo))
    expected = "a finite number";
  else if (std::isinf(hi))
    expected = fmt::format("a finite number {} {}", open_lo ? ">" : ">=", lo);
  else
    expected = fmt::format("a number in {}{}, {}{}", open_lo ? "(" : "[", lo, hi, open_hi ? ")" : "]");
  if (!v_ || !v_->is_number()) fail_expected(expected);
  const double x = v_->get<double>();
  const bool ok = std::isfinite(x) && (open_lo ? x > lo : x >= lo) && (open_hi ? x < hi : x <= hi);
  if (!ok) fail_expected(expected);
  return x;
}

bool JsonField::boolean() const {
  if (!v_ || !v_->is_boolean()) fail_expected("true or false");
  return v_->get<bool>();
}

std::string JsonField::string() const {
  if (!v_ || !v_->is_string()) fail_expected("a string");
  return v_->get<std::string>();
}

std::string JsonField::one_of(std::initializer_list<std::string_view> allowed) const {
  if (!v_ || !v_->is_string()) fail_expected(fmt::format("one of {}", join(allowed)));
  const std::string s = v_->get<std::string>();
  for (auto a : allowed)
    if (s == a) return s;
  const std::vector<std::string> names(allowed.begin(), allowed.end());
  ::tr::fail("{}: {} '{}' is not supported (one of {}){}", *file_, path_, shorten(s), join(allowed),
             did_you_mean(s, names));
}

const JsonField& JsonField::object() const {
  if (!v_ || !v_->is_object()) fail_expected("an object");
  return *this;
}

const JsonField& JsonField::array() const {
  if (!v_ || !v_->is_array()) fail_expected("an array");
  return *this;
}

int64_t JsonField::integer_or(int64_t def, int64_t lo, int64_t hi) const {
  return present() ? integer(lo, hi) : def;
}

double JsonField::number_or(double def, double lo, double hi, Bounds bounds) const {
  return present() ? number(lo, hi, bounds) : def;
}

bool JsonField::boolean_or(bool def) const { return present() ? boolean() : def; }

std::string JsonField::string_or(const std::string& def) const { return present() ? string() : def; }

std::string JsonField::one_of_or(const std::string& def,
                                 std::initializer_list<std::string_view> allowed) const {
  return present() ? one_of(allowed) : def;
}

}  // namespace tr
