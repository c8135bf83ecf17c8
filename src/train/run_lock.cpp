// OutputDirLock: flock on output_dir/.trainer.lock; see run_lock.h.
#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/error.h"

namespace tr::train {

namespace fs = std::filesystem;

namespace {

std::string read_holder(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  std::string s = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.empty() ? "unknown" : s;
}

bool same_file(int fd, const std::string& path) {
  struct stat a {
  }, b{};
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

}  // namespace

OutputDirLock::OutputDirLock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TR_CHECK(!ec, "--output_dir {}: cannot create it: {}", dir, ec.message());
  path_ = (fs::path(dir) / kFileName).string();
  // The releasing run unlinks the file: a lock taken on an unlinked file is retried on the new one.
  for (int attempt = 0; attempt < 100; ++attempt) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    TR_CHECK(fd_ >= 0, "--output_dir {}: cannot create the lock file {}: {}", dir, path_,
             std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string holder = read_holder(fd_);
      ::close(fd_);
      fd_ = -1;
      TR_CHECK(err != EWOULDBLOCK,
               "--output_dir {} is in use by another trainer (pid {}; lock {}): wait for it to finish or "
               "choose another --output_dir",
               dir, holder, path_);
      fail("--output_dir {}: cannot lock {}: {}", dir, path_, std::strerror(err));
    }
    if (same_file(fd_, path_)) break;
    ::close(fd_);
    fd_ = -1;
  }
  TR_CHECK(fd_ >= 0, "--output_dir {}: the lock file {} keeps changing", dir, path_);
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    // The lock holds without the pid; only the refusal message of another run would lack it.
  }
}

OutputDirLock::~OutputDirLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still locked: a waiting run retries on a fresh file (same_file)
  ::close(fd_);
}

}  // namespace tr::train
