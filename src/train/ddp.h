// DistributedDataParallel's two duties, for the Trainer: the parameters made identical on every rank at the
// start (rank 0's broadcast), and each optimizer step's gradients summed over the ranks in buckets of
// --ddp_bucket_cap_mb, last parameters first (the order backward finishes them). Buckets travel as f32 on
// the host whatever the gradients' dtype: half gradients are summed in f32 and rounded once, the same bits on
// every rank. The reduction runs after the step's last micro-batch (accumulation micro-batches reduce
// nothing: DDP's no_sync), so the optimizer sees the global gradient; clipping and the fp16 skip then read
// the same statistics on every rank.
#pragma once
#include <vector>

#include "dist/process_group.h"
#include "nn/layers.h"

namespace tr::train {

// Rank 0's values of every parameter, written into every rank's.
void broadcast_parameters(dist::ProcessGroup& group, const nn::ParamList& params);

class GradReducer {
 public:
  // `scale` multiplies the sums (1 / world size when each rank normalized its loss by its own tokens).
  GradReducer(dist::ProcessGroup& group, int64_t bucket_cap_bytes, double scale = 1.0);
  // Sums every parameter's gradient over the ranks, in place. A parameter without a gradient on this rank
  // (a rank whose micro-batches were empty at an epoch's end) contributes zeros and gets the sum.
  void reduce(const nn::ParamList& params);
  int64_t buckets() const { return buckets_; }  // all-reduce calls so far

 private:
  struct Pending;
  dist::ProcessGroup& group_;
  int64_t cap_elems_;
  float scale_;
  std::vector<float> bucket_;
  int64_t buckets_ = 0;
};

}  // namespace tr::train
