// Reliability of a run's folder: the output_dir lock (a second trainer is refused, the lock dies with its
// holder) and saves that fail for lack of space (the previous checkpoint stays, the message says why).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

#include "core/error.h"
#include "core/file_writer.h"
#include "train/run_lock.h"
#include "train/trainer.h"
#include "train_scratch.h"
#include "test_util.h"

namespace tr {
namespace {

namespace fs = std::filesystem;

using test::error_of;

TEST(OutputDirLock, ASecondLockIsRefusedUntilTheFirstIsReleased) {
  Scratch s("lock_twice");
  const std::string out = (s.dir / "run").string();
  {
    train::OutputDirLock first(out);
    const std::string msg = error_of([&] { train::OutputDirLock second(out); });
    EXPECT_NE(
        msg.find("--output_dir " + out + " is in use by another trainer (pid " + std::to_string(::getpid())),
        std::string::npos)
        << msg;
  }
  EXPECT_FALSE(fs::exists(fs::path(out) / train::OutputDirLock::kFileName));  // released and removed
  EXPECT_EQ(error_of([&] { train::OutputDirLock again(out); }), "(no error)");
}

TEST(OutputDirLock, TrainRefusesAFolderAnotherRunHoldsAndTouchesNothing) {
  Scratch s("lock_train");
  auto a = s.args("run");
  a.max_steps = 2;
  train::OutputDirLock other(a.output_dir);
  const std::string msg = error_of([&] { train::train(a); });
  EXPECT_NE(msg.find("is in use by another trainer"), std::string::npos) << msg;
  int files = 0;
  for (const auto& e : fs::directory_iterator(a.output_dir))
    files += e.path().filename() != train::OutputDirLock::kFileName;
  EXPECT_EQ(files, 0);  // no training_args.json, metrics or checkpoint written beside the other run's
}

// /dev/full fails every write with ENOSPC: the real error path of a full disk, without mounting anything.
TEST(FileWriter, AFullDeviceIsReportedWithThePathAndTheReason) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  const std::string msg = error_of([] { write_file("/dev/full", std::string(1 << 16, 'x')); });
  EXPECT_NE(msg.find("/dev/full: write failed: No space left on device"), std::string::npos) << msg;
}

TEST(SaveFailure, ASaveOnAFullDiskKeepsThePreviousCheckpointAndSaysWhy) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  Scratch s("save_full");
  auto a = s.args("run");
  a.max_steps = 6;
  a.save_steps = 2;
  train::TrainHooks hooks;
  int saves = 0;  // the second save (checkpoint-4) writes its optimizer state into /dev/full
  hooks.save_probe = [&](const std::string& stage) {
    if (stage == "model" && ++saves == 2)
      fs::create_symlink("/dev/full",
                         fs::path(a.output_dir) / ".tmp-checkpoint-4" / "optimizer.safetensors.tmp");
  };
  const std::string msg = error_of([&] { train::train(a, hooks); });
  EXPECT_NE(msg.find("saving " + a.output_dir + "/checkpoint-4 failed: "), std::string::npos) << msg;
  EXPECT_NE(msg.find("optimizer.safetensors.tmp: write failed: No space left on device"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("the previous checkpoint " + a.output_dir + "/checkpoint-2 is intact"),
            std::string::npos)
      << msg;
  for (const auto& e : fs::directory_iterator(a.output_dir))
    EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << e.path() << " left behind";
  EXPECT_FALSE(fs::exists(fs::path(a.output_dir) / "checkpoint-4"));
  // checkpoint-2 is whole: the run resumes from it and finishes
  auto b = a;
  b.resume_from_checkpoint = "true";
  EXPECT_EQ(train::train(b).steps, 4);
}

}  // namespace
}  // namespace tr
