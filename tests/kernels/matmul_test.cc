// cpu::MatMul against the two references, over type × shape × implementation:
//  - ref::MatMulQuantizedActivations (ggml's arithmetic, exact integer block
//    dots): equal up to f32 summation order. Tolerance: every path sums at
//    most N = k/16 + 64 rounded f32 terms (k/64 per-lane FMAs, a 16-lane
//    reduction, the aux dot), so |cpu - refq| <= N · 2^-24 · T where T is the
//    sum of the magnitudes of all terms (reported by the reference).
//  - ref::MatMul (dequantized weights, unquantized f32 activations, double):
//    within the activation quantizer's error. An element in a Q8_0/Q8_1 block
//    with scale d = amax/127 is represented as q·fp16(d) with
//    |x - q·fp16(d)| <= d/2 + 127·|d - fp16(d)| + (x·(1/d) rounding)
//                   <= d·(0.5 + 127·2^-11 + 2^-16) <= 0.563·d,
//    and in a Q8_K block (f32 d) with |err| <= 0.501·|d|. So
//      |Y - Yref| <= Σ_blocks e_b · Σ_{i∈b} |ŵ_i|   (e_b = 0.563·d_b or 0.501·|d_b|)
//                  + Q4_1 only: Σ_b |m_b| · |s_b - fp16(d_b)·Σq_b| <= |m_b|·|Σq_b|·d_b·2^-10·1.01
//                  + the summation tolerance above + 4·2^-24·Σ|ŵ||x| (rounding of ŵ).
//  - Float weights: |Y - Yref| <= (k + 16) · 2^-24 · Σ|w||x| (f32 FMA chains).
#include "kernels/cpu/matmul.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
#include "kernels/quant_blocks.h"
#include "kernels/ref/quant_ref.h"
#include "tests/testing/matmul_data.h"

namespace snapfill {
namespace {

bool IsKQuant(GgmlType t) { return t == GgmlType::kQ4_K || t == GgmlType::kQ5_K || t == GgmlType::kQ6_K; }
// Products whose weight rows are dequantized to f32 and multiplied with f32
// FMA (no activation quantization): the float types and Q5_1 / Q5_K. (Q5_0
// takes Q8_0 activations at every m: its blocks read in place for 1-3
// tokens, rewritten as Q8_0 rows in batches.)
bool IsFloat(GgmlType t) {
  return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16 || t == GgmlType::kQ5_1 ||
         t == GgmlType::kQ5_K;
}

std::vector<uint8_t> MakeWeights(GgmlType type, int64_t n, int64_t k, size_t row_bytes, uint32_t seed) {
  return testing::QuantizedWeights(type, n, k, row_bytes, seed, 0.01f);
}
using testing::HiddenStates;

// Per-element bound of |cpu - ref::MatMul| from the activation quantization
// (see the file comment), excluding the summation term.
std::vector<double> QuantizationBound(GgmlType type, const std::vector<float>& x, int64_t m, int64_t k,
                                      int64_t x_stride, const std::vector<uint8_t>& w, int64_t n,
                                      size_t row_bytes) {
  std::vector<double> bound(m * n, 0.0);
  std::vector<float> wrow(k);
  const GgmlType at = ref::ActivationType(type);
  // Per-block error bound e_b and (Q4_1) |Σq|·d for every X row.
  const int bs = at == GgmlType::kQ8_K ? 256 : 32;
  const int64_t nb = k / bs;
  std::vector<double> e(m * nb), qsum_d(m * nb, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = x.data() + i * x_stride;
    if (at == GgmlType::kQ8_K) {
      std::vector<BlockQ8_K> q(nb);
      ref::QuantizeRowQ8_K(xr, q.data(), k);
      for (int64_t b = 0; b < nb; ++b) e[i * nb + b] = 0.501 * std::fabs(q[b].d);
    } else {
      std::vector<BlockQ8_1> q(nb);
      ref::QuantizeRowQ8_1(xr, q.data(), k);
      for (int64_t b = 0; b < nb; ++b) {
        float amax = 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; ++j) {
          amax = std::max(amax, std::fabs(xr[32 * b + j]));
          sum += q[b].qs[j];
        }
        const double d = amax / 127.0;
        e[i * nb + b] = 0.563 * d;
        qsum_d[i * nb + b] = std::abs(sum) * d;
      }
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* wr = w.data() + j * row_bytes;
    ref::DequantizeRow(type, wr, wrow.data(), k);
    for (int64_t b = 0; b < nb; ++b) {
      double wabs = 0.0;
      for (int t = 0; t < bs; ++t) wabs += std::fabs(wrow[b * bs + t]);
      double m_abs = 0.0;
      if (type == GgmlType::kQ4_1) {
        m_abs = std::fabs(Fp16ToFp32(reinterpret_cast<const BlockQ4_1*>(wr)[b].m));
      }
      for (int64_t i = 0; i < m; ++i) {
        bound[i * n + j] += e[i * nb + b] * wabs + m_abs * qsum_d[i * nb + b] * 0x1p-10 * 1.01;
      }
    }
  }
  return bound;
}

struct Case {
  GgmlType type;
  int64_t m, n, k;
  cpu::MatMulImpl impl = cpu::MatMulImpl::kAuto;
  int64_t x_pad = 0, y_pad = 0, w_pad = 0;  // extra stride (floats / floats / bytes)
};

std::string CaseName(const Case& c) {
  std::ostringstream os;
  os << GetTypeTraits(c.type).name << "_m" << c.m << "_n" << c.n << "_k" << c.k
     << (c.impl == cpu::MatMulImpl::kGeneric ? "_Generic" : c.impl == cpu::MatMulImpl::kAvx2 ? "_Avx2" : "_Auto");
  if (c.x_pad || c.y_pad || c.w_pad) os << "_strided";
  return os.str();
}

void PrintTo(const Case& c, std::ostream* os) { *os << CaseName(c); }

class MatMulTest : public ::testing::TestWithParam<Case> {
 protected:
  void TearDown() override { cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAuto); }
};

TEST_P(MatMulTest, MatchesReferences) {
  const Case c = GetParam();
  // kAmxInt8 is kAuto without the AMX-BF16 path, whose arithmetic (bf16
  // operands) has its own reference and tests (matmul_amx_bf16_test.cc).
  cpu::SetMatMulImplForTesting(c.impl == cpu::MatMulImpl::kAuto ? cpu::MatMulImpl::kAmxInt8 : c.impl);
  const int64_t x_stride = c.k + c.x_pad, y_stride = c.n + c.y_pad;
  const size_t row_bytes = RowBytes(c.type, c.k) + c.w_pad;
  const std::vector<uint8_t> w = MakeWeights(c.type, c.n, c.k, row_bytes, 17 + c.n);
  const std::vector<float> x = HiddenStates(c.m, c.k, x_stride, 29 + c.m);

  const float kSentinel = -12345.0f;
  std::vector<float> y(c.m * y_stride, kSentinel);
  cpu::MatMul(x.data(), c.m, c.k, x_stride, w.data(), c.type, c.n, row_bytes, y.data(), y_stride);

  const bool is_float = IsFloat(c.type);
  EXPECT_EQ(cpu::MatMulQuantizesActivations(c.type, c.m), !is_float);
  std::vector<float> yq(c.m * c.n), ye(c.m * c.n);
  std::vector<double> abs_terms(c.m * c.n);
  ASSERT_TRUE(ref::MatMul(x.data(), c.m, c.k, x_stride, w.data(), c.type, c.n, row_bytes, ye.data(), c.n));
  if (is_float) {
    yq = ye;  // (the f32 rows: ggml's arithmetic is not the reference here)
  } else {
    ASSERT_TRUE(ref::MatMulQuantizedActivations(x.data(), c.m, c.k, x_stride, w.data(), c.type, c.n, row_bytes,
                                                yq.data(), c.n, abs_terms.data()));
  }

  // Σ|ŵ||x| for the rounding of dequantized weights and the float bound.
  std::vector<double> wx_abs(c.m * c.n, 0.0);
  {
    std::vector<float> wrow(c.k);
    for (int64_t j = 0; j < c.n; ++j) {
      ref::DequantizeRow(c.type, w.data() + j * row_bytes, wrow.data(), c.k);
      for (int64_t i = 0; i < c.m; ++i) {
        double a = 0.0;
        for (int64_t t = 0; t < c.k; ++t) a += std::fabs(static_cast<double>(wrow[t]) * x[i * x_stride + t]);
        wx_abs[i * c.n + j] = a;
      }
    }
  }
  std::vector<double> qbound;
  if (!is_float) qbound = QuantizationBound(c.type, x, c.m, c.k, x_stride, w, c.n, row_bytes);

  const double sum_n = static_cast<double>(c.k) / 16.0 + 64.0;
  int64_t bad_q = 0, bad_e = 0;
  double worst_q = 0.0, worst_e = 0.0;
  std::string worst_q_msg, worst_e_msg;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      const double got = y[i * y_stride + j];
      const int64_t idx = i * c.n + j;
      // Against ggml's arithmetic.
      const double tol_q = is_float ? (c.k + 16) * 0x1p-24 * wx_abs[idx]
                                           : sum_n * 0x1p-24 * abs_terms[idx];
      const double dq = std::fabs(got - yq[idx]);
      if (!(dq <= tol_q)) {
        ++bad_q;
        if (!(dq / (tol_q + 1e-300) <= worst_q)) {
          worst_q = dq / (tol_q + 1e-300);
          std::ostringstream os;
          os << "[" << i << "," << j << "] refq=" << yq[idx] << " cpu=" << got << " tol=" << tol_q;
          worst_q_msg = os.str();
        }
      }
      // Against the exact product.
      const double tol_e = is_float ? (c.k + 16) * 0x1p-24 * wx_abs[idx]
                                           : qbound[idx] + tol_q + 4 * 0x1p-24 * wx_abs[idx];
      const double de = std::fabs(got - ye[idx]);
      if (!(de <= tol_e)) {
        ++bad_e;
        if (!(de / (tol_e + 1e-300) <= worst_e)) {
          worst_e = de / (tol_e + 1e-300);
          std::ostringstream os;
          os << "[" << i << "," << j << "] exact=" << ye[idx] << " cpu=" << got << " bound=" << tol_e;
          worst_e_msg = os.str();
        }
      }
    }
    for (int64_t j = c.n; j < y_stride; ++j) ASSERT_EQ(y[i * y_stride + j], kSentinel) << "wrote padding";
  }
  EXPECT_EQ(bad_q, 0) << "vs ref::MatMulQuantizedActivations, worst " << worst_q_msg;
  EXPECT_EQ(bad_e, 0) << "vs ref::MatMul, worst " << worst_e_msg;
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  const GgmlType block_types[] = {GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kF32,
                                  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ5_0, GgmlType::kQ5_1};
  const GgmlType k_types[] = {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};
  const int64_t ms[] = {1, 3, 17, 64, 111};
  const int64_t ns[] = {1, 5, 17, 192};
  for (GgmlType t : block_types)
    for (int64_t m : ms)
      for (int64_t n : ns)
        for (int64_t k : {32, 96, 256, 576}) cases.push_back({t, m, n, k});
  for (GgmlType t : k_types)
    for (int64_t m : ms)
      for (int64_t n : ns)
        for (int64_t k : {256, 512, 1536}) cases.push_back({t, m, n, k});
  // The portable path on a subset (its packing is shared with the SIMD path).
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kF32, GgmlType::kF16,
                     GgmlType::kBF16, GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kQ5_0, GgmlType::kQ5_1,
                     GgmlType::kQ5_K}) {
    const int64_t k = IsKQuant(t) ? 512 : 96;
    cases.push_back({t, 3, 17, k, cpu::MatMulImpl::kGeneric});
    cases.push_back({t, 17, 5, IsKQuant(t) ? 256 : 576, cpu::MatMulImpl::kGeneric});
  }
  // The AVX2 kernels of token blocks and float weights (kAuto's where the
  // CPU has no AVX-512; forced here so that AVX-512 machines test them too):
  // odd token and row counts (tails of the 4 × 2 micro-kernel), several
  // blocks, a k that is no multiple of 64 (the packed rows' zero tail), strides.
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kF32, GgmlType::kF16,
                     GgmlType::kBF16, GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kQ5_0, GgmlType::kQ5_K}) {
    const bool kq = IsKQuant(t);
    cases.push_back({t, 17, 5, kq ? 256 : 576, cpu::MatMulImpl::kAvx2});
    cases.push_back({t, 37, 19, kq ? 512 : 96, cpu::MatMulImpl::kAvx2});
    cases.push_back({t, 64, 192, kq ? 1536 : 1536, cpu::MatMulImpl::kAvx2});
    cases.push_back({t, 19, 17, kq ? 512 : 160, cpu::MatMulImpl::kAvx2, 7, 3, 4});
  }
  // The float weights' panels in 8 × 8 tiles and a tail: k no multiple of 8,
  // a partial second half of the 16 rows, strides.
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16}) {
    cases.push_back({t, 13, 21, 100, cpu::MatMulImpl::kAvx2});
    cases.push_back({t, 7, 11, 45, cpu::MatMulImpl::kAvx2, 7, 3, 4});
  }
  // Non-contiguous x / y / weight rows.
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kF32,
                     GgmlType::kF16, GgmlType::kQ5_1, GgmlType::kQ5_K}) {
    const int64_t k = IsKQuant(t) ? 512 : 96;
    cases.push_back({t, 17, 17, k, cpu::MatMulImpl::kAuto, 7, 3, 4});
    cases.push_back({t, 5, 17, k, cpu::MatMulImpl::kGeneric, 7, 3, 4});
  }
  // SmolLM2-135M shapes: model_dim 576, ffn_dim 1536 (Q4_1 layers, Q8_0
  // embedding / output); m = 20 tokens keeps the double reference quick.
  cases.push_back({GgmlType::kQ4_1, 20, 1536, 576});
  cases.push_back({GgmlType::kQ4_1, 20, 576, 1536});
  cases.push_back({GgmlType::kQ4_1, 1, 576, 576});
  cases.push_back({GgmlType::kQ8_0, 3, 2048, 576});
  cases.push_back({GgmlType::kQ4_K, 9, 576, 1536});
  cases.push_back({GgmlType::kQ6_K, 9, 1536, 512});
  // AVX-512's Q4_0 / Q4_1 path passes the tokens in blocks of about 256 KiB
  // of X (168 tokens at k = 1536): two blocks, the second partial.
  cases.push_back({GgmlType::kQ4_1, 200, 40, 1536});
  cases.push_back({GgmlType::kQ4_0, 200, 40, 1536});
  // ... and splits a wide matrix into units of at most 1 MiB of records
  // (192 rows at k = 8192): three units, the last partial.
  cases.push_back({GgmlType::kQ4_1, 5, 450, 8192});
  // Decode (m <= 3: Q4_0 / Q4_1 / Q5_0 / Q8_0 read their blocks in place
  // instead of unpacking): m = 2 (the m = 1 and 3 cases are above), strided
  // operands, a row count that is no multiple of the 16-row chunks, the
  // portable path (Q5_0: rows rewritten as Q8_0 there), and the real decode
  // shapes including the Q8_0 output head.
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ5_0}) {
    for (int64_t n : {1, 17, 203}) cases.push_back({t, 2, n, 96});
    for (int64_t m : {1, 2, 3}) cases.push_back({t, m, 33, 96, cpu::MatMulImpl::kAuto, 7, 3, 4});
    cases.push_back({t, 1, 33, 96, cpu::MatMulImpl::kGeneric, 7, 3, 4});
  }
  // The small-m products of the types without integer kernels (m <= 4: a
  // row's blocks dequantized in registers), every m, strided, a K-quant;
  // Q5_0 at m = 4, the smallest batch it rewrites as Q8_0 rows.
  for (GgmlType t : {GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kF16, GgmlType::kBF16}) {
    for (int64_t m : {2, 4}) cases.push_back({t, m, 75, 96});
    cases.push_back({t, 4, 33, 576, cpu::MatMulImpl::kAuto, 7, 3, 4});
  }
  for (int64_t m : {2, 4}) cases.push_back({GgmlType::kQ5_K, m, 40, 512});
  // One token times Q4_K / Q6_K (AVX-512: the super-blocks read in place,
  // GemvRowsK1Avx512): strided operands, a row count no multiple of the
  // 16-row chunks, and a Llama-2/TinyLlama shape (ffn_down k = 5632, 22
  // super-blocks) big enough to go parallel.
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    cases.push_back({t, 1, 33, 768, cpu::MatMulImpl::kAuto, 7, 3, 4});
    cases.push_back({t, 1, 203, 2048});
    cases.push_back({t, 1, 64, 5632});
  }
  cases.push_back({GgmlType::kQ4_1, 1, 1536, 576});
  cases.push_back({GgmlType::kQ4_1, 1, 576, 1536});
  cases.push_back({GgmlType::kQ8_0, 1, 1536, 576});
  cases.push_back({GgmlType::kQ8_0, 1, 49152, 576});
  // Gemma 3 270M's Q5_0 decode shapes (hidden 640: Q, and gate / up).
  cases.push_back({GgmlType::kQ5_0, 1, 1024, 640});
  cases.push_back({GgmlType::kQ5_0, 1, 2048, 640});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cpu, MatMulTest, ::testing::ValuesIn(AllCases()),
                         [](const auto& info) { return CaseName(info.param); });

// The result does not depend on the thread count (each output element is
// computed by the same sequence of operations), so 1 and 2 threads agree bit
// for bit, and with the reference as checked above.
// Q5_0 in batches sums 4 steps of vpmaddubsw in int16 on plain AVX2
// (Tile8Q5Avx2, X as u8 = q + 128): the extremes of both operands reach
// 4 · 2 · 255 · 16 = 32,640 and must not saturate (decoding's pairs, q of
// 0..31 against x, reach 2 · 31 · 127). Every weight at -16 or +15 against
// activations all at +127 or -127, at every implementation.
TEST(MatMulExtremesTest, Q5_0AtItsEndsDoesNotSaturate) {
  constexpr int64_t n = 16, k = 256;
  for (const int64_t m : {8, 1}) {  // (batches, and a token read in place)
    const size_t row_bytes = static_cast<size_t>(RowBytes(GgmlType::kQ5_0, k));
    for (const bool low : {true, false}) {
      std::vector<uint8_t> w(n * row_bytes);
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t b = 0; b < k / 32; ++b) {
          auto* blk = reinterpret_cast<BlockQ5_0*>(w.data() + r * row_bytes) + b;
          blk->d = 0x3C00;  // 1.0
          std::memset(blk->qs, low ? 0x00 : 0xFF, sizeof(blk->qs));  // q 0 (-16) or 31 (+15)
          std::memset(blk->qh, low ? 0x00 : 0xFF, sizeof(blk->qh));
        }
      }
      for (const float xv : {1.0f, -1.0f}) {
        std::vector<float> x(m * k, xv);
        std::vector<float> want(m * n);
        ref::MatMulQuantizedActivations(x.data(), m, k, k, w.data(), GgmlType::kQ5_0, n, row_bytes, want.data(), n);
        // (-16 or 15) · (±127 · fp16(1/127)) per element, k of them.
        EXPECT_NEAR(want[0], (low ? -16.0f : 15.0f) * xv * k, 1e-3 * k * 16);
        for (cpu::MatMulImpl impl : {cpu::MatMulImpl::kAuto, cpu::MatMulImpl::kAvx2, cpu::MatMulImpl::kGeneric}) {
          cpu::SetMatMulImplForTesting(impl);
          std::vector<float> y(m * n, 0.0f);
          cpu::MatMul(x.data(), m, k, k, w.data(), GgmlType::kQ5_0, n, row_bytes, y.data(), n);
          for (int64_t i = 0; i < m * n; ++i) {
            ASSERT_NEAR(y[i], want[i], 1e-3f * std::fabs(want[i]))
                << "impl " << static_cast<int>(impl) << " low " << low << " x " << xv << " at " << i;
          }
        }
        cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAuto);
      }
    }
  }
}

// Q4_K / Q6_K token blocks interleave weight rows in the vector lanes: 16
// on AVX-512 (Tile16KAvx512), 8 on AVX2 (Tile8KAvx2). Each lane does the same
// integer sums and f32 steps in the same order, so the two give the same
// bits: rows that fill neither width, partial groups and token tiles, one
// and several super-blocks, one token (the one-token kernel, shared).
TEST(MatMulKQuantLanesTest, SixteenLanesEqualEightBitForBit) {
  if (!cpu::MatMulHasSimd() || !cpu::MatMulHasAvx2()) GTEST_SKIP() << "needs the AVX-512 and the AVX2 kernels";
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    for (const auto& [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{37, 512, 75},
                                  {5, 256, 16},
                                  {64, 1024, 41},
                                  {2, 256, 33},
                                  {1, 512, 40}}) {
      const size_t row_bytes = RowBytes(t, k);
      const auto w = MakeWeights(t, n, k, row_bytes, 7 + m);
      const auto x = HiddenStates(m, k, k, 8 + n);
      std::vector<float> y16(m * n), y8(m * n);
      cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kNoAmx);
      cpu::MatMul(x.data(), m, k, k, w.data(), t, n, row_bytes, y16.data(), n);
      cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAvx2);
      cpu::MatMul(x.data(), m, k, k, w.data(), t, n, row_bytes, y8.data(), n);
      cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAuto);
      EXPECT_EQ(std::memcmp(y16.data(), y8.data(), y8.size() * sizeof(float)), 0)
          << GetTypeTraits(t).name << " m=" << m << " k=" << k << " n=" << n;
    }
  }
}

TEST(MatMulThreadsTest, OneThreadEqualsTwo) {
  // m = 37: the packed path; m = 1: the decode path (n large enough that it
  // does go parallel).
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kF16,
                     GgmlType::kQ5_K, GgmlType::kQ5_0}) {
    for (const auto& [m, n] : {std::pair<int64_t, int64_t>{37, 75}, {1, 1000}}) {
      const int64_t k = IsKQuant(t) ? 512 : 576;
      const size_t row_bytes = RowBytes(t, k);
      const auto w = MakeWeights(t, n, k, row_bytes, 5);
      const auto x = HiddenStates(m, k, k, 6);
      EXPECT_TRUE(testing::MatMulSameOnOneAndTwoThreads(x.data(), m, k, w.data(), t, n, row_bytes))
          << GetTypeTraits(t).name << " m=" << m;
    }
  }
}

// MatMulShared quantizes X once for several weights; every output must be
// what a MatMul call of its own gives, bit for bit (the same units, the same
// operations), on every path: small m, the packed paths, float weights,
// padded strides, an empty product among them.
TEST(MatMulSharedTest, EqualsOneMatMulEachBitForBit) {
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kF16,
                     GgmlType::kQ5_0}) {
    const int64_t k = IsKQuant(t) ? 512 : 576;
    const int64_t ns[] = {192, 17, 0, 576};
    for (int64_t m : {1, 3, 17, 64, 100}) {
      const int64_t x_stride = k + 5;
      const auto x = HiddenStates(m, k, x_stride, 41 + m);
      std::vector<std::vector<uint8_t>> ws;
      std::vector<std::vector<float>> shared, alone;
      std::vector<cpu::MatMulOut> outs;
      const size_t row_bytes = RowBytes(t, k) + 4;
      for (int c = 0; c < 4; ++c) {
        const int64_t n = ns[c], y_stride = n + 3;
        ws.push_back(MakeWeights(t, std::max<int64_t>(n, 1), k, row_bytes, 50 + c));
        shared.emplace_back(m * y_stride, -7.0f);
        alone.emplace_back(m * y_stride, -7.0f);
      }
      for (int c = 0; c < 4; ++c) {
        outs.push_back({ws[c].data(), ns[c], row_bytes, shared[c].data(), ns[c] + 3});
        cpu::MatMul(x.data(), m, k, x_stride, ws[c].data(), t, ns[c], row_bytes, alone[c].data(), ns[c] + 3);
      }
      cpu::MatMulShared(x.data(), m, k, x_stride, t, outs.data(), 4);
      for (int c = 0; c < 4; ++c) {
        for (size_t i = 0; i < shared[c].size(); ++i) {
          ASSERT_EQ(std::memcmp(&shared[c][i], &alone[c][i], sizeof(float)), 0)
              << GetTypeTraits(t).name << " m=" << m << " weight " << c << " element " << i << ": "
              << shared[c][i] << " vs " << alone[c][i];
        }
      }
    }
  }
}

// More weights than one shared call of the AMX-BF16 path takes (8): the
// rest go to a second call, and every output is still MatMul's, bit for bit.
TEST(MatMulSharedTest, NineWeightsEqualOneMatMulEach) {
  const GgmlType t = GgmlType::kQ4_1;
  const int64_t k = 96, m = 40, count = 9;
  const auto x = HiddenStates(m, k, k, 7);
  const size_t row_bytes = RowBytes(t, k);
  std::vector<std::vector<uint8_t>> ws;
  std::vector<std::vector<float>> shared, alone;
  std::vector<cpu::MatMulOut> outs;
  for (int c = 0; c < count; ++c) {
    const int64_t n = 16 + 7 * c;
    ws.push_back(MakeWeights(t, n, k, row_bytes, 90 + c));
    shared.emplace_back(m * n, -7.0f);
    alone.emplace_back(m * n, -7.0f);
  }
  for (int c = 0; c < count; ++c) {
    const int64_t n = 16 + 7 * c;
    outs.push_back({ws[c].data(), n, row_bytes, shared[c].data(), n});
    cpu::MatMul(x.data(), m, k, k, ws[c].data(), t, n, row_bytes, alone[c].data(), n);
  }
  cpu::MatMulShared(x.data(), m, k, k, t, outs.data(), count);
  for (int c = 0; c < count; ++c) {
    ASSERT_EQ(std::memcmp(shared[c].data(), alone[c].data(), shared[c].size() * sizeof(float)), 0) << "weight " << c;
  }
}

// The down projection with its SwiGLU in front (MatMulSwiGlu) is SwiGlu over
// each row of gate and up, then MatMul, bit for bit: fused (AMX-BF16, where
// MatMulFuses says so) and on the other paths, for quantized and float
// weights, padded and contiguous rows, token counts below and above the AMX
// threshold and a partial token tile. The up rows are left as they were.
TEST(MatMulSwiGluTest, EqualsSwiGluThenMatMulBitForBit) {
  for (cpu::MatMulImpl impl : {cpu::MatMulImpl::kAuto, cpu::MatMulImpl::kNoAmx}) {
    cpu::SetMatMulImplForTesting(impl);
    for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kF16}) {
      for (int64_t k : {96, 1536}) {
        for (int64_t m : {1, 17, 64, 100}) {
          for (int64_t pad : {0, 7}) {
            const int64_t n = 40, x_stride = k + pad, y_stride = n + 3;
            const size_t row_bytes = RowBytes(t, k);
            const auto w = MakeWeights(t, n, k, row_bytes, 60 + m);
            // Gate and up of a real scale (a few units), so silu is far from linear.
            auto gate = HiddenStates(m, k, x_stride, 70 + m);
            const auto up = HiddenStates(m, k, x_stride, 80 + m);
            for (float& g : gate) g *= 4.0f;
            std::vector<float> h = gate, want(m * y_stride, -7.0f), got(m * y_stride, -7.0f);
            for (int64_t i = 0; i < m; ++i) cpu::SwiGlu(&h[i * x_stride], &up[i * x_stride], &h[i * x_stride], k);
            cpu::MatMul(h.data(), m, k, x_stride, w.data(), t, n, row_bytes, want.data(), y_stride);
            const std::vector<float> up_before = up;
            cpu::MatMulSwiGlu(gate.data(), up.data(), m, k, x_stride, w.data(), t, n, row_bytes, got.data(),
                              y_stride);
            ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
                << GetTypeTraits(t).name << " k=" << k << " m=" << m << " pad=" << pad << " impl "
                << static_cast<int>(impl) << " fused "
                << cpu::MatMulFuses(t, m, k, row_bytes);
            ASSERT_EQ(std::memcmp(up.data(), up_before.data(), up.size() * sizeof(float)), 0);  // (NaN padding)
          }
        }
      }
    }
  }
  cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAuto);
  // Where the CPU has AMX-BF16, the model's down projection (Q4_1, k = 1536,
  // a chunk of tokens) is fused; never without it, nor for one token.
  EXPECT_EQ(cpu::MatMulFuses(GgmlType::kQ4_1, 1024, 1536, RowBytes(GgmlType::kQ4_1, 1536)),
            cpu::MatMulHasAmxBf16());
  EXPECT_FALSE(cpu::MatMulFuses(GgmlType::kQ4_1, 1, 1536, RowBytes(GgmlType::kQ4_1, 1536)));
  EXPECT_FALSE(cpu::MatMulFuses(GgmlType::kF32, 1024, 1536, 1536 * 4));
}

// The whole feed-forward block (FeedForward) is MatMulShared over gate and
// up, then MatMulSwiGlu (with or without the residual add), bit for bit:
// fused (AMX-BF16, where FeedForwardFuses says so) and on the other paths;
// gate/up and down of different types, widths of one, several and a partial
// panel of row pairs, token counts below and above the AMX threshold with a
// partial token tile, padded rows. Y's padding is left alone.
TEST(FeedForwardTest, EqualsGateUpThenSwiGluMatMulBitForBit) {
  const GgmlType pairs[][2] = {{GgmlType::kQ4_1, GgmlType::kQ4_1},
                               {GgmlType::kQ4_0, GgmlType::kQ8_0},
                               {GgmlType::kQ8_0, GgmlType::kQ4_1},
                               {GgmlType::kF16, GgmlType::kF16}};
  for (cpu::MatMulImpl impl : {cpu::MatMulImpl::kAuto, cpu::MatMulImpl::kNoAmx}) {
    cpu::SetMatMulImplForTesting(impl);
    for (const auto& tt : pairs) {
      const GgmlType gt = tt[0], dt = tt[1];
      for (int64_t k : {64, 576}) {
        for (int64_t n_ff : {32, 160, 288}) {
          for (int64_t m : {1, 17, 64, 100}) {
            for (bool add : {false, true}) {
              const int64_t n = 48, x_stride = k + 5, y_stride = n + 3;
              const size_t gu_bytes = RowBytes(gt, k), d_bytes = RowBytes(dt, n_ff);
              const auto wg = MakeWeights(gt, n_ff, k, gu_bytes, 90 + m);
              const auto wu = MakeWeights(gt, n_ff, k, gu_bytes, 91 + m);
              const auto wd = MakeWeights(dt, n, n_ff, d_bytes, 92 + m);
              auto x = HiddenStates(m, k, x_stride, 93 + m);
              for (float& v : x) v *= 8.0f;  // gate outputs of a few units: silu far from linear
              const auto y0 = HiddenStates(m, n, y_stride, 94 + m);
              std::vector<float> g(m * n_ff), u(m * n_ff), want = y0, got = y0;
              const cpu::MatMulOut gu[2] = {{wg.data(), n_ff, gu_bytes, g.data(), n_ff},
                                            {wu.data(), n_ff, gu_bytes, u.data(), n_ff}};
              cpu::MatMulShared(x.data(), m, k, x_stride, gt, gu, 2);
              cpu::MatMulSwiGlu(g.data(), u.data(), m, n_ff, n_ff, wd.data(), dt, n, d_bytes, want.data(), y_stride,
                                add);
              cpu::FeedForward(x.data(), m, k, x_stride, wg.data(), wu.data(), gt, n_ff, gu_bytes, wd.data(), dt, n,
                               d_bytes, got.data(), y_stride, add);
              ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
                  << GetTypeTraits(gt).name << "/" << GetTypeTraits(dt).name << " k=" << k << " n_ff=" << n_ff
                  << " m=" << m << " add=" << add << " impl " << static_cast<int>(impl) << " fused "
                  << cpu::FeedForwardFuses(gt, dt, m, k, n_ff, gu_bytes, d_bytes);
            }
          }
        }
      }
    }
  }
  cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAuto);
  // The model's block (Q4_1, 576 -> 1536 -> 576, a chunk of tokens) fuses
  // where the CPU has AMX-BF16; one token, float weights or a width that is
  // not whole blocks never do.
  const size_t q576 = RowBytes(GgmlType::kQ4_1, 576), q1536 = RowBytes(GgmlType::kQ4_1, 1536);
  EXPECT_EQ(cpu::FeedForwardFuses(GgmlType::kQ4_1, GgmlType::kQ4_1, 1024, 576, 1536, q576, q1536),
            cpu::MatMulHasAmxBf16());
  EXPECT_FALSE(cpu::FeedForwardFuses(GgmlType::kQ4_1, GgmlType::kQ4_1, 1, 576, 1536, q576, q1536));
  EXPECT_FALSE(cpu::FeedForwardFuses(GgmlType::kF32, GgmlType::kQ4_1, 1024, 576, 1536, 576 * 4, q1536));
  EXPECT_FALSE(cpu::FeedForwardFuses(GgmlType::kQ4_1, GgmlType::kQ4_1, 1024, 576, 1520, q576,
                                     RowBytes(GgmlType::kQ4_1, 1520)));
}

// The layers' RMSNorm in front of the products (cpu::RowNorm): FeedForward
// and NormMatMulShared with a norm are cpu::RmsNorm into xn and then the
// product over xn, bit for bit, fused (the norm inside the conversion to
// bf16; xn untouched there) and on the other paths, where xn then holds the
// normalized rows.
TEST(FeedForwardTest, WithTheNormEqualsRmsNormThenTheProducts) {
  const GgmlType t = GgmlType::kQ4_1;
  const int64_t k = 576, n_ff = 160, n = 64;
  const size_t gu_bytes = RowBytes(t, k), d_bytes = RowBytes(t, n_ff);
  const auto wg = MakeWeights(t, n_ff, k, gu_bytes, 21), wu = MakeWeights(t, n_ff, k, gu_bytes, 22);
  const auto wd = MakeWeights(t, n, n_ff, d_bytes, 23);
  std::vector<float> weight(k);
  for (int64_t i = 0; i < k; ++i) weight[i] = 0.25f + static_cast<float>(i % 5) * 0.5f;
  for (cpu::MatMulImpl impl : {cpu::MatMulImpl::kAuto, cpu::MatMulImpl::kNoAmx}) {
    cpu::SetMatMulImplForTesting(impl);
    for (int64_t m : {1, 17, 100}) {
      const int64_t x_stride = k + 3;
      auto x = HiddenStates(m, k, x_stride, 24 + m);
      for (float& v : x) v *= 3.0f;
      std::vector<float> xn(m * x_stride, 0.0f);
      cpu::RmsNorm(x.data(), x_stride, weight.data(), xn.data(), x_stride, m, k, 1e-5f);
      // FeedForward with the residual add.
      const auto y0 = HiddenStates(m, n, n, 25 + m);
      std::vector<float> want = y0, got = y0, scratch(m * x_stride, 9.0f);
      const bool add = true;
      cpu::FeedForward(xn.data(), m, k, x_stride, wg.data(), wu.data(), t, n_ff, gu_bytes, wd.data(), t, n, d_bytes,
                       want.data(), n, add);
      cpu::RowNorm norm;
      norm.weight = weight.data();
      norm.eps = 1e-5f;
      norm.xn = scratch.data();
      norm.xn_stride = x_stride;
      cpu::FeedForward(x.data(), m, k, x_stride, wg.data(), wu.data(), t, n_ff, gu_bytes, wd.data(), t, n, d_bytes,
                       got.data(), n, add, norm);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << "m=" << m << " impl " << static_cast<int>(impl);
      const bool fused = cpu::FeedForwardFuses(t, t, m, k, n_ff, gu_bytes, d_bytes);
      if (!fused) {
        for (int64_t i = 0; i < m; ++i) {
          ASSERT_EQ(std::memcmp(&scratch[i * x_stride], &xn[i * x_stride], k * sizeof(float)), 0) << "row " << i;
        }
      }
      // NormMatMulShared over two weights (gate and up stand in for Q and K).
      std::vector<float> a1(m * n_ff), b1(m * n_ff), a2(m * n_ff, 1.0f), b2(m * n_ff, 1.0f);
      const cpu::MatMulOut o1[2] = {{wg.data(), n_ff, gu_bytes, a1.data(), n_ff},
                                    {wu.data(), n_ff, gu_bytes, b1.data(), n_ff}};
      const cpu::MatMulOut o2[2] = {{wg.data(), n_ff, gu_bytes, a2.data(), n_ff},
                                    {wu.data(), n_ff, gu_bytes, b2.data(), n_ff}};
      cpu::MatMulShared(xn.data(), m, k, x_stride, t, o1, 2);
      cpu::NormMatMulShared(x.data(), m, k, x_stride, norm, t, o2, 2);
      ASSERT_EQ(std::memcmp(a1.data(), a2.data(), a1.size() * sizeof(float)), 0) << "m=" << m;
      ASSERT_EQ(std::memcmp(b1.data(), b2.data(), b1.size() * sizeof(float)), 0) << "m=" << m;
    }
  }
  cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAuto);
}

// FeedForward may write its output over its input (the model's unfused
// residual path does): the same result as into a separate Y.
TEST(FeedForwardTest, OutputOverTheInput) {
  const GgmlType t = GgmlType::kQ4_1;
  const int64_t m = 70, k = 96, n_ff = 256, stride = 101;
  const size_t gu_bytes = RowBytes(t, k), d_bytes = RowBytes(t, n_ff);
  const auto wg = MakeWeights(t, n_ff, k, gu_bytes, 3), wu = MakeWeights(t, n_ff, k, gu_bytes, 4);
  const auto wd = MakeWeights(t, k, n_ff, d_bytes, 5);
  auto x = HiddenStates(m, k, stride, 6);
  for (float& v : x) v *= 8.0f;
  std::vector<float> want(m * stride, 0.0f), inplace = x;
  cpu::FeedForward(x.data(), m, k, stride, wg.data(), wu.data(), t, n_ff, gu_bytes, wd.data(), t, k, d_bytes,
                   want.data(), stride, false);
  cpu::FeedForward(inplace.data(), m, k, stride, wg.data(), wu.data(), t, n_ff, gu_bytes, wd.data(), t, k, d_bytes,
                   inplace.data(), stride, false);
  for (int64_t i = 0; i < m; ++i) {
    ASSERT_EQ(std::memcmp(&inplace[i * stride], &want[i * stride], k * sizeof(float)), 0) << "row " << i;
  }
}

// The residual add after a product (MatMulAdd, and MatMulSwiGlu with add):
// y + (the product) in f32 per output, bit for bit MatMul into a temporary
// and then the add, fused (AMX-BF16) and on the other paths; padded rows
// and outputs, partial token tiles and row groups. Y's padding is left alone.
// k = 1,280 (40 blocks) makes the AMX-BF16 kernels take K in three unequal
// parts, the add coming with the last.
TEST(MatMulAddTest, EqualsMatMulThenAddBitForBit) {
  for (cpu::MatMulImpl impl : {cpu::MatMulImpl::kAuto, cpu::MatMulImpl::kNoAmx}) {
    cpu::SetMatMulImplForTesting(impl);
    for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kF16}) {
      for (int64_t k : {96, 576, 1280}) {
        for (int64_t m : {1, 17, 64, 100}) {
          for (int64_t n : {40, 576}) {
            const int64_t x_stride = k + 5, y_stride = n + 3;
            const size_t row_bytes = RowBytes(t, k);
            const auto w = MakeWeights(t, n, k, row_bytes, 30 + m);
            const auto x = HiddenStates(m, k, x_stride, 31 + m);
            const auto y0 = HiddenStates(m, n, y_stride, 32 + m);  // the residual stream
            std::vector<float> prod(m * n), want = y0, got = y0;
            cpu::MatMul(x.data(), m, k, x_stride, w.data(), t, n, row_bytes, prod.data(), n);
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t j = 0; j < n; ++j) want[i * y_stride + j] += prod[i * n + j];
            }
            cpu::MatMulAdd(x.data(), m, k, x_stride, w.data(), t, n, row_bytes, got.data(), y_stride);
            ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
                << GetTypeTraits(t).name << " k=" << k << " m=" << m << " n=" << n << " impl "
                << static_cast<int>(impl) << " fused " << cpu::MatMulFuses(t, m, k, row_bytes);
            // The down projection with its SwiGLU and the add.
            auto gate = HiddenStates(m, k, x_stride, 33 + m), h = gate;
            for (int64_t i = 0; i < m; ++i) cpu::SwiGlu(&h[i * x_stride], &x[i * x_stride], &h[i * x_stride], k);
            cpu::MatMul(h.data(), m, k, x_stride, w.data(), t, n, row_bytes, prod.data(), n);
            want = y0;
            got = y0;
            for (int64_t i = 0; i < m; ++i) {
              for (int64_t j = 0; j < n; ++j) want[i * y_stride + j] += prod[i * n + j];
            }
            cpu::MatMulSwiGlu(gate.data(), x.data(), m, k, x_stride, w.data(), t, n, row_bytes, got.data(), y_stride,
                              /*add=*/true);
            ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
                << "swiglu " << GetTypeTraits(t).name << " k=" << k << " m=" << m << " n=" << n;
          }
        }
      }
    }
  }
  cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAuto);
}

// Weights given with their decode-layout copies (MatMulOut::packed): the
// AVX-512 Q4 kernels read the copies instead of packing the rows, and with
// enough tokens split the tokens between the threads instead of the rows.
// Every output must still be what MatMul gives from the GGUF rows, bit for
// bit: tokens below and above the split's threshold (64 a thread), a
// remainder of tokens that fills no whole tile, contiguous X (quantized as
// one run) and padded X, a row count that fills no whole 16-row group, an
// empty product among them.
TEST(MatMulSharedTest, DecodeLayoutCopiesGiveTheSameProducts) {
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ4_0, GgmlType::kQ8_0}) {
    const int64_t k = 576;
    const int64_t ns[] = {200, 0, 576};
    for (int64_t m : {2, 40, 127, 128, 301}) {
      for (int64_t x_stride : {k, k + 5}) {
        const auto x = HiddenStates(m, k, x_stride, 7 + m);
        std::vector<std::vector<uint8_t>> ws, copies;
        std::vector<std::vector<float>> given, alone;
        std::vector<cpu::MatMulOut> outs;
        const size_t row_bytes = RowBytes(t, k);
        for (int c = 0; c < 3; ++c) {
          const int64_t n = ns[c];
          ws.push_back(MakeWeights(t, std::max<int64_t>(n, 1), k, row_bytes, 90 + c));
          copies.emplace_back(std::max<size_t>(cpu::DecodePackedBytes(t, n, k), 1));
          if (n > 0 && cpu::DecodePackedBytes(t, n, k) > 0) {
            cpu::PackForDecode(ws[c].data(), t, n, k, row_bytes, copies[c].data());
          }
          given.emplace_back(m * n, -7.0f);
          alone.emplace_back(m * n, -7.0f);
          cpu::MatMul(x.data(), m, k, x_stride, ws[c].data(), t, n, row_bytes, alone[c].data(), n);
        }
        for (int c = 0; c < 3; ++c) {
          const bool has = cpu::DecodePackedBytes(t, ns[c], k) > 0;
          outs.push_back({ws[c].data(), ns[c], row_bytes, given[c].data(), ns[c], has ? copies[c].data() : nullptr});
        }
        cpu::MatMulShared(x.data(), m, k, x_stride, t, outs.data(), 3);
        for (int c = 0; c < 3; ++c) {
          for (size_t i = 0; i < given[c].size(); ++i) {
            ASSERT_EQ(std::memcmp(&given[c][i], &alone[c][i], sizeof(float)), 0)
                << GetTypeTraits(t).name << " m=" << m << " x_stride=" << x_stride << " weight " << c
                << " element " << i << ": " << given[c][i] << " vs " << alone[c][i];
          }
        }
      }
    }
  }
}

// The same kernels do read the copy where they take it: scribbling over the
// copy changes the product (AVX-512 Q4 on the token-block path only; the
// other paths read the GGUF rows, and there the product must not change).
TEST(MatMulSharedTest, DecodeLayoutCopyIsReadWhereTaken) {
  const GgmlType t = GgmlType::kQ4_1;
  const int64_t k = 576, n = 64, m = 300;
  const size_t row_bytes = RowBytes(t, k);
  if (cpu::DecodePackedBytes(t, n, k) == 0) GTEST_SKIP() << "no decode layout at this level";
  const auto w = MakeWeights(t, n, k, row_bytes, 3);
  const auto x = HiddenStates(m, k, k, 4);
  std::vector<uint8_t> copy(cpu::DecodePackedBytes(t, n, k));
  cpu::PackForDecode(w.data(), t, n, k, row_bytes, copy.data());
  for (size_t i = 0; i < copy.size(); i += 7) copy[i] ^= 0x5A;
  std::vector<float> given(m * n), alone(m * n);
  const cpu::MatMulOut out{w.data(), n, row_bytes, given.data(), n, copy.data()};
  cpu::MatMulShared(x.data(), m, k, k, t, &out, 1);
  cpu::MatMul(x.data(), m, k, k, w.data(), t, n, row_bytes, alone.data(), n);
  const bool differs = std::memcmp(given.data(), alone.data(), given.size() * sizeof(float)) != 0;
  EXPECT_EQ(differs, cpu::MatMulReadsDecodeLayout(t)) << "MatMulReadsDecodeLayout says the copy is "
                                                      << (cpu::MatMulReadsDecodeLayout(t) ? "" : "not ") << "read";
}

}  // namespace
}  // namespace snapfill
