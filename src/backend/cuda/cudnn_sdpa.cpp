// cuDNN's fused attention (cudnn_sdpa.h): which calls it takes, the forward and backward operation graphs,
// plans cached per shape and layout, execution on the compute stream.
#include "backend/cuda/cudnn_sdpa.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>

#include "backend/cuda/cuda_check.h"
#include "backend/cudnn_attention_rule.h"
#include "backend/cuda/cudnn_graph.h"

namespace tr::cuda {

using backend::AttentionGeometry;
using backend::HeadRows;

// A plan's identity: everything the graph bakes in (shapes, layouts, the direction; the scale is passed by
// value at each call). One plan per shape a run meets - its training and evaluation lengths - kept for the
// run.
struct CudnnSdpa::Key {
  bool backward;
  DType dt;
  int64_t B, H, KV, T, S, D;
  bool causal, dropout;
  std::vector<int64_t> strides;  // every operand's (batch, head, row)
  auto tie() const { return std::tie(backward, dt, B, H, KV, T, S, D, causal, dropout, strides); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

// A planned graph (or why there is none) and the unique ids of its operands, in the order execute() binds.
struct CudnnSdpa::Entry {
  dnn::GraphBuilder::Plan plan;
  bool ok = false;
  std::string refusal;
  // The operands' ids in the order forward() and backward() pass their pointers; 0 for one the graph lacks.
  std::vector<int64_t> uids;
};

namespace {

cudnnDataType_t dnn_type(DType dt) { return dt == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

using Dims = std::vector<int64_t>;

// [B, heads, rows, D] through its HeadRows (head dim contiguous), and the same memory read transposed.
dnn::TensorSpec operand(cudnnDataType_t dt, int64_t B, int64_t heads, int64_t rows, int64_t D,
                        const HeadRows& r) {
  return {{B, heads, rows, D}, {r.batch, r.head, r.row, 1}, dt};
}
dnn::TensorSpec transposed(cudnnDataType_t dt, int64_t B, int64_t heads, int64_t rows, int64_t D,
                           const HeadRows& r) {
  return {{B, heads, D, rows}, {r.batch, r.head, 1, r.row}, dt};
}

// A virtual intermediate: dims with the given strides, in `dt`.
dnn::TensorSpec inner(Dims dims, Dims strides, cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
  return {std::move(dims), std::move(strides), dt, true};
}

// A host f32 scalar passed with the variant pack.
dnn::TensorSpec by_value() {
  dnn::TensorSpec s{{1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT};
  s.by_value = true;
  return s;
}

// The shapes every graph shares: scores [B, H, T, S] and row statistics [B, H, T, 1], dense.
struct Shapes {
  int64_t B, H, KV, T, S, D;
  dnn::TensorSpec scores(cudnnDataType_t dt = CUDNN_DATA_FLOAT) const {
    return inner({B, H, T, S}, {H * T * S, T * S, S, 1}, dt);
  }
  dnn::TensorSpec scores_t(cudnnDataType_t dt) const {  // the scores' memory as [B, H, S, T]
    return inner({B, H, S, T}, {H * T * S, T * S, 1, S}, dt);
  }
  dnn::TensorSpec rows(bool is_virtual = true) const {
    dnn::TensorSpec r = inner({B, H, T, 1}, {H * T, T, 1, 1});
    r.is_virtual = is_virtual;
    return r;
  }
  dnn::TensorSpec keep_mask(cudnnDataType_t io) const {  // dropout's, in memory: [B, H, T, S] dense
    dnn::TensorSpec m = scores(io);
    m.is_virtual = false;
    return m;
  }
};

// Causal masking of x [B, H, T, S] (T == S: key s visible to query t iff s <= t, cudnn_frontend's top-left
// band): x where visible, -inf elsewhere.
int64_t causal_mask(dnn::GraphBuilder& g, const Shapes& sh, int64_t x, int64_t minus_inf) {
  const int64_t row = g.tensor(sh.scores(CUDNN_DATA_INT32)), col = g.tensor(sh.scores(CUDNN_DATA_INT32));
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, 0, row, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, 0, col, 3);
  const int64_t visible = g.tensor(sh.scores(CUDNN_DATA_BOOLEAN));
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, visible, -1, CUDNN_DATA_BOOLEAN);
  const int64_t y = g.tensor(sh.scores());
  g.select(x, minus_inf, visible, y);
  return y;
}

// The forward: S = Q K^T * scale, masked; stats = max + log(sum(exp(S - max))); O = softmax(S) V (the
// probabilities, times keep / (1 - p) under dropout, rounded to the inputs' type, as the engine's second
// product reads them). Operand ids in the order of CudnnSdpa::Entry::uids.
std::vector<int64_t> forward_graph(dnn::GraphBuilder& g, const Shapes& sh, cudnnDataType_t io,
                                   const backend::AttentionRows& r, bool causal, bool dropout) {
  const int64_t B = sh.B, H = sh.H, KV = sh.KV, T = sh.T, S = sh.S, D = sh.D;
  const int64_t q = g.tensor(operand(io, B, H, T, D, r.q)), kt = g.tensor(transposed(io, B, KV, S, D, r.k)),
                v = g.tensor(operand(io, B, KV, S, D, r.v)), o = g.tensor(operand(io, B, H, T, D, r.out)),
                stats = g.tensor(sh.rows(false)), scale = g.tensor(by_value()),
                minus_inf = causal ? g.tensor(by_value()) : 0;
  const int64_t qk = g.tensor(sh.scores()), scaled = g.tensor(sh.scores());
  g.matmul(q, kt, qk);
  g.pointwise(CUDNN_POINTWISE_MUL, qk, scale, scaled);
  const int64_t x = causal ? causal_mask(g, sh, scaled, minus_inf) : scaled;
  const int64_t m = g.tensor(sh.rows()), centered = g.tensor(sh.scores()), e = g.tensor(sh.scores()),
                z = g.tensor(sh.rows()), log_z = g.tensor(sh.rows()),
                p = g.tensor(sh.scores(dropout ? CUDNN_DATA_FLOAT : io));
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, x, m);
  g.pointwise(CUDNN_POINTWISE_SUB, x, m, centered);
  g.pointwise(CUDNN_POINTWISE_EXP, centered, 0, e);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  g.pointwise(CUDNN_POINTWISE_LOG, z, 0, log_z);
  g.pointwise(CUDNN_POINTWISE_ADD, m, log_z, stats);
  g.pointwise(CUDNN_POINTWISE_DIV, e, z, p);
  if (!dropout) {
    g.matmul(p, v, o);
    return {q, kt, v, o, stats, scale, minus_inf, 0, 0};
  }
  // cudnn_frontend's custom dropout mask: P * (1 / (1 - p)), then * keep (the scale by value, the mask ours).
  const int64_t keep = g.tensor(sh.keep_mask(io)), keep_scale = g.tensor(by_value()),
                scaled_p = g.tensor(sh.scores()), dropped = g.tensor(sh.scores(io));
  g.pointwise(CUDNN_POINTWISE_MUL, p, keep_scale, scaled_p);
  g.pointwise(CUDNN_POINTWISE_MUL, scaled_p, keep, dropped);
  g.matmul(dropped, v, o);
  return {q, kt, v, o, stats, scale, minus_inf, keep, keep_scale};
}

// The backward (cudnn_frontend's composite graph on cuDNN 9): delta = rowsum(dO * O) into softmax_sum;
// P = exp(Q K^T * scale - stats), masked; dV = P^T dO; dS = P * (dO V^T - delta) * scale; dK = dS^T Q;
// dQ = dS K through an f32 accumulator. dK and dV of grouped heads are summed over the group by a reduction.
// softmax_sum and the dQ accumulator live in the caller's workspace. Under dropout (keep mask M, factor
// s = 1 / (1 - p)): softmax_sum = delta * (1 - p), dV = (P M s)^T dO, dS = P * (M (dO V^T) - softmax_sum) * s
// * scale - the frontend's order of the same function.
std::vector<int64_t> backward_graph(dnn::GraphBuilder& g, const Shapes& sh, cudnnDataType_t io,
                                    const backend::AttentionRows& r, bool causal, bool dropout) {
  const int64_t B = sh.B, H = sh.H, KV = sh.KV, T = sh.T, S = sh.S, D = sh.D;
  const int64_t q = g.tensor(operand(io, B, H, T, D, r.q)), kt = g.tensor(transposed(io, B, KV, S, D, r.k)),
                vt = g.tensor(transposed(io, B, KV, S, D, r.v)), o = g.tensor(operand(io, B, H, T, D, r.out)),
                stats = g.tensor(sh.rows(false)), dout = g.tensor(operand(io, B, H, T, D, r.dout)),
                dq = g.tensor(operand(io, B, H, T, D, r.dq)), dk = g.tensor(operand(io, B, KV, S, D, r.dk)),
                dv = g.tensor(operand(io, B, KV, S, D, r.dv)), one = dropout ? 0 : g.tensor(by_value()),
                scale = g.tensor(by_value()), minus_inf = causal ? g.tensor(by_value()) : 0,
                keep = dropout ? g.tensor(sh.keep_mask(io)) : 0,
                keep_scale = dropout ? g.tensor(by_value()) : 0,
                keep_scale_inv = dropout ? g.tensor(by_value()) : 0, softmax_sum = g.tensor(sh.rows(false)),
                dq_acc = g.tensor({{B, H, T, D}, {H * T * D, T * D, D, 1}, CUDNN_DATA_FLOAT});
  // delta (cudnn_frontend's dO * O intermediate strides, kept as it ships them).
  const int64_t d_o = g.tensor(inner({B, H, T, D}, {H * T * D, T * D, H * D, 1})), rs = g.tensor(sh.rows());
  g.pointwise(CUDNN_POINTWISE_MUL, dout, o, d_o);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, d_o, rs);
  g.pointwise(CUDNN_POINTWISE_MUL, rs, dropout ? keep_scale_inv : one, softmax_sum);
  // P, recomputed from the saved statistics.
  const int64_t qk = g.tensor(sh.scores()), scaled = g.tensor(sh.scores()), centered = g.tensor(sh.scores());
  g.matmul(q, kt, qk);
  g.pointwise(CUDNN_POINTWISE_MUL, qk, scale, scaled);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, stats, centered);
  const int64_t x = causal ? causal_mask(g, sh, centered, minus_inf) : centered;
  const int64_t p = g.tensor(sh.scores()), pt = g.tensor(sh.scores_t(io));
  g.pointwise(CUDNN_POINTWISE_EXP, x, 0, p);
  int64_t p_dropped = p;
  if (dropout) {
    const int64_t kept = g.tensor(sh.scores());
    p_dropped = g.tensor(sh.scores());
    g.pointwise(CUDNN_POINTWISE_MUL, p, keep, kept);
    g.pointwise(CUDNN_POINTWISE_MUL, kept, keep_scale, p_dropped);
  }
  g.reshape(p_dropped, pt);
  // dV = P^T dO (summed over a group's query heads when they share a kv head).
  const bool grouped = H != KV;
  auto full = [&](int64_t kv_grad) {
    return grouped ? g.tensor(inner({B, H, S, D}, {H * S * D, S * D, D, 1}, io)) : kv_grad;
  };
  const int64_t dv_full = full(dv);
  g.matmul(pt, dout, dv_full);
  if (grouped) g.reduction(CUDNN_REDUCE_TENSOR_ADD, dv_full, dv);
  // dS = P * (dO V^T - delta) * scale (the dropout's mask and factor around it).
  const int64_t dp = g.tensor(sh.scores()), dp_centered = g.tensor(sh.scores()), dpp = g.tensor(sh.scores()),
                ds = g.tensor(sh.scores()), dst = g.tensor(sh.scores_t(io));
  g.matmul(dout, vt, dp);
  int64_t dp_kept = dp;
  if (dropout) {
    dp_kept = g.tensor(sh.scores());
    g.pointwise(CUDNN_POINTWISE_MUL, dp, keep, dp_kept);
  }
  g.pointwise(CUDNN_POINTWISE_SUB, dp_kept, softmax_sum, dp_centered);
  g.pointwise(CUDNN_POINTWISE_MUL, dp_centered, p, dpp);
  int64_t dpp_scaled = dpp;
  if (dropout) {
    dpp_scaled = g.tensor(sh.scores());
    g.pointwise(CUDNN_POINTWISE_MUL, dpp, keep_scale, dpp_scaled);
  }
  g.pointwise(CUDNN_POINTWISE_MUL, dpp_scaled, scale, ds);
  g.reshape(ds, dst);
  const int64_t dk_full = full(dk);
  g.matmul(dst, q, dk_full);
  if (grouped) g.reduction(CUDNN_REDUCE_TENSOR_ADD, dk_full, dk);
  // dQ = dS K: the transposed K view back to [B, KV, S, D] (f32 as cudnn_frontend infers it), into the f32
  // accumulator, then rounded into dq.
  const int64_t kv = g.tensor(inner({B, KV, S, D}, {r.k.batch, r.k.head, r.k.row, 1}));
  g.reshape(kt, kv);
  g.matmul(ds, kv, dq_acc);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_acc, 0, dq);
  return {q,         kt,          vt,     o,    dout,       stats,         dq, dk, dv, one, scale,
          minus_inf, softmax_sum, dq_acc, keep, keep_scale, keep_scale_inv};
}

int compute_major(int device) {
  int major = 0;
  TR_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major;
}

}  // namespace

CudnnSdpa::CudnnSdpa(int device) : major_(compute_major(device)) {
  if (const char* e = std::getenv("TRAINER_CUDNN_ATTENTION"); e && std::strcmp(e, "0") == 0) enabled_ = false;
}

CudnnSdpa::~CudnnSdpa() {
  plans_.clear();  // descriptors before the handle they were planned on
  std::string why;
  if (handle_)
    if (const dnn::Api* api = dnn::api(&why)) api->destroy(static_cast<cudnnHandle_t>(handle_));
}

void CudnnSdpa::set_enabled(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  enabled_ = on;
}

CudnnSdpa::Counts CudnnSdpa::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

std::string CudnnSdpa::unsupported(DType dt, const AttentionGeometry& g, int major, bool backward,
                                   std::initializer_list<const void*> ptrs) {
  if (const char* why = backend::cudnn_attention_declines(is_half(dt), g, major, backward)) return why;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return "an operand not 16-byte aligned";
  const auto& r = g.rows;
  for (const HeadRows& h : {r.q, r.k, r.v, r.out, r.dout, r.dq, r.dk, r.dv})
    if (h.batch % 8 != 0 || h.head % 8 != 0 || h.row % 8 != 0) return "strides not multiples of 8 elements";
  return "";
}

namespace {

const dnn::Api& loaded_api() {
  std::string why;
  const dnn::Api* api = dnn::api(&why);
  if (api == nullptr) throw dnn::DnnError(why);
  return *api;
}

void build_graph(dnn::GraphBuilder& b, DType dt, const AttentionGeometry& g, bool backward) {
  const Shapes sh{g.B, g.H, g.KV, g.T, g.S, g.D};
  if (backward)
    backward_graph(b, sh, dnn_type(dt), g.rows, g.causal, g.dropout > 0);
  else
    forward_graph(b, sh, dnn_type(dt), g.rows, g.causal, g.dropout > 0);
}

}  // namespace

int64_t CudnnSdpa::graph_operations(DType dt, const AttentionGeometry& g, bool backward) {
  dnn::GraphBuilder b(loaded_api());
  build_graph(b, dt, g, backward);
  return b.operations();
}

CudnnSdpa::Offline CudnnSdpa::plan_offline(DType dt, const AttentionGeometry& g, bool backward,
                                           const std::string& device_json) {
  const dnn::Api& api = loaded_api();
  const auto device = dnn::device_properties(api, device_json);
  dnn::GraphBuilder b(api);
  build_graph(b, dt, g, backward);
  const int64_t ops = b.operations();
  const auto plan = b.build(nullptr, device.get());
  return {ops, plan.workspace, plan.engine};
}

bool CudnnSdpa::ready(cudaStream_t stream, bool capturing) {
  if (!enabled_ || load_failed_) return false;
  if (!handle_ && capturing) return false;  // (cudnnCreate is not a call to make inside a stream capture)
  std::string why;
  const dnn::Api* api = dnn::api(&why);
  if (api == nullptr) {
    load_failed_ = true;
    std::fprintf(stderr, "cuda: cuDNN's fused attention is off (%s); attention runs our kernels\n",
                 why.c_str());
    return false;
  }
  try {
    if (!handle_) {
      cudnnHandle_t h = nullptr;
      api->check(api->create(&h), "cudnnCreate");
      handle_ = h;
    }
    api->check(api->set_stream(static_cast<cudnnHandle_t>(handle_), stream), "cudnnSetStream");
  } catch (const dnn::DnnError& e) {
    load_failed_ = true;
    std::fprintf(stderr, "cuda: cuDNN's fused attention is off (%s); attention runs our kernels\n", e.what());
    return false;
  }
  return true;
}

CudnnSdpa::Entry* CudnnSdpa::plan(const Key& key, const AttentionGeometry& g, DType dt, bool backward,
                                  bool capturing) {
  auto it = plans_.find(key);
  // Planning compiles and loads kernels: never inside a stream capture. A shape first met there runs our
  // kernels in the graph (an eager step before the capture plans the shapes a step has).
  if (it == plans_.end() && capturing) return nullptr;
  if (it == plans_.end()) {
    auto e = std::make_unique<Entry>();
    const dnn::Api& api = *dnn::api(nullptr);
    try {
      dnn::GraphBuilder b(api);
      const Shapes sh{g.B, g.H, g.KV, g.T, g.S, g.D};
      e->uids = backward ? backward_graph(b, sh, dnn_type(dt), g.rows, g.causal, g.dropout > 0)
                         : forward_graph(b, sh, dnn_type(dt), g.rows, g.causal, g.dropout > 0);
      e->plan = b.build(static_cast<cudnnHandle_t>(handle_));
      e->ok = true;
      ++counts_.plans;
    } catch (const dnn::DnnError& err) {
      refuse(*e, err.what(), g, backward);
    }
    it = plans_.emplace(key, std::move(e)).first;
  }
  return it->second->ok ? it->second.get() : nullptr;
}

// A shape cuDNN does not run: said once (its plan entry remembers), counted, and left to our kernels.
void CudnnSdpa::refuse(Entry& e, const std::string& why, const AttentionGeometry& g, bool backward) {
  e.ok = false;
  e.refusal = why;
  ++counts_.refused;
  counts_.last_refusal = why;
  std::fprintf(stderr,
               "cuda: cuDNN's fused attention refused the %s of B=%lld H=%lld KV=%lld T=%lld S=%lld D=%lld "
               "(%s); that shape runs our kernels\n",
               backward ? "backward" : "forward", static_cast<long long>(g.B), static_cast<long long>(g.H),
               static_cast<long long>(g.KV), static_cast<long long>(g.T), static_cast<long long>(g.S),
               static_cast<long long>(g.D), why.c_str());
}

// Why the loaded cuDNN is too old for this direction (nullptr when it is not), said once: cudnn_frontend
// rejects 9.10.0/9.10.1 and masks with lowest() below 9.10, and below 9.16 its backward adds a padding mask
// when S % 128 != 0 (below 9.6 the accumulator also needs zeroing). Those runtimes keep our kernels.
const char* CudnnSdpa::too_old(bool backward) {
  const size_t v = dnn::api(nullptr)->get_version();
  const char* why = backward && v < 91600 ? "the backward needs cuDNN 9.16 or later"
                    : v < 91002           ? "the forward needs cuDNN 9.10.2 or later"
                                          : nullptr;
  if (why && !said_too_old_[backward]) {
    said_too_old_[backward] = true;
    ++counts_.refused;
    counts_.last_refusal = fmt::format("{} (found {})", why, v);
    std::fprintf(stderr, "cuda: %s; attention runs our kernels\n", counts_.last_refusal.c_str());
  }
  return why;
}

namespace {

CudnnSdpa::Key key_of(bool backward, DType dt, const AttentionGeometry& g) {
  std::vector<int64_t> strides;
  const auto& r = g.rows;
  for (const HeadRows& h : {r.q, r.k, r.v, r.out, r.dout, r.dq, r.dk, r.dv})
    strides.insert(strides.end(), {h.batch, h.head, h.row});
  return {backward, dt, g.B, g.H, g.KV, g.T, g.S, g.D, g.causal, g.dropout > 0, std::move(strides)};
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TR_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace

// Runs e's plan, or, when cuDNN fails to (its variant pack or launch refused: nothing was queued), marks the
// shape refused and returns false so that our kernels run it, now and at its later calls.
bool CudnnSdpa::run(Entry& e, const std::vector<void*>& operands, void* workspace, const AttentionGeometry& g,
                    bool backward) {
  std::vector<int64_t> uids;
  std::vector<void*> ptrs;
  for (size_t i = 0; i < e.uids.size(); ++i)
    if (e.uids[i] > 0) uids.push_back(e.uids[i]), ptrs.push_back(operands[i]);  // (0: not in this graph)
  try {
    dnn::execute(*dnn::api(nullptr), static_cast<cudnnHandle_t>(handle_), *e.plan.plan, uids, ptrs,
                 workspace);
  } catch (const dnn::DnnError& err) {
    refuse(e, err.what(), g, backward);
    return false;
  }
  return true;
}

namespace {

// Under dropout, the call's keep mask drawn into `mask` on `stream` (our Philox stream: the mask every other
// form of ours draws; `shift` moves its offset in a CUDA graph's launches).
void draw_keep_mask(cudaStream_t stream, DType dt, const AttentionGeometry& g, void* mask,
                    const uint64_t* shift) {
  dropout_keep_mask(stream, dt, mask, g.B * g.H * g.T * g.S, g.dropout, g.seed, g.offset, shift);
}

}  // namespace

bool CudnnSdpa::forward(cudaStream_t stream, DType dt, const AttentionGeometry& g, const void* q,
                        const void* k, const void* v, void* out, void* lse, const uint64_t* shift,
                        Scratch& scratch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!unsupported(dt, g, major_, false, {q, k, v, out, lse}).empty()) return false;
  const bool graph = capturing(stream);
  if (!ready(stream, graph) || too_old(false)) return false;
  Entry* e = plan(key_of(false, dt, g), g, dt, false, graph);
  if (e == nullptr) return false;
  float scale = static_cast<float>(g.scale), minus_inf = -INFINITY,
        keep_scale = static_cast<float>(g.keep_scale);
  const auto mask_bytes = static_cast<size_t>(backend::cudnn_attention_dropout_mask_bytes(g));
  const size_t ws_bytes = mask_bytes + static_cast<size_t>(e->plan.workspace);
  auto* ws = ws_bytes > 0 ? static_cast<char*>(scratch.take(ws_bytes)) : nullptr;
  if (mask_bytes > 0) draw_keep_mask(stream, dt, g, ws, shift);
  if (!run(*e,
           {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), out, lse, &scale, &minus_inf,
            ws, &keep_scale},
           e->plan.workspace > 0 ? ws + mask_bytes : nullptr, g, false))
    return false;
  ++counts_.forward;
  return true;
}

bool CudnnSdpa::backward(cudaStream_t stream, DType dt, const AttentionGeometry& g, const void* q,
                         const void* k, const void* v, const void* out, const void* lse, const void* dout,
                         void* dq, void* dk, void* dv, const uint64_t* shift, Scratch& scratch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!unsupported(dt, g, major_, true, {q, k, v, out, lse, dout, dq, dk, dv}).empty()) return false;
  const bool graph = capturing(stream);
  if (!ready(stream, graph) || too_old(true)) return false;
  Entry* e = plan(key_of(true, dt, g), g, dt, true, graph);
  if (e == nullptr) return false;
  float one = 1.0f, scale = static_cast<float>(g.scale), minus_inf = -INFINITY,
        keep_scale = static_cast<float>(g.keep_scale), keep_scale_inv = 1.0f - g.dropout;
  // The workspace: dQ's accumulator, the row sums, the keep mask, then the engine's own.
  const auto acc = static_cast<size_t>(backend::cudnn_attention_dq_accumulator_bytes(g)),
             sums = static_cast<size_t>(backend::cudnn_attention_row_sum_bytes(g)),
             mask_bytes = static_cast<size_t>(backend::cudnn_attention_dropout_mask_bytes(g));
  auto* ws =
      static_cast<char*>(scratch.take(acc + sums + mask_bytes + static_cast<size_t>(e->plan.workspace)));
  char* mask = ws + acc + sums;
  if (mask_bytes > 0) draw_keep_mask(stream, dt, g, mask, shift);
  if (!run(*e,
           {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), const_cast<void*>(out),
            const_cast<void*>(dout), const_cast<void*>(lse), dq, dk, dv, &one, &scale, &minus_inf, ws + acc,
            ws, mask, &keep_scale, &keep_scale_inv},
           e->plan.workspace > 0 ? mask + mask_bytes : nullptr, g, true))
    return false;
  ++counts_.backward;
  return true;
}

}  // namespace tr::cuda
