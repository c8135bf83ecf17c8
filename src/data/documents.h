// The data files run_clm users bring, read as documents: .txt (the whole file is one document), .json /
// .jsonl (one JSON object per line, or one JSON array of objects), .csv / .tsv (RFC 4180: a header row,
// quoted fields with "" escapes and line breaks inside), each also compressed as .gz (zlib) or .zst (zstd). A
// structured file's document is the `text_column` of each row, else its "text" column, else its first
// column (run_clm's rule; for JSON the first column holding a string, where run_clm would fail on an id). Bad
// input is an error naming the file, the line and the field; every document is checked to be UTF-8.
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tr::data {

struct DocumentOptions {
  std::string text_column;  // empty: "text", else the first column
};

// The documents of the file at `path` (its name's extension decides the format).
std::vector<std::string> read_documents(const std::string& path, const DocumentOptions& o = {});

// The documents of `bytes` (already decompressed), in the format `name`'s extension names (.gz/.zst are
// stripped first); `name` also labels the errors. What read_documents does after reading the file.
std::vector<std::string> parse_documents(std::string_view bytes, const std::string& name,
                                         const DocumentOptions& o = {});

// Each document of `path` in order, with how many bytes of the file (on disk) are read so far. JSON lines
// (.jsonl, and .json files that hold lines rather than an array; also .gz/.zst) stream through a chunk at a
// time, so a file of any size needs only a chunk of memory; other formats are read whole (a .txt file is one
// document). Errors as read_documents'.
using DocumentFn = std::function<void(std::string&& document, int64_t file_bytes_read)>;
void for_each_document(const std::string& path, const DocumentOptions& o, const DocumentFn& fn);

// Whether read_documents reads `path` as rows of a table (json, jsonl, csv, tsv) rather than one text.
bool is_table_file(const std::string& path);

}  // namespace tr::data
