// Core layer: dtype conversions (RNE, NaN, Inf, subnormals), views, allocator accounting, devices.
#include <immintrin.h>

#include <bit>
#include <limits>

#include "backend/cpu/convert.h"
#include "backend/cpu/philox_cpu.h"
#include "backend/cpu/scratch_pool.h"
#include "backend/cpu/vec_math.h"
#include "backend/cpu/vec_unary.h"
#include "backend/unary_math.h"
#include "core/rng.h"
#include "test_util.h"

namespace tr {
namespace {

// f16 reference: the F16C instruction, an independent implementation of IEEE RNE conversion.
uint16_t f16c(float f) { return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }

TEST(Half, AllHalfValuesRoundTripExactly) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = half_bits_to_float(static_cast<uint16_t>(h));
    const float hw = _cvtsh_ss(static_cast<uint16_t>(h));
    if (hw != hw) {  // NaN: F16C quiets signalling NaNs, we keep the payload; both must stay NaN
      ASSERT_TRUE(f != f) << std::hex << h;
      EXPECT_TRUE((float_to_half_bits(f) & 0x7fff) > 0x7c00) << std::hex << h;
    } else {
      ASSERT_EQ(f32_bits(f), f32_bits(hw)) << std::hex << h;
      EXPECT_EQ(float_to_half_bits(f), h) << std::hex << h;
    }
  }
}

TEST(Half, MatchesF16cOnEdgesAndRandomFloats) {
  std::vector<float> edge = {0.0f,
                             -0.0f,
                             65504.0f,
                             65519.996f,
                             65520.0f,
                             1e10f,
                             -1e10f,
                             5.96e-8f,
                             2.98e-8f,
                             2.9802322e-08f,
                             2.9802326e-08f,
                             6.1035156e-05f,
                             6.097e-05f,
                             1.0f + 1.0f / 2048,
                             1.0f + 3.0f / 2048,
                             std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::denorm_min()};
  for (float f : edge) EXPECT_EQ(float_to_half_bits(f), f16c(f)) << f;
  uint64_t s = 12345;
  for (int i = 0; i < 2000000; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t bits = static_cast<uint32_t>(s >> 32);
    float f = bits_f32(bits);
    if (f != f) continue;
    ASSERT_EQ(float_to_half_bits(f), f16c(f)) << std::hex << bits;
  }
}

// bf16 reference: pick the nearer of the two neighbours in double arithmetic, ties to the even one.
uint16_t bf16_reference(float f) {
  uint32_t u = f32_bits(f);
  uint16_t lo = static_cast<uint16_t>(u >> 16);
  uint16_t hi = static_cast<uint16_t>(lo + 1);
  double dl = std::abs(static_cast<double>(bf16_bits_to_float(lo)) - f);
  double dh = std::abs(static_cast<double>(bf16_bits_to_float(hi)) - f);
  if ((u & 0xffff) == 0) return lo;
  if (std::isinf(bf16_bits_to_float(hi)) && !std::isinf(f)) {
    // The step to Inf: round like IEEE (overflow threshold is the midpoint to 2^128).
    double mid = std::abs(static_cast<double>(bf16_bits_to_float(lo))) + std::ldexp(1.0, 127 - 8);
    if (std::abs(static_cast<double>(f)) < mid) return lo;
    if (std::abs(static_cast<double>(f)) > mid) return hi;
    return (lo & 1) ? hi : lo;
  }
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(bits_f32(0x3f808000u)), 0x3f80);  // tie -> even (down)
  EXPECT_EQ(float_to_bf16_bits(bits_f32(0x3f818000u)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16_bits(bits_f32(0x3f808001u)), 0x3f81);
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to Inf, as in torch
  uint16_t nan = float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE((nan & 0x7f80) == 0x7f80 && (nan & 0x7f) != 0);
  // A signalling NaN whose payload lives only in the low bits must stay NaN, not become Inf.
  uint16_t snan = float_to_bf16_bits(bits_f32(0x7f800001u));
  EXPECT_TRUE((snan & 0x7f) != 0);
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_bf16_bits(bits_f32(0x00018000u)), 0x0002);  // subnormal tie to even
}

TEST(BFloat16, MatchesReferenceOnRandomFloats) {
  uint64_t s = 777;
  for (int i = 0; i < 2000000; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    float f = bits_f32(static_cast<uint32_t>(s >> 32));
    if (f != f) continue;
    ASSERT_EQ(float_to_bf16_bits(f), bf16_reference(f)) << std::hex << f32_bits(f);
  }
}

TEST(Convert, TensorCopyConvertsEveryPair) {
  Tensor x = ops::from_vector<float>({1.5f, -2.25f, 0.0f, 3.0f}, {4});
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i32, DType::i64, DType::u8}) {
    Tensor y = ops::to_dtype(ops::to_dtype(x, dt), DType::f64);
    auto v = test::values(y);
    if (is_floating(dt)) {
      EXPECT_EQ(v, (std::vector<double>{1.5, -2.25, 0.0, 3.0})) << dtype_name(dt);
    }
  }
  Tensor b = ops::to_dtype(x, DType::boolean);
  EXPECT_EQ(test::values(b), (std::vector<double>{1, 1, 0, 1}));
}

// The CPU kernels' bulk conversions (vectorized bf16, F16C f16) give core/half.h's bits: every 16-bit
// pattern widened, edge and random floats narrowed, over runs whose lengths leave vector tails.
TEST(Convert, CpuBulkConversionsMatchTheScalarOnes) {
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> wide(all.size());
  auto same_float = [](float a, float b) { return (a != a && b != b) || f32_bits(a) == f32_bits(b); };
  cpu::widen_run(reinterpret_cast<const BFloat16*>(all.data()), wide.data(), 0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h)
    ASSERT_EQ(f32_bits(wide[h]), f32_bits(bf16_bits_to_float(all[h]))) << h;
  cpu::widen_run(reinterpret_cast<const Half*>(all.data()), wide.data(), 0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) ASSERT_TRUE(same_float(wide[h], half_bits_to_float(all[h]))) << h;

  std::vector<float> f = {0.0f,
                          -0.0f,
                          65504.0f,
                          65520.0f,
                          2.9802322e-08f,
                          6.097e-05f,
                          1.0f + 1.0f / 2048,
                          std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::quiet_NaN(),
                          bits_f32(0x7f800001u),
                          bits_f32(0xffc12345u),
                          bits_f32(0x3f808000u),
                          bits_f32(0x3f818000u),
                          bits_f32(0x00018000u)};
  uint64_t s = 4242;
  while (f.size() < 1000003) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    f.push_back(bits_f32(static_cast<uint32_t>(s >> 32)));
  }
  std::vector<uint16_t> narrow(f.size());
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{9}, static_cast<int64_t>(f.size())}) {
    cpu::narrow_run(f.data(), reinterpret_cast<BFloat16*>(narrow.data()), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(narrow[i], float_to_bf16_bits(f[i])) << std::hex << f32_bits(f[i]);
    cpu::narrow_run(f.data(), reinterpret_cast<Half*>(narrow.data()), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(narrow[i], float_to_half_bits(f[i])) << std::hex << f32_bits(f[i]);
  }
  // Strided rows, threaded: 300 rows of 301 values read with leading dimension 305.
  const int64_t rows = 300, cols = 301, ld = 305;
  std::vector<uint16_t> src(static_cast<size_t>(rows * ld));
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(i * 40503u);
  std::vector<float> out(static_cast<size_t>(rows * cols));
  cpu::convert_rows(reinterpret_cast<const BFloat16*>(src.data()), ld, out.data(), cols, rows, cols,
                    cpu::widen_run<BFloat16>);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(f32_bits(out[r * cols + c]), f32_bits(bf16_bits_to_float(src[r * ld + c]))) << r << "," << c;
}

// The widened GEMMs' scratch: a returned buffer serves the next lease that fits (no fresh pages per call),
// two leases at once never share a buffer, and the pool keeps only its few largest.
TEST(ScratchPool, ReusesBuffersAndKeepsOnlyTheLargest) {
  cpu::ScratchPool pool;
  float* first;
  {
    auto a = pool.take(1000000);
    first = a.get();
    a.get()[999999] = 1.0f;
  }
  EXPECT_GE(pool.pooled_bytes(), 4000000u);
  {
    auto again = pool.take(500000);  // fits the returned buffer
    auto other = pool.take(500000);  // must not share it
    EXPECT_EQ(again.get(), first);
    EXPECT_NE(other.get(), first);
  }
  {
    std::vector<cpu::ScratchPool::Lease> many;
    for (size_t i = 1; i <= 8; ++i) many.push_back(pool.take(i << 20));
  }
  EXPECT_LE(pool.pooled_bytes(), size_t{4} * (size_t{8} << 20) * sizeof(float));  // four kept: 5..8 Mi floats
  EXPECT_GE(pool.pooled_bytes(), (size_t{5} + 6 + 7 + 8) * (size_t{1} << 20) * sizeof(float));
  pool.release_all();
  EXPECT_EQ(pool.pooled_bytes(), 0u);
}

TEST(Views, ShareStorageAndIndexCorrectly) {
  Tensor x = ops::from_vector<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor t = ops::transpose(x, 0, 1);
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(test::values(t), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(t.storage().get(), x.storage().get());
  Tensor n = ops::narrow(x, 1, 1, 2);
  EXPECT_EQ(test::values(n), (std::vector<double>{1, 2, 4, 5}));
  Tensor e = ops::expand(ops::narrow(x, 0, 1, 1), {4, 3});
  EXPECT_EQ(e.strides()[0], 0);
  EXPECT_EQ(test::values(e), (std::vector<double>{3, 4, 5, 3, 4, 5, 3, 4, 5, 3, 4, 5}));
  Tensor p = ops::permute(ops::view(ops::arange(24, DType::f32), {2, 3, 4}), {2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.item_at(1), 4.0);  // p[0,0,1] = x[0,1,0]
  Tensor c = ops::contiguous(t);
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_NE(c.storage().get(), x.storage().get());
  EXPECT_EQ(test::values(c), test::values(t));
  // view of a transposed tensor: merging non-contiguous dims is refused; reshape copies instead
  EXPECT_THROW(ops::view(t, {6}), Error);
  EXPECT_EQ(test::values(ops::reshape(t, {6})), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  // splitting a dim of a transposed tensor is a valid view
  Tensor big = ops::transpose(ops::view(ops::arange(24, DType::f32), {4, 6}), 0, 1);  // [6, 4]
  Tensor v = ops::view(big, {2, 3, 4});
  EXPECT_EQ(v.storage().get(), big.storage().get());
  EXPECT_EQ(test::values(v), test::values(ops::reshape(ops::contiguous(big), {2, 3, 4})));
  EXPECT_EQ(ops::view(x, {-1}).shape(), (Shape{6}));
  EXPECT_EQ(ops::unsqueeze(x, 1).shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(ops::squeeze(ops::unsqueeze(x, 0), 0).shape(), (Shape{2, 3}));
}

TEST(Views, InvalidViewsThrowNamingTheOp) {
  Tensor x = ops::zeros({2, 3});
  try {
    ops::view(x, {4, 2});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("view"), std::string::npos);
  }
  EXPECT_THROW(ops::narrow(x, 1, 2, 2), Error);
  EXPECT_THROW(ops::expand(x, {2, 4}), Error);
  EXPECT_THROW(ops::transpose(x, 0, 2), Error);
  EXPECT_THROW(ops::permute(x, {0, 0}), Error);
  EXPECT_THROW(x.as_strided({3, 3}, {3, 1}, 0), Error);
}

TEST(Allocator, CpuIs64ByteAlignedAndCountsPeak) {
  CpuAllocator& a = cpu_allocator();
  int64_t base = a.stats().current_bytes;
  a.reset_peak();
  {
    Tensor t1 = ops::empty({1000}, DType::f32);  // 4000 bytes
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t1.data_ptr()) % 64, 0u);
    {
      Tensor t2 = ops::empty({250}, DType::f64);  // 2000 bytes
      EXPECT_EQ(a.stats().current_bytes - base, 6000);
    }
    Tensor t3 = ops::empty({100}, DType::bf16);  // 200 bytes
    EXPECT_EQ(a.stats().current_bytes - base, 4200);
    Tensor v = ops::transpose(ops::view(t1, {10, 100}), 0, 1);  // a view allocates nothing
    EXPECT_EQ(a.stats().current_bytes - base, 4200);
  }
  EXPECT_EQ(a.stats().current_bytes, base);
  EXPECT_EQ(a.stats().peak_bytes - base, 6000);
}

TEST(Allocator, MetaTensorsCountBytesButHoldNoData) {
  MetaAllocator& m = meta_allocator();
  int64_t base = m.stats().current_bytes;
  Tensor t = ops::empty({8, 8}, DType::f32, Device::meta());
  EXPECT_EQ(m.stats().current_bytes - base, 256);
  EXPECT_THROW(t.data_ptr(), Error);
  Tensor y = ops::matmul(t, t);
  EXPECT_EQ(y.shape(), (Shape{8, 8}));
  EXPECT_TRUE(y.device().is_meta());
}

TEST(Device, ParsesAndPrints) {
  EXPECT_EQ(Device::parse("cuda:3").index, 3);
  EXPECT_EQ(Device::parse("cpu").str(), "cpu");
  EXPECT_EQ(Device::parse("meta").str(), "meta");
  EXPECT_THROW(Device::parse("tpu"), Error);
  EXPECT_THROW(Device::parse("cuda:x"), Error);
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_THROW(parse_dtype("float8"), Error);
}

TEST(Rng, CounterBasedAndReproducible) {
  Generator g(7);
  Tensor a = ops::randn({1000}, g);
  Generator h(7);
  Tensor b = ops::randn({1000}, h);
  EXPECT_EQ(test::values(a), test::values(b));
  Tensor c = ops::randn({1000}, g);  // the generator advanced: new numbers
  EXPECT_NE(test::values(a), test::values(c));
  auto v = test::values(a);
  double m = 0, s2 = 0;
  for (double x : v) m += x;
  m /= v.size();
  for (double x : v) s2 += (x - m) * (x - m);
  EXPECT_NEAR(m, 0.0, 0.1);
  EXPECT_NEAR(std::sqrt(s2 / v.size()), 1.0, 0.1);
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

// The vectorized f32 exp/expm1/tanh of the CPU backend against libm in double.
TEST(VecMath, FastExpExpm1TanhAreAccurate) {
  double worst_exp = 0, worst_tanh = 0, worst_expm1 = 0;
  for (int i = -200000; i <= 200000; ++i) {
    float x = static_cast<float>(i) * 4.4e-4f;  // [-88, 88]
    double e = std::exp(static_cast<double>(x));
    if (e > 1e-37 && e < 3e38) worst_exp = std::max(worst_exp, std::abs(cpu::fast_expf(x) - e) / e);
    float xs = x / 8.0f;
    double t = std::tanh(static_cast<double>(xs));
    if (t != 0) worst_tanh = std::max(worst_tanh, std::abs(cpu::fast_tanhf(xs) - t) / std::abs(t));
    double m = std::expm1(static_cast<double>(xs));
    if (m != 0) worst_expm1 = std::max(worst_expm1, std::abs(cpu::fast_expm1f(xs) - m) / std::abs(m));
  }
  EXPECT_LT(worst_exp, 3e-7);
  EXPECT_LT(worst_expm1, 5e-7);
  EXPECT_LT(worst_tanh, 5e-7);
  RecordProperty("exp_rel_err", std::to_string(worst_exp));
  EXPECT_EQ(cpu::fast_expf(-INFINITY), 0.0f);
  EXPECT_EQ(cpu::fast_expf(-100.0f), 0.0f);
  EXPECT_TRUE(std::isinf(cpu::fast_expf(INFINITY)));
  EXPECT_TRUE(std::isnan(cpu::fast_expf(NAN)));
  EXPECT_TRUE(std::isnan(cpu::fast_tanhf(NAN)));
  EXPECT_EQ(cpu::fast_tanhf(50.0f), 1.0f);
  EXPECT_EQ(cpu::fast_tanhf(-50.0f), -1.0f);
  EXPECT_EQ(cpu::fast_tanhf(0.0f), 0.0f);
}

// The AVX2 row kernels of the unary ops (vec_unary.h) against their formulas in double, and an element's bits
// independent of its place in a row (the tail runs the same 8-lane code).
template <backend::UnaryOp OP>
void check_vec_unary(double (*f)(double), double (*df)(double), double lo, double hi) {
  const int n = 40001;
  std::vector<float> x(n), y(n), g(n), ones(n, 1.0f);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(lo + (hi - lo) * i / (n - 1));
  cpu::unary_row<OP>(x.data(), y.data(), n);
  cpu::unary_grad_row<OP>(x.data(), ones.data(), g.data(), n);
  // Errors relative to the value, or to 1e-2 (1 + |x|) where the value is small: f32 formulas cancel there
  // (1 - tanh^2 near saturation). The bound is the scalar formula's own (unary_math.h, the code these
  // replace) with a little slack.
  double worst_f = 0, worst_g = 0, scalar_f = 0, scalar_g = 0;
  for (int i = 0; i < n; ++i) {
    const double xd = x[i], floor = 1e-2 * (1 + std::abs(xd));
    const double fd = f(xd), gd = df(xd), nf = std::max(std::abs(fd), floor),
                 ng = std::max(std::abs(gd), floor);
    worst_f = std::max(worst_f, std::abs(y[i] - fd) / nf);
    worst_g = std::max(worst_g, std::abs(g[i] - gd) / ng);
    scalar_f = std::max(scalar_f, std::abs(backend::unary_fn(OP, x[i]) - fd) / nf);
    scalar_g = std::max(scalar_g, std::abs(backend::unary_grad(OP, x[i]) - gd) / ng);
  }
  EXPECT_LT(worst_f, 1.5 * scalar_f + 5e-7) << backend::unary_name(OP) << " (scalar " << scalar_f << ")";
  EXPECT_LT(worst_g, 1.5 * scalar_g + 5e-7) << backend::unary_name(OP) << " (scalar " << scalar_g << ")";
  EXPECT_LT(std::max(worst_f, worst_g), 5e-5) << backend::unary_name(OP);
  std::printf("%-10s worst relative error: f %.2e (scalar %.2e), f' %.2e (scalar %.2e)\n",
              backend::unary_name(OP), worst_f, scalar_f, worst_g, scalar_g);
  for (int len : {1, 3, 8, 13}) {  // rows of other lengths at other offsets give the same bits
    for (int start = 0; start + len <= 64; start += 5) {
      std::vector<float> yr(len), gr(len);
      cpu::unary_row<OP>(x.data() + 1000 + start, yr.data(), len);
      cpu::unary_grad_row<OP>(x.data() + 1000 + start, ones.data(), gr.data(), len);
      for (int j = 0; j < len; ++j) {
        ASSERT_EQ(std::bit_cast<uint32_t>(yr[j]), std::bit_cast<uint32_t>(y[1000 + start + j]));
        ASSERT_EQ(std::bit_cast<uint32_t>(gr[j]), std::bit_cast<uint32_t>(g[1000 + start + j]));
      }
    }
  }
  float nan = NAN, out = 0;
  cpu::unary_row<OP>(&nan, &out, 1);
  EXPECT_TRUE(std::isnan(out)) << backend::unary_name(OP);
}

double gelu_tanh_d(double x) {
  return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double gelu_tanh_grad_d(double x) {
  const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}
double sigmoid_d(double x) { return 1 / (1 + std::exp(-x)); }
double silu_d(double x) { return x * sigmoid_d(x); }
double silu_grad_d(double x) { return sigmoid_d(x) * (1 + x * (1 - sigmoid_d(x))); }
double sigmoid_grad_d(double x) { return sigmoid_d(x) * (1 - sigmoid_d(x)); }
double tanh_d(double x) { return std::tanh(x); }
double tanh_grad_d(double x) { return 1 - std::tanh(x) * std::tanh(x); }
double exp_d(double x) { return std::exp(x); }

// The 16-lane kernels (vec_unary512.h, what an AVX-512 CPU runs) give the 8-lane ones' bits, element for
// element: across the range, at the edges (+-20 where tanh clamps, +-0.5 where expm1 switches forms, exp's
// overflow and underflow), for infinities and NaN, and in rows whose tails end at every lane.
template <backend::UnaryOp OP>
void expect_sixteen_lanes_match_eight(double lo, double hi) {
  std::vector<float> x;
  for (int i = 0; i < 20011; ++i) x.push_back(static_cast<float>(lo + (hi - lo) * i / 20010));
  for (float e : {0.5f, 0.25f, 10.0f, 20.0f, 44.0f, 88.3762626647949f, 87.3365447504f, 1e-30f, 0.0f})
    for (float v : {e, std::nextafter(e, 0.0f), std::nextafter(e, 1e30f)}) {
      x.push_back(v);
      x.push_back(-v);
    }
  for (float v : {INFINITY, -INFINITY, NAN, -0.0f, 1e30f, -1e30f}) x.push_back(v);
  const auto n = static_cast<int64_t>(x.size());
  std::vector<float> gy(x.size());
  for (size_t i = 0; i < gy.size(); ++i) gy[i] = static_cast<float>(std::cos(0.37 * static_cast<double>(i)));
  for (int64_t len : {n, int64_t{1}, int64_t{7}, int64_t{15}, int64_t{17}, int64_t{31}}) {
    std::vector<float> y8(len), y16(len), g8(len), g16(len);
    cpu::unary_row8<OP>(x.data(), y8.data(), len);
    cpu::unary_row16<OP>(x.data(), y16.data(), len);
    cpu::unary_grad_row8<OP>(x.data(), gy.data(), g8.data(), len);
    cpu::unary_grad_row16<OP>(x.data(), gy.data(), g16.data(), len);
    for (int64_t i = 0; i < len; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(y16[i]), std::bit_cast<uint32_t>(y8[i]))
          << backend::unary_name(OP) << " f(" << x[i] << ")";
      ASSERT_EQ(std::bit_cast<uint32_t>(g16[i]), std::bit_cast<uint32_t>(g8[i]))
          << backend::unary_name(OP) << " f'(" << x[i] << ")";
    }
  }
}

// philox_words (one Philox block per four words: dropout, attention's dropout factors) hands out exactly
// philox_word's words, for runs starting and ending at every place within a block.
TEST(Philox, WordsOfARunAreTheWordsOneByOne) {
  for (const uint64_t first :
       {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{4}, uint64_t{1} << 40})
    for (const int64_t n : {0, 1, 2, 3, 4, 5, 9, 130}) {
      std::vector<uint32_t> got(static_cast<size_t>(n), 0);
      int64_t calls = 0, last = -1;
      philox_words(77, 1234, first, n, [&](int64_t k, uint32_t w) {
        EXPECT_EQ(k, last + 1);  // in order, each once
        last = k;
        got[static_cast<size_t>(k)] = w;
        ++calls;
      });
      ASSERT_EQ(calls, n);
      for (int64_t k = 0; k < n; ++k)
        ASSERT_EQ(got[static_cast<size_t>(k)], philox_word(77, 1234, first + static_cast<uint64_t>(k)))
            << "first " << first << " n " << n << " word " << k;
    }
}

// philox_block_words (the CUDA dropout kernel's pack of 4 or 8 elements) gives philox_word's words, across
// the 32-bit counter carry.
TEST(Philox, BlockWordsOfAPackAreTheWordsOneByOne) {
  for (const uint64_t offset : {uint64_t{0}, uint64_t{1234}, (uint64_t{1} << 32) - 1})
    for (const uint64_t first : {uint64_t{0}, uint64_t{4}, uint64_t{8}, uint64_t{1} << 40}) {
      uint32_t w4[4], w8[8];
      philox_block_words(77, offset, first, w4);
      philox_block_words(77, offset, first, w8);
      for (uint64_t k = 0; k < 8; ++k) {
        if (k < 4) {
          ASSERT_EQ(w4[k], philox_word(77, offset, first + k)) << first << " " << k;
        }
        ASSERT_EQ(w8[k], philox_word(77, offset, first + k)) << first << " " << k;
      }
    }
}

// The AVX-512 Philox (eight blocks at once) gives philox_word's words, across the 32-bit counter carry, and
// philox_words_fast's runs (ragged heads and tails around the vector middle) too.
TEST(Philox, EightBlocksAtOnceMatchOneByOne) {
  if (!cpu::cpu_has_avx512f()) GTEST_SKIP() << "no AVX-512F on this CPU";
  for (const uint64_t counter : {uint64_t{0}, uint64_t{12345}, uint64_t{0xFFFFFFFC}, ~uint64_t{0} - 3})
    for (const uint64_t key : {uint64_t{0}, uint64_t{42}, uint64_t{0x123456789ABCDEF0}}) {
      uint32_t out[32];
      cpu::philox_x8(counter, key, out);
      for (int b = 0; b < 8; ++b)
        for (int w = 0; w < 4; ++w)
          ASSERT_EQ(out[4 * b + w], philox4x32(counter + static_cast<uint64_t>(b), key).w[w])
              << "counter " << counter << " key " << key << " block " << b << " word " << w;
    }
  for (const uint64_t first : {uint64_t{0}, uint64_t{3}, uint64_t{5}, uint64_t{1} << 33})
    for (const int64_t n : {0, 7, 31, 32, 33, 100, 257}) {
      std::vector<uint32_t> got(static_cast<size_t>(n), 0);
      int64_t last = -1;
      cpu::philox_words_fast(9, 77, first, n, [&](int64_t k, uint32_t w) {
        ASSERT_EQ(k, last + 1);
        last = k;
        got[static_cast<size_t>(k)] = w;
      });
      ASSERT_EQ(last, n - 1);
      for (int64_t k = 0; k < n; ++k)
        ASSERT_EQ(got[static_cast<size_t>(k)], philox_word(9, 77, first + static_cast<uint64_t>(k)))
            << "first " << first << " n " << n << " word " << k;
    }
}

TEST(VecMath, SixteenLanesMatchEight) {
  if (!cpu::cpu_has_avx512f()) GTEST_SKIP() << "no AVX-512F on this CPU";
  expect_sixteen_lanes_match_eight<backend::UnaryOp::gelu_tanh>(-12, 12);
  expect_sixteen_lanes_match_eight<backend::UnaryOp::silu>(-30, 30);
  expect_sixteen_lanes_match_eight<backend::UnaryOp::sigmoid>(-30, 30);
  expect_sixteen_lanes_match_eight<backend::UnaryOp::tanh>(-12, 12);
  expect_sixteen_lanes_match_eight<backend::UnaryOp::exp>(-100, 100);
}

TEST(VecMath, UnaryRowKernelsMatchTheirFormulas) {
  check_vec_unary<backend::UnaryOp::gelu_tanh>(gelu_tanh_d, gelu_tanh_grad_d, -12, 12);
  check_vec_unary<backend::UnaryOp::silu>(silu_d, silu_grad_d, -30, 30);
  check_vec_unary<backend::UnaryOp::sigmoid>(sigmoid_d, sigmoid_grad_d, -30, 30);
  check_vec_unary<backend::UnaryOp::tanh>(tanh_d, tanh_grad_d, -12, 12);
  check_vec_unary<backend::UnaryOp::exp>(exp_d, exp_d, -80, 80);
  float x[3] = {-INFINITY, INFINITY, -1e30f}, y[3];
  cpu::unary_row<backend::UnaryOp::exp>(x, y, 3);
  EXPECT_EQ(y[0], 0.0f);  // masked attention scores
  EXPECT_TRUE(std::isinf(y[1]));
  EXPECT_EQ(y[2], 0.0f);
  cpu::unary_row<backend::UnaryOp::tanh>(x, y, 2);
  EXPECT_EQ(y[0], -1.0f);
  EXPECT_EQ(y[1], 1.0f);
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

TEST(Allocator, CpuCachesLargeBlocksAndEmptiesOnRequest) {
  CpuAllocator& a = cpu_allocator();
  a.empty_cache();
  void* first;
  {
    Tensor t = ops::empty({3 << 20}, DType::f32);  // 12 MiB
    first = t.data_ptr();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % (2 << 20), 0u);
  }
  EXPECT_GE(a.cached_bytes(), size_t{12} << 20);
  {
    Tensor t = ops::empty({3 << 20}, DType::f32);  // same size: the cached block comes back
    EXPECT_EQ(t.data_ptr(), first);
    EXPECT_EQ(a.cached_bytes(), 0u);
  }
  a.empty_cache();
  EXPECT_EQ(a.cached_bytes(), 0u);
  a.set_cache_limit(0);
  { Tensor t = ops::empty({3 << 20}, DType::f32); }
  EXPECT_EQ(a.cached_bytes(), 0u);
  a.set_cache_limit(size_t{4} << 30);
}

}  // namespace
}  // namespace tr

namespace tr {
namespace {

TEST(Convert, F64ToHalfTypesRoundsOnceAndBoolTestsTheSourceValue) {
  // Just above a bf16 tie: rounding through f32 first would land on the tie and round to even (down).
  const double d = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  EXPECT_EQ(double_to_bf16_bits(d), 0x3f81);
  EXPECT_EQ(float_to_bf16_bits(static_cast<float>(d)), 0x3f80);        // the double rounding we avoid
  const double h = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);  // same for f16 (ulp 2^-10)
  EXPECT_EQ(double_to_half_bits(h), 0x3c01);
  EXPECT_EQ(double_to_half_bits(1.0), 0x3c00);
  EXPECT_EQ(double_to_half_bits(1e300), 0x7c00);
  EXPECT_EQ(double_to_bf16_bits(-1e300), 0xff80);
  Tensor x = ops::from_vector<double>({d, 1e-50, 0.0}, {3});
  EXPECT_EQ(test::values(ops::to_dtype(x, DType::boolean)), (std::vector<double>{1, 1, 0}));
  EXPECT_EQ(ops::to_dtype(x, DType::bf16).item_at(0), static_cast<double>(bf16_bits_to_float(0x3f81)));
}

TEST(Views, ScalarsAreRejectedByDimOps) {
  Tensor s = ops::full({}, 2.0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_THROW(ops::cat({s, s}, 0), Error);
  EXPECT_THROW(ops::transpose(s, 0, 0), Error);
  EXPECT_THROW(ops::softmax(s, -1), Error);
  EXPECT_THROW(ops::argmax(s, 0), Error);
  EXPECT_THROW(s.size(0), Error);
  EXPECT_EQ(ops::unsqueeze(s, 0).shape(), (Shape{1}));
  EXPECT_EQ(ops::reduce(ops::ReduceOp::sum, s, {}, false).item(), 2.0);
}

}  // namespace
}  // namespace tr
