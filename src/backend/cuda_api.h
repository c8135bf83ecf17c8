// Entry points the CUDA backend provides; backend/cuda implements them with CUDA and backend/no_cuda with
// clear errors, so no code outside the backends needs an #ifdef.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace tr::backend {

// cuBLASLt's workspace per device (PyTorch's size for Hopper): cudaMalloc'd once, outside the caching
// allocator; `trainer estimate --device cuda` counts it.
inline constexpr size_t kCublasLtWorkspaceBytes = size_t{32} << 20;

// True when compiled with CUDA support (whether or not a GPU is present).
bool cuda_compiled();
// The CUDA backend; throws when built without CUDA or when no GPU is present.
Backend& cuda_backend();
// Makes cuda:index the calling thread's current device - the one kernels, streams, cuBLAS handles and graph
// captures of the backend follow - as PyTorch's device guard; backend_for(cuda:i) calls it, so an op on
// another GPU's tensors runs on that GPU. Cheap when it already is current.
void cuda_use_device(int index);
// Copies between host and a GPU (or two GPUs): both contiguous, same dtype and size.
void cuda_copy_between_devices(const Tensor& src, const Tensor& dst);
// Host memory for data headed to a GPU: page-locked (cudaHostAlloc) when a GPU is usable, else plain
// 64-byte-aligned memory. Counts like any allocator.
Allocator& pinned_host_allocator();

// A dedicated stream for host-to-device copies. copy_async() queues the copy of a contiguous host tensor
// (page-locked for true overlap) into a same-sized device tensor, after the work the compute stream has
// queued so far (the caching allocator may hand out a block that queued kernels still read: a copy on another
// stream must not overwrite it before they ran); make_compute_wait() orders the device's compute stream after
// every copy queued so far. Neither blocks the host.
class CopyStream {
 public:
  explicit CopyStream(Device device);
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;
  void copy_async(const Tensor& host, const Tensor& dev);
  void make_compute_wait();
  // Blocks until every queued copy is done (before their host buffers are reused or freed).
  void synchronize();

 private:
  Device device_;
  void* stream_ = nullptr;   // cudaStream_t
  void* event_ = nullptr;    // cudaEvent_t: the copies queued so far
  void* compute_ = nullptr;  // cudaEvent_t: the compute work queued before a copy
};

// A point in a device's compute stream. record() marks the work queued so far, on the thread that queued
// it. A collective issued later, from any thread, then waits on the GPU for that point only, not for the
// work queued after it. (ZeRO's buckets are packed on the training thread and reduced on the communication
// thread while backward goes on: a mark taken at issue time would hold the reduction behind the rest of
// backward.) Off a GPU it marks nothing.
class ComputeFence {
 public:
  explicit ComputeFence(Device device);
  ~ComputeFence();
  ComputeFence(const ComputeFence&) = delete;
  ComputeFence& operator=(const ComputeFence&) = delete;
  void record();
  // The cudaEvent_t of the last record() (null off a GPU or before the first).
  void* event() const { return recorded_ ? event_ : nullptr; }

 private:
  Device device_;
  void* event_ = nullptr;  // cudaEvent_t
  bool recorded_ = false;
};

// An NCCL communicator, one GPU per rank (backend/cuda/nccl_comm.cpp; NCCL is loaded when the first one is
// made, so a binary without libnccl.so.2 beside it still runs everything else; without CUDA: throws). The
// collectives run on a communication stream of the communicator's own, so the kernels other threads queue on
// the compute stream meanwhile (the rest of backward) run beside them: host memory is staged through a device
// buffer there, and a collective over device memory first waits (on the GPU) for the compute work queued
// before the call. Each returns when its result is complete (in host memory, or in the device buffer). Every
// wait polls the collective's own event and NCCL's asynchronous errors, and aborts the communicator past
// `timeout`: a peer that died or hangs is an error naming the collective, never a silent hang.
class NcclComm {
 public:
  // ncclGetUniqueId's bytes, which rank 0 hands every rank before they construct theirs.
  static std::string unique_id();
  NcclComm(int device_index, int rank, int world, const std::string& id, std::chrono::milliseconds timeout);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  int rank() const { return rank_; }
  int size() const { return world_; }
  // Element-wise sums of n f32 or f64 values, in place (host memory, staged through the GPU).
  void all_reduce_sum(void* data, size_t n, DType dt);
  // The same over this communicator's GPU's own memory, in place: no host copies (DDP's device buckets).
  // `after`: as reduce_blocks_device's.
  void all_reduce_sum_device(void* device_data, size_t n, DType dt, const void* after = nullptr);
  // Over the GPU's memory too: out (n f32) = the sum over the ranks of their in[rank * n, (rank + 1) * n)
  // (ncclReduceScatter; ZeRO's gradient shard).
  void reduce_scatter_sum_device(const float* in, float* out, size_t n);
  // Block j of `in` (counts[j] f32, consecutive by rank) summed into rank j's `out` (one ncclReduce per
  // non-empty block, grouped; ZeRO's buckets that span shards). `after` (a cudaEvent_t, ComputeFence's):
  // the compute-stream point `in` was written by; null: the compute work queued so far.
  void reduce_blocks_device(const float* in, const std::vector<int64_t>& counts, float* out,
                            const void* after = nullptr);
  // Every rank's `bytes` from `in`, concatenated by rank into `out` (ncclAllGather; ZeRO's updated shard).
  void all_gather_device(const void* in, void* out, size_t bytes);
  // Variable blocks: rank j's counts[j] bytes (this rank's from `in`) concatenated by rank into `out` (one
  // ncclBroadcast per non-empty block, grouped; ZeRO-3's gather of a chunk).
  void all_gather_v_device(const void* in, void* out, const std::vector<size_t>& counts);
  void broadcast(void* data, size_t bytes, int root);
  void all_gather(const void* in, void* out, size_t bytes);
  // Point-to-point in one group: send_bytes[j] bytes from `in` (consecutive by peer) to rank j, recv_bytes[i]
  // bytes from rank i into `out` (consecutive by peer); zero counts are skipped. all_to_all, the variable
  // gathers and gather_v to one rank are this.
  void exchange(const void* in, const std::vector<size_t>& send_bytes, void* out,
                const std::vector<size_t>& recv_bytes);
  // ncclCommSplit: the ranks giving the same color, ordered by key (every rank calls it).
  std::unique_ptr<NcclComm> split(int color, int key);

 private:
  NcclComm(int device_index, int rank, int world, void* comm, std::chrono::milliseconds timeout);
  void* staging(size_t bytes);  // the device buffer, grown to at least `bytes`
  // The communication stream (made at the first call, on device_), for a collective over host memory; with
  // `after_compute`, it first waits for the compute work queued so far (device inputs), or with `after` (a
  // cudaEvent_t) for the compute work that event marks.
  void* begin(bool after_compute, const void* after = nullptr);
  void wait(const char* what);  // until the communication stream's work is done (or fails, or times out)
  int device_, rank_, world_;
  void* comm_ = nullptr;  // ncclComm_t
  void* buf_ = nullptr;
  size_t buf_bytes_ = 0;
  void* stream_ = nullptr;  // cudaStream_t: the communication stream
  void* queued_ = nullptr;  // cudaEvent_t: the compute work a device collective follows
  void* done_ = nullptr;    // cudaEvent_t: the last collective's end, which wait() polls
  std::chrono::milliseconds timeout_;
};

// cuDNN's fused attention (backend/cuda/cudnn_sdpa.h), which the CUDA backend tries first for the calls it
// takes (bf16/f16, no padding mask, dropout through our keep mask, ...): on unless TRAINER_CUDNN_ATTENTION=0
// was set at start. What it ran so far, over every GPU of the process.
struct CudnnAttentionCounts {
  int64_t forward = 0, backward = 0;  // calls cuDNN ran
  int64_t plans = 0;                  // graphs planned (one per shape and layout, each direction)
  int64_t refused = 0;                // shapes cuDNN could not plan (each said once on stderr)
  std::string last_refusal;           // the latest refusal's reason
};
void cuda_use_cudnn_attention(bool on);
CudnnAttentionCounts cuda_cudnn_attention_counts();

// cuda:0 when a GPU is usable, else the CPU (a CUDA build without a GPU says so once on stderr).
Device default_device();
// cuda:<index>'s name ("NVIDIA H200"); empty when there is no such GPU or no CUDA.
std::string cuda_device_name(int index);
// One line about the CUDA runtime, driver and devices (or why there is none).
std::string cuda_summary();
// The GPU libraries, each as built against and as found at run time: cuBLASLt (linked), NCCL (opened at the
// first communicator) and cuDNN (opened at the first attention it may run). Empty without CUDA.
std::string gpu_library_versions();

}  // namespace tr::backend
