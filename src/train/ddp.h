// DistributedDataParallel's two duties, for the Trainer: the parameters made identical on every rank at the
// start (rank 0's broadcast), and each optimizer step's gradients summed over the ranks in buckets of
// --ddp_bucket_cap_mb, last parameters first (the order backward finishes them). During the step's last
// backward a communication thread all-reduces each bucket as soon as the autograd engine reports all of its
// gradients final (autograd::GradReadyScope), overlapping the rest of backward; accumulation micro-batches
// before it reduce nothing (DDP's no_sync). Buckets are f32 whatever the gradients' dtype: half gradients are
// summed in f32 and rounded once, the same bits on every rank. Host gradients fill a host buffer on the
// communication thread; a device's (a GPU's, a host partition's) are packed on the training thread, as the
// engine reports a bucket complete, into one of two device slots (on a GPU with a ComputeFence after the
// copies, so the all-reduce waits for them and not for the rest of backward queued later), reduced there
// where the group's transport reads device memory (NCCL on the rank's GPU: no host copies), else staged
// through host memory. The optimizer then sees the global gradient, so clipping and the fp16 skip read the
// same statistics on every rank.
#pragma once
#include <array>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "dist/process_group.h"
#include "nn/layers.h"
#include "train/host_stage.h"

namespace tr::train {

// Rank 0's values of every parameter, written into every rank's.
void broadcast_parameters(dist::ProcessGroup& group, const nn::ParamList& params);

class GradReducer {
 public:
  // `scale` multiplies the sums (1 / world size when each rank normalized its loss by its own tokens).
  GradReducer(dist::ProcessGroup& group, int64_t bucket_cap_bytes, double scale = 1.0);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Before the step's last backward: buckets of `params` are launched as grad_ready() reports them.
  void begin(const nn::ParamList& params);
  // The autograd engine's report that `leaf`'s gradient is final (installed with autograd::GradReadyScope).
  void grad_ready(const TensorImpl* leaf);
  // After backward: the buckets not launched yet go too (a parameter without a gradient on this rank - one
  // whose micro-batches were empty at an epoch's end - contributes zeros and gets the sum); returns when
  // every gradient holds its sum. Rethrows a collective's error.
  void finish();
  // begin + finish: every bucket after backward (the compiled step's replays report no gradients).
  void reduce(const nn::ParamList& params) {
    begin(params);
    finish();
  }
  // Before begin(): a device's buckets read it from there.
  void set_scale(double scale) { scale_ = static_cast<float>(scale); }
  int64_t buckets() const { return buckets_; }       // all-reduce calls so far
  int64_t launched_early() const { return early_; }  // of them, started before finish()

 private:
  struct Segment {  // elements [at, at + n) of params_[param] at [slot, slot + n) of its bucket
    size_t param;
    int64_t at, n, slot;
  };
  struct Bucket {
    std::vector<Segment> segs;
    int64_t elems = 0;
    int waiting = 0;  // parameters of this bucket not reported ready yet
  };
  // Off the host: a bucket packed on the training thread, until the communication thread has reduced it.
  struct Slot {
    Tensor bucket;                                  // f32, the largest bucket's elements, on device_
    std::unique_ptr<backend::ComputeFence> packed;  // on a GPU: the compute-stream point after the packing
    std::vector<Tensor> grads;                      // the packed bucket's segments' gradients
  };
  void run_buckets();
  void reduce_bucket(Bucket& b);
  // Training thread: packs the buckets whose gradients are all final (every one when finishing), in order,
  // each into the slot the bucket two before it has left.
  void pack_ready();
  void pack(size_t k);
  void reduce_slot(size_t k);  // communication thread

  dist::ProcessGroup& group_;
  int64_t cap_elems_;
  float scale_;
  host_stage::StagingBuffer<float> buffer_;  // a bucket on the host (pinned for a GPU's, under Gloo)
  Device device_;                            // the gradients'
  bool on_device_ = false;                   // the gradients are off the host: slots, packed here
  std::array<Slot, 2> slots_;                // kept from step to step (`trainer estimate` counts both)
  Tensor scale_t_;                           // scale_ on device_, for the slots' unpacking
  size_t next_pack_ = 0;                     // training thread: the next bucket to pack
  size_t packed_ = 0, reduced_ = 0;          // buckets packed / reduced and unpacked (under mu_)
  std::vector<const Tensor*> params_;
  std::vector<Tensor> host_;  // a gradient's host f32 copy while its buckets are in flight
  std::vector<int64_t> summed_;
  std::vector<std::vector<size_t>> buckets_of_;  // per parameter: the buckets holding it
  std::unordered_map<const TensorImpl*, size_t> index_;
  std::vector<Bucket> plan_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool finishing_ = false;
  bool abort_ = false;  // destroyed mid-step (an error unwinding): reduce nothing more
  std::exception_ptr error_;
  std::thread comm_;
  std::atomic<int64_t> buckets_{0}, early_{0};
};

}  // namespace tr::train
