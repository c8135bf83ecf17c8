// NativeMatmul: one oneDNN matmul primitive per call (oneDNN's primitive cache keeps the kernels it JITs);
// speed is the brgemm kernel's (AVX512_BF16: up to 2x f32 FMA throughput, where the core runs VDPBF16PS at
// the FMA rate; AMX tiles: far more).
#include "backend/cpu/matmul_native.h"

#include <cpuid.h>

#include <string>

#include "backend/cpu/amx_tiles.h"
#include "core/error.h"

namespace tr::cpu {

namespace {

// [batch, rows, cols] of `dt` read with row stride ld (or column stride ld when transposed) and batch stride
// `stride` (0: one matrix for every batch, broadcast).
bool describe(dnnl_memory_desc_t* md, dnnl_data_type_t dt, int64_t batch, int64_t stride, int64_t rows,
              int64_t cols, int64_t ld, bool transposed) {
  const bool broadcast = stride == 0 && batch > 1;
  dnnl_dims_t dims = {broadcast ? 1 : batch, rows, cols};
  dnnl_dims_t strides = {stride != 0 ? stride : rows * cols, transposed ? 1 : ld, transposed ? ld : 1};
  if (rows == 1) strides[1] = cols;  // a degenerate dim's stride is free; keep the layout plain
  if (cols == 1) strides[2] = 1;
  return dnnl_memory_desc_init_by_strides(md, 3, dims, dt, strides) == dnnl_success;
}

// Releases oneDNN handles at scope exit (every early return of run()).
struct Handles {
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t post_ops = nullptr;
  dnnl_primitive_desc_t pd = nullptr;
  dnnl_primitive_t prim = nullptr;
  dnnl_memory_t mem[3] = {nullptr, nullptr, nullptr};
  ~Handles() {
    for (dnnl_memory_t m : mem)
      if (m) dnnl_memory_destroy(m);
    if (prim) dnnl_primitive_destroy(prim);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (post_ops) dnnl_post_ops_destroy(post_ops);
    if (attr) dnnl_primitive_attr_destroy(attr);
  }
};

std::string probe_impl(dnnl_engine_t engine, dnnl_data_type_t dt) {
  dnnl_memory_desc_t a, b, c;
  dnnl_dims_t dims = {64, 64}, strides = {64, 1};
  dnnl_matmul_desc_t md;
  dnnl_primitive_desc_t pd = nullptr;
  std::string impl;
  if (dnnl_memory_desc_init_by_strides(&a, 2, dims, dt, strides) == dnnl_success &&
      dnnl_memory_desc_init_by_strides(&b, 2, dims, dt, strides) == dnnl_success &&
      dnnl_memory_desc_init_by_strides(&c, 2, dims, dnnl_f32, strides) == dnnl_success &&
      dnnl_matmul_desc_init(&md, &a, &b, nullptr, &c) == dnnl_success &&
      dnnl_primitive_desc_create(&pd, &md, nullptr, engine, nullptr) == dnnl_success) {
    const char* s = nullptr;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &s) == dnnl_success && s) impl = s;
    dnnl_primitive_desc_destroy(pd);
  }
  return impl;
}

}  // namespace

NativeMatmul::NativeMatmul() {
  if (dnnl_engine_create(&engine_, dnnl_cpu, 0) != dnnl_success) return;
  if (dnnl_stream_create(&stream_, engine_, dnnl_stream_default_flags) != dnnl_success) return;
  // oneDNN 2.x also JITs bf16 matmuls for plain AVX-512 that convert in software: native means the BF16
  // instructions, whose ISA level (AVX512_BF16, or AMX above it) includes them.
  const unsigned isa = dnnl_get_effective_cpu_isa();
  bf16_ = (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
  amx_ = (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;  // leaf 0: the vendor string in EBX, EDX, ECX
  const bool amd = __get_cpuid(0, &eax, &ebx, &ecx, &edx) && ebx == 0x68747541u && edx == 0x69746e65u &&
                   ecx == 0x444d4163u;  // "Auth" "enti" "cAMD"
  // leaf 1, EAX: base family in bits 8-11, plus the extended family (bits 20-27) when the base is 0xF
  if (amd && __get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
    const unsigned base = eax >> 8 & 0xFu, family = base == 0xFu ? base + (eax >> 20 & 0xFFu) : base;
    amd_zen4_ = family >= 0x19u;  // Zen 3 shares family 0x19 but lacks AVX512_BF16 (bf16_ says)
  }
  // leaf 7, sub-leaf 0: EDX bit 23 is AVX512_FP16
  avx512_fp16_ = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx >> 23 & 1u);
  tiles_ = amx_ && amx::request_tiles();
  bf16_impl_ = probe_impl(engine_, dnnl_bf16);
  f16_impl_ = probe_impl(engine_, dnnl_f16);
}

NativeMatmul::~NativeMatmul() {
  if (stream_) dnnl_stream_destroy(stream_);
  if (engine_) dnnl_engine_destroy(engine_);
}

bool NativeMatmul::run(const backend::GemmArgs& g) {
  if (!bf16_ || !stream_ || g.a.dtype() != DType::bf16 || g.b.dtype() != DType::bf16) return false;
  if (g.c.dtype() != DType::bf16 && g.c.dtype() != DType::f32) return false;
  const dnnl_data_type_t cdt = g.c.dtype() == DType::bf16 ? dnnl_bf16 : dnnl_f32;
  dnnl_memory_desc_t a_md, b_md, c_md;
  if (!describe(&a_md, dnnl_bf16, g.batch, g.stride_a, g.m, g.k, g.lda, g.trans_a) ||
      !describe(&b_md, dnnl_bf16, g.batch, g.stride_b, g.k, g.n, g.ldb, g.trans_b) ||
      !describe(&c_md, cdt, g.batch, g.m * g.c_ld(), g.m, g.n, g.c_ld(), false))
    return false;
  Handles h;
  dnnl_matmul_desc_t desc;
  if (dnnl_matmul_desc_init(&desc, &a_md, &b_md, nullptr, &c_md) != dnnl_success) return false;
  if (dnnl_primitive_attr_create(&h.attr) != dnnl_success) return false;
  const float alpha = static_cast<float>(g.alpha);
  if (alpha != 1.0f && dnnl_primitive_attr_set_output_scales(h.attr, 1, 0, &alpha) != dnnl_success)
    return false;
  if (g.beta != 0.0) {
    if (dnnl_post_ops_create(&h.post_ops) != dnnl_success ||
        dnnl_post_ops_append_sum(h.post_ops, static_cast<float>(g.beta)) != dnnl_success ||
        dnnl_primitive_attr_set_post_ops(h.attr, h.post_ops) != dnnl_success)
      return false;
  }
  if (dnnl_primitive_desc_create(&h.pd, &desc, h.attr, engine_, nullptr) != dnnl_success) return false;
  const char* impl = nullptr;
  if (dnnl_primitive_desc_query(h.pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl ||
      std::string(impl).rfind("ref", 0) == 0)
    return false;  // a reference loop would be far slower than widening to sgemm
  if (dnnl_primitive_create(&h.prim, h.pd) != dnnl_success) return false;
  void* ptrs[3] = {g.a.data_ptr(), g.b.data_ptr(), g.c.data_ptr()};
  const dnnl_memory_desc_t* mds[3] = {&a_md, &b_md, &c_md};
  for (int i = 0; i < 3; ++i)
    if (dnnl_memory_create(&h.mem[i], mds[i], engine_, ptrs[i]) != dnnl_success) return false;
  dnnl_exec_arg_t args[3] = {
      {DNNL_ARG_SRC, h.mem[0]}, {DNNL_ARG_WEIGHTS, h.mem[1]}, {DNNL_ARG_DST, h.mem[2]}};
  // Past this point c may be partly written: a failure cannot fall back any more.
  TR_CHECK(dnnl_primitive_execute(h.prim, stream_, 3, args) == dnnl_success &&
               dnnl_stream_wait(stream_) == dnnl_success,
           "matmul: oneDNN's bf16 matmul ({}) failed for [{}, {}] x [{}, {}]", impl, g.m, g.k, g.k, g.n);
  return true;
}

}  // namespace tr::cpu
