// A process group: the ranks of one training run and the collectives between them (HF/torch's
// torch.distributed process group). `init_process_group` runs the rendezvous through rank 0's TCP store
// (every rank checked in, one world size, no rank twice) and connects the backend: Gloo over TCP for host
// memory. Collectives are blocking and have the group's timeout (--ddp_timeout): a peer that died or hangs
// is an error naming the collective, never a silent hang.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/device.h"
#include "dist/env.h"

namespace tr::backend {
class ComputeFence;
}

namespace tr::dist {

enum class CommBackend { gloo, nccl };
// "gloo" / "nccl"; throws naming --ddp_backend otherwise.
CommBackend parse_comm_backend(const std::string& name);
const char* comm_backend_name(CommBackend b);

// What the collectives of a group moved and how long the caller waited in them (benchmarks, logs).
struct CommStats {
  int64_t calls = 0, bytes = 0;  // bytes: this rank's payload handed to collectives
  double seconds = 0;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend_name() const = 0;
  // Element-wise sums over the ranks, in place (host memory). Every rank gets the same bits.
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  virtual void all_reduce_sum(double* data, size_t n) = 0;
  // Rank `root`'s bytes to every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Every rank's `bytes` from `in`, concatenated by rank into `out` (size() * bytes).
  virtual void all_gather(const void* in, void* out, size_t bytes) = 0;
  // Variable blocks: this rank's `bytes` from `in`; `out` receives rank i's counts[i] bytes, consecutive by
  // rank (counts[rank()] == bytes). ZeRO-3's per-layer parameter gather.
  virtual void all_gather_v(const void* in, size_t bytes, void* out, const std::vector<size_t>& counts) = 0;
  // Variable blocks to one rank: this rank's `bytes` from `in`; on `root`, `out` receives rank i's counts[i]
  // bytes, consecutive by rank (elsewhere `out` is not touched and may be null). Streamed checkpoint saves
  // gather one parameter at a time into the writer's tensor this way. `tag` tells consecutive gathers
  // apart: ranks that disagree on it wait (and time out) rather than exchange the wrong blocks.
  virtual void gather_v(const void* in, size_t bytes, void* out, const std::vector<size_t>& counts, int root,
                        uint32_t tag = 0) = 0;
  // Block j of `in` (size() blocks of `bytes`) to rank j; `out` receives rank i's block for this rank at i.
  virtual void all_to_all(const void* in, void* out, size_t bytes) = 0;
  // Variable blocks: send_counts[j] floats of `in` (consecutive, by rank) to rank j; `out` receives
  // recv_counts[i] floats from rank i, consecutive by rank.
  virtual void all_to_all_v(const float* in, const std::vector<int64_t>& send_counts, float* out,
                            const std::vector<int64_t>& recv_counts) = 0;
  // out[0, n) = the sum over the ranks of their in[rank() * n, (rank() + 1) * n): ZeRO's reduce-scatter.
  // The ranks' blocks are added in rank order, so the bits do not depend on the transport. `scratch` holds
  // size() * n floats between calls (no allocation per bucket).
  void reduce_scatter_sum(const float* in, float* out, size_t n, std::vector<float>& scratch);
  // reduce_blocks_on in host memory: the blocks go to their ranks (all_to_all_v) and are added in rank order.
  void reduce_blocks(const float* in, const std::vector<int64_t>& counts, float* out,
                     std::vector<float>& scratch);
  virtual void barrier() = 0;

  // ---- The same collectives over the memory of device `d`, without host copies, where reads(d) holds:
  // every group reads the host's memory (host partitions such as cpu:1 included: the host collectives above
  // do the work, with their bits), NCCL also its rank's own GPU, waiting for the compute stream's queued work
  // first (or, given a fence, for the work before it). Where reads(d) does not hold, callers stage through
  // host memory (train/host_stage.h).
  virtual bool reads(Device d) const { return d.is_cpu(); }
  // all_reduce_sum over n f32 values in d's memory (`after`: as reduce_blocks_on's).
  virtual void all_reduce_sum_on(Device d, float* data, size_t n,
                                 const backend::ComputeFence* after = nullptr);
  // reduce_scatter_sum's result (size() * n floats in, this rank's n out) in d's memory. NCCL sums in its
  // own order: the bits may differ from the host's, as its all-reduce's do.
  virtual void reduce_scatter_sum_on(Device d, const float* in, float* out, size_t n);
  // Block j of `in` (counts[j] floats, consecutive by rank; the same counts on every rank) summed over the
  // ranks into rank j's `out` (counts[rank()] floats): ZeRO's reduction of a bucket that spans shards.
  // `after` (recorded where `in` was written, maybe on another thread): on a GPU, the collective waits for
  // that point of the compute stream instead of everything queued by the time it is issued.
  virtual void reduce_blocks_on(Device d, const float* in, const std::vector<int64_t>& counts, float* out,
                                const backend::ComputeFence* after = nullptr);
  // all_gather in d's memory.
  virtual void all_gather_on(Device d, const void* in, void* out, size_t bytes);
  // all_gather_v in d's memory (ZeRO-3's gather of a chunk's pieces).
  virtual void all_gather_v_on(Device d, const void* in, size_t bytes, void* out,
                               const std::vector<size_t>& counts);
  // torch.distributed.new_group by colors (MPI_Comm_split): every rank calls it; the ranks that give the
  // same color form one group, ranked in this group's order. The parent must outlive it; the sub-group's
  // traffic counts in the parent's stats() as well.
  virtual std::unique_ptr<ProcessGroup> split(int color) = 0;
  // Where the ranks met, for the run's banner ("" for a group that needed no rendezvous).
  virtual std::string rendezvous() const { return ""; }
  // A copy: collectives of a sub-group may add to it from another thread (ZeRO-3's gathers).
  CommStats stats() const {
    std::lock_guard<std::mutex> g(stats_mu_);
    return stats_;
  }

 protected:
  void add_stats(size_t bytes, double seconds) {
    std::lock_guard<std::mutex> g(stats_mu_);
    stats_.calls += 1;
    stats_.bytes += static_cast<int64_t>(bytes);
    stats_.seconds += seconds;
  }

 private:
  mutable std::mutex stats_mu_;
  CommStats stats_;
};

// Rank 0 of a world of `world_size` whose collectives move and wait for nothing: `trainer estimate`'s dry run
// of a sharded step on the meta device, where there are no values to exchange. With `device_memory` it
// reads the meta device's memory, as NCCL reads its GPU's: the dry run takes the device paths' buffers.
std::unique_ptr<ProcessGroup> dry_run_group(int world_size, bool device_memory = false);

// The group of a distributed environment (one process is a world of one). Rank 0 serves the store at
// MASTER_PORT for the group's lifetime. Throws naming the ranks that did not arrive within `timeout`.
std::unique_ptr<ProcessGroup> init_process_group(const DistEnv& env, CommBackend backend,
                                                 std::chrono::milliseconds timeout);

}  // namespace tr::dist
