// Typed, range-checked reading of JSON that came from a file: every error names the file, the field's path,
// what was expected and what was found, so no library exception text (nlohmann's) ever reaches a user.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tr {

// Largest counter a file may hold (steps, data positions, token counts): exact in a double, so a value
// written by Python reads back unchanged, and far from int64 overflow in sums and products with small
// factors.
inline constexpr int64_t kMaxJsonCounter = int64_t{1} << 53;

// Deepest nesting of arrays and objects a JSON file may have (real files: under 10).
inline constexpr size_t kMaxJsonDepth = 256;

// Reads and parses the JSON file at `path`. Throws tr::Error naming the file when it cannot be read or is
// not JSON (with the line and column of the syntax error), or nests deeper than kMaxJsonDepth.
nlohmann::json read_json(const std::string& path);
// Parses `text` read from `source` (used in errors only); `what` says what a parse failure means there.
nlohmann::json parse_json(std::string_view text, const std::string& source,
                          std::string_view what = "not valid JSON");

// Which ends of a number's range are excluded.
enum class Bounds { closed, open_low, open_high, open };

// One value inside a JSON document read from `file`, at `path` ("data_position.batch",
// "added_tokens[3].id"; empty for the whole document). It may be missing (a member that does not exist).
// A view: the document and the file name must outlive it.
class JsonField {
 public:
  // The whole document.
  JsonField(const nlohmann::json& document, const std::string& file);

  bool exists() const { return v_ != nullptr; }
  // Exists and is not null: HF writes null for an unset optional field.
  bool present() const { return v_ != nullptr && !v_->is_null(); }
  const std::string& file() const { return *file_; }
  const std::string& path() const { return path_; }
  // The value as parsed, for keeping a validated piece as it is; fails when missing.
  const nlohmann::json& raw() const;

  // A member (this must be an object; the member may be missing) or an element (this must be an array).
  JsonField operator[](std::string_view key) const;
  JsonField operator[](size_t index) const;
  // Members of an object or elements of an array (this must be one of them).
  size_t size() const;
  // Calls fn(key, member) for each member of an object / fn(element) for each element of an array.
  void each_member(const std::function<void(const std::string&, const JsonField&)>& fn) const;
  void each_element(const std::function<void(const JsonField&)>& fn) const;

  // Typed getters: they fail unless the field is present, of the type and inside the range. Integers also
  // accept an integral float (3.0) up to 2^53; numbers must be finite.
  int64_t integer(int64_t lo, int64_t hi) const;
  uint64_t unsigned_integer(uint64_t hi = std::numeric_limits<uint64_t>::max()) const;
  double number(double lo, double hi, Bounds bounds = Bounds::closed) const;
  bool boolean() const;
  std::string string() const;
  std::string one_of(std::initializer_list<std::string_view> allowed) const;
  const JsonField& object() const;  // checks, and returns *this for chaining
  const JsonField& array() const;

  // The same, with a default when the field is missing or null.
  int64_t integer_or(int64_t def, int64_t lo, int64_t hi) const;
  double number_or(double def, double lo, double hi, Bounds bounds = Bounds::closed) const;
  bool boolean_or(bool def) const;
  std::string string_or(const std::string& def) const;
  std::string one_of_or(const std::string& def, std::initializer_list<std::string_view> allowed) const;

  // "{file}: field '{path}' must be {expected}, got {what is there}" ("missing field" when missing).
  [[noreturn]] void fail_expected(std::string_view expected) const;
  // "{file}: field '{path}' {message}", for checks beyond type and range (duplicates, contradictions).
  template <typename... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) const {
    fail_message(fmt::format(f, std::forward<Args>(args)...));
  }

 private:
  JsonField(const nlohmann::json* v, const std::string* file, std::string path)
      : v_(v), file_(file), path_(std::move(path)) {}
  [[noreturn]] void fail_message(const std::string& message) const;

  const nlohmann::json* v_;  // nullptr: missing
  const std::string* file_;
  std::string path_;
};

// What a JSON value is, for messages: "an array", "a string \"ten\"", "-1", "null". Never longer than about
// 60 characters, whatever the value.
std::string describe_json(const nlohmann::json& v);

}  // namespace tr
