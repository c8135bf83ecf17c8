// How many sequences a run puts in each micro-batch: --per_device_train_batch_size auto and
// --total_batch_size resolved, auto_find_batch_size's first split predicted, its retries' smaller batches;
// see batch_size.h.
#include "train/batch_size.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/json_fields.h"
#include "dist/env.h"
#include "ops/ops.h"
#include "train/checkpoint.h"
#include "train/estimate.h"
#include "train/setup.h"

namespace tr::train {

namespace fs = std::filesystem;

namespace {

// What an allocator may still hand out: its cap less what is held, or a GPU's memory less what is held with
// 10% kept back (the CUDA context and the kernels' own scratch are not in the estimate); 0 when neither is
// known (the host without a cap).
int64_t allocator_budget(const Allocator& al) {
  const int64_t held = al.stats().current_bytes;
  if (al.limit() > 0) return al.limit() - held;
  if (al.capacity() > 0) return al.capacity() / 10 * 9 - held;
  return 0;
}

// A GPU's memory is the caching allocator's: its reserved segments are what must fit.
MemoryDevice memory_device_of(Device d) { return d.is_cuda() ? MemoryDevice::cuda : MemoryDevice::cpu; }

}  // namespace

// The batch split a resumed checkpoint's trainer_state.json recorded ({0, 0} without the file).
std::pair<int64_t, int64_t> saved_batch_split(const std::string& resume) {
  const fs::path state = fs::path(resume) / "trainer_state.json";
  if (!fs::exists(state)) return {0, 0};
  return read_batch_split(read_json_file(state.string()), state.string());
}

// auto_find_batch_size, with a memory budget (the allocator's cap less what the process holds, or a GPU's
// memory): the largest divisor of the effective batch, up to the batch given, whose estimated peak fits
// becomes the first try, so the search starts where it would end instead of at an OOM. Returns that peak (0:
// no budget, or nothing fits - the OOM retries decide then).
int64_t predict_batch_split(TrainingArguments& a, int64_t effective) {
  const int64_t budget = allocator_budget(ops::allocator_for(training_device(a)));
  if (budget <= 0) return 0;
  for (int64_t bs = a.per_device_train_batch_size; bs >= 1; --bs) {  // as HF: the batch given, or smaller
    if (effective % bs != 0) continue;
    TrainingArguments t = a;
    t.per_device_train_batch_size = bs;
    t.gradient_accumulation_steps = effective / bs;
    const int64_t peak = estimate_memory(t, {1, 0, memory_device_of(training_device(a))}).fit_bytes();
    if (peak > budget) continue;
    std::fprintf(stderr,
                 "auto_find_batch_size: per_device_train_batch_size %lld x gradient_accumulation_steps %lld "
                 "(estimated peak %.3f GiB of %.3f GiB)\n",
                 static_cast<long long>(bs), static_cast<long long>(effective / bs),
                 static_cast<double>(peak) / (1 << 30), static_cast<double>(budget) / (1 << 30));
    a.per_device_train_batch_size = bs;
    a.gradient_accumulation_steps = effective / bs;
    return peak;
  }
  std::fprintf(stderr,
               "auto_find_batch_size: no split of the batch of %lld is estimated to fit in %.3f GiB\n",
               static_cast<long long>(effective), static_cast<double>(budget) / (1 << 30));
  return 0;
}

int64_t host_memory_available() {
  int64_t avail = 0;
  std::ifstream in("/proc/meminfo");
  for (std::string key; in >> key;) {
    int64_t kib = 0;
    in >> kib;
    if (key == "MemAvailable:") avail = kib * 1024;
    in.ignore(1 << 10, '\n');
  }
  // A container's cgroup limit (v2) binds before the machine's memory does.
  std::ifstream cg("/sys/fs/cgroup/memory.max"), cur("/sys/fs/cgroup/memory.current");
  int64_t max_b = 0, used_b = 0;
  if (cg >> max_b && cur >> used_b && max_b > used_b)
    avail = avail > 0 ? std::min(avail, max_b - used_b) : max_b - used_b;
  return avail;
}

namespace {

// What a run may use for --per_device_train_batch_size auto: allocator_budget, or on the host what the kernel
// reports available.
int64_t auto_batch_budget(Device dev) {
  const Allocator& al = ops::allocator_for(dev);
  if (al.limit() > 0 || al.capacity() > 0) return allocator_budget(al);
  return host_memory_available();
}

}  // namespace

// --per_device_train_batch_size auto and --total_batch_size (ours) into a batch and an accumulation.
void resolve_batch(TrainingArguments& a, const std::string& resume) {
  const bool resuming = !resume.empty();
  const int64_t total = a.total_batch_sequences();
  const int64_t world = dist::read_dist_env().world_size;  // every process draws its batch of the total
  if (a.per_device_train_batch_size != kAutoBatch) {
    if (total > 0) {
      TR_CHECK(total % (a.per_device_train_batch_size * world) == 0,
               "--total_batch_size {} ({} sequences) is not a multiple of --per_device_train_batch_size {} x "
               "{} process(es)",
               a.total_batch_size, total, a.per_device_train_batch_size, world);
      const int64_t ga = total / (a.per_device_train_batch_size * world);
      if (a.gradient_accumulation_steps != 1 && a.gradient_accumulation_steps != ga)
        std::fprintf(
            stderr,
            "train: --total_batch_size %s sets gradient_accumulation_steps to %lld (not the %lld given)\n",
            a.total_batch_size.c_str(), static_cast<long long>(ga),
            static_cast<long long>(a.gradient_accumulation_steps));
      a.gradient_accumulation_steps = ga;
    }
    return;
  }
  if (resuming) {  // the split the run started with (its memory may differ now; the data order must not)
    const auto [bs, ga] = saved_batch_split(resume);
    TR_CHECK(bs > 0 && ga > 0,
             "{}/trainer_state.json: no train_batch_size to resume --per_device_train_batch_size auto with",
             resume);
    a.per_device_train_batch_size = bs;
    a.gradient_accumulation_steps = ga;
    return;
  }
  const int64_t budget = auto_batch_budget(training_device(a));
  TR_CHECK(budget > 0, "--per_device_train_batch_size auto: no memory budget is known for {}; give a number",
           training_device(a).str());
  const BatchChoice c = auto_batch(a, budget, {1, 0, memory_device_of(training_device(a))});
  TR_CHECK(c.batch > 0,
           "--per_device_train_batch_size auto: not even batch 1 is estimated to fit in {:.3f} GiB",
           static_cast<double>(budget) / (1 << 30));
  std::fprintf(
      stderr,
      "per_device_train_batch_size auto: %lld x gradient_accumulation_steps %lld (estimated peak %.3f GiB "
      "of %.3f GiB)%s\n",
      static_cast<long long>(c.batch), static_cast<long long>(c.accumulation),
      static_cast<double>(c.peak_bytes) / (1 << 30), static_cast<double>(budget) / (1 << 30),
      total > 0 ? "" : "; without --total_batch_size the effective batch depends on this machine's memory");
  a.per_device_train_batch_size = c.batch;
  a.gradient_accumulation_steps = c.accumulation;
}

// Divisors keep the effective batch exact: the largest divisor of `effective` at most 0.9 x bs.
int64_t smaller_batch(int64_t bs, int64_t effective) {
  for (int64_t b = static_cast<int64_t>(bs * 0.9); b >= 1; --b)
    if (effective % b == 0) return b;
  return 0;
}

}  // namespace tr::train
