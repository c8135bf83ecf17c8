// cuBLASLt GEMMs: plan cache keyed by shape, layout, dtype, epilogue and pointer alignment; one heuristic
// query per plan (max-autotune: its candidates timed once); the workspace allocated once per device. See
// gemm_lt.h.
#include "backend/cuda/gemm_lt.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <compare>
#include <cstdio>
#include <string>

#include "core/error.h"

namespace tr::cuda {

namespace {

#define TR_LT_CHECK(call)                                                                                \
  do {                                                                                                   \
    cublasStatus_t s_ = (call);                                                                          \
    TR_CHECK(s_ == CUBLAS_STATUS_SUCCESS, "cuBLASLt error {} ({}) in {} at {}:{}", static_cast<int>(s_), \
             cublasGetStatusString(s_), #call, __FILE__, __LINE__);                                      \
  } while (0)

cublasLtHandle_t lt(void* h) { return static_cast<cublasLtHandle_t>(h); }

// The largest power of two (<= 256) dividing the address: what cuBLASLt's kernels may assume.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al >>= 1;
  return al;
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  TR_LT_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof v));
}

template <typename T>
void set_layout(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const T& v) {
  TR_LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, attr, &v, sizeof v));
}

}  // namespace

bool gemm_types(DType dt, bool tf32, cudaDataType_t* data, cublasComputeType_t* compute) {
  switch (dt) {
    case DType::f32:
      *data = CUDA_R_32F;
      *compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      return true;
    case DType::f64:
      *data = CUDA_R_64F;
      *compute = CUBLAS_COMPUTE_64F;
      return true;
    case DType::bf16:
      *data = CUDA_R_16BF;
      *compute = CUBLAS_COMPUTE_32F;
      return true;
    case DType::f16:
      *data = CUDA_R_16F;
      *compute = CUBLAS_COMPUTE_32F;
      return true;
    default: return false;
  }
}

struct LtGemm::Key {
  int dtype = 0, c_dtype = 0, compute = 0, epilogue = 0;
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0, sa = 0, sb = 0, batch = 0;
  uint32_t align_a = 0, align_b = 0, align_c = 0, align_bias = 0, align_aux = 0;
  int device = 0;
  bool autotune = false;
  auto operator<=>(const Key&) const = default;
};

struct LtGemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;  // the heuristic returned an algorithm
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (op) cublasLtMatmulDescDestroy(op);
    for (auto l : {a, b, c})
      if (l) cublasLtMatrixLayoutDestroy(l);
  }
};

LtGemm::LtGemm() {
  cublasLtHandle_t h = nullptr;
  TR_LT_CHECK(cublasLtCreate(&h));
  handle_ = h;
}

LtGemm::~LtGemm() {
  for (void* w : workspaces_)
    if (w) cudaFree(w);
  plans_.clear();
  if (handle_) cublasLtDestroy(lt(handle_));
}

size_t LtGemm::plans() const {
  std::lock_guard<std::mutex> g(mu_);
  return plans_.size();
}

size_t LtGemm::tuned() const {
  std::lock_guard<std::mutex> g(mu_);
  return tuned_;
}

size_t LtGemm::tuned_away() const {
  std::lock_guard<std::mutex> g(mu_);
  return tuned_away_;
}

// Times each candidate on g's operands: D goes to scratch (C is read, never written, so an accumulating GEMM
// is timed on its real input), GELU's aux too. One warm-up, then kTimed runs between two events; candidates
// cuBLASLt refuses at run time are skipped. Ties keep the heuristic's order.
void LtGemm::autotune(Plan& p, const backend::GemmArgs& g, const cublasLtMatmulHeuristicResult_t* found,
                      int n, void* ws, cudaStream_t stream, Scratch& scratch) {
  constexpr int kTimed = 3;
  const bool gelu = g.epilogue == backend::GemmEpilogue::bias_gelu;
  const size_t product =
      static_cast<size_t>(g.batch * g.m * g.c_ld()) * dtype_size(g.c.dtype());  // D's layout
  void* d = scratch.take(product);
  void* aux = gelu ? scratch.take(static_cast<size_t>(g.m * g.n) * dtype_size(g.aux.dtype())) : nullptr;
  if (gelu) set_desc(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
  const float af = static_cast<float>(g.alpha), bf = static_cast<float>(g.beta);
  const double ad = g.alpha, bd = g.beta;
  const bool f64 = g.c.dtype() == DType::f64;
  const void* alpha = f64 ? static_cast<const void*>(&ad) : static_cast<const void*>(&af);
  const void* beta = f64 ? static_cast<const void*>(&bd) : static_cast<const void*>(&bf);
  cudaEvent_t start = nullptr, stop = nullptr;
  TR_CHECK(cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess,
           "max-autotune: cudaEventCreate failed");
  float best_ms = 0;
  int best = -1;
  for (int i = 0; i < n; ++i) {
    const auto run = [&] {
      return cublasLtMatmul(lt(handle_), p.op, alpha, g.b.data_ptr(), p.a, g.a.data_ptr(), p.b, beta,
                            g.c.data_ptr(), p.c, d, p.c, &found[i].algo, ws, kWorkspaceBytes, stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;
    cudaEventRecord(start, stream);
    bool ok = true;
    for (int r = 0; r < kTimed && ok; ++r) ok = run() == CUBLAS_STATUS_SUCCESS;
    cudaEventRecord(stop, stream);
    float ms = 0;
    if (!ok || cudaEventSynchronize(stop) != cudaSuccess ||
        cudaEventElapsedTime(&ms, start, stop) != cudaSuccess)
      continue;
    if (best < 0 || ms < best_ms) best_ms = ms, best = i;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGetLastError();  // a refused candidate's error is not the caller's
  p.algo = found[best < 0 ? 0 : best].algo;
  ++tuned_;
  if (best > 0) ++tuned_away_;
}

void* LtGemm::workspace(int device) {
  if (device >= static_cast<int>(workspaces_.size())) workspaces_.resize(static_cast<size_t>(device) + 1);
  void*& w = workspaces_[static_cast<size_t>(device)];
  if (!w) {
    const cudaError_t e = cudaMalloc(&w, kWorkspaceBytes);
    TR_CHECK(e == cudaSuccess, "cuBLASLt workspace: cudaMalloc of {} MiB failed ({})", kWorkspaceBytes >> 20,
             cudaGetErrorString(e));
  }
  return w;
}

bool LtGemm::run(const backend::GemmArgs& g, cudaStream_t stream, Scratch& scratch) {
  cudaDataType_t t, tc;  // operands' type and the product's (f32 for an unrounded half product)
  cublasComputeType_t compute, unused;
  if (!gemm_types(g.a.dtype(), g.tf32, &t, &compute) || !gemm_types(g.c.dtype(), g.tf32, &tc, &unused))
    return false;
  const cudaDataType_t scale_t = g.c.dtype() == DType::f64 ? CUDA_R_64F : CUDA_R_32F;
  const bool epi = g.epilogue != backend::GemmEpilogue::none;
  const bool gelu = g.epilogue == backend::GemmEpilogue::bias_gelu;
  if (g.k == 0 || g.m == 0 || g.n == 0) return false;
  if (epi &&
      (g.batch != 1 || g.beta != 0.0 || g.c_ld() != g.n || !g.bias.defined() || g.c.dtype() != g.a.dtype()))
    return false;
  if (gelu && (!g.aux.defined() || g.n % 8 != 0))
    return false;  // the aux leading dim must be a multiple of 8
  // cuBLASLt's GELU in f64 is good to ~3e-10 relative (H200, cuBLASLt 13.1), not f64's: f64 is the reference
  // dtype, so its GELU runs as our own kernel after the GEMM.
  if (gelu && g.c.dtype() == DType::f64) return false;
  int device = 0;
  TR_CHECK(cudaGetDevice(&device) == cudaSuccess, "cuBLASLt: no current CUDA device");

  Key key;
  key.dtype = static_cast<int>(t);
  key.c_dtype = static_cast<int>(tc);
  key.compute = static_cast<int>(compute);
  key.epilogue = static_cast<int>(g.epilogue);
  key.ta = g.trans_a;
  key.tb = g.trans_b;
  key.m = g.m;
  key.n = g.n;
  key.k = g.k;
  key.lda = g.lda;
  key.ldb = g.ldb;
  key.ldc = g.c_ld();
  key.sa = g.stride_a;
  key.sb = g.stride_b;
  key.batch = g.batch;
  key.align_a = alignment(g.a.data_ptr());
  key.align_b = alignment(g.b.data_ptr());
  key.align_c = alignment(g.c.data_ptr());
  key.align_bias = epi ? alignment(g.bias.data_ptr()) : 0;
  key.align_aux = gelu ? alignment(g.aux.data_ptr()) : 0;
  key.device = device;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  TR_CHECK(cudaStreamIsCapturing(stream, &capturing) == cudaSuccess,
           "cuBLASLt: cudaStreamIsCapturing failed");
  key.autotune = g.autotune && capturing == cudaStreamCaptureStatusNone;

  std::lock_guard<std::mutex> lock(mu_);
  void* ws = workspace(device);
  auto it = plans_.find(key);
  Plan* plan = nullptr;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our b, its "B" our a;
  // D is n x m column-major with leading dimension ldc (n, or a padded buffer's row stride).
  const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                          op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (it == plans_.end()) {
    auto p = std::make_unique<Plan>();
    TR_LT_CHECK(cublasLtMatmulDescCreate(&p->op, compute, scale_t));
    set_desc(p->op, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
    set_desc(p->op, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
    if (epi) {
      const cublasLtEpilogue_t e = gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS;
      set_desc(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, e);
      set_desc(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias.data_ptr());
      if (gelu) {
        set_desc(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux.data_ptr());
        set_desc(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(g.n));
      }
    }
    const uint64_t ra = op_a == CUBLAS_OP_N ? g.n : g.k, ca = op_a == CUBLAS_OP_N ? g.k : g.n;
    const uint64_t rb = op_b == CUBLAS_OP_N ? g.k : g.m, cb = op_b == CUBLAS_OP_N ? g.m : g.k;
    TR_LT_CHECK(cublasLtMatrixLayoutCreate(&p->a, t, ra, ca, g.ldb));
    TR_LT_CHECK(cublasLtMatrixLayoutCreate(&p->b, t, rb, cb, g.lda));
    TR_LT_CHECK(cublasLtMatrixLayoutCreate(&p->c, tc, g.n, g.m, g.c_ld()));
    if (g.batch > 1) {
      const int32_t count = static_cast<int32_t>(g.batch);
      const int64_t sa = g.stride_b, sb = g.stride_a, sc = g.m * g.c_ld();
      for (auto [l, s] : {std::pair{p->a, sa}, std::pair{p->b, sb}, std::pair{p->c, sc}}) {
        set_layout(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, count);
        set_layout(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, s);
      }
    }
    cublasLtMatmulPreference_t pref = nullptr;
    TR_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws_bytes = kWorkspaceBytes;
    TR_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &ws_bytes, sizeof ws_bytes));
    const uint32_t al[4] = {key.align_b, key.align_a, key.align_c, key.align_c};  // Lt's A, B, C, D
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i)
      TR_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof al[i]));
    cublasLtMatmulHeuristicResult_t results[kAutotuneCandidates]{};
    int found = 0;
    const cublasStatus_t s =
        cublasLtMatmulAlgoGetHeuristic(lt(handle_), p->op, p->a, p->b, p->c, p->c, pref,
                                       key.autotune ? kAutotuneCandidates : 1, results, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    p->usable = s == CUBLAS_STATUS_SUCCESS && found > 0;
    if (p->usable) {
      p->algo = results[0].algo;
      if (key.autotune && found > 1) autotune(*p, g, results, found, ws, stream, scratch);
    } else if (!warned_) {  // once: the fallback is correct but slower, so say which shape took it
      warned_ = true;
      std::fprintf(
          stderr,
          "notice: cuBLASLt has no algorithm for a %s GEMM m=%lld n=%lld k=%lld batch=%lld epilogue=%d "
          "(status %d); using cuBLAS for such shapes\n",
          std::string(dtype_name(g.c.dtype())).c_str(), static_cast<long long>(g.m),
          static_cast<long long>(g.n), static_cast<long long>(g.k), static_cast<long long>(g.batch),
          key.epilogue, static_cast<int>(s));
    }
    plan = p.get();
    plans_.emplace(key, std::move(p));
  } else {
    plan = it->second.get();
  }
  if (!plan->usable) return false;
  if (epi) {  // this call's operands (the plan was chosen for pointers of the same alignment)
    set_desc(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias.data_ptr());
    if (gelu) set_desc(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux.data_ptr());
  }
  const float af = static_cast<float>(g.alpha), bf = static_cast<float>(g.beta);
  const double ad = g.alpha, bd = g.beta;
  const bool f64 = g.c.dtype() == DType::f64;
  const void* alpha = f64 ? static_cast<const void*>(&ad) : static_cast<const void*>(&af);
  const void* beta = f64 ? static_cast<const void*>(&bd) : static_cast<const void*>(&bf);
  TR_LT_CHECK(cublasLtMatmul(lt(handle_), plan->op, alpha, g.b.data_ptr(), plan->a, g.a.data_ptr(), plan->b,
                             beta, g.c.data_ptr(), plan->c, g.c.data_ptr(), plan->c, &plan->algo, ws,
                             kWorkspaceBytes, stream));
  return true;
}

}  // namespace tr::cuda
