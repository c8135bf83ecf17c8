// Fused attention from cuDNN (its flash-attention engines, FlashAttention-2/3 schedules on sm_80/sm_90) for
// one GPU: the forward (out and the logsumexp) and the backward built as cuDNN operation graphs (matmul ->
// scale -> causal mask -> softmax with statistics -> matmul, and the graph of its gradients), planned once
// per shape and layout, run on the backend's compute stream with workspace from the caching allocator.
//
// It takes a call only where cuDNN computes our function (backend/cudnn_attention_rule.h: bf16/f16, no key
// padding mask, attention dropout through our own Philox mask drawn for the call, ...; the logsumexp it saves
// is the one our backward reads, so a cuDNN forward may pair with our backward and the reverse) on 16-byte
// aligned operands whose strides are multiples of 8 elements. Everything else, and every shape cuDNN refuses
// (said once per shape on stderr), runs the backend's flash or tiled kernels.
#pragma once
#include <cudnn_graph.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "backend/attention_geometry.h"
#include "backend/cuda_api.h"
#include "backend/cuda/kernels.h"
#include "core/dtype.h"

namespace tr::cuda {

namespace dnn {
class Desc;
}

class CudnnSdpa {
 public:
  // For the GPU `device`, current when this is made and at every call (the handle is made at the first call
  // that may use cuDNN).
  explicit CudnnSdpa(int device);
  ~CudnnSdpa();
  CudnnSdpa(const CudnnSdpa&) = delete;
  CudnnSdpa& operator=(const CudnnSdpa&) = delete;

  // Why cuDNN's attention does not take this call ("" when it may): the rules above. `major` is the device's
  // compute capability; ptrs the operands' data pointers.
  static std::string unsupported(DType dt, const backend::AttentionGeometry& g, int major, bool backward,
                                 std::initializer_list<const void*> ptrs);

  // Queues out [B, H, T, D] and lse [B, H, T] (contiguous, f32 for the half types) on `stream` and returns
  // true; or returns false, when cuDNN does not take the call (the caller runs its own kernels), having
  // queued at most the dropout mask's drawing. `shift` moves the dropout's Philox offset in a CUDA graph's
  // launches (null: none).
  bool forward(cudaStream_t stream, DType dt, const backend::AttentionGeometry& g, const void* q,
               const void* k, const void* v, void* out, void* lse, const uint64_t* shift, Scratch& scratch);
  // dq, dk, dv (overwritten) from the saved out and lse; same contract.
  bool backward(cudaStream_t stream, DType dt, const backend::AttentionGeometry& g, const void* q,
                const void* k, const void* v, const void* out, const void* lse, const void* dout, void* dq,
                void* dk, void* dv, const uint64_t* shift, Scratch& scratch);

  // The graph of a call built without planning it, which needs no GPU: every tensor and operation
  // descriptor finalized, so cuDNN has checked their attributes. Returns the number of operations; throws
  // dnn::DnnError (a std::runtime_error) with cuDNN's reason, or when libcudnn.so.9 does not load.
  static int64_t graph_operations(DType dt, const backend::AttentionGeometry& g, bool backward);
  // The same graph planned for the GPU `device_json` describes (cuDNN's JSON of its properties), still with
  // none present: whether cuDNN's heuristics find an engine for it there, and which.
  struct Offline {
    int64_t operations = 0, workspace = 0, engine = -1;
  };
  static Offline plan_offline(DType dt, const backend::AttentionGeometry& g, bool backward,
                              const std::string& device_json);

  // Off: every call declines (TRAINER_CUDNN_ATTENTION=0 at start, or cuda_use_cudnn_attention(false)).
  void set_enabled(bool on);
  using Counts = backend::CudnnAttentionCounts;
  Counts counts() const;

  struct Key;
  struct Entry;

 private:
  // The plan for `key` (built on first use, never while `capturing`), or null when there is none.
  Entry* plan(const Key& key, const backend::AttentionGeometry& g, DType dt, bool backward, bool capturing);
  // Whether cuDNN is on, loaded and has a handle bound to `stream`.
  bool ready(cudaStream_t stream, bool capturing);
  const char* too_old(bool backward);
  void refuse(Entry& e, const std::string& why, const backend::AttentionGeometry& g, bool backward);
  bool run(Entry& e, const std::vector<void*>& operands, void* workspace, const backend::AttentionGeometry& g,
           bool backward);
  bool said_too_old_[2] = {false, false};
  int major_;  // compute capability
  bool enabled_ = true;
  bool load_failed_ = false;
  void* handle_ = nullptr;  // cudnnHandle_t
  std::map<Key, std::unique_ptr<Entry>> plans_;
  Counts counts_;
  mutable std::mutex mu_;
};

}  // namespace tr::cuda
