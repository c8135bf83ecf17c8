// The batch size of a run: --per_device_train_batch_size auto and --total_batch_size resolved into a batch
// and an accumulation, auto_find_batch_size's first split predicted by the estimate, its smaller retries.
#pragma once
#include <cstdint>
#include <string>
#include <utility>

#include "train/args.h"

namespace tr::train {

// The batch split checkpoint folder `resume`'s trainer_state.json recorded ({0, 0} without the file).
std::pair<int64_t, int64_t> saved_batch_split(const std::string& resume);
// auto_find_batch_size with a memory budget (the allocator's cap less what the process holds, or a GPU's
// memory): the largest divisor of the effective batch, up to the batch given, whose estimated peak fits
// becomes the first try. Returns that peak (0: no budget, or nothing fits - the OOM retries decide then).
int64_t predict_batch_split(TrainingArguments& a, int64_t effective);
// --per_device_train_batch_size auto (the largest batch estimated to fit; a resumed run's own split when
// `resume` names its checkpoint) and --total_batch_size (the accumulation) into a batch and an accumulation.
void resolve_batch(TrainingArguments& a, const std::string& resume);
// auto_find_batch_size's next try: the largest divisor of `effective` at most 0.9 x bs (0: none left).
int64_t smaller_batch(int64_t bs, int64_t effective);

// Host memory this process may still take: what the kernel reports available (MemAvailable), within a
// container's cgroup (v2) limit; 0 when neither can be read.
int64_t host_memory_available();

}  // namespace tr::train
