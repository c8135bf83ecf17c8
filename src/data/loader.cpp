// Sequence datasets, seeded/distributed sampling and the prefetching DataLoader.
#include "data/loader.h"

#include <algorithm>
#include <numeric>
#include <system_error>

#include "core/error.h"
#include "core/rng.h"
#include "ops/ops.h"

namespace tr::data {

SequenceDataset::SequenceDataset(std::shared_ptr<const TokenStream> stream, DatasetOptions opts)
    : stream_(std::move(stream)), opts_(opts) {
  TR_CHECK(opts_.block_size > 0, "dataset: block_size must be positive, got {}", opts_.block_size);
  TR_CHECK(opts_.world_size > 0 && opts_.rank >= 0 && opts_.rank < opts_.world_size,
           "dataset: rank {} outside world size {}", opts_.rank, opts_.world_size);
  TR_CHECK(opts_.rank_slice > 0, "dataset: rank_slice must be positive, got {}", opts_.rank_slice);
  num_samples_ = stream_->size() / opts_.block_size;
  TR_CHECK(num_samples_ > 0, "dataset: {} tokens are fewer than one block of {}", stream_->size(),
           opts_.block_size);
}

std::vector<int64_t> SequenceDataset::epoch_order(int64_t epoch) const {
  std::vector<int64_t> all(static_cast<size_t>(num_samples_));
  std::iota(all.begin(), all.end(), 0);
  if (opts_.shuffle) {
    // Fisher-Yates driven by Philox words keyed on (seed, epoch): the same order on every machine.
    const uint64_t off = static_cast<uint64_t>(epoch) << 40;
    for (int64_t i = num_samples_ - 1; i > 0; --i) {
      const uint64_t w =
          (static_cast<uint64_t>(philox_word(opts_.seed, off, 2 * static_cast<uint64_t>(i))) << 32) |
          philox_word(opts_.seed, off, 2 * static_cast<uint64_t>(i) + 1);
      std::swap(all[static_cast<size_t>(i)], all[static_cast<size_t>(w % static_cast<uint64_t>(i + 1))]);
    }
  }
  // Rank r takes the r-th slice of every round of world_size slices: shares are disjoint and together cover
  // the epoch in its order.
  std::vector<int64_t> mine;
  const int64_t s = opts_.rank_slice, round = s * opts_.world_size;
  for (int64_t i = opts_.rank * s; i < num_samples_; i += round)
    for (int64_t j = i; j < std::min(i + s, num_samples_); ++j) mine.push_back(all[static_cast<size_t>(j)]);
  return mine;
}

void SequenceDataset::sample(int64_t epoch, int64_t i, int64_t* out) const {
  const int64_t T = opts_.block_size;
  int64_t begin = i * T;
  if (opts_.sampling == Sampling::windows) {
    const uint64_t span = static_cast<uint64_t>(stream_->size() - T + 1);
    const uint64_t w =
        (static_cast<uint64_t>(philox_word(opts_.seed ^ 0x5eed, static_cast<uint64_t>(epoch) << 40,
                                           2 * static_cast<uint64_t>(i)))
         << 32) |
        philox_word(opts_.seed ^ 0x5eed, static_cast<uint64_t>(epoch) << 40,
                    2 * static_cast<uint64_t>(i) + 1);
    begin = static_cast<int64_t>(w % span);
  }
  stream_->read(begin, T, out);
  if (opts_.vocab_size > 0)
    for (int64_t k = 0; k < T; ++k)
      TR_CHECK(out[k] >= 0 && out[k] < opts_.vocab_size,
               "dataset: token {} at stream position {} is >= the model's vocab size {}", out[k], begin + k,
               opts_.vocab_size);
}

DataLoader::DataLoader(std::shared_ptr<const SequenceDataset> ds, DataLoaderOptions opts)
    : ds_(std::move(ds)), opts_(opts) {
  TR_CHECK(opts_.batch_size > 0, "dataloader: batch size must be positive");
  TR_CHECK(opts_.num_workers >= 0 && opts_.prefetch_factor > 0,
           "dataloader: num_workers >= 0 and prefetch_factor > 0");
  order_ = ds_->epoch_order(0);
  TR_CHECK(batches_per_epoch() > 0, "dataloader: {} samples on this rank make no batch of {} (drop_last={})",
           order_.size(), opts_.batch_size, opts_.drop_last);
  if (opts_.device.is_cuda()) copy_ = std::make_unique<backend::CopyStream>(opts_.device);
  start_workers();
}

DataLoader::~DataLoader() {
  stop_workers();
  if (copy_) copy_->synchronize();
}

int64_t DataLoader::batches_per_epoch() const {
  const int64_t world = ds_->options().world_size;
  if (world == 1 || ds_->options().rank_slice != opts_.batch_size) {  // this rank's own samples
    const auto n = static_cast<int64_t>(order_.size());
    return opts_.drop_last ? n / opts_.batch_size : (n + opts_.batch_size - 1) / opts_.batch_size;
  }
  const int64_t n = ds_->num_samples(), global = opts_.batch_size * world;  // batches sliced across ranks
  return opts_.drop_last ? n / global : (n + global - 1) / global;
}

Batch DataLoader::make_batch(int64_t epoch, int64_t b) const {
  const int64_t T = ds_->options().block_size;
  const int64_t first = b * opts_.batch_size;
  const int64_t n = std::clamp<int64_t>(static_cast<int64_t>(order_.size()) - first, 0, opts_.batch_size);
  Allocator& host =
      opts_.pin_memory && opts_.device.is_cuda() ? backend::pinned_host_allocator() : cpu_allocator();
  Tensor ids = Tensor::empty({n, T}, DType::i64, host);
  int64_t* p = ids.data<int64_t>();
  for (int64_t r = 0; r < n; ++r) ds_->sample(epoch, order_[static_cast<size_t>(first + r)], p + r * T);
  Batch out{ids, ids, ids, epoch, b};
  out.global_size = n;
  const auto& d = ds_->options();
  if (d.world_size > 1 && d.rank_slice == opts_.batch_size) {  // a slice of the global batch b
    const int64_t global = opts_.batch_size * d.world_size;
    out.global_first = d.rank * opts_.batch_size;
    out.global_unit = opts_.batch_size;
    out.global_size = std::min(global, ds_->num_samples() - b * global);
  }
  return out;
}

void DataLoader::start_workers() {
  stop_ = false;
  slots_.clear();
  for (int w = 0; w < opts_.num_workers; ++w) slots_.push_back(std::make_unique<Slot>());
  const LoaderPosition start = pos_;
  const int64_t total = batches_per_epoch();
  for (int w = 0; w < opts_.num_workers; ++w) {
    try {
      start_worker(w, start, total);
    } catch (const std::system_error& e) {  // the system's thread limit: stop the ones started, then say so
      stop_workers();
      const std::exception_ptr error = std::make_exception_ptr(Error(
          fmt::format("dataloader: could not start worker {} of --dataloader_num_workers {} ({}); use fewer "
                      "workers",
                      w, opts_.num_workers, e.what())));
      for (auto& s : slots_) s->error = error;  // a later next() rethrows it rather than wait for no one
      std::rethrow_exception(error);
    }
  }
}

// Worker w builds batches start.batch + w, + 2w, ... of this epoch, in order.
void DataLoader::start_worker(int w, LoaderPosition start, int64_t total) {
  workers_.emplace_back([this, w, start, total] {
    Slot& s = *slots_[static_cast<size_t>(w)];
    for (int64_t b = start.batch + w; b < total; b += opts_.num_workers) {
      Batch batch;
      try {
        batch = make_batch(start.epoch, b);
      } catch (...) {
        std::lock_guard<std::mutex> g(s.mu);
        s.error = std::current_exception();
        s.cv.notify_all();
        return;
      }
      std::unique_lock<std::mutex> lk(s.mu);
      s.cv.wait(lk, [&] { return stop_ || static_cast<int>(s.queue.size()) < opts_.prefetch_factor; });
      if (stop_) return;
      s.queue.emplace_back(b, std::move(batch));
      s.cv.notify_all();
    }
  });
}

void DataLoader::stop_workers() {
  for (auto& s : slots_) {
    std::lock_guard<std::mutex> g(s->mu);
    stop_ = true;
    s->cv.notify_all();
  }
  stop_ = true;
  for (auto& t : workers_) t.join();
  workers_.clear();
}

std::optional<Batch> DataLoader::next() {
  if (pos_.batch >= batches_per_epoch()) {
    seek({pos_.epoch + 1, 0});
    return std::nullopt;
  }
  Batch b;
  if (opts_.num_workers == 0) {
    b = make_batch(pos_.epoch, pos_.batch);
  } else {
    Slot& s = *slots_[static_cast<size_t>(pos_.batch % opts_.num_workers)];
    std::unique_lock<std::mutex> lk(s.mu);
    s.cv.wait(lk, [&] { return !s.queue.empty() || s.error; });
    if (s.queue.empty() && s.error) std::rethrow_exception(s.error);
    b = std::move(s.queue.front().second);
    s.queue.pop_front();
    s.cv.notify_all();
  }
  ++pos_.batch;
  b.host_labels = b.labels;
  if (copy_) {
    copy_->synchronize();  // the previous copy is long done; its host buffer may now go
    in_flight_ = b;
    Tensor dev = ops::empty(b.input_ids.shape(), DType::i64, opts_.device);
    copy_->copy_async(b.input_ids, dev);
    copy_->make_compute_wait();
    b.input_ids = b.labels = dev;
  }
  return b;
}

void DataLoader::seek(LoaderPosition p) {
  TR_CHECK(p.epoch >= 0 && p.batch >= 0, "dataloader: invalid position ({}, {})", p.epoch, p.batch);
  stop_workers();
  pos_ = p;
  order_ = ds_->epoch_order(p.epoch);
  start_workers();
}

}  // namespace tr::data
