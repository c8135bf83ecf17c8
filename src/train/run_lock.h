// An exclusive lock on a run's output_dir, so two trainers never write checkpoints into one folder.
#pragma once
#include <string>

namespace tr::train {

// flock(2) on output_dir/.trainer.lock, which holds the owner's pid for the refusal message. The kernel
// releases it when the process ends, however it ends: a killed run never leaves a stale lock behind.
class OutputDirLock {
 public:
  // Creates `dir` if needed; throws tr::Error naming the folder and the holder's pid when it is taken.
  explicit OutputDirLock(const std::string& dir);
  ~OutputDirLock();
  OutputDirLock(const OutputDirLock&) = delete;
  OutputDirLock& operator=(const OutputDirLock&) = delete;

  static constexpr const char* kFileName = ".trainer.lock";

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace tr::train
