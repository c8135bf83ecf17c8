// Data files as documents (data/documents.h): each format's rows and column choice, RFC 4180 quoting,
// compression, and the bad inputs' messages (file, line, field).
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/documents.h"

namespace {

using tr::data::DocumentOptions;
using tr::data::parse_documents;
using Docs = std::vector<std::string>;

struct Case {
  std::string name, bytes, column;
  Docs want;
};

TEST(Documents, EachFormatYieldsItsRows) {
  const std::vector<Case> cases{
      {"a.txt", "Call me Ishmael.\nSome years ago", "", {"Call me Ishmael.\nSome years ago"}},
      {"a.jsonl", "{\"text\": \"one\"}\n\n{\"text\": \"two\", \"id\": 2}\r\n", "", {"one", "two"}},
      {"a.jsonl",
       "{\"id\": 1, \"body\": \"first string column\"}\n{\"id\": 2, \"body\": \"b\"}",
       "",
       {"first string column", "b"}},
      {"a.jsonl", "{\"title\": \"t\", \"body\": \"x\"}", "body", {"x"}},
      {"a.jsonl", "{\"title\": \"first in the file\", \"body\": \"x\"}", "", {"first in the file"}},
      {"a.json", "[{\"text\": \"x\"}, {\"text\": \"y\\nz\"}]", "", {"x", "y\nz"}},
      {"a.json", "{\"text\": \"json lines in a .json file\"}\n", "", {"json lines in a .json file"}},
      {"a.csv",
       "id,text\n1,hello\n2,\"quoted, with comma\"\n3,\"two\nlines and \"\"quotes\"\"\"\n",
       "",
       {"hello", "quoted, with comma", "two\nlines and \"quotes\""}},
      {"a.csv", "\xEF\xBB\xBFtitle,body\r\nT,\"B\"\r\n", "", {"T"}},  // no text column: the first
      {"a.csv", "title,body\nT,B\n", "body", {"B"}},
      {"a.csv", "text\n\"\"\n", "", {""}},
      {"a.tsv", "text\tlabel\nwith, commas\t1\n\"tab\tinside\"\t0\n", "", {"with, commas", "tab\tinside"}},
      {"a.jsonl.gz", "{\"text\": \"after decompression\"}", "", {"after decompression"}},
  };
  for (const auto& c : cases)
    EXPECT_EQ(parse_documents(c.bytes, c.name, DocumentOptions{c.column}), c.want)
        << c.name << ": " << c.bytes;
}

std::string error_of(const std::string& name, const std::string& bytes, const std::string& column = "") {
  try {
    parse_documents(bytes, name, DocumentOptions{column});
  } catch (const tr::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Documents, BadInputNamesTheFileLineAndField) {
  const std::vector<std::tuple<std::string, std::string, std::string, std::string>> cases{
      {"d.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"cut", "", "d.jsonl:2: not a JSON value"},
      {"d.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"x\"}\n", "", "d.jsonl:2: the row has no field 'text'"},
      {"d.jsonl", "{\"text\": 3}\n", "", "d.jsonl:1: field 'text' is number, expected a string"},
      {"d.jsonl", "[1, 2]\n", "", "d.jsonl:1: expected a JSON object per row, got array"},
      {"d.jsonl", "{\"a\": \"x\"}\n", "text",
       "d.jsonl:1: no column 'text' (--text_column_name); the columns are a"},
      {"d.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"caf\xC3\"}\n", "", "d.jsonl:2: invalid UTF-8"},
      {"d.json", "[{\"text\": \"x\"}, 5]", "",
       "d.json: element 1: expected a JSON object per row, got number"},
      {"d.json", "[{\"text\": \"x\"", "", "d.json: not valid JSON"},
      {"d.csv", "text\n\"never closed\n", "", "d.csv: a quoted field opened on line 2 is never closed"},
      {"d.csv", "a,text\n1,2,3\n", "", "d.csv:2: 3 fields, the header has 2"},
      {"d.csv", "text\n\"x\"y\n", "", "d.csv:2: text after a closing quote"},
      {"d.csv", "", "", "d.csv: no header row"},
      {"d.csv", "a,b\n1,2\n", "text", "d.csv:1: no column 'text' (--text_column_name); the columns are a, b"},
      {"d.txt", "line one\nline \xFF two\n", "", "d.txt:2: invalid UTF-8 (byte offset 14 of the file)"},
      {"d.txt", "\xED\xA0\x80", "", "d.txt:1: invalid UTF-8"},  // a UTF-16 surrogate
      {"d.txt", "\xC0\xAF", "", "d.txt:1: invalid UTF-8"},      // an overlong '/'
  };
  for (const auto& [name, bytes, column, want] : cases) {
    const std::string got = error_of(name, bytes, column);
    EXPECT_NE(got.find(want), std::string::npos) << name << ": got '" << got << "', want '" << want << "'";
  }
}

TEST(Documents, CompressedFilesReadAsTheirContent) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("trainer-docs-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string csv = "id,text\n1,\"gz, then zst\"\n2,second\n";
  const std::string gz = (dir / "t.csv.gz").string();
  gzFile g = gzopen(gz.c_str(), "wb");
  gzwrite(g, csv.data(), static_cast<unsigned>(csv.size()));
  gzclose(g);
  std::string packed(ZSTD_compressBound(csv.size()), '\0');
  packed.resize(ZSTD_compress(packed.data(), packed.size(), csv.data(), csv.size(), 3));
  const std::string zst = (dir / "t.csv.zst").string();
  std::ofstream(zst, std::ios::binary) << packed;
  const Docs want{"gz, then zst", "second"};
  EXPECT_EQ(tr::data::read_documents(gz), want);
  EXPECT_EQ(tr::data::read_documents(zst), want);
  std::ofstream(dir / "bad.jsonl.zst", std::ios::binary) << "not zstd at all";
  std::ofstream(dir / "plain.csv.gz", std::ios::binary) << csv;  // a .gz name without gzip inside
  {
    std::ifstream in(gz, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(dir / "cut.csv.gz", std::ios::binary) << all.substr(0, all.size() - 12);
  }
  std::ofstream(dir / "cut.csv.zst", std::ios::binary) << packed.substr(0, packed.size() / 2);
  for (const auto& [file, want_msg] :
       std::vector<std::pair<std::string, std::string>>{{"bad.jsonl.zst", "not a readable zstd file"},
                                                        {"cut.csv.zst", "the zstd stream is cut short"},
                                                        {"plain.csv.gz", "not a gzip file"},
                                                        {"cut.csv.gz", "the gzip stream is cut short"},
                                                        {"missing.jsonl.gz", "missing.jsonl.gz: cannot open"},
                                                        {"missing.csv", "missing.csv: cannot open"}}) {
    try {
      tr::data::read_documents((dir / file).string());
      ADD_FAILURE() << file;
    } catch (const tr::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want_msg), std::string::npos) << e.what();
    }
  }
  fs::remove_all(dir);
}

// Tables and JSON arrays stream record by record (for_each_document, what `trainer tokenize` reads): over
// 8 MB read chunks, quoted fields holding line breaks, "" and \r\n cut at a chunk's edge, the documents are
// the whole-file parse's; the bad inputs' messages are the same through either path.
TEST(Documents, TablesAndJsonArraysStreamAsTheWholeFileParses) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("trainer-docs-stream-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string csv = "id,text,note\r\n", tsv = "text\tid\n", json = "[";
  for (int i = 0; csv.size() < (size_t{9} << 20); ++i) {
    std::string text = "row " + std::to_string(i) + std::string(static_cast<size_t>(i % 97), 'x');
    if (i % 3 == 0) text += "\nsecond line, with \"\"quotes\"\"";
    csv += std::to_string(i) + ",\"" + text + "\",n\r\n";
    tsv += "\"" + text + "\"\t" + std::to_string(i) + "\n";
    nlohmann::json row = {{"id", i}, {"text", text}, {"nested", {{"a", {1, 2, {{"b", "c"}}}}}}};
    json += (i ? "," : "") + row.dump();
  }
  json += "]";
  for (const auto& [name, bytes] : std::vector<std::pair<std::string, std::string>>{
           {"big.csv", csv}, {"big.tsv", tsv}, {"big.json", json}}) {
    const std::string path = (dir / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    Docs streamed;
    int64_t last_read = 0;
    tr::data::for_each_document(path, DocumentOptions{}, [&](std::string&& d, int64_t read) {
      streamed.push_back(std::move(d));
      EXPECT_GE(read, last_read);
      last_read = read;
    });
    const Docs whole = parse_documents(bytes, name, DocumentOptions{});
    EXPECT_GT(whole.size(), 10000u) << name;
    EXPECT_EQ(streamed, whole) << name;
  }
  for (const auto& [name, bytes, want] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"s.csv", "text\n\"never closed\n", "s.csv: a quoted field opened on line 2 is never closed"},
           {"s.csv", "a,text\n1,2,3\n", "s.csv:2: 3 fields, the header has 2"},
           {"s.csv", "text\nok\nbad \xff byte\n", "s.csv:3: invalid UTF-8"},
           {"s.json", "[{\"text\": \"x\"}, 5]",
            "s.json: element 1: expected a JSON object per row, got number"},
           {"s.json", "[{\"text\": \"x\"", "s.json: not valid JSON"},
           {"s.json", "[{\"text\": \"caf\xC3\"}]", "s.json: not valid JSON"}}) {
    const std::string path = (dir / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    for (bool stream : {true, false}) {
      std::string got;
      try {
        if (stream)
          tr::data::for_each_document(path, DocumentOptions{}, [](std::string&&, int64_t) {});
        else
          parse_documents(bytes, name, DocumentOptions{});
      } catch (const tr::Error& e) {
        got = e.what();
      }
      EXPECT_NE(got.find(want), std::string::npos)
          << name << (stream ? " streamed" : " whole") << ": " << got;
    }
  }
  fs::remove_all(dir);
}

}  // namespace
