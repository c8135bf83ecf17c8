// Writing files with the reason of a failure: std::ofstream only says "failed", so a full disk read as a
// mystery; FileWriter names the path and the system's reason ("No space left on device").
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace tr {

class FileWriter {
 public:
  // Creates or truncates `path`; throws tr::Error naming it and the reason.
  explicit FileWriter(const std::string& path);
  ~FileWriter();  // closes without checking: an error was already thrown, or close() was called
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t bytes);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // fsync (when `sync`) and close, both checked: a delayed write error surfaces here, not never.
  void close(bool sync = false);

 private:
  std::string path_;
  int fd_ = -1;
};

// The whole file in one go.
void write_file(const std::string& path, std::string_view content, bool sync = false);

// `dir` and its parents made where missing; throws tr::Error "{what} {dir}: cannot make that folder (reason)"
// - a file in the way, no permission - where std::filesystem would throw its own wording.
void make_directories(const std::string& dir, std::string_view what = "");

}  // namespace tr
