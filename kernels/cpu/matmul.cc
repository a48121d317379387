// Quantized and float matrix products on the CPU; see matmul.h.
//
// Scheme (one call):
//  1. Quantize every X row once into the weight type's partner format, kept
//     in a "packed" form the micro-kernels stream: int8 values, per-lane f32
//     scales, and a per-block f32 "aux" vector that carries the part of each
//     block dot that is not a plain int8 product (Q4_0's -8·Σq, Q4_1's min,
//     the K-quants' mins / -32 offset).
//  2. Split Y into (weight-row block × token block) units over OpenMP threads.
//     A unit unpacks its weight rows once into the same packed form (nibbles
//     to bytes, fp16 scales to f32 lane scales) and then runs micro-kernels of
//     up to 4 weight rows × 4 tokens over the whole k, so each unpacked weight
//     vector is reused for 4 tokens from registers and for all tokens of the
//     unit from cache.
// Every block dot is then  Σ_lanes int32(Σ4 w·x) · (ws·xs)  +  Σ_blocks waux·xaux:
//   Q4_0: w = q (u8 0..15), x = qx (s8); ws·xs = dw·dx; aux: dw · (-8·dx·Σqx)
//   Q4_1: w = q (u8),        x = qx (s8); ws·xs = dw·dx; aux: mw · sx
//   Q8_0: w = qw (s8), x = qx + 128 (u8); ws·xs = dw·dx; aux: (dw·Σqw) · (-128·dx)
//   Q4_K: w = q (u8), x = qx (s8), per-2-element int16 scale sc_j, f32 d·dx
//         per super-block; aux per 16: (-dmin·m_j) · (dx·bsum_g)
//   Q6_K: w = q (u8 0..63), x = qx (s8), int16 scale sc_g, f32 d·dx;
//         aux per 16: (-32·d·sc_g) · (dx·bsum_g)
// All these f32 products of fp16 scales and small integers are exact, so the
// only rounding is f32 accumulation: the result equals
// ref::MatMulQuantizedActivations up to summation order.
//
// Small m (decode, m <= 3) with Q4_0 / Q4_1 / Q8_0 weights skips the packing
// and reads the ggml blocks in place; see "Small-m path" below (one token
// with AVX-512: GemvRows1Avx512). Token blocks (m >= 16) with those types go
// to the AMX tile paths (matmul_amx.cc, matmul_amx_bf16.cc) when the CPU and
// OS allow it.
//
// ISA: AVX-512 F/BW/VNNI kernels (vpdpbusd for 32-blocks, vpmaddubsw +
// vpdpwssd for K-quants) when compiled with them (-march=native here); else
// AVX2 kernels on the same packed data (vpmaddubsw + vpmaddwd; "AVX2
// micro-kernels" below); a portable scalar path otherwise, or when a test
// asks for it with SetMatMulImplForTesting.
#include "kernels/cpu/matmul.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/cpu/matmul_amx.h"
#include "kernels/quant_blocks.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VL__)
// GCC 12's AVX-512 intrinsics initialize their "undefined" operands with
// themselves, which trips -Wuninitialized once inlined; the warning points
// into the header, so silencing it around the include is enough.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#define SNAPFILL_MATMUL_AVX512 1
#else
#define SNAPFILL_MATMUL_AVX512 0
#endif

// The small-m (decode) path needs only AVX2 + FMA + F16C (VNNI when present).
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#if !SNAPFILL_MATMUL_AVX512
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif
#define SNAPFILL_GEMV_AVX2 1
#else
#define SNAPFILL_GEMV_AVX2 0
#endif
static_assert(!SNAPFILL_MATMUL_AVX512 || SNAPFILL_GEMV_AVX2, "AVX-512 builds also have the AVX2 kernels");

namespace snapfill::cpu {
namespace {

std::atomic<int> g_impl{static_cast<int>(MatMulImpl::kAuto)};

[[maybe_unused]] bool UseSimd() {
  return SNAPFILL_MATMUL_AVX512 && g_impl.load(std::memory_order_relaxed) !=
                                       static_cast<int>(MatMulImpl::kGeneric);
}

// Kernels of the packed path (token blocks) and of float weights.
enum class PackedIsa { kScalar, kAvx2, kAvx512 };
// Tokens per AVX2 micro-kernel call: 4 rows × 2 tokens keeps the 8
// accumulators, 4 weight vectors and the operands in the 16 ymm registers.
constexpr int kAvx2Tokens = 2;
PackedIsa PickPackedIsa() {
  const int impl = g_impl.load(std::memory_order_relaxed);
  if (impl == static_cast<int>(MatMulImpl::kGeneric)) return PackedIsa::kScalar;
  if (SNAPFILL_MATMUL_AVX512 && impl != static_cast<int>(MatMulImpl::kAvx2)) return PackedIsa::kAvx512;
  return SNAPFILL_GEMV_AVX2 ? PackedIsa::kAvx2 : PackedIsa::kScalar;
}

// The AMX tile paths (matmul_amx.cc, matmul_amx_bf16.cc) for token blocks;
// kNoAmx and kGeneric turn them off, kAmxInt8 keeps AMX-INT8 where AMX-BF16
// would be used.
bool UseAmx(GgmlType type, int64_t m, int64_t k, size_t w_row_bytes) {
  const int impl = g_impl.load(std::memory_order_relaxed);
  return m >= internal::kAmxMinTokens && k >= 32 && internal::AmxSupportsType(type) &&
         w_row_bytes < (size_t{1} << 26) &&  // 16 row offsets fit the gathers' int32 lanes
         (impl == static_cast<int>(MatMulImpl::kAuto) || impl == static_cast<int>(MatMulImpl::kAmxInt8)) &&
         internal::AmxAvailable();
}

bool UseAmxBf16() {
  return g_impl.load(std::memory_order_relaxed) == static_cast<int>(MatMulImpl::kAuto) &&
         internal::AmxBf16Available();
}

constexpr int64_t RoundUp(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

#if SNAPFILL_MATMUL_AVX512
// Horizontal sum / max of 16 lanes.
inline float HSum(__m512 v) {
  __m512 t = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  t = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, _MM_SHUFFLE(2, 3, 0, 1)));
  __m128 x = _mm512_castps512_ps128(t);
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
inline float HMax(__m512 v) {
  __m512 t = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  t = _mm512_max_ps(t, _mm512_shuffle_f32x4(t, t, _MM_SHUFFLE(2, 3, 0, 1)));
  __m128 x = _mm512_castps512_ps128(t);
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
#endif

// ---------------------------------------------------------------------------
// Activation quantization cores (bit-identical to ref::QuantizeRowQ8_*).

// One 32-element Q8_0/Q8_1 block: q = roundf(x / d), d = amax / 127.
// Returns the f32 d (before fp16 rounding); *sum = Σq.
// (Inlined: at 2048 × 576 → 192 on AVX2 a third of the product's perf samples
// fell in this function as a call; inlined, that product is about 5% faster.)
inline __attribute__((always_inline)) float QuantBlock8(const float* x, int8_t* q, int* sum) {
#if SNAPFILL_MATMUL_AVX512
  if (UseSimd()) {
    const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    const float amax = HMax(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    const __m512 half = _mm512_set1_ps(0.5f);
    __m512i qi[2];
    for (int h = 0; h < 2; ++h) {
      const __m512 v = _mm512_mul_ps(h == 0 ? a : b, vid);
      // roundf: truncate, then step away from zero when the dropped part is
      // >= 0.5 (v - trunc(v) is exact).
      __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, t)), half, _CMP_GE_OQ);
      const __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f),
                                      _mm512_and_ps(v, _mm512_set1_ps(-0.0f)));  // ±1
      t = _mm512_mask_add_ps(t, up, t, one);
      qi[h] = _mm512_cvttps_epi32(t);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * h), _mm512_cvtepi32_epi8(qi[h]));
    }
    *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qi[0], qi[1]));
    return d;
  }
#elif SNAPFILL_GEMV_AVX2
  if (PickPackedIsa() == PackedIsa::kAvx2) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(x + 8 * i);
    __m256 vmax = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    const __m256 half = _mm256_set1_ps(0.5f);
    __m256i qi[4];
    for (int i = 0; i < 4; ++i) {
      // roundf as in the AVX-512 branch: truncate, step away from zero when
      // the dropped part is >= 0.5.
      const __m256 p = _mm256_mul_ps(v[i], vid);
      __m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(p, t)), half, _CMP_GE_OQ);
      const __m256 one = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(p, sign));  // ±1
      t = _mm256_add_ps(t, _mm256_and_ps(up, one));
      qi[i] = _mm256_cvttps_epi32(t);
    }
    // |q| <= 127: the saturating packs are exact; the permute undoes their
    // lane interleave.
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                        _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    const __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
    *sum = _mm_cvtsi128_si32(s4);
    return d;
  }
#endif
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int s = 0;
  for (int j = 0; j < 32; ++j) {
    q[j] = static_cast<int8_t>(std::roundf(x[j] * id));
    s += q[j];
  }
  *sum = s;
  return d;
}

// One 256-element Q8_K block: iscale = -127 / max (signed value of the first
// largest |x|), q = min(127, rint(iscale * x)) with ties to even; returns
// d = 1 / iscale and fills bsums.
float QuantBlockK(const float* x, int8_t* q, int16_t* bsums) {
#if SNAPFILL_MATMUL_AVX512
  if (UseSimd()) {
    __m512 vmax = _mm512_setzero_ps();
    for (int j = 0; j < kQK_K; j += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(x + j)));
    const float amax = HMax(vmax);
    if (amax == 0.0f) {
      std::memset(q, 0, kQK_K);
      std::memset(bsums, 0, 16 * sizeof(int16_t));
      return 0.0f;
    }
    float max = 0.0f;
    const __m512 vamax = _mm512_set1_ps(amax);
    for (int j = 0; j < kQK_K; j += 16) {
      const __mmask16 hit =
          _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + j)), vamax, _CMP_EQ_OQ);
      if (hit) {
        max = x[j + __builtin_ctz(hit)];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m512 vs = _mm512_set1_ps(iscale);
    const __m512i v127 = _mm512_set1_epi32(127);
    for (int g = 0; g < 16; ++g) {
      __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(vs, _mm512_loadu_ps(x + 16 * g)));
      qi = _mm512_min_epi32(qi, v127);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * g), _mm512_cvtepi32_epi8(qi));
      bsums[g] = static_cast<int16_t>(_mm512_reduce_add_epi32(qi));
    }
    return 1.0f / iscale;
  }
#endif
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kQK_K; ++j) {
    const float ax = std::fabs(x[j]);
    if (ax > amax) {
      amax = ax;
      max = x[j];
    }
  }
  if (amax == 0.0f) {
    std::memset(q, 0, kQK_K);
    std::memset(bsums, 0, 16 * sizeof(int16_t));
    return 0.0f;
  }
  const float iscale = -127.0f / max;
  for (int j = 0; j < kQK_K; ++j) {
    const float v = iscale * x[j];
    q[j] = static_cast<int8_t>(std::min(127, static_cast<int>(std::nearbyint(v))));
  }
  for (int g = 0; g < 16; ++g) {
    int s = 0;
    for (int j = 0; j < 16; ++j) s += q[16 * g + j];
    bsums[g] = static_cast<int16_t>(s);
  }
  return 1.0f / iscale;
}

// ---------------------------------------------------------------------------
// Packed layouts.

enum class Family { kBlock32, kSuper256 };

struct TypeInfo {
  Family family;
  bool x_unsigned;  // activations stored as u8 = q + 128 (Q8_0 weights)
  int aux_group;    // elements per aux entry (32 or 16)
};

TypeInfo Info(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0: return {Family::kBlock32, true, 32};
    case GgmlType::kQ4_K:
    case GgmlType::kQ6_K: return {Family::kSuper256, false, 16};
    default: return {Family::kBlock32, false, 32};
  }
}

// Sizes of one packed row (X or W) for a given k.
struct PackDims {
  int64_t kp;          // bytes of int8 values (k rounded up to 64)
  int64_t scale_len;   // Block32: f32 lane scales (kp/4); Super256: int16 scales (k/2)
  int64_t nsb;         // Super256: super-blocks (f32 d per row); 0 otherwise
  int64_t aux_len;     // aux entries rounded up to 16
};

PackDims Dims(GgmlType type, int64_t k) {
  const TypeInfo ti = Info(type);
  PackDims d;
  d.kp = RoundUp(k, 64);
  d.scale_len = ti.family == Family::kBlock32 ? d.kp / 4 : k / 2;
  d.nsb = ti.family == Family::kSuper256 ? k / kQK_K : 0;
  d.aux_len = RoundUp(k / ti.aux_group, 16);
  return d;
}

// Quantized activations: m rows.
struct XPack {
  std::vector<uint8_t> q;   // [m, kp]
  std::vector<float> s;     // Block32: [m, kp/4] lane scales dx; Super256: [m, nsb] d
  std::vector<float> aux;   // [m, aux_len]
  int64_t s_stride = 0;
};

// Unpacked weight rows for one unit.
struct WPack {
  std::vector<uint8_t> q;    // [rows, kp]
  std::vector<float> s;      // Block32: [rows, kp/4] lane scales dw
  std::vector<int16_t> sc;   // Super256: [rows, k/2] per-2-element int scales
  std::vector<float> d;      // Super256: [rows, nsb]
  std::vector<float> aux;    // [rows, aux_len]
};

void PackXRow(GgmlType type, const float* x, int64_t k, const PackDims& pd, uint8_t* q, float* s,
              float* aux) {
  std::memset(aux, 0, pd.aux_len * sizeof(float));
  if (Info(type).family == Family::kSuper256) {
    for (int64_t b = 0; b < k / kQK_K; ++b) {
      int16_t bsums[16];
      const float d = QuantBlockK(x + b * kQK_K, reinterpret_cast<int8_t*>(q + b * kQK_K), bsums);
      s[b] = d;
      for (int g = 0; g < 16; ++g) aux[16 * b + g] = d * static_cast<float>(bsums[g]);
    }
    return;
  }
  std::memset(q + k, 0, pd.kp - k);
  std::memset(s + k / 4, 0, (pd.kp - k) / 4 * sizeof(float));
  for (int64_t b = 0; b < k / 32; ++b) {
    int sum = 0;
    int8_t* qb = reinterpret_cast<int8_t*>(q + 32 * b);
    const float d = QuantBlock8(x + 32 * b, qb, &sum);
    const float dx = Fp16ToFp32(Fp32ToFp16(d));
    for (int l = 0; l < 8; ++l) s[8 * b + l] = dx;
    switch (type) {
      case GgmlType::kQ4_0: aux[b] = dx * static_cast<float>(-8 * sum); break;
      case GgmlType::kQ4_1: aux[b] = Fp16ToFp32(Fp32ToFp16(static_cast<float>(sum) * d)); break;
      case GgmlType::kQ8_0:
        aux[b] = -128.0f * dx;
        for (int j = 0; j < 32; ++j) q[32 * b + j] ^= 0x80;  // s8 -> u8 + 128
        break;
      default: break;
    }
  }
}

// Block b of a Q4_0 / Q4_1 weight row: its 32 quants as u8 0..15 in element
// order into q32 (elements 0..15 are the low nibbles, 16..31 the high ones),
// the packed path's aux term into *waux (Q4_0: dw, for its -8 offset; Q4_1:
// m); returns dw.
float UnpackQ4Block(GgmlType type, const uint8_t* row, int64_t b, uint8_t* q32, float* waux) {
  const uint8_t* qs;
  float dw;
  if (type == GgmlType::kQ4_1) {
    const auto* blk = reinterpret_cast<const BlockQ4_1*>(row) + b;
    dw = Fp16ToFp32(blk->d);
    *waux = Fp16ToFp32(blk->m);
    qs = blk->qs;
  } else {
    const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
    dw = *waux = Fp16ToFp32(blk->d);
    qs = blk->qs;
  }
#if SNAPFILL_MATMUL_AVX512 || SNAPFILL_GEMV_AVX2
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0F);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q32), _mm_and_si128(v, mask));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q32 + 16), _mm_and_si128(_mm_srli_epi16(v, 4), mask));
#else
  for (int j = 0; j < 16; ++j) {
    q32[j] = qs[j] & 0xF;
    q32[j + 16] = qs[j] >> 4;
  }
#endif
  return dw;
}

// Unpacks weight row `src` of `type` into packed row r of `wp`.
void PackWRow(GgmlType type, const uint8_t* src, int64_t k, const PackDims& pd, WPack* wp, int64_t r) {
  uint8_t* q = wp->q.data() + r * pd.kp;
  float* aux = wp->aux.data() + r * pd.aux_len;
  std::memset(aux, 0, pd.aux_len * sizeof(float));
  if (type == GgmlType::kQ4_K || type == GgmlType::kQ6_K) {
    int16_t* sc = wp->sc.data() + r * pd.scale_len;
    float* dd = wp->d.data() + r * pd.nsb;
    for (int64_t b = 0; b < k / kQK_K; ++b) {
      uint8_t* qb = q + b * kQK_K;
      int16_t* scb = sc + b * (kQK_K / 2);
      float* auxb = aux + 16 * b;
      if (type == GgmlType::kQ4_K) {
        const auto* blk = reinterpret_cast<const BlockQ4_K*>(src) + b;
        dd[b] = Fp16ToFp32(blk->d);
        const float dmin = Fp16ToFp32(blk->dmin);
        for (int c = 0; c < 4; ++c) {
          for (int l = 0; l < 32; ++l) {
            qb[64 * c + l] = blk->qs[32 * c + l] & 0xF;
            qb[64 * c + 32 + l] = blk->qs[32 * c + l] >> 4;
          }
        }
        for (int j = 0; j < 8; ++j) {
          uint8_t s, m;
          GetScaleMinK4(j, blk->scales, &s, &m);
          for (int l = 0; l < 16; ++l) scb[16 * j + l] = s;
          auxb[2 * j] = auxb[2 * j + 1] = -(dmin * static_cast<float>(m));
        }
      } else {
        const auto* blk = reinterpret_cast<const BlockQ6_K*>(src) + b;
        const float d = Fp16ToFp32(blk->d);
        dd[b] = d;
        for (int h = 0; h < 2; ++h) {
          const uint8_t* ql = blk->ql + 64 * h;
          const uint8_t* qh = blk->qh + 32 * h;
          uint8_t* o = qb + 128 * h;
          for (int l = 0; l < 32; ++l) {
            o[l] = (ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4);
            o[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            o[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            o[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
          }
        }
        for (int g = 0; g < 16; ++g) {
          for (int l = 0; l < 8; ++l) scb[8 * g + l] = blk->scales[g];
          auxb[g] = -32.0f * (d * static_cast<float>(blk->scales[g]));
        }
      }
    }
    return;
  }
  float* s = wp->s.data() + r * pd.scale_len;
  std::memset(q + k, 0, pd.kp - k);
  std::memset(s + k / 4, 0, (pd.kp - k) / 4 * sizeof(float));
  for (int64_t b = 0; b < k / 32; ++b) {
    uint8_t* qb = q + 32 * b;
    float dw;
    if (type == GgmlType::kQ8_0) {
      const auto* blk = reinterpret_cast<const BlockQ8_0*>(src) + b;
      dw = Fp16ToFp32(blk->d);
      std::memcpy(qb, blk->qs, 32);
      int sum = 0;
      for (int j = 0; j < 32; ++j) sum += blk->qs[j];
      aux[b] = dw * static_cast<float>(sum);
    } else {
      dw = UnpackQ4Block(type, src, b, qb, &aux[b]);
    }
    for (int l = 0; l < 8; ++l) s[8 * b + l] = dw;
  }
}

// Arguments shared by the micro-kernels: rows r of the packed W and tokens t
// of the packed X, output Y[t, r] at y + t * y_stride + r.
struct TileArgs {
  const uint8_t* wq;
  const float* ws;      // Block32 lane scales
  const int16_t* wsc;   // Super256 int16 scales
  const float* wd;      // Super256 d
  const float* waux;
  const uint8_t* xq;
  const float* xs;
  const float* xaux;
  float* y;
  int64_t y_stride;
  const PackDims* pd;
  int64_t k;
  int64_t x_s_stride;
};

// ---------------------------------------------------------------------------
// Portable micro-kernel: same packed data, scalar loops. Block dots are exact
// integers; f32 accumulation per block (Block32) or super-block (Super256).
void GenericTile(const TileArgs& a, int rm, int rn, Family family, bool x_unsigned) {
  const PackDims& pd = *a.pd;
  for (int r = 0; r < rm; ++r) {
    const uint8_t* wq = a.wq + r * pd.kp;
    const float* waux = a.waux + r * pd.aux_len;
    for (int t = 0; t < rn; ++t) {
      const uint8_t* xq = a.xq + t * pd.kp;
      const float* xs = a.xs + t * a.x_s_stride;
      const float* xaux = a.xaux + t * pd.aux_len;
      float acc = 0.0f;
      if (family == Family::kBlock32) {
        const float* ws = a.ws + r * pd.scale_len;
        for (int64_t b = 0; b < pd.kp / 32; ++b) {
          int32_t isum = 0;
          for (int e = 32 * b; e < 32 * b + 32; ++e) {
            isum += x_unsigned ? static_cast<int32_t>(xq[e]) * static_cast<int8_t>(wq[e])
                               : static_cast<int32_t>(wq[e]) * static_cast<int8_t>(xq[e]);
          }
          acc += static_cast<float>(isum) * (ws[8 * b] * xs[8 * b]);
        }
      } else {
        const int16_t* sc = a.wsc + r * pd.scale_len;
        const float* wd = a.wd + r * pd.nsb;
        for (int64_t b = 0; b < pd.nsb; ++b) {
          int32_t isum = 0;
          for (int e = kQK_K * b; e < kQK_K * (b + 1); ++e) {
            isum += static_cast<int32_t>(wq[e]) * static_cast<int8_t>(xq[e]) * sc[e / 2];
          }
          acc += static_cast<float>(isum) * (wd[b] * xs[b]);
        }
      }
      for (int64_t c = 0; c < pd.aux_len; ++c) acc += waux[c] * xaux[c];
      a.y[t * a.y_stride + r] = acc;
    }
  }
}

#if SNAPFILL_MATMUL_AVX512
// Super256 micro-kernel: per 64 elements vpmaddubsw (u8 q × s8 x, pairs to
// int16, no saturation: 2·63·127 < 2^15) then vpdpwssd with the int16 scales;
// the int32 lanes of one super-block (|lane| <= 8·16002·128 < 2^24, exact in
// f32) are scaled by d·dx once per 256 elements.
template <int RM, int RN>
void TileK(const TileArgs& a) {
  const PackDims& pd = *a.pd;
  __m512 acc[RM][RN];
  for (int r = 0; r < RM; ++r)
    for (int t = 0; t < RN; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < pd.nsb; ++b) {
    __m512i iacc[RM][RN];
    for (int r = 0; r < RM; ++r)
      for (int t = 0; t < RN; ++t) iacc[r][t] = _mm512_setzero_si512();
    for (int64_t s = b * kQK_K; s < (b + 1) * kQK_K; s += 64) {
      __m512i w[RM], sc[RM];
      for (int r = 0; r < RM; ++r) {
        w[r] = _mm512_loadu_si512(a.wq + r * pd.kp + s);
        sc[r] = _mm512_loadu_si512(a.wsc + r * pd.scale_len + s / 2);
      }
      for (int t = 0; t < RN; ++t) {
        const __m512i xv = _mm512_loadu_si512(a.xq + t * pd.kp + s);
        for (int r = 0; r < RM; ++r) {
          iacc[r][t] = _mm512_dpwssd_epi32(iacc[r][t], _mm512_maddubs_epi16(w[r], xv), sc[r]);
        }
      }
    }
    for (int r = 0; r < RM; ++r) {
      const float wd = a.wd[r * pd.nsb + b];
      for (int t = 0; t < RN; ++t) {
        const __m512 f = _mm512_set1_ps(wd * a.xs[t * a.x_s_stride + b]);
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[r][t]), f, acc[r][t]);
      }
    }
  }
  for (int64_t c = 0; c < pd.aux_len; c += 16) {
    for (int r = 0; r < RM; ++r) {
      const __m512 wa = _mm512_loadu_ps(a.waux + r * pd.aux_len + c);
      for (int t = 0; t < RN; ++t) {
        acc[r][t] = _mm512_fmadd_ps(wa, _mm512_loadu_ps(a.xaux + t * pd.aux_len + c), acc[r][t]);
      }
    }
  }
  for (int t = 0; t < RN; ++t)
    for (int r = 0; r < RM; ++r) a.y[t * a.y_stride + r] = HSum(acc[r][t]);
}

using TileFn = void (*)(const TileArgs&);

TileFn PickK(int rm, int rn) {
  static constexpr TileFn kTable[4][2] = {
      {TileK<1, 1>, TileK<1, 2>},
      {TileK<2, 1>, TileK<2, 2>},
      {TileK<3, 1>, TileK<3, 2>},
      {TileK<4, 1>, TileK<4, 2>},
  };
  return kTable[rm - 1][rn - 1];
}
#endif  // SNAPFILL_MATMUL_AVX512

// ---------------------------------------------------------------------------
// Small-m path (decode: m = 1..3 tokens) for Q4_0 / Q4_1 / Q8_0 weights.
//
// With so few tokens each weight byte is used at most 3 times, so unpacking
// rows into WPack (write + re-read) costs more than the dot itself. Here the
// ggml blocks are read in place: per 32-block the 16 nibble bytes (or 32 s8)
// are expanded in a ymm register and dotted with the token's Q8 block
// (vpdpbusd, or vpmaddubsw + vpmaddwd without VNNI), giving 8 int32 lanes of
// exact partial sums; then acc_lanes += f32(isum_lanes) · (dw·dx) in f32 FMA
// (two accumulators, even/odd blocks). The part of each block dot that is not
// a plain int8 product goes to two scalar f32 sums (even/odd blocks, so the
// add chains overlap): Q4_1 mw·sx (sx = fp16(d·Σq)), Q4_0 dw·(dx·(-8·Σq)). Same data and formulas as the packed path, so the
// result equals ref::MatMulQuantizedActivations up to f32 summation order
// (at most k/32 + k/32 + 4 rounded terms per output). Threads: OpenMP static
// split of the output rows; every row is computed by the same operation
// sequence whatever the thread count.
#if SNAPFILL_GEMV_AVX2

// Quantized activation rows: q [m, k] s8 in natural order, fp16-rounded dx
// and the aux term per 32-block.
struct GemvX {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<float> aux;
  // m = 1, Q4 types, AVX-512: q per pair of blocks as [b 0..15, b+1 0..15,
  // b 16..31, b+1 16..31] (GemvRows1Avx512), zero past the last block.
  std::vector<int8_t> q2;
};

GemvX& CallerGemvX() {
  static thread_local GemvX gx;
  return gx;
}

inline float HSum256(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// 8 int32 lanes, each the sum of 4 products u8 a · s8 b.
inline __m256i DotU8S8(__m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), a, b);
#else
  // |a·b| <= 255·128 per product; pairs <= 32640 (Q4: 15·127·2) for the
  // operands used here (a <= 128 and |b| <= 127), so vpmaddubsw never saturates.
  return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
#endif
}

inline float F16(uint16_t h) { return _cvtsh_ss(h); }

// Output rows [j0, j1) for M tokens.
template <int M, GgmlType kType>
void GemvRows(const uint8_t* w, size_t w_row_bytes, int64_t j0, int64_t j1, int64_t k, const GemvX& x,
              float* y, int64_t y_stride) {
  const int64_t nb = k / 32;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = w + j * w_row_bytes;
    // This machine's hardware prefetcher does not follow the row stream (a
    // decode step read its weights at 3.5 GB/s on one core without this, 7.6
    // with it: BM_DecodeStep_Cpu), so fetch the row two ahead explicitly.
    // Prefetches past the end of the matrix are harmless hints.
    for (size_t o = 0; o < w_row_bytes; o += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(row + 2 * w_row_bytes + o), _MM_HINT_T0);
    }
    __m256 acc[2][M];
    float aux[2][M];
    for (int t = 0; t < M; ++t) {
      acc[0][t] = acc[1][t] = _mm256_setzero_ps();
      aux[0][t] = aux[1][t] = 0.0f;
    }
    for (int64_t b = 0; b < nb; ++b) {
      const int h = static_cast<int>(b & 1);
      __m256i wv;
      float dw, waux = 0.0f;
      if constexpr (kType == GgmlType::kQ8_0) {
        const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
        dw = F16(blk->d);
        wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qs));
      } else {
        const uint8_t* qs;
        if constexpr (kType == GgmlType::kQ4_1) {
          const auto* blk = reinterpret_cast<const BlockQ4_1*>(row) + b;
          dw = F16(blk->d);
          waux = F16(blk->m);
          qs = blk->qs;
        } else {
          const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
          dw = F16(blk->d);
          waux = dw;
          qs = blk->qs;
        }
        // Elements 0..15 are the low nibbles, 16..31 the high ones.
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
        wv = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low4);
      }
      if constexpr (kType == GgmlType::kQ8_0) {
        // s8 · s8 as |w| (u8) · (x with w's sign).
        const __m256i aw = _mm256_sign_epi8(wv, wv);
        for (int t = 0; t < M; ++t) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q.data() + t * k + 32 * b));
          const __m256i isum = DotU8S8(aw, _mm256_sign_epi8(xv, wv));
          acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * x.d[t * nb + b]), acc[h][t]);
        }
      } else {
        for (int t = 0; t < M; ++t) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q.data() + t * k + 32 * b));
          const __m256i isum = DotU8S8(wv, xv);
          acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * x.d[t * nb + b]), acc[h][t]);
          aux[h][t] += waux * x.aux[t * nb + b];
        }
      }
    }
    for (int t = 0; t < M; ++t) {
      y[t * y_stride + j] = HSum256(_mm256_add_ps(acc[0][t], acc[1][t])) + (aux[0][t] + aux[1][t]);
    }
  }
}

#if SNAPFILL_MATMUL_AVX512
// One token (m = 1) with AVX-512: the same data and formulas as GemvRows,
// with the per-block scalar work taken out of the block loop. Per row, the
// fp16 headers of 16 blocks come in with one gather and give dw·dx (and the
// aux weights) as vectors; the aux dot Σ waux·aux is one vector FMA per 16
// blocks. The block loop takes two blocks per zmm: Q4 nibbles as [b lo | b+1
// lo | b hi | b+1 hi] against activations reordered once per call to match
// (GemvX::q2), Q8_0 as [b | b+1] in natural order (|w| · x with w's sign);
// vpdpbusd gives 16 int32 lanes of exact partial dots, multiplied by the
// matching block scales (a permute of the 16-block scale vector) into two f32
// accumulators. About 10 vector ops per 40 weight bytes, against 15 per 20
// in GemvRows: the product streams its weights instead of computing.
template <GgmlType kType>
void GemvRows1Avx512(const uint8_t* w, size_t w_row_bytes, int64_t j0, int64_t j1, int64_t k, const GemvX& x,
                     float* y) {
  constexpr bool kQ8 = kType == GgmlType::kQ8_0;
  constexpr int64_t kBlk = kType == GgmlType::kQ4_1 ? sizeof(BlockQ4_1)
                           : kType == GgmlType::kQ4_0 ? sizeof(BlockQ4_0)
                                                      : sizeof(BlockQ8_0);
  constexpr int kQsOff = kType == GgmlType::kQ4_1 ? 4 : 2;
  const int64_t nb = k / 32;
  const __m512i hdr_idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                             _mm512_set1_epi32(static_cast<int>(kBlk)));
  // Lane pattern of pair p's scales: Q4 [2p x4, 2p+1 x4, 2p x4, 2p+1 x4],
  // Q8_0 [2p x8, 2p+1 x8]; + 2p per pair.
  const __m512i pat = kQ8 ? _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0)
                          : _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const int8_t* xq = kQ8 ? x.q.data() : x.q2.data();
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = w + j * w_row_bytes;
    for (size_t o = 0; o < w_row_bytes; o += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(row + 8 * w_row_bytes + o), _MM_HINT_T0);
    }
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), aacc = _mm512_setzero_ps();
    for (int64_t g0 = 0; g0 < nb; g0 += 16) {
      const int cnt = static_cast<int>(std::min<int64_t>(16, nb - g0));
      const __mmask16 gm = static_cast<__mmask16>((1u << cnt) - 1);
      const __m512i hdr = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), gm, hdr_idx, row + g0 * kBlk, 1);
      const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr));
      const __m512 sc = _mm512_mul_ps(dw, _mm512_maskz_loadu_ps(gm, x.d.data() + g0));
      if constexpr (kType == GgmlType::kQ4_1) {
        const __m512 mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hdr, 16)));
        aacc = _mm512_fmadd_ps(mw, _mm512_maskz_loadu_ps(gm, x.aux.data() + g0), aacc);
      } else if constexpr (kType == GgmlType::kQ4_0) {
        aacc = _mm512_fmadd_ps(dw, _mm512_maskz_loadu_ps(gm, x.aux.data() + g0), aacc);
      }
      for (int p = 0; 2 * p < cnt; ++p) {
        const int64_t b = g0 + 2 * p;
        const bool two = 2 * p + 1 < cnt;
        const uint8_t* q0 = row + b * kBlk + kQsOff;
        __m512i wv;
        if constexpr (kQ8) {
          const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q0));
          const __m256i r1 = two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q0 + kBlk))
                                 : _mm256_setzero_si256();
          wv = _mm512_inserti64x4(_mm512_castsi256_si512(r0), r1, 1);
        } else {
          const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q0));
          const __m128i r1 = two ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(q0 + kBlk)) : _mm_setzero_si128();
          const __m256i raw = _mm256_inserti128_si256(_mm256_castsi128_si256(r0), r1, 1);
          const __m256i lo = _mm256_and_si256(raw, low4);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
          wv = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        }
        __m512i xv = _mm512_loadu_si512(xq + 32 * b);  // block pair b, b+1 (64 bytes; zero past nb)
        if constexpr (kQ8) {
          const __mmask64 neg = _mm512_movepi8_mask(wv);
          xv = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
          wv = _mm512_abs_epi8(wv);
        }
        const __m512i isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, xv);
        const __m512 s2 = _mm512_permutexvar_ps(_mm512_add_epi32(pat, _mm512_set1_epi32(2 * p)), sc);
        if (p & 1) {
          acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s2, acc1);
        } else {
          acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s2, acc0);
        }
      }
    }
    y[j] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + _mm512_reduce_add_ps(aacc);
  }
}
#endif  // SNAPFILL_MATMUL_AVX512

using GemvFn = void (*)(const uint8_t*, size_t, int64_t, int64_t, int64_t, const GemvX&, float*, int64_t);

template <GgmlType kType>
GemvFn PickGemvM(int64_t m) {
  switch (m) {
    case 1: return GemvRows<1, kType>;
    case 2: return GemvRows<2, kType>;
    default: return GemvRows<3, kType>;
  }
}

bool GemvHandles(GgmlType type, int64_t m) {
  return m <= 3 && (type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1 || type == GgmlType::kQ8_0) &&
         g_impl.load(std::memory_order_relaxed) != static_cast<int>(MatMulImpl::kGeneric);
}

// The activations of a small-m product, quantized on the calling thread
// (m·k <= 3·k elements: no extra barrier): q (int8, natural order), d =
// fp16-rounded block scale, aux = the block's offset term (Q4_1: s of
// Q8_1; Q4_0: the -8 of its nibbles, d·(-8·Σq); Q8_0: 0).
void QuantizeGemvX(const float* x, int64_t m, int64_t k, int64_t x_stride, GgmlType type, GemvX& gx) {
  const int64_t nb = k / 32;
  if (gx.q.size() < static_cast<size_t>(m * k)) gx.q.resize(m * k);
  if (gx.d.size() < static_cast<size_t>(m * nb)) gx.d.resize(m * nb);
  if (gx.aux.size() < static_cast<size_t>(m * nb)) gx.aux.resize(m * nb);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      int sum = 0;
      const float d = QuantBlock8(x + i * x_stride + 32 * b, gx.q.data() + i * k + 32 * b, &sum);
      const float dx = Fp16ToFp32(Fp32ToFp16(d));
      gx.d[i * nb + b] = dx;
      gx.aux[i * nb + b] = type == GgmlType::kQ4_1   ? Fp16ToFp32(Fp32ToFp16(static_cast<float>(sum) * d))
                           : type == GgmlType::kQ4_0 ? dx * static_cast<float>(-8 * sum)
                                                     : 0.0f;
    }
  }
}

void Gemv(const float* x, int64_t m, int64_t k, int64_t x_stride, const uint8_t* w, GgmlType type, int64_t n,
          size_t w_row_bytes, float* y, int64_t y_stride) {
  [[maybe_unused]] const int64_t nb = k / 32;
  GemvX& gx = CallerGemvX();
  QuantizeGemvX(x, m, k, x_stride, type, gx);
  const GemvFn fn = type == GgmlType::kQ4_1   ? PickGemvM<GgmlType::kQ4_1>(m)
                    : type == GgmlType::kQ4_0 ? PickGemvM<GgmlType::kQ4_0>(m)
                                              : PickGemvM<GgmlType::kQ8_0>(m);
#if SNAPFILL_MATMUL_AVX512
  const bool one = m == 1 && UseSimd();
  if (one) {
    // Padded to whole block pairs (+ 64 bytes: the pair loads read 64).
    const int64_t padded = (nb + 1) / 2 * 64 + 64;
    if (type != GgmlType::kQ8_0) {
      if (gx.q2.size() < static_cast<size_t>(padded)) gx.q2.resize(padded);
      std::fill(gx.q2.begin(), gx.q2.begin() + padded, 0);
      for (int64_t b = 0; b < nb; ++b) {
        int8_t* dst = gx.q2.data() + (b / 2) * 64 + (b % 2) * 16;
        std::memcpy(dst, gx.q.data() + 32 * b, 16);
        std::memcpy(dst + 32, gx.q.data() + 32 * b + 16, 16);
      }
    } else {
      if (gx.q.size() < static_cast<size_t>(padded)) gx.q.resize(padded);
      std::fill(gx.q.begin() + k, gx.q.begin() + padded, 0);
    }
  }
  const auto fn1 = type == GgmlType::kQ4_1   ? GemvRows1Avx512<GgmlType::kQ4_1>
                   : type == GgmlType::kQ4_0 ? GemvRows1Avx512<GgmlType::kQ4_0>
                                             : GemvRows1Avx512<GgmlType::kQ8_0>;
#endif
  // Chunks of 16 rows, contiguous per thread (schedule(static) without a
  // chunk size), so each thread streams one contiguous span of W. Small
  // products stay on the calling thread: waking the team costs more.
  constexpr int64_t kRows = 16;
  const int64_t chunks = (n + kRows - 1) / kRows;
  const int threads = m * n * k < (1 << 16) ? 1 : std::min<int64_t>(omp_get_max_threads(), chunks);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t c = 0; c < chunks; ++c) {
#if SNAPFILL_MATMUL_AVX512
    if (one) {
      fn1(w, w_row_bytes, c * kRows, std::min(n, (c + 1) * kRows), k, gx, y);
      continue;
    }
#endif
    fn(w, w_row_bytes, c * kRows, std::min(n, (c + 1) * kRows), k, gx, y, y_stride);
  }
}

#if SNAPFILL_MATMUL_AVX512
// Groups [g0, g1) of a matrix in the decode layout (quant_blocks.h) times
// one quantized token: lane r of every vector is row 16g + r. Per record
// the quants take T vpdpbusd (Q4: low and high nibbles, 2T) against 4
// activation bytes broadcast, and the scales apply once per block as
// vectors: about 4 vector ops per 64 weight bytes, against 10 per 40 in
// GemvRows1Avx512, and no horizontal sums.
template <GgmlType kType>
void DecodeGroups(const uint8_t* packed, int64_t g0, int64_t g1, int64_t nb, int64_t n, const GemvX& x,
                  float* y) {
  constexpr int64_t kRec = DecodeRecordBytes(kType);
  constexpr int64_t kQuant = DecodeQuantBytes(kType);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* p = packed + g * nb * kRec;
    __m512 acc = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b, p += kRec) {
      // Eight records (2.5-4.5 KiB) ahead: the next group's first records
      // are on the way while this group finishes.
#pragma GCC unroll 9
      for (int64_t o = 0; o < kRec; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + 8 * kRec + o), _MM_HINT_T0);
      const uint8_t* xb = reinterpret_cast<const uint8_t*>(x.q.data() + 32 * b);
      auto bcast = [&](int t) {
        int32_t v;
        std::memcpy(&v, xb + 4 * t, 4);
        return _mm512_set1_epi32(v);
      };
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      if constexpr (kType == GgmlType::kQ8_0) {
        // vpdpbusd multiplies unsigned by signed bytes: |w| against x with
        // w's sign (|-128| = 128 is right as unsigned).
#pragma GCC unroll 8
        for (int t = 0; t < 8; ++t) {
          const __m512i wv = _mm512_loadu_si512(p + 64 * t);
          __m512i xv = bcast(t);
          xv = _mm512_mask_sub_epi8(xv, _mm512_movepi8_mask(wv), _mm512_setzero_si512(), xv);
          if (t & 1) {
            s1 = _mm512_dpbusd_epi32(s1, _mm512_abs_epi8(wv), xv);
          } else {
            s0 = _mm512_dpbusd_epi32(s0, _mm512_abs_epi8(wv), xv);
          }
        }
      } else {
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
          const __m512i wv = _mm512_loadu_si512(p + 64 * t);
          s0 = _mm512_dpbusd_epi32(s0, _mm512_and_si512(wv, low4), bcast(t));  // elements 4t..4t+3
          s1 = _mm512_dpbusd_epi32(s1, _mm512_and_si512(_mm512_srli_epi16(wv, 4), low4),
                                   bcast(4 + t));  // elements 16+4t..
        }
      }
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kQuant)));
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_mul_ps(d, _mm512_set1_ps(x.d[b])),
                            acc);
      if constexpr (kType == GgmlType::kQ4_1) {
        const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kQuant + 32)));
        acc2 = _mm512_fmadd_ps(mw, _mm512_set1_ps(x.aux[b]), acc2);
      } else if constexpr (kType == GgmlType::kQ4_0) {
        acc2 = _mm512_fmadd_ps(d, _mm512_set1_ps(x.aux[b]), acc2);
      }
    }
    const int64_t rows = std::min<int64_t>(kDecodeGroupRows, n - g * kDecodeGroupRows);
    const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1);
    _mm512_mask_storeu_ps(y + g * kDecodeGroupRows, mask, _mm512_add_ps(acc, acc2));
  }
}
#endif  // SNAPFILL_MATMUL_AVX512

inline __m256i MaddPairs(__m256i pairs) { return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)); }

// The decode layout on AVX2 (no AVX-512): each 16-row record is read as two
// halves of 8 rows (lane r = row 8h + r). Q4: per half, the 4 quant vectors
// give 8 vpmaddubsw (low nibbles against elements 4t.., high against
// 16+4t..) summed in int16 (|sum| <= 8 · 2 · 15 · 127 = 30,480), then one
// vpmaddwd to int32. Q8_0: |w| against x with w's sign, each vpmaddubsw
// widened to int32 at once (a pair reaches 2 · 128 · 127). The integer block
// dots are exact, and the scales apply in the same order as DecodeGroups, so
// the result is the AVX-512 kernel's bit for bit.
template <GgmlType kType>
void DecodeGroupsAvx2(const uint8_t* packed, int64_t g0, int64_t g1, int64_t nb, int64_t n, const GemvX& x,
                      float* y) {
  constexpr int64_t kRec = DecodeRecordBytes(kType);
  constexpr int64_t kQuant = DecodeQuantBytes(kType);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* p = packed + g * nb * kRec;
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 acc2[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < nb; ++b, p += kRec) {
#pragma GCC unroll 9
      for (int64_t o = 0; o < kRec; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + 8 * kRec + o), _MM_HINT_T0);
      const uint8_t* xb = reinterpret_cast<const uint8_t*>(x.q.data() + 32 * b);
      __m256i xv[8];
      for (int t = 0; t < 8; ++t) {
        int32_t v;
        std::memcpy(&v, xb + 4 * t, 4);
        xv[t] = _mm256_set1_epi32(v);
      }
      const __m256 dx = _mm256_set1_ps(x.d[b]);
      const __m256 xaux = _mm256_set1_ps(x.aux[b]);
      for (int h = 0; h < 2; ++h) {
        __m256i isum;
        if constexpr (kType == GgmlType::kQ8_0) {
          isum = _mm256_setzero_si256();
#pragma GCC unroll 8
          for (int t = 0; t < 8; ++t) {
            const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * t + 32 * h));
            isum = _mm256_add_epi32(
                isum, MaddPairs(_mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv[t], wv))));
          }
        } else {
          __m256i s16 = _mm256_setzero_si256();
#pragma GCC unroll 4
          for (int t = 0; t < 4; ++t) {
            const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * t + 32 * h));
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(_mm256_and_si256(wv, low4), xv[t]));
            s16 = _mm256_add_epi16(s16,
                                   _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(wv, 4), low4), xv[4 + t]));
          }
          isum = MaddPairs(s16);
        }
        const __m256 d =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kQuant + 16 * h)));
        acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, dx), acc[h]);
        if constexpr (kType == GgmlType::kQ4_1) {
          const __m256 mw =
              _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kQuant + 32 + 16 * h)));
          acc2[h] = _mm256_fmadd_ps(mw, xaux, acc2[h]);
        } else if constexpr (kType == GgmlType::kQ4_0) {
          acc2[h] = _mm256_fmadd_ps(d, xaux, acc2[h]);
        }
      }
    }
    const int64_t rows = std::min<int64_t>(kDecodeGroupRows, n - g * kDecodeGroupRows);
    alignas(32) float out[16];
    _mm256_store_ps(out, _mm256_add_ps(acc[0], acc2[0]));
    _mm256_store_ps(out + 8, _mm256_add_ps(acc[1], acc2[1]));
    std::memcpy(y + g * kDecodeGroupRows, out, rows * sizeof(float));
  }
}

// ---------------------------------------------------------------------------
// AVX2 micro-kernels of the packed path (token blocks on CPUs without
// AVX-512, e.g. AMD Zen under hypervisors that hide it; MatMulImpl::kAvx2
// forces them where AVX-512 is there, for tests and benchmarks). Same packed
// data and formulas as the AVX-512 kernels (Tile16Avx512 / TileK), 32 elements (one block) per step.
// (Q4_0 / Q4_1 go to Tile8Avx2 below, which interleaves weight rows.)
//   Q8_0: X is packed as u8 = q + 128, which vpmaddubsw would saturate on; the
//         kernel flips it back to s8 and multiplies |w| by x with w's sign
//         (|pair| <= 2·127·127), vpmaddwd with 1 → 8 int32 lanes, f32 FMA with
//         the lane scale; the +128 correction (the aux terms) is not needed
//         and is skipped: one f32 term fewer per block, the same exact integer
//         block dots.
//   Q4_K / Q6_K: vpmaddubsw then vpmaddwd with the int16 scales, int32 per
//         super-block, as TileK.
template <int RM, int RN>
void TileQ8Avx2(const TileArgs& a) {
  const PackDims& pd = *a.pd;
  __m256 acc[RM][RN];
  for (int r = 0; r < RM; ++r)
    for (int t = 0; t < RN; ++t) acc[r][t] = _mm256_setzero_ps();
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t s = 0; s < pd.kp; s += 32) {
    __m256i w[RM];
    __m256 ws[RM];
    for (int r = 0; r < RM; ++r) {
      w[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.wq + r * pd.kp + s));
      ws[r] = _mm256_broadcast_ss(a.ws + r * pd.scale_len + s / 4);
    }
    for (int t = 0; t < RN; ++t) {
      const __m256i xv =
          _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + t * pd.kp + s)), flip);
      const __m256 xs = _mm256_broadcast_ss(a.xs + t * a.x_s_stride + s / 4);
      for (int r = 0; r < RM; ++r) {
        const __m256i isum =
            MaddPairs(_mm256_maddubs_epi16(_mm256_sign_epi8(w[r], w[r]), _mm256_sign_epi8(xv, w[r])));
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(ws[r], xs), acc[r][t]);
      }
    }
  }
  for (int t = 0; t < RN; ++t)
    for (int r = 0; r < RM; ++r) a.y[t * a.y_stride + r] = HSum256(acc[r][t]);
}

template <int RM, int RN>
void TileKAvx2(const TileArgs& a) {
  const PackDims& pd = *a.pd;
  __m256 acc[RM][RN];
  for (int r = 0; r < RM; ++r)
    for (int t = 0; t < RN; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < pd.nsb; ++b) {
    __m256i iacc[RM][RN];
    for (int r = 0; r < RM; ++r)
      for (int t = 0; t < RN; ++t) iacc[r][t] = _mm256_setzero_si256();
    for (int64_t s = b * kQK_K; s < (b + 1) * kQK_K; s += 32) {
      __m256i w[RM], sc[RM];
      for (int r = 0; r < RM; ++r) {
        w[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.wq + r * pd.kp + s));
        sc[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.wsc + r * pd.scale_len + s / 2));
      }
      for (int t = 0; t < RN; ++t) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + t * pd.kp + s));
        for (int r = 0; r < RM; ++r) {
          iacc[r][t] = _mm256_add_epi32(iacc[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(w[r], xv), sc[r]));
        }
      }
    }
    for (int r = 0; r < RM; ++r) {
      const float wd = a.wd[r * pd.nsb + b];
      for (int t = 0; t < RN; ++t) {
        const __m256 f = _mm256_set1_ps(wd * a.xs[t * a.x_s_stride + b]);
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[r][t]), f, acc[r][t]);
      }
    }
  }
  for (int64_t c = 0; c < pd.aux_len; c += 8) {
    for (int r = 0; r < RM; ++r) {
      const __m256 wa = _mm256_loadu_ps(a.waux + r * pd.aux_len + c);
      for (int t = 0; t < RN; ++t) {
        acc[r][t] = _mm256_fmadd_ps(wa, _mm256_loadu_ps(a.xaux + t * pd.aux_len + c), acc[r][t]);
      }
    }
  }
  for (int t = 0; t < RN; ++t)
    for (int r = 0; r < RM; ++r) a.y[t * a.y_stride + r] = HSum256(acc[r][t]);
}

using TileAvx2Fn = void (*)(const TileArgs&);

TileAvx2Fn PickQ8Avx2(int rm, int rn) {
  static constexpr TileAvx2Fn kTable[4][2] = {
      {TileQ8Avx2<1, 1>, TileQ8Avx2<1, 2>},
      {TileQ8Avx2<2, 1>, TileQ8Avx2<2, 2>},
      {TileQ8Avx2<3, 1>, TileQ8Avx2<3, 2>},
      {TileQ8Avx2<4, 1>, TileQ8Avx2<4, 2>},
  };
  return kTable[rm - 1][rn - 1];
}

TileAvx2Fn PickKAvx2(int rm, int rn) {
  static constexpr TileAvx2Fn kTable[4][2] = {
      {TileKAvx2<1, 1>, TileKAvx2<1, 2>},
      {TileKAvx2<2, 1>, TileKAvx2<2, 2>},
      {TileKAvx2<3, 1>, TileKAvx2<3, 2>},
      {TileKAvx2<4, 1>, TileKAvx2<4, 2>},
  };
  return kTable[rm - 1][rn - 1];
}
#endif  // SNAPFILL_GEMV_AVX2

// Per-thread scratch (OpenMP worker threads persist across calls).
WPack& ThreadWPack() {
  static thread_local WPack wp;
  return wp;
}
XPack& CallerXPack() {
  static thread_local XPack xp;
  return xp;
}

// Work split: units of (nb rows × mb tokens), n-major so that a thread's
// consecutive units often share their weight rows (packed once).
struct Split {
  int64_t nb, mb, num_n, num_m;
};

Split MakeSplit(int64_t m, int64_t n, int threads) {
  Split s;
  s.mb = std::min<int64_t>(m, 256);
  s.num_m = (m + s.mb - 1) / s.mb;
  // Enough row blocks that every thread gets several units.
  const int64_t want_units = 4 * threads;
  const int64_t want_n = std::max<int64_t>(1, (want_units + s.num_m - 1) / s.num_m);
  s.nb = std::clamp<int64_t>(RoundUp((n + want_n - 1) / want_n, 4), 4, 64);
  s.num_n = (n + s.nb - 1) / s.nb;
  return s;
}

#if SNAPFILL_GEMV_AVX2
// ---------------------------------------------------------------------------
// AVX2 token blocks with Q4_0 / Q4_1 weights: 8 weight rows interleaved.
//
// A row-major kernel (as TileQ8Avx2) spends 5 vector ops per (row, token,
// block) (vpmaddubsw, vpmaddwd, convert, scale product, FMA) and a horizontal
// sum per output.
// Here a unit's weight rows are unpacked in groups of 8 with the rows in the
// vector lanes: for block b, vector j (j = 0..7) holds elements 4j..4j+3 of
// each of the 8 rows (lane r = row r), so one vpmaddubsw against the token's
// 4 activation bytes broadcast gives 2 int16 partial sums per row. The 8
// vectors of a block are added in int16 (|sum| <= 8 · 2 · 15 · 127 = 30,480,
// no saturation), turned into int32 by one vpmaddwd, and scaled by the 8
// rows' dw times the token's dx with one FMA; the aux term (Q4_1 mw·sx,
// Q4_0 dw·(-8·dx·Σq)) is one more FMA. About 2.4 vector ops per 32 products,
// no horizontal sums; the outputs of a group are 8 consecutive floats of Y.
// Same data and formulas as the packed path (exact integer block dots, f32
// accumulation over blocks), so the result equals
// ref::MatMulQuantizedActivations up to summation order.
// The weight rows of a unit, unpacked for the row-interleaved kernels: R rows
// per group (8 for Tile8Avx2, 16 for Tile16Avx512), lane r = row r.
struct WPackLanes {
  std::vector<uint8_t> q;   // [group][block][8 vectors][R rows][4] quants (u8 0..15; Q8_0: s8)
  std::vector<float> d;     // [group][block][R] dw
  std::vector<float> aux;   // [group][block][R] waux (Q4_0: dw; Q4_1: m; Q8_0: dw·Σq)
};

WPackLanes& ThreadWPackLanes() {
  static thread_local WPackLanes wp;
  return wp;
}

// Unpacks weight rows [j0, j0 + rows) of a Q4_0 / Q4_1 / Q8_0 matrix into
// groups of R (absent rows zero).
template <int R>
void PackWLanes(GgmlType type, const uint8_t* w, size_t w_row_bytes, int64_t j0, int64_t rows, int64_t nb,
                WPackLanes* wp) {
  const int64_t groups = (rows + R - 1) / R;
  const size_t qn = static_cast<size_t>(groups * nb * 32 * R), fn = static_cast<size_t>(groups * nb * R);
  if (wp->q.size() < qn) wp->q.resize(qn);
  if (wp->d.size() < fn) wp->d.resize(fn);
  if (wp->aux.size() < fn) wp->aux.resize(fn);
  for (int64_t g = 0; g < groups; ++g) {
    for (int r = 0; r < R; ++r) {
      const int64_t row = g * R + r;
      const uint8_t* src = w + (j0 + row) * w_row_bytes;
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* qd = wp->q.data() + (g * nb + b) * 32 * R + 4 * r;
        float* dd = wp->d.data() + (g * nb + b) * R + r;
        float* ad = wp->aux.data() + (g * nb + b) * R + r;
        if (row >= rows) {
          for (int j = 0; j < 8; ++j) std::memset(qd + 4 * R * j, 0, 4);
          *dd = *ad = 0.0f;
          continue;
        }
        alignas(16) uint8_t e[32];
        if (type == GgmlType::kQ8_0) {
          const auto* blk = reinterpret_cast<const BlockQ8_0*>(src) + b;
          *dd = Fp16ToFp32(blk->d);
          std::memcpy(e, blk->qs, 32);
          int sum = 0;
          for (int j = 0; j < 32; ++j) sum += blk->qs[j];
          *ad = *dd * static_cast<float>(sum);
        } else {
          *dd = UnpackQ4Block(type, src, b, e, ad);
        }
        for (int j = 0; j < 8; ++j) std::memcpy(qd + 4 * R * j, e + 4 * j, 4);
      }
    }
  }
}

struct LaneTileArgs {
  const uint8_t* wq;    // group 0's block 0
  const float* wd;
  const float* waux;     // (groups are nb blocks apart)
  const uint8_t* xq;    // token 0's packed row
  const float* xs;      // lane scales (8 per block; lane 0 read)
  const float* xaux;
  int64_t kp, x_s_stride, aux_len, nb;
  float* y;             // Y[token 0, row 0 of group 0]
  int64_t y_stride;
  int rows;             // valid rows from row 0 (all groups)
};

template <int RG, int RN>
void Tile8Avx2(const LaneTileArgs& a) {
  __m256 acc[RG][RN];
  for (int g = 0; g < RG; ++g)
    for (int t = 0; t < RN; ++t) acc[g][t] = _mm256_setzero_ps();
  // (The constant held here, not MaddPairs: with the helper gcc 12 schedules
  // this kernel differently, 5-40% slower at the prefill shapes, measured.)
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < a.nb; ++b) {
    __m256i s[RG][RN];
    for (int g = 0; g < RG; ++g)
      for (int t = 0; t < RN; ++t) s[g][t] = _mm256_setzero_si256();
    // (Fully unrolled, gcc 12 keeps the 64 vpmaddubsw results on the stack
    // and sums them later: 1.2x slower. Two steps at a time keep the int16
    // sums in registers.)
#pragma GCC unroll 2
    for (int j = 0; j < 8; ++j) {
      __m256i xb[RN];
      for (int t = 0; t < RN; ++t) {
        int32_t v;
        std::memcpy(&v, a.xq + t * a.kp + 32 * b + 4 * j, 4);
        xb[t] = _mm256_set1_epi32(v);
      }
      for (int g = 0; g < RG; ++g) {
        const __m256i wv = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(a.wq + (g * a.nb + b) * 256 + 32 * j));
        for (int t = 0; t < RN; ++t) s[g][t] = _mm256_add_epi16(s[g][t], _mm256_maddubs_epi16(wv, xb[t]));
      }
    }
    for (int g = 0; g < RG; ++g) {
      const __m256 dv = _mm256_loadu_ps(a.wd + (g * a.nb + b) * 8);
      const __m256 av = _mm256_loadu_ps(a.waux + (g * a.nb + b) * 8);
      for (int t = 0; t < RN; ++t) {
        const __m256 isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(s[g][t], ones));
        const __m256 scale = _mm256_mul_ps(dv, _mm256_broadcast_ss(a.xs + t * a.x_s_stride + 8 * b));
        acc[g][t] = _mm256_fmadd_ps(isum, scale, acc[g][t]);
        acc[g][t] = _mm256_fmadd_ps(av, _mm256_broadcast_ss(a.xaux + t * a.aux_len + b), acc[g][t]);
      }
    }
  }
  for (int g = 0; g < RG; ++g) {
    const int valid = std::clamp(a.rows - 8 * g, 0, 8);
    for (int t = 0; t < RN; ++t) {
      float* dst = a.y + t * a.y_stride + 8 * g;
      if (valid == 8) {
        _mm256_storeu_ps(dst, acc[g][t]);
      } else {
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, acc[g][t]);
        for (int r = 0; r < valid; ++r) dst[r] = tmp[r];
      }
    }
  }
}

// 3 groups × 2 tokens: 6 int16 sums, 3 weight vectors and 2 broadcasts in
// registers (measured at 512 × 576 → 1536: 1 × 3 tokens 247 GOP/s, 2 × 2 272,
// 2 × 3 263, 3 × 1 200, 3 × 2 285, 4 × 2 226).
constexpr int kTile8Groups = 3, kTile8Tokens = 2;
using LaneTileFn = void (*)(const LaneTileArgs&);
LaneTileFn PickTile8(int rg, int rn) {
  static constexpr LaneTileFn kTable[3][2] = {{Tile8Avx2<1, 1>, Tile8Avx2<1, 2>},
                                           {Tile8Avx2<2, 1>, Tile8Avx2<2, 2>},
                                           {Tile8Avx2<3, 1>, Tile8Avx2<3, 2>}};
  return kTable[rg - 1][rn - 1];
}
#endif  // SNAPFILL_GEMV_AVX2

#if SNAPFILL_MATMUL_AVX512
// ---------------------------------------------------------------------------
// AVX-512 VNNI token blocks with Q4_0 / Q4_1 / Q8_0 weights: 16 weight rows
// interleaved, Tile8Avx2's scheme at twice the width with vpdpbusd.
//
// A row-major kernel spends 4 vector ops per (row, token, 64 elements)
// (vpdpbusd, convert, scale product, FMA) and a horizontal sum per output:
// vpdpbusd is a quarter of the work. Here, for block b, vector j (j = 0..7)
// holds elements 4j..4j+3 of each of the 16 rows (lane r = row r), and one
// vpdpbusd against the token's 4 activation bytes broadcast adds 4 products
// to every row's int32 lane; the 8 of a block give the exact block dots
// (|lane| <= 32 · 255 · 128 < 2^24, exact in f32), then one convert, one
// scale product (the 16 rows' dw times the token's dx) and two FMAs (the dot
// and the aux term) per 16 rows: 8 vpdpbusd in 12 vector ops, no horizontal
// sums, the outputs of a group 16 consecutive floats of Y.
//   Q4_0 / Q4_1: w = q (u8 0..15) is vpdpbusd's unsigned operand, x (s8) the
//         signed one; aux as the packed path (Q4_1 mw·sx, Q4_0 dw·(-8·dx·Σq)).
//   Q8_0: x is packed as u8 = q + 128 and is the unsigned operand, w (s8) the
//         signed one; aux (dw·Σqw)·(-128·dx) takes the offset back out.
// Same data and formulas as the packed path, so the result equals
// ref::MatMulQuantizedActivations up to f32 summation order.
template <int RG, int RN, bool kXUnsigned>
void Tile16Avx512(const LaneTileArgs& a) {
  __m512 acc[RG][RN];
  for (int g = 0; g < RG; ++g)
    for (int t = 0; t < RN; ++t) acc[g][t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    __m512i s[RG][RN];
    for (int g = 0; g < RG; ++g)
      for (int t = 0; t < RN; ++t) s[g][t] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      __m512i xb[RN];
      for (int t = 0; t < RN; ++t) {
        int32_t v;
        std::memcpy(&v, a.xq + t * a.kp + 32 * b + 4 * j, 4);
        xb[t] = _mm512_set1_epi32(v);
      }
      for (int g = 0; g < RG; ++g) {
        const __m512i wv = _mm512_loadu_si512(a.wq + (g * a.nb + b) * 512 + 64 * j);
        for (int t = 0; t < RN; ++t) {
          s[g][t] = kXUnsigned ? _mm512_dpbusd_epi32(s[g][t], xb[t], wv) : _mm512_dpbusd_epi32(s[g][t], wv, xb[t]);
        }
      }
    }
    for (int g = 0; g < RG; ++g) {
      const __m512 dv = _mm512_loadu_ps(a.wd + (g * a.nb + b) * 16);
      const __m512 av = _mm512_loadu_ps(a.waux + (g * a.nb + b) * 16);
      for (int t = 0; t < RN; ++t) {
        const __m512 scale = _mm512_mul_ps(dv, _mm512_set1_ps(a.xs[t * a.x_s_stride + 8 * b]));
        acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[g][t]), scale, acc[g][t]);
        acc[g][t] = _mm512_fmadd_ps(av, _mm512_set1_ps(a.xaux[t * a.aux_len + b]), acc[g][t]);
      }
    }
  }
  for (int g = 0; g < RG; ++g) {
    const int valid = std::clamp(a.rows - 16 * g, 0, 16);
    const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
    for (int t = 0; t < RN; ++t) _mm512_mask_storeu_ps(a.y + t * a.y_stride + 16 * g, mask, acc[g][t]);
  }
}

#ifndef SNAPFILL_TILE16_GROUPS
#define SNAPFILL_TILE16_GROUPS 2
#define SNAPFILL_TILE16_TOKENS 6
#endif
// Groups of 16 rows × tokens per call (SNAPFILL_TILE16_* override them for
// the register-tile sweep in docs/BENCHMARKS.md).
constexpr int kTile16Groups = SNAPFILL_TILE16_GROUPS, kTile16Tokens = SNAPFILL_TILE16_TOKENS;
static_assert(kTile16Groups >= 1 && kTile16Groups <= 4 && kTile16Tokens >= 1 && kTile16Tokens <= 6);

template <bool kXUnsigned, int RG, int... RN>
constexpr std::array<LaneTileFn, sizeof...(RN)> Tile16Row(std::integer_sequence<int, RN...>) {
  return {Tile16Avx512<RG, RN + 1, kXUnsigned>...};
}

template <bool kXUnsigned>
LaneTileFn PickTile16(int rg, int rn) {
  using Tokens = std::make_integer_sequence<int, kTile16Tokens>;
  static constexpr std::array<std::array<LaneTileFn, kTile16Tokens>, 4> kTable = {
      Tile16Row<kXUnsigned, 1>(Tokens{}), Tile16Row<kXUnsigned, 2>(Tokens{}),
      Tile16Row<kXUnsigned, 3>(Tokens{}), Tile16Row<kXUnsigned, 4>(Tokens{})};
  return kTable[rg - 1][rn - 1];
}
#endif  // SNAPFILL_MATMUL_AVX512

void MatMulQuantized(const float* x, int64_t m, int64_t k, int64_t x_stride, const uint8_t* w,
                     GgmlType type, int64_t n, size_t w_row_bytes, float* y, int64_t y_stride) {
#if SNAPFILL_GEMV_AVX2
  if (GemvHandles(type, m)) {
    Gemv(x, m, k, x_stride, w, type, n, w_row_bytes, y, y_stride);
    return;
  }
#endif
  if (UseAmx(type, m, k, w_row_bytes)) {
    if (UseAmxBf16()) {
      internal::MatMulAmxBf16(x, m, k, x_stride, w, type, n, w_row_bytes, y, y_stride);
    } else {
      internal::MatMulAmx(x, m, k, x_stride, w, type, n, w_row_bytes, y, y_stride);
    }
    return;
  }
  const TypeInfo ti = Info(type);
  const PackDims pd = Dims(type, k);
  const PackedIsa isa = PickPackedIsa();
  XPack& xp = CallerXPack();
  xp.s_stride = ti.family == Family::kBlock32 ? pd.scale_len : pd.nsb;
  if (xp.q.size() < static_cast<size_t>(m * pd.kp)) xp.q.resize(m * pd.kp);
  if (xp.s.size() < static_cast<size_t>(m * xp.s_stride)) xp.s.resize(m * xp.s_stride);
  if (xp.aux.size() < static_cast<size_t>(m * pd.aux_len)) xp.aux.resize(m * pd.aux_len);

  const int threads = omp_get_max_threads();
  // Token blocks with rows interleaved in the vector lanes: 16 at a time on
  // AVX-512 VNNI (Tile16Avx512: Q4_0 / Q4_1 / Q8_0), 8 on AVX2 (Tile8Avx2:
  // Q4_0 / Q4_1); 0 for the row-major packed path.
  const bool q4 = type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1;
  int lanes = 0, lane_groups = 1, lane_tokens = 1;
#if SNAPFILL_MATMUL_AVX512
  if (isa == PackedIsa::kAvx512 && ti.family == Family::kBlock32) {
    lanes = 16, lane_groups = kTile16Groups, lane_tokens = kTile16Tokens;
  }
#endif
#if SNAPFILL_GEMV_AVX2
  if (isa == PackedIsa::kAvx2 && q4) lanes = 8, lane_groups = kTile8Groups, lane_tokens = kTile8Tokens;
#endif
  Split sp = MakeSplit(m, n, threads);
  if (lanes > 0) {
    sp.nb = RoundUp(sp.nb, lanes * lane_groups);
    sp.num_n = (n + sp.nb - 1) / sp.nb;
  }
  const int64_t num_units = sp.num_n * sp.num_m;

#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m; ++i) {
      PackXRow(type, x + i * x_stride, k, pd, xp.q.data() + i * pd.kp, xp.s.data() + i * xp.s_stride,
               xp.aux.data() + i * pd.aux_len);
    }
    WPack& wp = ThreadWPack();
    int64_t packed_nblock = -1;
#pragma omp for schedule(static)
    for (int64_t u = 0; u < num_units; ++u) {
      const int64_t nbi = u / sp.num_m, mbi = u % sp.num_m;
      const int64_t j0 = nbi * sp.nb, rows = std::min(sp.nb, n - j0);
      const int64_t i0 = mbi * sp.mb, toks = std::min(sp.mb, m - i0);
#if SNAPFILL_GEMV_AVX2
      if (lanes > 0) {
        WPackLanes& wl = ThreadWPackLanes();
        const int64_t nb = k / 32;
        if (packed_nblock != nbi) {
          (lanes == 16 ? PackWLanes<16> : PackWLanes<8>)(type, w, w_row_bytes, j0, rows, nb, &wl);
          packed_nblock = nbi;
        }
        const int64_t groups = (rows + lanes - 1) / lanes;
        for (int64_t t0 = 0; t0 < toks; t0 += lane_tokens) {
          const int rn = static_cast<int>(std::min<int64_t>(lane_tokens, toks - t0));
          const int64_t ti0 = i0 + t0;
          for (int64_t g0 = 0; g0 < groups; g0 += lane_groups) {
            const int rg = static_cast<int>(std::min<int64_t>(lane_groups, groups - g0));
            LaneTileArgs a;
            a.wq = wl.q.data() + g0 * nb * 32 * lanes;
            a.wd = wl.d.data() + g0 * nb * lanes;
            a.waux = wl.aux.data() + g0 * nb * lanes;
            a.xq = xp.q.data() + ti0 * pd.kp;
            a.xs = xp.s.data() + ti0 * xp.s_stride;
            a.xaux = xp.aux.data() + ti0 * pd.aux_len;
            a.kp = pd.kp;
            a.x_s_stride = xp.s_stride;
            a.aux_len = pd.aux_len;
            a.nb = nb;
            a.y = y + ti0 * y_stride + j0 + lanes * g0;
            a.y_stride = y_stride;
            a.rows = static_cast<int>(rows - lanes * g0);
#if SNAPFILL_MATMUL_AVX512
            if (lanes == 16) {
              (ti.x_unsigned ? PickTile16<true> : PickTile16<false>)(rg, rn)(a);
              continue;
            }
#endif
            PickTile8(rg, rn)(a);
          }
        }
        continue;
      }
#endif
      if (packed_nblock != nbi) {
        const size_t r_cap = static_cast<size_t>(sp.nb);
        if (wp.q.size() < r_cap * pd.kp) wp.q.resize(r_cap * pd.kp);
        if (wp.aux.size() < r_cap * pd.aux_len) wp.aux.resize(r_cap * pd.aux_len);
        if (ti.family == Family::kBlock32) {
          if (wp.s.size() < r_cap * pd.scale_len) wp.s.resize(r_cap * pd.scale_len);
        } else {
          if (wp.sc.size() < r_cap * pd.scale_len) wp.sc.resize(r_cap * pd.scale_len);
          if (wp.d.size() < r_cap * pd.nsb) wp.d.resize(r_cap * pd.nsb);
        }
        for (int64_t r = 0; r < rows; ++r) PackWRow(type, w + (j0 + r) * w_row_bytes, k, pd, &wp, r);
        packed_nblock = nbi;
      }
      const int max_rn = ti.family == Family::kSuper256 ? 2 : isa == PackedIsa::kAvx2 ? kAvx2Tokens : 4;
      for (int64_t t0 = 0; t0 < toks; t0 += max_rn) {
        const int rn = static_cast<int>(std::min<int64_t>(max_rn, toks - t0));
        const int64_t ti0 = i0 + t0;
        for (int64_t r0 = 0; r0 < rows; r0 += 4) {
          const int rm = static_cast<int>(std::min<int64_t>(4, rows - r0));
          TileArgs a;
          a.wq = wp.q.data() + r0 * pd.kp;
          a.ws = ti.family == Family::kBlock32 ? wp.s.data() + r0 * pd.scale_len : nullptr;
          a.wsc = ti.family == Family::kSuper256 ? wp.sc.data() + r0 * pd.scale_len : nullptr;
          a.wd = ti.family == Family::kSuper256 ? wp.d.data() + r0 * pd.nsb : nullptr;
          a.waux = wp.aux.data() + r0 * pd.aux_len;
          a.xq = xp.q.data() + ti0 * pd.kp;
          a.xs = xp.s.data() + ti0 * xp.s_stride;
          a.xaux = xp.aux.data() + ti0 * pd.aux_len;
          a.y = y + ti0 * y_stride + j0 + r0;
          a.y_stride = y_stride;
          a.pd = &pd;
          a.k = k;
          a.x_s_stride = xp.s_stride;
#if SNAPFILL_MATMUL_AVX512
          if (isa == PackedIsa::kAvx512) {
            // (Q4_0 / Q4_1 / Q8_0 took the interleaved path above.)
            PickK(rm, rn)(a);
            continue;
          }
#endif
#if SNAPFILL_GEMV_AVX2
          if (isa == PackedIsa::kAvx2) {
            // (Q4_0 / Q4_1 took the interleaved path above; Q8_0 is left.)
            (ti.family == Family::kSuper256 ? PickKAvx2 : PickQ8Avx2)(rm, rn)(a);
            continue;
          }
#endif
          GenericTile(a, rm, rn, ti.family, ti.x_unsigned);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Float weights (F32 / F16 / BF16): rows converted to f32, f32 FMA.

void ConvertRow(GgmlType type, const uint8_t* src, float* dst, int64_t k) {
  switch (type) {
    case GgmlType::kF32: std::memcpy(dst, src, k * sizeof(float)); break;
    case GgmlType::kF16: {
      const auto* h = reinterpret_cast<const uint16_t*>(src);
      int64_t i = 0;
#if SNAPFILL_MATMUL_AVX512
      for (; i + 16 <= k; i += 16) {
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i))));
      }
#elif SNAPFILL_GEMV_AVX2
      for (; i + 8 <= k; i += 8) {
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
      }
#endif
      for (; i < k; ++i) dst[i] = Fp16ToFp32(h[i]);
      break;
    }
    default: {  // BF16
      const auto* h = reinterpret_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < k; ++i) dst[i] = Bf16ToFp32(h[i]);
      break;
    }
  }
}

#if SNAPFILL_MATMUL_AVX512
template <int RM, int RN>
void TileF32(const float* w, int64_t w_stride, const float* x, int64_t x_stride, int64_t k, float* y,
             int64_t y_stride) {
  __m512 acc[RM][RN];
  for (int r = 0; r < RM; ++r)
    for (int t = 0; t < RN; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t s = 0; s < k; s += 16) {
    const __mmask16 mask = k - s >= 16 ? static_cast<__mmask16>(0xFFFF)
                                       : static_cast<__mmask16>((1u << (k - s)) - 1);
    __m512 wv[RM];
    for (int r = 0; r < RM; ++r) wv[r] = _mm512_maskz_loadu_ps(mask, w + r * w_stride + s);
    for (int t = 0; t < RN; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + t * x_stride + s);
      for (int r = 0; r < RM; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  for (int t = 0; t < RN; ++t)
    for (int r = 0; r < RM; ++r) y[t * y_stride + r] = HSum(acc[r][t]);
}

using TileF32Fn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t);
TileF32Fn PickF32(int rm, int rn) {
  static constexpr TileF32Fn kTable[4][4] = {
      {TileF32<1, 1>, TileF32<1, 2>, TileF32<1, 3>, TileF32<1, 4>},
      {TileF32<2, 1>, TileF32<2, 2>, TileF32<2, 3>, TileF32<2, 4>},
      {TileF32<3, 1>, TileF32<3, 2>, TileF32<3, 3>, TileF32<3, 4>},
      {TileF32<4, 1>, TileF32<4, 2>, TileF32<4, 3>, TileF32<4, 4>},
  };
  return kTable[rm - 1][rn - 1];
}
#endif

#if SNAPFILL_GEMV_AVX2
template <int RM, int RN>
void TileF32Avx2(const float* w, int64_t w_stride, const float* x, int64_t x_stride, int64_t k, float* y,
                 int64_t y_stride) {
  __m256 acc[RM][RN];
  for (int r = 0; r < RM; ++r)
    for (int t = 0; t < RN; ++t) acc[r][t] = _mm256_setzero_ps();
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t s = 0; s < k; s += 8) {
    // All lanes below k - s (vmaskmovps reads nothing past the mask).
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(8, k - s))), lane);
    __m256 wv[RM];
    for (int r = 0; r < RM; ++r) wv[r] = _mm256_maskload_ps(w + r * w_stride + s, mask);
    for (int t = 0; t < RN; ++t) {
      const __m256 xv = _mm256_maskload_ps(x + t * x_stride + s, mask);
      for (int r = 0; r < RM; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  for (int t = 0; t < RN; ++t)
    for (int r = 0; r < RM; ++r) y[t * y_stride + r] = HSum256(acc[r][t]);
}

using TileF32Avx2Fn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t);
TileF32Avx2Fn PickF32Avx2(int rm, int rn) {
  static constexpr TileF32Avx2Fn kTable[4][2] = {
      {TileF32Avx2<1, 1>, TileF32Avx2<1, 2>},
      {TileF32Avx2<2, 1>, TileF32Avx2<2, 2>},
      {TileF32Avx2<3, 1>, TileF32Avx2<3, 2>},
      {TileF32Avx2<4, 1>, TileF32Avx2<4, 2>},
  };
  return kTable[rm - 1][rn - 1];
}
#endif

void MatMulFloat(const float* x, int64_t m, int64_t k, int64_t x_stride, const uint8_t* w,
                 GgmlType type, int64_t n, size_t w_row_bytes, float* y, int64_t y_stride) {
  const PackedIsa isa = PickPackedIsa();
  const int threads = omp_get_max_threads();
  const Split sp = MakeSplit(m, n, threads);
  const int64_t num_units = sp.num_n * sp.num_m;
  const bool direct = type == GgmlType::kF32 && w_row_bytes % sizeof(float) == 0;
#pragma omp parallel num_threads(threads)
  {
    static thread_local std::vector<float> wbuf;
    int64_t packed_nblock = -1;
#pragma omp for schedule(static)
    for (int64_t u = 0; u < num_units; ++u) {
      const int64_t nbi = u / sp.num_m, mbi = u % sp.num_m;
      const int64_t j0 = nbi * sp.nb, rows = std::min(sp.nb, n - j0);
      const int64_t i0 = mbi * sp.mb, toks = std::min(sp.mb, m - i0);
      const float* wf;
      int64_t w_stride;
      if (direct) {
        wf = reinterpret_cast<const float*>(w + j0 * w_row_bytes);
        w_stride = static_cast<int64_t>(w_row_bytes / sizeof(float));
      } else {
        if (packed_nblock != nbi) {
          if (wbuf.size() < static_cast<size_t>(sp.nb * k)) wbuf.resize(sp.nb * k);
          for (int64_t r = 0; r < rows; ++r) ConvertRow(type, w + (j0 + r) * w_row_bytes, wbuf.data() + r * k, k);
          packed_nblock = nbi;
        }
        wf = wbuf.data();
        w_stride = k;
      }
      const int max_rn = isa == PackedIsa::kAvx2 ? kAvx2Tokens : 4;
      for (int64_t t0 = 0; t0 < toks; t0 += max_rn) {
        const int rn = static_cast<int>(std::min<int64_t>(max_rn, toks - t0));
        const float* xt = x + (i0 + t0) * x_stride;
        for (int64_t r0 = 0; r0 < rows; r0 += 4) {
          const int rm = static_cast<int>(std::min<int64_t>(4, rows - r0));
          float* yt = y + (i0 + t0) * y_stride + j0 + r0;
#if SNAPFILL_MATMUL_AVX512
          if (isa == PackedIsa::kAvx512) {
            PickF32(rm, rn)(wf + r0 * w_stride, w_stride, xt, x_stride, k, yt, y_stride);
            continue;
          }
#endif
#if SNAPFILL_GEMV_AVX2
          if (isa == PackedIsa::kAvx2) {
            PickF32Avx2(rm, rn)(wf + r0 * w_stride, w_stride, xt, x_stride, k, yt, y_stride);
            continue;
          }
#endif
          for (int t = 0; t < rn; ++t) {
            for (int r = 0; r < rm; ++r) {
              float acc = 0.0f;
              const float* wr = wf + (r0 + r) * w_stride;
              for (int64_t e = 0; e < k; ++e) acc += wr[e] * xt[t * x_stride + e];
              yt[t * y_stride + r] = acc;
            }
          }
        }
      }
    }
  }
}

}  // namespace

bool MatMulSupports(GgmlType type) { return IsSupportedWeightType(type); }

void SetMatMulImplForTesting(MatMulImpl impl) {
  g_impl.store(static_cast<int>(impl), std::memory_order_relaxed);
}

bool MatMulHasSimd() { return SNAPFILL_MATMUL_AVX512; }
bool MatMulHasAvx2() { return SNAPFILL_GEMV_AVX2; }

bool MatMulHasDecodeLayout() {
  return SNAPFILL_GEMV_AVX2 && g_impl.load(std::memory_order_relaxed) != static_cast<int>(MatMulImpl::kGeneric);
}

bool MatMulHasAmx() { return internal::AmxAvailable(); }

bool MatMulHasAmxBf16() { return internal::AmxBf16Available(); }

void MatMul(const float* x, int64_t m, int64_t k, int64_t x_stride, const void* w,
            GgmlType w_type, int64_t n, size_t w_row_bytes, float* y, int64_t y_stride) {
  if (m <= 0 || n <= 0) return;
  const auto* wb = static_cast<const uint8_t*>(w);
  switch (w_type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
      MatMulFloat(x, m, k, x_stride, wb, w_type, n, w_row_bytes, y, y_stride);
      return;
    default:
      MatMulQuantized(x, m, k, x_stride, wb, w_type, n, w_row_bytes, y, y_stride);
      return;
  }
}

size_t DecodePackedBytes(GgmlType type, int64_t n, int64_t k) {
  if (!MatMulHasDecodeLayout() || DecodeRecordBytes(type) == 0 || n <= 0 || k <= 0 || k % 32 != 0) {
    return 0;
  }
  const int64_t groups = (n + kDecodeGroupRows - 1) / kDecodeGroupRows;
  return static_cast<size_t>(groups * (k / 32) * DecodeRecordBytes(type));
}

void PackForDecode(const void* w, GgmlType type, int64_t n, int64_t k, size_t w_row_bytes, void* out) {
  const int64_t rec = DecodeRecordBytes(type), quant = DecodeQuantBytes(type);
  const int64_t nb = k / 32, groups = (n + kDecodeGroupRows - 1) / kDecodeGroupRows;
  const int64_t blk = RowBytes(type, 32);
  const int64_t qs_off = type == GgmlType::kQ4_1 ? 4 : 2;
  const int64_t words = quant / 64;  // 4-byte words per row and block
  const auto* src = static_cast<const uint8_t*>(w);
  auto* dst = static_cast<uint8_t*>(out);
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* r = dst + (g * nb + b) * rec;
      std::memset(r, 0, rec);
      for (int64_t row = 0; row < kDecodeGroupRows && g * kDecodeGroupRows + row < n; ++row) {
        const uint8_t* blkp = src + (g * kDecodeGroupRows + row) * w_row_bytes + b * blk;
        for (int64_t t = 0; t < words; ++t) std::memcpy(r + 64 * t + 4 * row, blkp + qs_off + 4 * t, 4);
        std::memcpy(r + quant + 2 * row, blkp, 2);                                              // d
        if (type == GgmlType::kQ4_1) std::memcpy(r + quant + 32 + 2 * row, blkp + 2, 2);  // m
      }
    }
  }
}

void MatMulDecodePacked(const float* x, int64_t k, const void* packed, GgmlType type, int64_t n, float* y) {
#if SNAPFILL_GEMV_AVX2
  if (n <= 0) return;
  GemvX& gx = CallerGemvX();
  QuantizeGemvX(x, 1, k, k, type, gx);
  using GroupsFn = void (*)(const uint8_t*, int64_t, int64_t, int64_t, int64_t, const GemvX&, float*);
  GroupsFn fn = type == GgmlType::kQ4_1   ? DecodeGroupsAvx2<GgmlType::kQ4_1>
                : type == GgmlType::kQ4_0 ? DecodeGroupsAvx2<GgmlType::kQ4_0>
                                          : DecodeGroupsAvx2<GgmlType::kQ8_0>;
#if SNAPFILL_MATMUL_AVX512
  if (PickPackedIsa() == PackedIsa::kAvx512) {
    fn = type == GgmlType::kQ4_1   ? DecodeGroups<GgmlType::kQ4_1>
         : type == GgmlType::kQ4_0 ? DecodeGroups<GgmlType::kQ4_0>
                                   : DecodeGroups<GgmlType::kQ8_0>;
  }
#endif
  const auto* p = static_cast<const uint8_t*>(packed);
  const int64_t nb = k / 32, groups = (n + kDecodeGroupRows - 1) / kDecodeGroupRows;
  // Contiguous spans of groups per thread (schedule(static)), so each thread
  // streams one run of records; small products stay on the calling thread.
  const int threads = n * k < (1 << 16) ? 1 : static_cast<int>(std::min<int64_t>(omp_get_max_threads(), groups));
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t g = 0; g < groups; ++g) fn(p, g, g + 1, nb, n, gx, y);
#else
  (void)x, (void)k, (void)packed, (void)type, (void)n, (void)y;
#endif
}

void QuantizeRowQ8_0(const float* x, void* y, int64_t k) {
  auto* blocks = static_cast<BlockQ8_0*>(y);
  for (int64_t b = 0; b < k / kQK8_0; ++b) {
    int sum = 0;
    blocks[b].d = Fp32ToFp16(QuantBlock8(x + b * kQK8_0, blocks[b].qs, &sum));
  }
}

void QuantizeRowQ8_1(const float* x, void* y, int64_t k) {
  auto* blocks = static_cast<BlockQ8_1*>(y);
  for (int64_t b = 0; b < k / kQK8_1; ++b) {
    int sum = 0;
    const float d = QuantBlock8(x + b * kQK8_1, blocks[b].qs, &sum);
    blocks[b].d = Fp32ToFp16(d);
    blocks[b].s = Fp32ToFp16(static_cast<float>(sum) * d);
  }
}

void QuantizeRowQ8_K(const float* x, void* y, int64_t k) {
  auto* blocks = static_cast<BlockQ8_K*>(y);
  for (int64_t b = 0; b < k / kQK_K; ++b) {
    blocks[b].d = QuantBlockK(x + b * kQK_K, blocks[b].qs, blocks[b].bsums);
  }
}

void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t k) {
  const auto* s = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16: ConvertRow(type, s, dst, k); return;
    case GgmlType::kQ4_0: {
      const auto* x = reinterpret_cast<const BlockQ4_0*>(s);
      for (int64_t b = 0; b < k / 32; ++b) {
        const float d = Fp16ToFp32(x[b].d);
        for (int j = 0; j < 16; ++j) {
          dst[32 * b + j] = static_cast<float>((x[b].qs[j] & 0xF) - 8) * d;
          dst[32 * b + j + 16] = static_cast<float>((x[b].qs[j] >> 4) - 8) * d;
        }
      }
      return;
    }
    case GgmlType::kQ4_1: {
      const auto* x = reinterpret_cast<const BlockQ4_1*>(s);
      for (int64_t b = 0; b < k / 32; ++b) {
        const float d = Fp16ToFp32(x[b].d), mn = Fp16ToFp32(x[b].m);
        for (int j = 0; j < 16; ++j) {
          dst[32 * b + j] = std::fmaf(static_cast<float>(x[b].qs[j] & 0xF), d, mn);
          dst[32 * b + j + 16] = std::fmaf(static_cast<float>(x[b].qs[j] >> 4), d, mn);
        }
      }
      return;
    }
    case GgmlType::kQ8_0: {
      const auto* x = reinterpret_cast<const BlockQ8_0*>(s);
      for (int64_t b = 0; b < k / 32; ++b) {
        const float d = Fp16ToFp32(x[b].d);
        for (int j = 0; j < 32; ++j) dst[32 * b + j] = static_cast<float>(x[b].qs[j]) * d;
      }
      return;
    }
    case GgmlType::kQ4_K: {
      const auto* x = reinterpret_cast<const BlockQ4_K*>(s);
      for (int64_t b = 0; b < k / kQK_K; ++b) {
        const float d = Fp16ToFp32(x[b].d), dmin = Fp16ToFp32(x[b].dmin);
        float* out = dst + b * kQK_K;
        for (int c = 0; c < 4; ++c) {
          uint8_t sc, mn;
          GetScaleMinK4(2 * c, x[b].scales, &sc, &mn);
          const float d1 = d * sc, m1 = dmin * mn;
          GetScaleMinK4(2 * c + 1, x[b].scales, &sc, &mn);
          const float d2 = d * sc, m2 = dmin * mn;
          const uint8_t* q = x[b].qs + 32 * c;
          for (int l = 0; l < 32; ++l) {
            out[64 * c + l] = std::fmaf(d1, static_cast<float>(q[l] & 0xF), -m1);
            out[64 * c + 32 + l] = std::fmaf(d2, static_cast<float>(q[l] >> 4), -m2);
          }
        }
      }
      return;
    }
    case GgmlType::kQ6_K: {
      const auto* x = reinterpret_cast<const BlockQ6_K*>(s);
      for (int64_t b = 0; b < k / kQK_K; ++b) {
        const float d = Fp16ToFp32(x[b].d);
        for (int h = 0; h < 2; ++h) {
          const uint8_t* ql = x[b].ql + 64 * h;
          const uint8_t* qh = x[b].qh + 32 * h;
          const int8_t* sc = x[b].scales + 8 * h;
          float* out = dst + b * kQK_K + 128 * h;
          for (int l = 0; l < 32; ++l) {
            const int g = l / 16;
            out[l] = d * static_cast<float>(sc[g]) *
                     static_cast<float>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            out[l + 32] = d * static_cast<float>(sc[g + 2]) *
                          static_cast<float>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            out[l + 64] = d * static_cast<float>(sc[g + 4]) *
                          static_cast<float>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            out[l + 96] = d * static_cast<float>(sc[g + 6]) *
                          static_cast<float>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
          }
        }
      }
      return;
    }
    default:
      std::memset(dst, 0, k * sizeof(float));
      return;
  }
}

}  // namespace snapfill::cpu
