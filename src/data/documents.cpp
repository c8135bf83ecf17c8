// Data files as documents; see documents.h.
#include "data/documents.h"

#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <streambuf>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizers/unicode.h"

namespace tr::data {

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The name without a compression suffix: what decides the format.
std::string base_name(const std::string& name) {
  for (std::string_view z : {".gz", ".zst"})
    if (ends_with(name, z)) return name.substr(0, name.size() - z.size());
  return name;
}

enum class Format { text, json, jsonl, csv, tsv };

Format format_of(const std::string& name) {
  const std::string b = base_name(name);
  if (ends_with(b, ".jsonl")) return Format::jsonl;
  if (ends_with(b, ".json")) return Format::json;
  if (ends_with(b, ".csv")) return Format::csv;
  if (ends_with(b, ".tsv")) return Format::tsv;
  return Format::text;
}

// `where` names the line already (a JSON line), or `whole` says the text is a whole file whose line is found.
void check_utf8(std::string_view text, const std::string& where, bool whole = false) {
  const size_t bad = tokenizers::first_invalid_utf8(text);
  if (bad == std::string_view::npos) return;
  if (!whole) fail("{}: invalid UTF-8 at byte {} of the line", where, bad);
  const int64_t line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(bad), '\n');
  fail("{}:{}: invalid UTF-8 (byte offset {} of the file)", where, line, bad);
}

std::string line_of(const std::string& name, int64_t line) { return fmt::format("{}:{}", name, line); }

// The column a table's documents come from, given its columns in order.
std::string pick_column(const std::vector<std::string>& columns, const DocumentOptions& o,
                        const std::string& where) {
  auto has = [&](const std::string& c) {
    return std::find(columns.begin(), columns.end(), c) != columns.end();
  };
  const std::string list = fmt::format("{}", fmt::join(columns, ", "));
  if (!o.text_column.empty()) {
    TR_CHECK(has(o.text_column), "{}: no column '{}' (--text_column_name); the columns are {}", where,
             o.text_column, list);
    return o.text_column;
  }
  if (has("text")) return "text";
  TR_CHECK(!columns.empty(), "{}: the table has no columns", where);
  return columns.front();
}

// Objects keep their keys in file order: "the first column" is the file's first, as run_clm's.
using Json = nlohmann::ordered_json;

// One JSON row's document.
std::string json_row_text(const Json& row, std::string& column, const DocumentOptions& o,
                          const std::string& where) {
  TR_CHECK(row.is_object(), "{}: expected a JSON object per row, got {}", where, row.type_name());
  if (column.empty()) {
    std::vector<std::string> cols;
    for (auto it = row.begin(); it != row.end(); ++it) cols.push_back(it.key());
    if (o.text_column.empty() && !row.contains("text"))  // the first column holding a string
      for (auto it = row.begin(); it != row.end(); ++it)
        if (it->is_string()) {
          cols.insert(cols.begin(), it.key());
          break;
        }
    column = pick_column(cols, o, where);
  }
  const auto it = row.find(column);
  TR_CHECK(it != row.end(), "{}: the row has no field '{}'", where, column);
  TR_CHECK(it->is_string(), "{}: field '{}' is {}, expected a string", where, column, it->type_name());
  return it->get<std::string>();
}

// One JSON line's document into `out`; false for a blank line. `column` carries the file's text column.
bool json_line(std::string_view l, int64_t line, const std::string& name, std::string& column,
               const DocumentOptions& o, std::string& out) {
  if (l.find_first_not_of(" \t\r") == std::string_view::npos) return false;  // blank lines
  const std::string where = line_of(name, line);
  check_utf8(l, where);
  const auto j = Json::parse(l, nullptr, /*allow_exceptions=*/false);
  TR_CHECK(!j.is_discarded(), "{}: not a JSON value (one JSON object per line is expected)", where);
  out = json_row_text(j, column, o, where);
  return true;
}

std::vector<std::string> json_lines(std::string_view bytes, const std::string& name,
                                    const DocumentOptions& o) {
  std::vector<std::string> docs;
  std::string column, doc;
  int64_t line = 0;
  for (size_t at = 0; at < bytes.size();) {
    size_t end = bytes.find('\n', at);
    if (end == std::string_view::npos) end = bytes.size();
    const std::string_view l = bytes.substr(at, end - at);
    at = end + 1;
    if (json_line(l, ++line, name, column, o, doc)) docs.push_back(std::move(doc));
  }
  return docs;
}

// A JSON array's rows one at a time (nlohmann's SAX events build each element, the rest of the array is never
// held): fn(text) per element, after json_row_text. Any istream: a file's decompressed bytes, or memory.
class JsonArrayRows final : public nlohmann::json_sax<Json> {
 public:
  using Fn = std::function<void(std::string&&)>;
  JsonArrayRows(std::string name, const DocumentOptions& o, Fn fn)
      : name_(std::move(name)), o_(o), fn_(std::move(fn)) {}
  void run(std::istream& in) {
    Json::sax_parse(in, this);
    TR_CHECK(depth_ == 0 && started_, "{}: not valid JSON (the array is not closed)", name_);
  }
  bool null() override { return value(nullptr); }
  bool boolean(bool v) override { return value(v); }
  bool number_integer(number_integer_t v) override { return value(v); }
  bool number_unsigned(number_unsigned_t v) override { return value(v); }
  bool number_float(number_float_t v, const string_t&) override { return value(v); }
  bool string(string_t& v) override { return value(std::move(v)); }
  bool binary(binary_t& v) override { return value(Json::binary(std::move(v))); }
  bool start_object(std::size_t) override { return open(Json::object()); }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override {
    if (depth_ == 0) {  // the top-level array itself
      TR_CHECK(!started_, "{}: more than one JSON value", name_);
      started_ = true;
      ++depth_;
      return true;
    }
    return open(Json::array());
  }
  bool end_array() override {
    if (depth_ == 1) {
      --depth_;
      return true;
    }
    return close();
  }
  bool parse_error(std::size_t at, const std::string&, const nlohmann::detail::exception& e) override {
    fail("{}: not valid JSON at byte {}: {}", name_, at, e.what());
  }

 private:
  // A value where the element tree wants one: the element itself at depth 1, else inside its parent.
  bool value(Json v) {
    TR_CHECK(depth_ > 0, "{}: expected an array of objects (or one object per line), got {}", name_,
             v.type_name());
    if (stack_.empty()) return row(std::move(v));
    Json& top = *stack_.back();
    if (top.is_object())
      top[key_] = std::move(v);
    else
      top.push_back(std::move(v));
    return true;
  }
  bool open(Json v) {
    TR_CHECK(depth_ > 0, "{}: expected an array of objects (or one object per line), got {}", name_,
             v.type_name());
    if (stack_.empty()) {
      element_ = std::move(v);
      stack_.push_back(&element_);
    } else {
      Json& top = *stack_.back();
      Json* child =
          top.is_object() ? &(top[key_] = std::move(v)) : &(top.push_back(std::move(v)), top.back());
      stack_.push_back(child);
    }
    ++depth_;
    return true;
  }
  bool close() {
    stack_.pop_back();
    --depth_;
    if (stack_.empty()) return row(std::move(element_));
    return true;
  }
  bool row(Json v) {
    fn_(json_row_text(v, column_, o_, fmt::format("{}: element {}", name_, index_++)));
    return true;
  }

  std::string name_;
  const DocumentOptions& o_;
  Fn fn_;
  Json element_;
  std::vector<Json*> stack_;  // the element's open objects and arrays
  std::string key_, column_;
  int64_t depth_ = 0, index_ = 0;
  bool started_ = false;
};

// A read-only stream over memory (the whole-file path of the streaming readers).
class MemoryBuf final : public std::streambuf {
 public:
  explicit MemoryBuf(std::string_view s) {
    char* p = const_cast<char*>(s.data());
    setg(p, p, p + s.size());
  }
};

std::vector<std::string> json_array(std::string_view bytes, const std::string& name,
                                    const DocumentOptions& o) {
  std::vector<std::string> docs;
  MemoryBuf buf(bytes);
  std::istream in(&buf);
  JsonArrayRows(name, o, [&](std::string&& d) { docs.push_back(std::move(d)); }).run(in);
  return docs;
}

// RFC 4180 records fed a chunk at a time: fields split at `sep`, a quoted field may hold separators, "" and
// line breaks; a record ends at an unquoted line break (\n or \r\n). Each complete record goes to
// fn(line it starts on, fields) with its fields checked as UTF-8; what a chunk leaves open (a field, a
// record) waits for the next. A byte-order mark at the start is skipped.
class CsvRecords {
 public:
  using Fn = std::function<void(int64_t, std::vector<std::string>&)>;
  CsvRecords(char sep, std::string name, Fn fn) : sep_(sep), name_(std::move(name)), fn_(std::move(fn)) {}
  // Consumes what of `s` can be decided now (all of it when `last`); returns the bytes consumed.
  size_t feed(std::string_view s, bool last) {
    size_t i = 0;
    if (first_) {
      if (!last && s.size() < 3) return 0;
      if (s.substr(0, 3) == "\xEF\xBB\xBF") i = 3;  // a spreadsheet's byte-order mark
      first_ = false;
    }
    for (; i < s.size(); ++i) {
      const char c = s[i];
      // A quote or a carriage return decides with the next byte: kept for the next chunk.
      if (!last && i + 1 == s.size() && (c == '"' || c == '\r')) return i;
      if (quoted_) {
        if (c == '"') {
          if (i + 1 < s.size() && s[i + 1] == '"') {
            field_ += '"';
            ++i;
          } else {
            quoted_ = false;
            after_quote_ = true;
          }
        } else {
          if (c == '\n') ++line_;
          field_ += c;
        }
        continue;
      }
      if (c == sep_) {
        end_field();
        any_ = true;
      } else if (c == '\n' || (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n')) {
        if (c == '\r') ++i;
        end_record();
        ++line_;
        rec_line_ = line_;
      } else if (c == '"' && field_.empty() && !after_quote_) {
        quoted_ = true;
        quote_line_ = line_;
        any_ = true;
      } else {
        TR_CHECK(!after_quote_,
                 "{}: text after a closing quote (a quote inside a field must be written \"\")",
                 line_of(name_, line_));
        field_ += c;
        any_ = true;
      }
    }
    if (last) {
      TR_CHECK(!quoted_, "{}: a quoted field opened on line {} is never closed", name_, quote_line_);
      if (any_ || !field_.empty() || !rec_.empty()) end_record();
    }
    return s.size();
  }

 private:
  void end_field() {
    rec_.push_back(std::move(field_));
    field_.clear();
    after_quote_ = false;
  }
  void end_record() {
    end_field();
    if (!(rec_.size() == 1 && rec_[0].empty() && !any_)) {  // not a blank line
      for (const auto& f : rec_) check_utf8(f, line_of(name_, rec_line_));
      fn_(rec_line_, rec_);
    }
    rec_.clear();
    any_ = false;
  }

  char sep_;
  std::string name_;
  Fn fn_;
  std::vector<std::string> rec_;
  std::string field_;
  int64_t line_ = 1, rec_line_ = 1, quote_line_ = 0;
  bool quoted_ = false, after_quote_ = false, any_ = false, first_ = true;
};

// A table's documents, record by record: the header picks the column, every record must have its fields.
class TableRows {
 public:
  TableRows(char sep, const std::string& name, const DocumentOptions& o,
            std::function<void(std::string&&)> fn)
      : name_(name),
        o_(o),
        fn_(std::move(fn)),
        csv_(sep, name, [this](int64_t line, std::vector<std::string>& f) { record(line, f); }) {}
  size_t feed(std::string_view s, bool last) {
    const size_t n = csv_.feed(s, last);
    if (last) TR_CHECK(!header_.empty(), "{}: no header row", name_);
    return n;
  }

 private:
  void record(int64_t line, std::vector<std::string>& fields) {
    if (header_.empty()) {
      header_ = fields;
      const std::string column = pick_column(header_, o_, line_of(name_, 1));
      k_ = static_cast<size_t>(std::find(header_.begin(), header_.end(), column) - header_.begin());
      return;
    }
    TR_CHECK(fields.size() == header_.size(), "{}: {} fields, the header has {}", line_of(name_, line),
             fields.size(), header_.size());
    fn_(std::move(fields[k_]));
  }

  std::string name_;
  const DocumentOptions& o_;
  std::function<void(std::string&&)> fn_;
  std::vector<std::string> header_;
  size_t k_ = 0;
  CsvRecords csv_;
};

std::vector<std::string> table(std::string_view bytes, char sep, const std::string& name,
                               const DocumentOptions& o) {
  std::vector<std::string> docs;
  TableRows(sep, name, o, [&](std::string&& d) { docs.push_back(std::move(d)); }).feed(bytes, true);
  return docs;
}

std::string gunzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  TR_CHECK(f != nullptr, "{}: cannot open", path);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      int code = 0;
      const std::string why = gzerror(f, &code);
      gzclose(f);
      fail("{}: not a readable gzip file ({})", path, why);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  int code = Z_OK;
  gzerror(f, &code);
  const bool plain = gzdirect(f) == 1;  // zlib passes data that is not gzip through as it is
  gzclose(f);
  TR_CHECK(!plain, "{}: not a gzip file (a .gz name, but no gzip header)", path);
  TR_CHECK(code != Z_BUF_ERROR, "{}: the gzip stream is cut short", path);
  return out;
}

std::string unzstd(const std::string& path, const std::string& packed) {
  ZSTD_DCtx* d = ZSTD_createDCtx();
  std::string out;
  std::vector<char> buf(ZSTD_DStreamOutSize());
  ZSTD_inBuffer in{packed.data(), packed.size(), 0};
  size_t last = 0;
  while (in.pos < in.size) {
    ZSTD_outBuffer o{buf.data(), buf.size(), 0};
    last = ZSTD_decompressStream(d, &o, &in);
    if (ZSTD_isError(last)) {
      const std::string why = ZSTD_getErrorName(last);
      ZSTD_freeDCtx(d);
      fail("{}: not a readable zstd file ({})", path, why);
    }
    out.append(buf.data(), o.pos);
  }
  ZSTD_freeDCtx(d);
  TR_CHECK(last == 0, "{}: the zstd stream is cut short", path);
  return out;
}

// A file's decompressed bytes a chunk at a time (plain, gzip or zstd), and how much of the file on disk has
// been read (progress).
class ByteSource {
 public:
  explicit ByteSource(const std::string& path) : path_(path) {
    if (ends_with(path, ".gz")) {
      gz_ = gzopen(path.c_str(), "rb");
      TR_CHECK(gz_ != nullptr, "{}: cannot open", path);
      // Before any work (zlib reads the header to answer): a .gz name without a gzip stream is refused.
      TR_CHECK(gzdirect(gz_) != 1, "{}: not a gzip file (a .gz name, but no gzip header)", path);
      return;
    }
    in_.open(path, std::ios::binary);
    TR_CHECK(in_.is_open(), "{}: cannot open", path);
    if (ends_with(path, ".zst")) {
      zst_ = ZSTD_createDCtx();
      packed_.resize(ZSTD_DStreamInSize());
    }
  }
  ~ByteSource() {
    if (gz_ != nullptr) gzclose(gz_);
    if (zst_ != nullptr) ZSTD_freeDCtx(zst_);
  }
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  // Appends about `max` more bytes to `out`; false once the file is done (and checked whole).
  bool read(std::string& out, size_t max) {
    const size_t at = out.size();
    out.resize(at + max);
    size_t got = 0;
    if (gz_ != nullptr) {
      got = read_gz(out.data() + at, max);
    } else if (zst_ != nullptr) {
      got = read_zst(out.data() + at, max);
    } else {
      in_.read(out.data() + at, static_cast<std::streamsize>(max));
      got = static_cast<size_t>(in_.gcount());
      consumed_ += static_cast<int64_t>(got);
    }
    out.resize(at + got);
    return got > 0;
  }
  int64_t consumed() const { return gz_ != nullptr ? static_cast<int64_t>(gzoffset(gz_)) : consumed_; }

 private:
  size_t read_gz(char* dst, size_t max) {
    const int n = gzread(gz_, dst, static_cast<unsigned>(std::min<size_t>(max, 1u << 30)));
    if (n < 0) {
      int code = 0;
      fail("{}: not a readable gzip file ({})", path_, gzerror(gz_, &code));
    }
    if (n == 0) {  // the end: the same checks as reading it whole
      int code = Z_OK;
      gzerror(gz_, &code);
      TR_CHECK(gzdirect(gz_) != 1, "{}: not a gzip file (a .gz name, but no gzip header)", path_);
      TR_CHECK(code != Z_BUF_ERROR, "{}: the gzip stream is cut short", path_);
    }
    return static_cast<size_t>(std::max(n, 0));
  }
  size_t read_zst(char* dst, size_t max) {
    ZSTD_outBuffer o{dst, max, 0};
    while (o.pos == 0) {
      if (zin_.pos == zin_.size) {
        in_.read(packed_.data(), static_cast<std::streamsize>(packed_.size()));
        const size_t n = static_cast<size_t>(in_.gcount());
        consumed_ += static_cast<int64_t>(n);
        if (n == 0) {
          TR_CHECK(last_ == 0, "{}: the zstd stream is cut short", path_);
          return 0;
        }
        zin_ = {packed_.data(), n, 0};
      }
      last_ = ZSTD_decompressStream(zst_, &o, &zin_);
      TR_CHECK(!ZSTD_isError(last_), "{}: not a readable zstd file ({})", path_, ZSTD_getErrorName(last_));
    }
    return o.pos;
  }

  std::string path_;
  std::ifstream in_;
  gzFile gz_ = nullptr;
  ZSTD_DCtx* zst_ = nullptr;
  std::vector<char> packed_;
  ZSTD_inBuffer zin_{nullptr, 0, 0};
  size_t last_ = 0;
  int64_t consumed_ = 0;
};

}  // namespace

namespace {

// Whether a .json file holds JSON lines (HF's Dataset.to_json writes them) rather than one array: its first
// non-blank byte is not '['.
bool json_file_holds_lines(const std::string& path) {
  ByteSource src(path);
  std::string head;
  while (src.read(head, 4096)) {
    const size_t first = head.find_first_not_of(" \t\r\n");
    if (first != std::string::npos) return head[first] != '[';
    head.clear();
  }
  return true;
}

}  // namespace

namespace {

// A ByteSource as an istream (nlohmann's SAX parser reads the JSON array through it).
class SourceBuf final : public std::streambuf {
 public:
  explicit SourceBuf(ByteSource& src) : src_(src) {}

 private:
  int_type underflow() override {
    buf_.clear();
    if (!src_.read(buf_, size_t{1} << 20)) return traits_type::eof();
    setg(buf_.data(), buf_.data(), buf_.data() + buf_.size());
    return traits_type::to_int_type(buf_[0]);
  }
  ByteSource& src_;
  std::string buf_;
};

}  // namespace

void for_each_document(const std::string& path, const DocumentOptions& o, const DocumentFn& fn) {
  const Format f = format_of(path);
  if (f == Format::text) {  // a text is one document
    auto docs = read_documents(path, o);
    const auto size = static_cast<int64_t>(std::filesystem::file_size(path));
    for (auto& d : docs) fn(std::move(d), size);
    return;
  }
  if (f == Format::json && !json_file_holds_lines(path)) {  // one array: element by element
    ByteSource src(path);
    SourceBuf sb(src);
    std::istream in(&sb);
    JsonArrayRows(path, o, [&](std::string&& d) { fn(std::move(d), src.consumed()); }).run(in);
    return;
  }
  if (f == Format::csv || f == Format::tsv) {  // record by record, a chunk at a time
    ByteSource src(path);
    TableRows rows(f == Format::csv ? ',' : '\t', path, o,
                   [&](std::string&& d) { fn(std::move(d), src.consumed()); });
    std::string buf;
    for (bool more = true; more;) {
      more = src.read(buf, size_t{8} << 20);
      buf.erase(0, rows.feed(buf, !more));
    }
    return;
  }
  ByteSource src(path);
  std::string buf, column, doc;
  size_t at = 0, scan = 0;  // the current line's start; where its '\n' is still to be looked for
  int64_t line = 0;
  bool more = true;
  while (at < buf.size() || more) {
    size_t end = buf.find('\n', scan);
    if (end == std::string::npos && more) {  // the line continues in the next chunk
      buf.erase(0, at);
      at = 0;
      scan = buf.size();
      more = src.read(buf, size_t{8} << 20);
      continue;
    }
    if (end == std::string::npos) end = buf.size();
    const std::string_view l(buf.data() + at, end - at);
    at = scan = end + 1;
    if (json_line(l, ++line, path, column, o, doc)) fn(std::move(doc), src.consumed());
  }
}

bool is_table_file(const std::string& path) { return format_of(path) != Format::text; }

std::vector<std::string> parse_documents(std::string_view bytes, const std::string& name,
                                         const DocumentOptions& o) {
  switch (format_of(name)) {
    case Format::jsonl: return json_lines(bytes, name, o);
    case Format::json: {
      const size_t first = bytes.find_first_not_of(" \t\r\n");
      if (first != std::string_view::npos && bytes[first] == '[') return json_array(bytes, name, o);
      return json_lines(bytes, name, o);  // HF's json loader reads JSON lines from .json too
    }
    case Format::csv: return table(bytes, ',', name, o);
    case Format::tsv: return table(bytes, '\t', name, o);
    case Format::text: break;
  }
  check_utf8(bytes, name, true);
  return {std::string(bytes)};
}

std::vector<std::string> read_documents(const std::string& path, const DocumentOptions& o) {
  std::string bytes;
  if (ends_with(path, ".gz")) {
    bytes = gunzip(path);
  } else {
    std::ifstream in(path, std::ios::binary);
    TR_CHECK(in.is_open(), "{}: cannot open", path);
    std::stringstream ss;
    ss << in.rdbuf();
    bytes = ss.str();
    if (ends_with(path, ".zst")) bytes = unzstd(path, bytes);
  }
  return parse_documents(bytes, path, o);
}

}  // namespace tr::data
