// Datasets of fixed-length token sequences over a TokenStream, a seeded shuffling and distributed sampler
// with a resumable position, and a DataLoader whose worker threads prefetch batches into bounded queues.
// Note [Sequences]: "blocks" (the default) cuts the stream into contiguous, non-overlapping blocks of
// block_size tokens, as HF's run_clm group_texts does; labels equal input_ids and the model shifts them, so
// every token but the first of a block is predicted once per epoch. "windows" takes block_size tokens at
// random offsets (llm.c style), seeded per (epoch, sample): more varied contexts, tokens seen unevenly.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "backend/cuda_api.h"
#include "core/tensor.h"
#include "data/shards.h"

namespace tr::data {

enum class Sampling { blocks, windows };

struct DatasetOptions {
  int64_t block_size = 1024;
  Sampling sampling = Sampling::blocks;
  bool shuffle = true;
  uint64_t seed = 42;
  int rank = 0, world_size = 1;  // distributed: this rank's disjoint share of every epoch
  // Consecutive samples a rank takes per round: the per-device batch size makes rank r's batch k the r-th
  // slice of the batch a single process with world_size x the batch would draw at k (1: every
  // world_size-th sample, torch's DistributedSampler).
  int64_t rank_slice = 1;
  int64_t vocab_size = 0;  // > 0: every id read is checked against the model's vocabulary
};

class SequenceDataset {
 public:
  SequenceDataset(std::shared_ptr<const TokenStream> stream, DatasetOptions opts);
  int64_t num_samples() const { return num_samples_; }  // over all ranks
  // The sample indices this rank visits in `epoch`, in order.
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  // Tokens of sample i of `epoch` (block_size ids).
  void sample(int64_t epoch, int64_t i, int64_t* out) const;
  const DatasetOptions& options() const { return opts_; }

 private:
  std::shared_ptr<const TokenStream> stream_;
  DatasetOptions opts_;
  int64_t num_samples_ = 0;
};

struct Batch {
  Tensor input_ids, labels;  // int64 [B, T] on the loader's device; labels == input_ids (the model shifts)
  Tensor host_labels;        // the labels on the CPU (what the Trainer counts without a device sync)
  int64_t epoch = 0, index = 0;
  // Distributed: this batch's rows are rows [global_first, global_first + B) of a global batch of
  // global_size sequences (the batch one process would have drawn); alone: 0 and B.
  int64_t global_first = 0, global_size = 0;
  int64_t global_unit = 0;  // sequences per rank slice (the per-device batch size); 0 alone
};

// Where the loader is: the next batch to hand out. Saved in checkpoints; seek() resumes there directly.
struct LoaderPosition {
  int64_t epoch = 0, batch = 0;
  bool operator==(const LoaderPosition&) const = default;
};

struct DataLoaderOptions {
  int64_t batch_size = 8;
  int num_workers = 0;      // 0: batches are built on the calling thread
  int prefetch_factor = 2;  // batches queued per worker
  bool drop_last = false;
  // Batches for a GPU are built in page-locked host memory (pin_memory) and copied on a stream of their own,
  // overlapping compute; the compute stream waits for the copy without blocking the host.
  bool pin_memory = true;
  Device device = Device::cpu();
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const SequenceDataset> ds, DataLoaderOptions opts);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;
  // The same on every rank: the global batches of an epoch (a rank whose slice of the last one is empty
  // gets an empty batch for it).
  int64_t batches_per_epoch() const;
  // The next batch of the current epoch, or nullopt at its end (the position then moves to the next epoch).
  // A worker's error is rethrown here.
  std::optional<Batch> next();
  LoaderPosition position() const { return pos_; }
  void seek(LoaderPosition p);

 private:
  Batch make_batch(int64_t epoch, int64_t b) const;
  void start_workers();
  void start_worker(int w, LoaderPosition start, int64_t total);
  void stop_workers();
  struct Slot {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::pair<int64_t, Batch>> queue;
    std::exception_ptr error;
  };
  std::shared_ptr<const SequenceDataset> ds_;
  DataLoaderOptions opts_;
  LoaderPosition pos_;
  std::vector<int64_t> order_;  // this epoch's sample order
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::thread> workers_;
  std::atomic<bool> stop_{false};
  std::unique_ptr<backend::CopyStream> copy_;
  Batch in_flight_;  // the host batch of the last asynchronous copy, alive until that copy is done
};

}  // namespace tr::data
