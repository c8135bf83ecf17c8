// Shared by the fuzz targets: a per-process scratch folder for the parsers that only take a path (the input
// is written there each run), in /dev/shm when it exists so the fuzzing loop does not hit the disk.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace tr::fuzz {

// The folder, made on first use. libFuzzer ends with _Exit (no atexit handlers), so each process instead
// removes the folders of processes that are gone.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path base = fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
                              ? fs::path("/dev/shm")
                              : fs::temp_directory_path();
    const std::string prefix = "trainer-fuzz-";
    for (const auto& e : fs::directory_iterator(base, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(prefix, 0) != 0) continue;
      const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
      if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove_all(e.path(), ec);
    }
    fs::path d = base / (prefix + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

// Writes `size` bytes to scratch_dir()/name and returns the path; aborts if the write fails (not a finding of
// the parser, but nothing after it would mean anything).
inline std::string write_scratch(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = (scratch_dir() / name).string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) std::abort();
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return path;
}

inline std::string write_scratch(const std::string& name, const std::string& text) {
  return write_scratch(name, reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

}  // namespace tr::fuzz
