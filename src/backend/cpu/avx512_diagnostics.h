// One pair of macros around the headers with AVX-512 intrinsics in target("avx512f") functions.
// GCC 12's AVX-512 intrinsics seed their results with a self-initialized `__Y` (_mm512_undefined_*), which
// its own -Wuninitialized flags once they inline into such a function: a known false positive, silenced
// between TR_AVX512_DIAGNOSTICS_BEGIN and TR_AVX512_DIAGNOSTICS_END only.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#define TR_AVX512_DIAGNOSTICS_BEGIN                                                    \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define TR_AVX512_DIAGNOSTICS_END _Pragma("GCC diagnostic pop")
#else
#define TR_AVX512_DIAGNOSTICS_BEGIN
#define TR_AVX512_DIAGNOSTICS_END
#endif
