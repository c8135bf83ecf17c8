// Data files as documents; see documents.h.
#include "data/documents.h"

#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

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
  std::string list;
  for (const auto& c : columns) list += (list.empty() ? "" : ", ") + c;
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

std::vector<std::string> json_array(std::string_view bytes, const std::string& name,
                                    const DocumentOptions& o) {
  check_utf8(bytes, name, true);
  const auto j = Json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  TR_CHECK(!j.is_discarded(), "{}: not valid JSON", name);
  TR_CHECK(j.is_array(), "{}: expected an array of objects (or one object per line), got {}", name,
           j.type_name());
  std::vector<std::string> docs;
  std::string column;
  for (size_t i = 0; i < j.size(); ++i)
    docs.push_back(json_row_text(j[i], column, o, fmt::format("{}: element {}", name, i)));
  return docs;
}

// RFC 4180 records: fields split at `sep`, a quoted field may hold separators, "" and line breaks; a record
// ends at an unquoted line break (\n or \r\n). Each record comes with the line it starts on.
std::vector<std::pair<int64_t, std::vector<std::string>>> csv_records(std::string_view s, char sep,
                                                                      const std::string& name) {
  std::vector<std::pair<int64_t, std::vector<std::string>>> out;
  std::vector<std::string> rec;
  std::string field;
  int64_t line = 1, rec_line = 1, quote_line = 0;
  bool quoted = false, after_quote = false, any = false;
  auto end_field = [&] {
    rec.push_back(std::move(field));
    field.clear();
    after_quote = false;
  };
  auto end_record = [&] {
    end_field();
    if (!(rec.size() == 1 && rec[0].empty() && !any))
      out.emplace_back(rec_line, std::move(rec));  // blank line
    rec.clear();
    any = false;
  };
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quoted) {
      if (c == '"') {
        if (i + 1 < s.size() && s[i + 1] == '"') {
          field += '"';
          ++i;
        } else {
          quoted = false;
          after_quote = true;
        }
      } else {
        if (c == '\n') ++line;
        field += c;
      }
      continue;
    }
    if (c == sep) {
      end_field();
      any = true;
    } else if (c == '\n' || (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n')) {
      if (c == '\r') ++i;
      end_record();
      ++line;
      rec_line = line;
    } else if (c == '"' && field.empty() && !after_quote) {
      quoted = true;
      quote_line = line;
      any = true;
    } else {
      TR_CHECK(!after_quote, "{}: text after a closing quote (a quote inside a field must be written \"\")",
               line_of(name, line));
      field += c;
      any = true;
    }
  }
  TR_CHECK(!quoted, "{}: a quoted field opened on line {} is never closed", name, quote_line);
  if (any || !field.empty() || !rec.empty()) end_record();
  return out;
}

std::vector<std::string> table(std::string_view bytes, char sep, const std::string& name,
                               const DocumentOptions& o) {
  if (bytes.substr(0, 3) == "\xEF\xBB\xBF") bytes.remove_prefix(3);  // a spreadsheet's byte-order mark
  check_utf8(bytes, name, true);
  const auto recs = csv_records(bytes, sep, name);
  TR_CHECK(!recs.empty(), "{}: no header row", name);
  const std::vector<std::string>& header = recs.front().second;
  const std::string column = pick_column(header, o, line_of(name, 1));
  const size_t k = static_cast<size_t>(std::find(header.begin(), header.end(), column) - header.begin());
  std::vector<std::string> docs;
  for (size_t r = 1; r < recs.size(); ++r) {
    const auto& [line, fields] = recs[r];
    TR_CHECK(fields.size() == header.size(), "{}: {} fields, the header has {}", line_of(name, line),
             fields.size(), header.size());
    docs.push_back(fields[k]);
  }
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

void for_each_document(const std::string& path, const DocumentOptions& o, const DocumentFn& fn) {
  const Format f = format_of(path);
  if (f != Format::jsonl && !(f == Format::json && json_file_holds_lines(path))) {
    // Read whole: a text is one document, a table or a JSON array is parsed whole.
    auto docs = read_documents(path, o);
    const auto size = static_cast<int64_t>(std::filesystem::file_size(path));
    for (auto& d : docs) fn(std::move(d), size);
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
