// ZeRO-3 (HF's --fsdp full_shard) on a process group: besides ZeRO-2's sharded gradients and optimizer state,
// the parameters themselves live only as each rank's shard of the flat space (the ShardedOptimizer's fp32
// masters). A unit - the root (final norm, LM head, and the embeddings unless the head is untied, when they
// are a unit of their own) or one decoder layer - is all-gathered into
// the model's own parameter tensors (their storage taken again, in the compute dtype) just before the
// forward pass uses it and released right after; a layer is gathered again when its output gradient
// arrives in backward, and once all of its parameters' gradients are final they are packed into a send
// buffer and the layer is released, while a communication thread reduce-scatters the packed chunk (adds it
// into the owners' gradient shards: every micro-batch, so no whole gradient outlives its layer's backward)
// beside the backward of the layers below. Every rank runs the same collectives in the same order - the
// communication thread runs gathers and reductions in the order the training thread queued them - and a
// rank without data runs an idle micro-batch (idle_inputs) rather than none.
#pragma once
#include <array>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/loader.h"
#include "models/causal_lm.h"
#include "train/comm_queue.h"
#include "train/zero.h"

namespace tr::train {

// HF's fsdp_config prefetch keys: forward_prefetch (default false) gathers layer i + 1 while layer i runs
// forward; backward_prefetch "backward_pre" (the default) gathers layer i - 1 when layer i's backward starts,
// "backward_post" when its gradients are reduced, "no_prefetch" not at all.
struct FsdpOptions {
  bool forward_prefetch = false;
  enum class BackwardPrefetch { pre, post, none } backward_prefetch = BackwardPrefetch::pre;
};
// --fsdp_config FILE (HF's keys, with or without their "fsdp_" prefix): the prefetch options; the keys that
// describe what we do anyway (wrapping per decoder layer, ...) are accepted, the rest refused naming the
// file.
FsdpOptions read_fsdp_config(const std::string& path);

class FullShard final : public models::LayerHooks {
 public:
  // `opt` (stage 3) holds this rank's shard of `params` (the model's parameters, fp32 or the compute
  // dtype); every parameter is released here. `bucket_cap_bytes` bounds each collective's payload. Gathers
  // and gradient reductions run on a communication thread in the order they were queued, overlapping the
  // layer that runs meanwhile; the optimizer's collectives come after drain() (one order on every rank).
  FullShard(ShardedOptimizer& opt, const nn::ParamList& params, int64_t bucket_cap_bytes,
            FsdpOptions options = {});
  ~FullShard() override;
  FullShard(const FullShard&) = delete;
  FullShard& operator=(const FullShard&) = delete;

  void before_forward(int unit) override;   // gathered unless resident
  void after_forward(int unit) override;    // released (the root stays while grad mode is on)
  void before_backward(int unit) override;  // gathered again for the layer's backward
  void after_embeddings() override;         // an untied model's embeddings released
  void before_head() override;              // and its final norm and head gathered

  // Before a step's first micro-batch: the gradient shard starts at zero.
  void begin_step();
  // One micro-batch's backward: begin_backward before it; grad_ready from the autograd engine (a unit whose
  // gradients are all final is packed chunk by chunk into a send slot and queued for the communication
  // thread, which adds the ranks' sums - times `scale` - into the owners' shards; its gradients are dropped
  // and the unit released at once); finish_backward after it (units no gradient reached, in a fixed order;
  // returns with every reduction done, the gradient shard complete).
  void begin_backward(double scale);
  void grad_ready(const TensorImpl* leaf);
  void finish_backward();
  // Every queued gather and reduction finished (rethrows a failed one); before any collective of another
  // caller and before the gradient shard is read.
  void drain();

  // Units: the decoder layers, the root, and the embeddings apart from it when the head is untied.
  int units() const { return static_cast<int>(units_.size()); }
  int layers() const { return layers_; }
  int64_t prefetched() const { return prefetched_; }  // gathers started before they were needed
  // Seconds the training thread waited on this object's collectives (gathers not done yet, reductions),
  // and seconds its collectives took in all on the communication thread (the group's time in them).
  double blocked_seconds() const { return comm_ ? comm_->blocked_seconds() : 0; }
  double comm_seconds() { return comm_ ? comm_->collective_seconds() : 0; }
  int64_t gathers() const { return gathers_; }  // unit gathers so far (tests: forward + backward per layer)
  int64_t reductions() const { return reductions_; }  // chunk reductions queued so far
  // Whether every parameter is released (between steps).
  bool all_released() const;

 private:
  struct Piece {  // elements [at, at + n) of parameter `param`, inside one rank's shard
    size_t param;
    int64_t at, n, flat;
    int owner;
  };
  struct Chunk {  // pieces in flat order (so grouped by owner), at most the bucket cap in elements
    std::vector<Piece> pieces;
    std::vector<int64_t> per_rank;  // elements owned by each rank
  };
  enum class State { released, pending, resident };  // pending: storage taken, gather queued
  struct Unit {
    std::vector<size_t> params;
    std::vector<Chunk> chunks;
    State state = State::released;
    uint64_t ticket = 0;   // the queued gather while pending
    int waiting = 0;       // parameters whose gradient this backward has not finished
    bool reduced = false;  // in this backward
  };
  Unit& unit(int u);
  void start_gather(Unit& u, bool prefetch);  // storage taken here (the training thread's allocation order)
  void wait(Unit& u);
  void gather(Unit& u) {
    start_gather(u, false);
    wait(u);
  }
  void prefetch(int layer);  // when that layer exists
  void release(Unit& u);
  // A reduction's send side: a chunk's gradient pieces in f32, packed by the training thread while the
  // communication thread reduces the chunk packed into the other slot. Host path: `host`; the device path:
  // `send`, the owners' sums `sum` and the scale, on the shard's device (made once, at the first reduction).
  struct Slot {
    std::vector<float> host;
    Tensor send, sum, scale;
    std::unique_ptr<backend::ComputeFence> packed;  // on a GPU: the compute-stream point after the packing
    uint64_t ticket = 0;                            // the last job that read this slot
  };
  void reduce(Unit& u);
  void gather_chunk(const Chunk& c);
  void pack_chunk(const Chunk& c, Slot& s);                 // training thread
  void reduce_chunk(const Chunk& c, Slot& s, float scale);  // communication thread (or a dry run's)
  // The same over the model's device's memory where the optimizer's collectives run there
  // (ShardedOptimizer::device_comm; zero_device.cpp): pieces packed and unpacked by device copies.
  void gather_chunk_on_device(const Chunk& c);
  void pack_chunk_on_device(const Chunk& c, Slot& s);
  void reduce_chunk_on_device(const Chunk& c, Slot& s, float scale);
  // The device path's buffers - the gather's (this rank's pieces of a chunk, every rank's) and the send
  // slots' - made for the largest chunk at first use, on the training thread: the allocation order stays
  // independent of timing.
  void make_gather_buffers();
  void make_slots();
  std::pair<int64_t, int64_t> largest_chunk() const;  // this rank's part of any chunk, any chunk's elements

  ShardedOptimizer& opt_;
  nn::ParamList params_;
  FsdpOptions options_;
  std::vector<Unit> units_;  // [0]: the root, [i + 1]: decoder layer i, [layers + 1]: the embeddings apart
  int layers_ = 0;
  int embed_unit_ = 0;        // the embeddings' unit when apart from the root (an untied head), else 0
  std::vector<int> unit_of_;  // per parameter
  std::vector<char> seen_;    // per parameter: reported by this backward
  std::unordered_map<const TensorImpl*, size_t> index_;
  DType dtype_;
  bool meta_ = false;
  float scale_ = 1;
  bool in_backward_ = false;
  int64_t gathers_ = 0, prefetched_ = 0, reductions_ = 0;
  Tensor gather_send_, gather_recv_;      // make_gather_buffers
  std::vector<char> send_;                // the communication thread's
  host_stage::StagingBuffer<char> recv_;  // and the gathered pieces on their way into the parameters
  std::array<Slot, 2> slots_;             // reductions: one packed while the other is reduced
  int next_slot_ = 0;
  std::vector<float> frecv_;  // the communication thread's receiving side of a reduction
  // Pieces off the host (pinned beside a GPU): the communication thread's master pieces and gradient shard
  // pieces, the training thread's gradient pieces.
  host_stage::StagingBuffer<float> gather_tmp_, shard_tmp_;
  host_stage::StagingBuffer<char> grad_tmp_;
  bool shard_tmp_sized_ = false;  // on the training thread, before the first reduction
  // The gathers and reductions, in queue order (none in a dry run). Last: it goes first, skipping what is
  // left, before the buffers its jobs use.
  std::unique_ptr<CommQueue> comm_;
};

// An idle micro-batch for a rank past its data (ZeRO-3: every rank must run every forward's collectives):
// one row of `T` zeros whose labels are all ignored (-100), so it adds nothing to any loss or gradient.
data::Batch idle_batch(int64_t T, Device device);

}  // namespace tr::train
