// FileWriter: POSIX writes with errno in every message; see file_writer.h.
#include "core/file_writer.h"

#include <filesystem>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace tr {

FileWriter::FileWriter(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TR_CHECK(fd_ >= 0, "{}: cannot create: {}", path, std::strerror(errno));
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::write(const void* data, size_t bytes) {
  TR_CHECK(fd_ >= 0, "{}: write after close", path_);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    // A short write of 0 bytes on a regular file means the device is full, as ENOSPC does.
    TR_CHECK(n > 0, "{}: write failed: {}", path_, n == 0 ? std::strerror(ENOSPC) : std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void FileWriter::close(bool sync) {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (sync && ::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail("{}: write failed: {}", path_, std::strerror(err));
  }
  TR_CHECK(::close(fd) == 0, "{}: write failed: {}", path_, std::strerror(errno));
}

void write_file(const std::string& path, std::string_view content, bool sync) {
  FileWriter w(path);
  w.write(content);
  w.close(sync);
}

void make_directories(const std::string& dir, std::string_view what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!ec && std::filesystem::is_directory(dir, ec)) return;
  fail("{}{}{}: cannot make that folder ({})", what, what.empty() ? "" : " ", dir,
       ec ? ec.message() : "a file has that name");
}

}  // namespace tr
