// Tests of the ggml block formats: fp16/bf16 conversion, dequantization of
// hand-built blocks (expected values from the format's formula), quantizer
// round trips within each format's named error budget, and cpu == ref bit
// equality for dequantization and the activation quantizers.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/matmul.h"
#include "kernels/quant_blocks.h"
#include "kernels/ref/quant_ref.h"
#include "src/gguf/gguf_reader.h"
#include "tests/testing/status_matchers.h"
#include "tools/cli/environment.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace snapfill {
namespace {

// ---------------------------------------------------------------------------
// fp16 / bf16.

TEST(Fp16Test, KnownValues) {
  EXPECT_EQ(Fp16ToFp32(0x3C00), 1.0f);
  EXPECT_EQ(Fp16ToFp32(0xC000), -2.0f);
  EXPECT_EQ(Fp16ToFp32(0x7BFF), 65504.0f);
  EXPECT_EQ(Fp16ToFp32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(Fp16ToFp32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(Fp16ToFp32(0x3555), 1365.0f / 4096.0f);       // 0.333251953125
  EXPECT_TRUE(std::isinf(Fp16ToFp32(0x7C00)));
  EXPECT_TRUE(std::isnan(Fp16ToFp32(0x7E00)));
  EXPECT_TRUE(std::signbit(Fp16ToFp32(0x8000)));

  EXPECT_EQ(Fp32ToFp16(1.0f), 0x3C00);
  EXPECT_EQ(Fp32ToFp16(-2.0f), 0xC000);
  // Ties go to even: 1 + 2^-11 is halfway between 0x3C00 and 0x3C01.
  EXPECT_EQ(Fp32ToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(Fp32ToFp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7C00);  // halfway to 2^16 rounds to inf
  EXPECT_EQ(Fp32ToFp16(65519.0f), 0x7BFF);
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even (0)
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(Fp32ToFp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp ties to even
}

TEST(Fp16Test, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Fp16ToFp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(Fp32ToFp16(f), h) << "h=" << h;
  }
}

#if defined(__F16C__)
// The hardware conversion (vcvtps2ph, round to nearest even) is an
// independent reference for Fp32ToFp16 on arbitrary floats.
TEST(Fp16Test, MatchesF16C) {
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) continue;
    const uint16_t hw = _cvtss_sh(f, 0);
    ASSERT_EQ(Fp32ToFp16(f), hw) << "bits=" << bits;
  }
}

// The AVX2 and higher copies of the CPU kernels convert with F16C in place
// of these functions (matmul_variant.inc), so the two must agree exactly:
// every half both ways, and every tie (the float halfway between two
// neighbouring halves, where round-to-nearest-even decides).
TEST(Fp16Test, EveryHalfAndEveryTieMatchesF16C) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Fp16ToFp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    const float hw = _cvtsh_ss(static_cast<uint16_t>(h));
    ASSERT_EQ(std::memcmp(&f, &hw, sizeof(f)), 0) << "h=" << h;  // bits: ±0 differ
    if ((h & 0x7FFF) >= 0x7BFF) continue;  // the next half up is inf / NaN
    const float up = Fp16ToFp32(static_cast<uint16_t>(h + 1));
    const float tie = f + (up - f) / 2;  // exact: one more bit than f16 has
    ASSERT_EQ(Fp32ToFp16(tie), _cvtss_sh(tie, 0)) << "h=" << h;
    ASSERT_EQ(Fp32ToFp16(tie), (h & 1) ? h + 1 : h) << "h=" << h;  // to even
  }
}
#endif

TEST(Bf16Test, KnownValues) {
  EXPECT_EQ(Bf16ToFp32(0x3F80), 1.0f);
  EXPECT_EQ(Bf16ToFp32(0xC000), -2.0f);
  EXPECT_EQ(Fp32ToBf16(1.0f), 0x3F80);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even.
  EXPECT_EQ(Fp32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(Fp32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_TRUE(std::isnan(Bf16ToFp32(Fp32ToBf16(std::nanf("")))));
}

// ---------------------------------------------------------------------------
// Dequantization of hand-built blocks. Expected values use each format's
// formula directly on the chosen integers and scales (all exactly
// representable, so any rounding-order difference would show).

void ExpectDequant(GgmlType type, const void* block, const std::vector<float>& expected) {
  const int64_t k = static_cast<int64_t>(expected.size());
  std::vector<float> got_ref(k, -999.0f), got_cpu(k, -999.0f);
  ASSERT_TRUE(ref::DequantizeRow(type, block, got_ref.data(), k));
  cpu::DequantizeRow(type, block, got_cpu.data(), k);
  for (int64_t i = 0; i < k; ++i) {
    ASSERT_EQ(got_ref[i], expected[i]) << GetTypeTraits(type).name << " ref element " << i;
    ASSERT_EQ(got_cpu[i], expected[i]) << GetTypeTraits(type).name << " cpu element " << i;
  }
}

TEST(DequantizeKnownTest, Q4_0) {
  BlockQ4_0 b;
  b.d = 0x3800;  // 0.5
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::vector<float> want(32);
  for (int j = 0; j < 16; ++j) {
    want[j] = 0.5f * (j - 8);
    want[j + 16] = 0.5f * (15 - j - 8);
  }
  ExpectDequant(GgmlType::kQ4_0, &b, want);
}

TEST(DequantizeKnownTest, Q4_1) {
  BlockQ4_1 b;
  b.d = 0x3400;  // 0.25
  b.m = 0xBC00;  // -1
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((j ^ 5) << 4));
  std::vector<float> want(32);
  for (int j = 0; j < 16; ++j) {
    want[j] = 0.25f * j - 1.0f;
    want[j + 16] = 0.25f * (j ^ 5) - 1.0f;
  }
  ExpectDequant(GgmlType::kQ4_1, &b, want);
}

TEST(DequantizeKnownTest, Q8_0) {
  BlockQ8_0 b;
  b.d = 0x4000;  // 2
  std::vector<float> want(32);
  for (int j = 0; j < 32; ++j) {
    b.qs[j] = static_cast<int8_t>(8 * j - 128);
    want[j] = 2.0f * (8 * j - 128);
  }
  ExpectDequant(GgmlType::kQ8_0, &b, want);
}

TEST(DequantizeKnownTest, Q4_K) {
  // Scales/mins chosen to exercise the 2 high bits of sub-blocks 4..7.
  const int sc[8] = {1, 2, 3, 4, 17, 33, 50, 63};
  const int mn[8] = {0, 5, 10, 63, 16, 32, 48, 7};
  BlockQ4_K b;
  b.d = 0x3C00;     // 1
  b.dmin = 0x3800;  // 0.5
  // ggml's 12-byte packing: bytes 0-3 hold sc[0..3] (6 bits) with the top two
  // bits of sc[4..7] above; bytes 4-7 the same for the mins; bytes 8-11 the
  // low nibbles of sc[4..7] | mins[4..7] << 4.
  for (int j = 0; j < 4; ++j) {
    b.scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    b.scales[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    b.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  for (int i = 0; i < 128; ++i) b.qs[i] = static_cast<uint8_t>((i % 16) | ((15 - i % 16) << 4));
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int chunk = e / 64, within = e % 64, j = e / 32;
    const int q = within < 32 ? (b.qs[32 * chunk + within] & 15) : (b.qs[32 * chunk + within - 32] >> 4);
    want[e] = 1.0f * sc[j] * q - 0.5f * mn[j];
  }
  ExpectDequant(GgmlType::kQ4_K, &b, want);
}

// Q5_0 / Q5_1: element j < 16 is the low nibble of qs[j] with bit j of qh
// (little-endian) as its fifth bit; element j + 16 the high nibble with
// bit j + 16 (ggml's dequantize_row_q5_0 / _1).
TEST(DequantizeKnownTest, Q5_0) {
  BlockQ5_0 b;
  b.d = 0x3800;  // 0.5
  const uint32_t qh = 0xA5C3F00Fu;
  std::memcpy(b.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::vector<float> want(32);
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>((qh >> j) & 1), h1 = static_cast<int>((qh >> (j + 16)) & 1);
    want[j] = 0.5f * ((j | (h0 << 4)) - 16);
    want[j + 16] = 0.5f * (((15 - j) | (h1 << 4)) - 16);
  }
  ExpectDequant(GgmlType::kQ5_0, &b, want);
}

TEST(DequantizeKnownTest, Q5_1) {
  BlockQ5_1 b;
  b.d = 0x3400;  // 0.25
  b.m = 0xC000;  // -2
  const uint32_t qh = 0x0FF0F00Fu;
  std::memcpy(b.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((j ^ 9) << 4));
  std::vector<float> want(32);
  for (int j = 0; j < 16; ++j) {
    const int h0 = static_cast<int>((qh >> j) & 1), h1 = static_cast<int>((qh >> (j + 16)) & 1);
    want[j] = 0.25f * (j | (h0 << 4)) - 2.0f;
    want[j + 16] = 0.25f * ((j ^ 9) | (h1 << 4)) - 2.0f;
  }
  ExpectDequant(GgmlType::kQ5_1, &b, want);
}

// Q5_K: Q4_K's scales and nibbles, the fifth bit of element 64c + l (l < 32)
// bit 2c of qh[l], of element 64c + 32 + l bit 2c + 1 (ggml's u1 / u2).
TEST(DequantizeKnownTest, Q5_K) {
  const int sc[8] = {1, 2, 3, 4, 17, 33, 50, 63};
  const int mn[8] = {0, 5, 10, 63, 16, 32, 48, 7};
  BlockQ5_K b;
  b.d = 0x3400;     // 0.25
  b.dmin = 0x3800;  // 0.5
  for (int j = 0; j < 4; ++j) {
    b.scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    b.scales[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    b.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  std::memset(b.qh, 0, sizeof(b.qh));
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int v = (e * 11 + 5) % 32;
    const int c = e / 64, half = (e % 64) / 32, l = e % 32;
    uint8_t& q = b.qs[32 * c + l];
    q = static_cast<uint8_t>(half ? (q & 0x0F) | ((v & 15) << 4) : (q & 0xF0) | (v & 15));
    b.qh[l] |= static_cast<uint8_t>((v >> 4) << (2 * c + half));
    want[e] = 0.25f * sc[e / 32] * v - 0.5f * mn[e / 32];
  }
  ExpectDequant(GgmlType::kQ5_K, &b, want);
}

TEST(DequantizeKnownTest, Q6_K) {
  BlockQ6_K b;
  std::memset(&b, 0, sizeof(b));
  b.d = 0x3000;  // 0.125
  for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<int8_t>(g - 8);
  // Element e = 128h + 32r + l: low nibble in ql[64h + l + 32(r%2)] (low
  // half for r < 2, high half otherwise), 2 high bits at qh[32h + l] >> 2r.
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) {
    const int v = (e * 7 + 3) % 64;
    const int h = e / 128, r = (e % 128) / 32, l = e % 32;
    b.ql[64 * h + l + 32 * (r % 2)] |= static_cast<uint8_t>((v & 15) << (r < 2 ? 0 : 4));
    b.qh[32 * h + l] |= static_cast<uint8_t>((v >> 4) << (2 * r));
    want[e] = 0.125f * (e / 16 - 8) * (v - 32);
  }
  ExpectDequant(GgmlType::kQ6_K, &b, want);
}

TEST(DequantizeKnownTest, FloatTypes) {
  const uint16_t f16[4] = {0x3C00, 0xC000, 0x0001, 0x7BFF};
  ExpectDequant(GgmlType::kF16, f16, {1.0f, -2.0f, std::ldexp(1.0f, -24), 65504.0f});
  const uint16_t bf16[3] = {0x3F80, 0xC000, 0x4049};
  ExpectDequant(GgmlType::kBF16, bf16, {1.0f, -2.0f, 3.140625f});
  const float f32[2] = {1.5f, -0.25f};
  ExpectDequant(GgmlType::kF32, f32, {1.5f, -0.25f});
}

TEST(DequantizeTest, UnsupportedTypeIsRejected) {
  float y[32];
  uint8_t x[64] = {};
  EXPECT_FALSE(ref::DequantizeRow(GgmlType::kIQ4_NL, x, y, 32));
  EXPECT_FALSE(cpu::MatMulSupports(GgmlType::kIQ4_NL));
  EXPECT_FALSE(cpu::MatMulSupports(GgmlType::kQ3_K));
  EXPECT_TRUE(cpu::MatMulSupports(GgmlType::kQ4_1));
}

// cpu::DequantizeRow is bit-identical to ref on random blocks (random bytes
// with finite fp16 scales), over several blocks.
TEST(DequantizeTest, CpuMatchesRefBitwise) {
  std::mt19937 rng(11);
  const GgmlType types[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0,
                            GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                            GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};
  for (GgmlType type : types) {
    const int64_t k = 1024;
    const int64_t bytes = RowBytes(type, k);
    std::vector<uint8_t> row(bytes);
    for (auto& b : row) b = static_cast<uint8_t>(rng());
    // Make every 16-bit field a finite value (clear exponent-all-ones).
    for (int64_t i = 1; i < bytes; i += 2) row[i] &= 0x7B;
    if (type == GgmlType::kF32) {
      std::uniform_real_distribution<float> u(-3, 3);
      for (int64_t i = 0; i < k; ++i) {
        const float f = u(rng);
        std::memcpy(row.data() + 4 * i, &f, 4);
      }
    }
    std::vector<float> a(k), b(k);
    ASSERT_TRUE(ref::DequantizeRow(type, row.data(), a.data(), k));
    cpu::DequantizeRow(type, row.data(), b.data(), k);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), k * sizeof(float)), 0) << GetTypeTraits(type).name;
  }
}

// ---------------------------------------------------------------------------
// Activation quantizers: known values (ggml's rounding rules), then cpu ==
// ref bit for bit on random and edge-case rows for both cpu implementations.

TEST(ActivationQuantTest, Q8_0RoundsHalfAwayFromZero) {
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;  // amax = 127 -> d = 1, id = 1
  x[1] = 63.5f;
  x[2] = -63.5f;
  x[3] = 0.5f;
  x[4] = -2.5f;
  x[5] = 2.4f;
  BlockQ8_0 b;
  ref::QuantizeRowQ8_0(x.data(), &b, 32);
  EXPECT_EQ(b.d, 0x3C00);
  EXPECT_EQ(b.qs[0], 127);
  EXPECT_EQ(b.qs[1], 64);
  EXPECT_EQ(b.qs[2], -64);
  EXPECT_EQ(b.qs[3], 1);
  EXPECT_EQ(b.qs[4], -3);
  EXPECT_EQ(b.qs[5], 2);
  EXPECT_EQ(b.qs[6], 0);
}

TEST(ActivationQuantTest, Q8_1SumUsesUnroundedScale) {
  std::vector<float> x(32, 0.0f);
  x[0] = 1.0f;  // d = 1/127 (not an fp16 value), q[0] = 127
  x[1] = 0.5f;  // 63.5 -> 64
  BlockQ8_1 b;
  ref::QuantizeRowQ8_1(x.data(), &b, 32);
  EXPECT_EQ(b.qs[0], 127);
  EXPECT_EQ(b.qs[1], 64);
  const float d = 1.0f / 127.0f;
  EXPECT_EQ(b.d, Fp32ToFp16(d));
  EXPECT_EQ(b.s, Fp32ToFp16(191.0f * d));
}

TEST(ActivationQuantTest, Q8_KRoundsHalfToEvenWithSignedScale) {
  std::vector<float> x(256, 0.0f);
  x[0] = 127.0f;  // max = +127 -> iscale = -1, d = -1
  x[1] = 63.5f;   // -63.5 -> -64 (even)
  x[2] = 62.5f;   // -62.5 -> -62 (even)
  x[3] = -0.5f;   // 0.5 -> 0
  x[17] = -1.5f;  // 1.5 -> 2
  BlockQ8_K b;
  ref::QuantizeRowQ8_K(x.data(), &b, 256);
  EXPECT_EQ(b.d, -1.0f);
  EXPECT_EQ(b.qs[0], -127);
  EXPECT_EQ(b.qs[1], -64);
  EXPECT_EQ(b.qs[2], -62);
  EXPECT_EQ(b.qs[3], 0);
  EXPECT_EQ(b.qs[17], 2);
  EXPECT_EQ(b.bsums[0], -127 - 64 - 62);
  EXPECT_EQ(b.bsums[1], 2);
  // The first element of largest magnitude picks the sign: -127 first.
  x[0] = -127.0f;
  x[5] = 127.0f;
  ref::QuantizeRowQ8_K(x.data(), &b, 256);
  EXPECT_EQ(b.d, 1.0f);
  EXPECT_EQ(b.qs[0], -127);
  EXPECT_EQ(b.qs[5], 127);
}

std::vector<float> ActivationTestRow(int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-3, 3);
  std::vector<float> x(k);
  for (auto& v : x) v = u(rng);
  // Edge cases: an all-zero block, exact ties of x/d, a lone outlier, and a
  // block whose extremes are equal with opposite signs.
  for (int j = 0; j < 32; ++j) x[j] = 0.0f;
  if (k >= 64) {
    x[32] = 127.0f;
    for (int j = 33; j < 64; ++j) x[j] = (j - 48) + 0.5f;
  }
  if (k >= 512) {
    x[300] = 1e4f;
    x[256] = -5.0f;
    x[257] = 5.0f;
    for (int j = 258; j < 512; ++j) x[j] = std::fmod(j * 0.37f, 5.0f) - 2.5f;
    x[258] = 0.0f;
  }
  return x;
}

class ActivationQuantImplTest : public ::testing::TestWithParam<cpu::MatMulImpl> {
 protected:
  void SetUp() override { cpu::SetMatMulImplForTesting(GetParam()); }
  void TearDown() override { cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAuto); }
};

// k: whole runs of 16 blocks (the AVX-512 products quantize 16 at once), a
// run and a rest (the model's 576), and fewer than 16 blocks.
TEST_P(ActivationQuantImplTest, CpuMatchesRefBitwise) {
  for (const int64_t k : {int64_t{1536}, int64_t{576}, int64_t{96}}) {
    for (uint32_t seed = 1; seed <= 5; ++seed) {
      SCOPED_TRACE(::testing::Message() << "k " << k << " seed " << seed);
      const std::vector<float> x = ActivationTestRow(k, seed);
      {
        std::vector<BlockQ8_0> a(k / 32), b(k / 32);
        ref::QuantizeRowQ8_0(x.data(), a.data(), k);
        cpu::QuantizeRowQ8_0(x.data(), b.data(), k);
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])), 0) << "Q8_0";
      }
      {
        std::vector<BlockQ8_1> a(k / 32), b(k / 32);
        ref::QuantizeRowQ8_1(x.data(), a.data(), k);
        cpu::QuantizeRowQ8_1(x.data(), b.data(), k);
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])), 0) << "Q8_1";
      }
      if (k % 256 == 0) {
        std::vector<BlockQ8_K> a(k / 256), b(k / 256);
        ref::QuantizeRowQ8_K(x.data(), a.data(), k);
        cpu::QuantizeRowQ8_K(x.data(), b.data(), k);
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])), 0) << "Q8_K";
      }
    }
  }
}

// The products' quantizer (16 blocks at a time on AVX-512, in spans of 64
// blocks): k = 2080 is a whole span and one more block, 1536 whole groups of
// 16, 576 a group and a rest, 96 fewer than 16 blocks. The rows hold exact
// ties of x / d (which roundf takes away from zero).
TEST_P(ActivationQuantImplTest, ProductQuantizerMatchesRefBitwise) {
  for (const int64_t k : {int64_t{2080}, int64_t{1536}, int64_t{576}, int64_t{96}}) {
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      SCOPED_TRACE(::testing::Message() << "k " << k << " seed " << seed);
      const std::vector<float> x = ActivationTestRow(k, seed);
      std::vector<BlockQ8_1> r(k / 32);
      ref::QuantizeRowQ8_1(x.data(), r.data(), k);
      for (const GgmlType w_type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0}) {
        SCOPED_TRACE(GetTypeTraits(w_type).name);
        std::vector<uint8_t> q(k);
        std::vector<float> s(k / 32), aux(k / 32);
        cpu::QuantizeActivationsForTesting(w_type, x.data(), k, q.data(), s.data(), aux.data());
        for (int64_t b = 0; b < k / 32; ++b) {
          int sum = 0;
          for (int j = 0; j < 32; ++j) {
            const int8_t want = r[b].qs[j];
            sum += want;
            const uint8_t got = w_type == GgmlType::kQ8_0 ? q[32 * b + j] ^ 0x80 : q[32 * b + j];
            ASSERT_EQ(static_cast<int8_t>(got), want) << "block " << b << " element " << j;
          }
          const float dx = Fp16ToFp32(r[b].d);
          ASSERT_EQ(s[b], dx) << "block " << b;
          const float want_aux = w_type == GgmlType::kQ4_0   ? dx * static_cast<float>(-8 * sum)
                                 : w_type == GgmlType::kQ4_1 ? Fp16ToFp32(r[b].s)
                                                             : -128.0f * dx;
          ASSERT_EQ(aux[b], want_aux) << "block " << b;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, ActivationQuantImplTest,
                         ::testing::Values(cpu::MatMulImpl::kAuto, cpu::MatMulImpl::kGeneric),
                         [](const auto& info) {
                           return std::string(info.param == cpu::MatMulImpl::kAuto ? "Auto" : "Generic");
                         });

// ---------------------------------------------------------------------------
// Round trips: quantize (ref) -> dequantize, per-element budget derived from
// each format's construction, plus a named RMS budget per format.

struct RoundTripCase {
  GgmlType type;
  double max_rel_rms;  // named budget: rms(x - x̂) / rms(x)
};

class RoundTripTest : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(RoundTripTest, WithinBudget) {
  const GgmlType type = GetParam().type;
  const int64_t k = 1536, rows = 8;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(rows * k);
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = std::ldexp(1.0f, static_cast<int>(r) - 4);  // 1/16 .. 8
    for (int64_t i = 0; i < k; ++i) x[r * k + i] = scale * nd(rng);
  }
  x[5] = 0.0f;
  for (int i = 64; i < 96; ++i) x[i] = 0.25f;  // constant block (range 0)
  const int64_t row_bytes = RowBytes(type, k);
  std::vector<uint8_t> q(rows * row_bytes);
  std::vector<float> xh(rows * k);
  double err2 = 0.0, ref2 = 0.0;
  int64_t outside = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * k;
    uint8_t* qr = q.data() + r * row_bytes;
    float* xhr = xh.data() + r * k;
    switch (type) {
      case GgmlType::kQ4_0: ref::QuantizeRowQ4_0(xr, reinterpret_cast<BlockQ4_0*>(qr), k); break;
      case GgmlType::kQ4_1: ref::QuantizeRowQ4_1(xr, reinterpret_cast<BlockQ4_1*>(qr), k); break;
      case GgmlType::kQ8_0: ref::QuantizeRowQ8_0(xr, reinterpret_cast<BlockQ8_0*>(qr), k); break;
      case GgmlType::kQ4_K: ref::QuantizeRowQ4_K(xr, reinterpret_cast<BlockQ4_K*>(qr), k); break;
      case GgmlType::kQ6_K: ref::QuantizeRowQ6_K(xr, reinterpret_cast<BlockQ6_K*>(qr), k); break;
      case GgmlType::kQ5_0: ref::QuantizeRowQ5_0(xr, reinterpret_cast<BlockQ5_0*>(qr), k); break;
      case GgmlType::kQ5_1: ref::QuantizeRowQ5_1(xr, reinterpret_cast<BlockQ5_1*>(qr), k); break;
      case GgmlType::kQ5_K: ref::QuantizeRowQ5_K(xr, reinterpret_cast<BlockQ5_K*>(qr), k); break;
      default: FAIL();
    }
    ASSERT_TRUE(ref::DequantizeRow(type, qr, xhr, k));
    for (int64_t i = 0; i < k; ++i) {
      // Per-element budget, from the block the element belongs to.
      double budget = 0.0;
      const int64_t b32 = i / 32;
      float amax = 0.0f, mn = 1e30f, mx = -1e30f;
      for (int j = 0; j < 32; ++j) {
        amax = std::max(amax, std::fabs(xr[32 * b32 + j]));
        mn = std::min(mn, xr[32 * b32 + j]);
        mx = std::max(mx, xr[32 * b32 + j]);
      }
      switch (type) {
        case GgmlType::kQ4_0:
          // d = max/-8; the level opposite the max clamps at 7: up to one step.
          budget = amax / 8.0 * (1.0 + 0x1p-7);
          break;
        case GgmlType::kQ4_1:
          // Half a step d = range/15, plus fp16 rounding of d (15 levels) and m.
          budget = 0.5 * (mx - mn) / 15.0 + 15.0 * (mx - mn) / 15.0 * 0x1p-11 + std::fabs(mn) * 0x1p-11 +
                   amax * 0x1p-20;
          break;
        case GgmlType::kQ5_0:
          // d = max/-16; the level opposite the max clamps at 15: up to one step.
          budget = amax / 16.0 * (1.0 + 0x1p-7);
          break;
        case GgmlType::kQ5_1:
          // As Q4_1 with 31 levels.
          budget = 0.5 * (mx - mn) / 31.0 + 31.0 * (mx - mn) / 31.0 * 0x1p-11 + std::fabs(mn) * 0x1p-11 +
                   amax * 0x1p-20;
          break;
        case GgmlType::kQ8_0:
          // Half a step of d = amax/127, plus fp16 rounding of d times |q| <= 127.
          budget = (0.5 + 127.0 * 0x1p-11) * amax / 127.0 + amax * 0x1p-20;
          break;
        case GgmlType::kQ4_K: {
          const auto* blk = reinterpret_cast<const BlockQ4_K*>(qr) + i / 256;
          uint8_t sc, m;
          GetScaleMinK4(static_cast<int>((i % 256) / 32), blk->scales, &sc, &m);
          budget = 0.5 * Fp16ToFp32(blk->d) * sc * (1.0 + 0x1p-20) + amax * 0x1p-20;
          break;
        }
        case GgmlType::kQ5_K: {
          const auto* blk = reinterpret_cast<const BlockQ5_K*>(qr) + i / 256;
          uint8_t sc, m;
          GetScaleMinK4(static_cast<int>((i % 256) / 32), blk->scales, &sc, &m);
          budget = 0.5 * Fp16ToFp32(blk->d) * sc * (1.0 + 0x1p-20) + amax * 0x1p-20;
          break;
        }
        case GgmlType::kQ6_K: {
          const auto* blk = reinterpret_cast<const BlockQ6_K*>(qr) + i / 256;
          budget = 0.5 * Fp16ToFp32(blk->d) * std::abs(blk->scales[(i % 256) / 16]) * (1.0 + 0x1p-20) +
                   amax * 0x1p-20;
          break;
        }
        default: break;
      }
      const double e = std::fabs(static_cast<double>(xr[i]) - xhr[i]);
      if (e > budget) {
        if (outside == 0) {
          ADD_FAILURE() << GetTypeTraits(type).name << " row " << r << " element " << i << ": x=" << xr[i]
                        << " x̂=" << xhr[i] << " |err|=" << e << " > budget " << budget;
        }
        ++outside;
      }
      err2 += e * e;
      ref2 += static_cast<double>(xr[i]) * xr[i];
    }
  }
  EXPECT_EQ(outside, 0);
  // Constant block: Q4_1 and the K formats represent it closely.
  const double rel_rms = std::sqrt(err2 / ref2);
  EXPECT_LE(rel_rms, GetParam().max_rel_rms) << GetTypeTraits(type).name;
  // cpu dequantizes the same bytes identically.
  std::vector<float> xc(rows * k);
  for (int64_t r = 0; r < rows; ++r) cpu::DequantizeRow(type, q.data() + r * row_bytes, xc.data() + r * k, k);
  EXPECT_EQ(std::memcmp(xc.data(), xh.data(), xh.size() * sizeof(float)), 0);
}

// Named budgets: 4-bit formats over Gaussian blocks have rms error about
// step/sqrt(12) with step ≈ 6σ/15, i.e. ~0.12σ; 5-bit about half that;
// 6-bit ~0.03σ; 8-bit ~0.005σ.
INSTANTIATE_TEST_SUITE_P(Formats, RoundTripTest,
                         ::testing::Values(RoundTripCase{GgmlType::kQ4_0, 0.16},
                                           RoundTripCase{GgmlType::kQ4_1, 0.13},
                                           RoundTripCase{GgmlType::kQ8_0, 0.008},
                                           RoundTripCase{GgmlType::kQ4_K, 0.13},
                                           RoundTripCase{GgmlType::kQ5_0, 0.08},
                                           RoundTripCase{GgmlType::kQ5_1, 0.065},
                                           RoundTripCase{GgmlType::kQ5_K, 0.065},
                                           RoundTripCase{GgmlType::kQ6_K, 0.035}),
                         [](const auto& info) { return std::string(GetTypeTraits(info.param.type).name); });

// ---------------------------------------------------------------------------
// The real model: a few rows of its Q4_1 and Q8_0 tensors dequantize
// identically through ref and cpu, and to finite values of sane magnitude.

// --model's resolution without the flag: $SNAPFILL_MODEL, else models/.
std::string ModelPath() { return cli::ResolveModelPath(""); }

TEST(RealModelTest, DequantizeRowsCpuMatchesRef) {
  const std::string path = ModelPath();
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
  } else {
    GTEST_SKIP() << "model not found at " << path << " (set SNAPFILL_MODEL)";
  }
  auto file_or = GgufFile::Open(path);
  SNAPFILL_ASSERT_OK(file_or);
  const GgufFile& file = **file_or;
  int checked_q4_1 = 0, checked_q8_0 = 0;
  for (const GgufTensorInfo& t : file.tensors()) {
    if (t.type != GgmlType::kQ4_1 && t.type != GgmlType::kQ8_0) continue;
    int& checked = t.type == GgmlType::kQ4_1 ? checked_q4_1 : checked_q8_0;
    if (checked >= 3) continue;
    ++checked;
    const int64_t k = t.shape[0];
    const int64_t row_bytes = RowBytes(t.type, k);
    ASSERT_GT(row_bytes, 0) << t.name;
    const int64_t rows = std::min<int64_t>(4, t.num_elements() / k);
    std::vector<float> a(k), b(k);
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* src = t.data + r * row_bytes;
      ASSERT_TRUE(ref::DequantizeRow(t.type, src, a.data(), k));
      cpu::DequantizeRow(t.type, src, b.data(), k);
      ASSERT_EQ(std::memcmp(a.data(), b.data(), k * sizeof(float)), 0) << t.name << " row " << r;
      double sum2 = 0.0;
      for (float v : a) {
        ASSERT_TRUE(std::isfinite(v)) << t.name;
        sum2 += static_cast<double>(v) * v;
      }
      const double rms = std::sqrt(sum2 / k);
      EXPECT_GT(rms, 1e-4) << t.name;  // trained weights are neither zero
      EXPECT_LT(rms, 10.0) << t.name;  // nor huge
    }
  }
  EXPECT_GT(checked_q4_1, 0) << "no Q4_1 tensor in " << path;
  EXPECT_GT(checked_q8_0, 0) << "no Q8_0 tensor in " << path;
}

}  // namespace
}  // namespace snapfill
