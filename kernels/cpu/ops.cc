// Element-wise and attention kernels on the CPU (f32); see ops.h.
//
// SIMD: one small vector abstraction (Vec) per ISA, chosen at compile time:
// AVX-512F (16 lanes), AVX2+FMA (8 lanes), or plain float (1 lane, the
// generic fallback). The attention kernels are written once against it.
//
// Attention layout trick ("rows in lanes"): a work item owns M score rows
// (the G query heads of one KV head × a block of queries). Q is transposed
// once per item to Qt[d][Mp] (Mp = M rounded up to the vector width), so
//   St[j][r] = Σ_d K[j][d] · Qt[d][r]   (broadcast a K element, FMA a row vector)
//   Ot[d][r] = Σ_j V[j][d] · Pt[j][r]   (broadcast a V element, FMA a row vector)
// read K and V in their natural head-major layout (no per-tile transposes),
// work for any head_dim (d is a scalar loop), and the online softmax's row
// max / row sum become vertical vector ops (no horizontal reductions).
#include "kernels/cpu/ops.h"

// GCC 12 reports (maybe-)uninitialized inside its own AVX-512 intrinsic
// headers (the _mm512_undefined_* pass-through operands, GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <numeric>
#include <vector>

#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/matmul_amx.h"

namespace snapfill::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp(x) for x < kExpZeroBelow is flushed to 0 (true value < 1.7e-38, the
// smallest normal float), which keeps the kernels free of denormals and makes
// exp(-inf) (masked scores) exactly 0.
constexpr float kExpZeroBelow = -87.0f;
constexpr float kExpMax = 88.0f;  // exp(88) = 1.65e38, below FLT_MAX.

// Cephes expf: x = n·ln2 + r, |r| <= ln2/2, exp(r) by a degree-7 polynomial
// (about 1 ulp), times 2^n.
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpP0 = 1.9875691500e-4f;
constexpr float kExpP1 = 1.3981999507e-3f;
constexpr float kExpP2 = 8.3334519073e-3f;
constexpr float kExpP3 = 4.1665795894e-2f;
constexpr float kExpP4 = 1.6666665459e-1f;
constexpr float kExpP5 = 5.0000001201e-1f;

#if defined(__AVX512F__)
struct Vec {
  using T = __m512;
  static constexpr int kW = 16;
  static constexpr int kMaxNV = 4;  // row vectors per micro-tile (4 × 6 = 24 accumulators)
  static T Zero() { return _mm512_setzero_ps(); }
  static T Set1(float x) { return _mm512_set1_ps(x); }
  static T Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T Add(T a, T b) { return _mm512_add_ps(a, b); }
  static T Sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T Mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T Div(T a, T b) { return _mm512_div_ps(a, b); }
  static T Max(T a, T b) { return _mm512_max_ps(a, b); }
  static T Fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  // a < b ? y : x
  static T SelectLt(T a, T b, T x, T y) {
    return _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), y);
  }
  static float ReduceAdd(T v) { return _mm512_reduce_add_ps(v); }
  static T Exp(T x) {
    const __mmask16 zero = _mm512_cmp_ps_mask(x, Set1(kExpZeroBelow), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, Set1(kExpZeroBelow)), Set1(kExpMax));
    const T n =
        _mm512_roundscale_ps(Mul(x, Set1(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    T r = _mm512_fnmadd_ps(n, Set1(kLn2Hi), x);
    r = _mm512_fnmadd_ps(n, Set1(kLn2Lo), r);
    T p = Set1(kExpP0);
    p = Fma(p, r, Set1(kExpP1));
    p = Fma(p, r, Set1(kExpP2));
    p = Fma(p, r, Set1(kExpP3));
    p = Fma(p, r, Set1(kExpP4));
    p = Fma(p, r, Set1(kExpP5));
    p = Fma(p, Mul(r, r), Add(r, Set1(1.0f)));
    return _mm512_maskz_mov_ps(static_cast<__mmask16>(~zero), _mm512_scalef_ps(p, n));
  }
};
#elif defined(__AVX2__) && defined(__FMA__)
struct Vec {
  using T = __m256;
  static constexpr int kW = 8;
  static constexpr int kMaxNV = 2;  // 16 ymm registers: 2 × 6 accumulators
  static T Zero() { return _mm256_setzero_ps(); }
  static T Set1(float x) { return _mm256_set1_ps(x); }
  static T Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T Add(T a, T b) { return _mm256_add_ps(a, b); }
  static T Sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T Mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T Div(T a, T b) { return _mm256_div_ps(a, b); }
  static T Max(T a, T b) { return _mm256_max_ps(a, b); }
  static T Fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T SelectLt(T a, T b, T x, T y) {
    return _mm256_blendv_ps(x, y, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
  }
  static float ReduceAdd(T v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static T Exp(T x) {
    const T zero = _mm256_cmp_ps(x, Set1(kExpZeroBelow), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, Set1(kExpZeroBelow)), Set1(kExpMax));
    const T n =
        _mm256_round_ps(Mul(x, Set1(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    T r = _mm256_fnmadd_ps(n, Set1(kLn2Hi), x);
    r = _mm256_fnmadd_ps(n, Set1(kLn2Lo), r);
    T p = Set1(kExpP0);
    p = Fma(p, r, Set1(kExpP1));
    p = Fma(p, r, Set1(kExpP2));
    p = Fma(p, r, Set1(kExpP3));
    p = Fma(p, r, Set1(kExpP4));
    p = Fma(p, r, Set1(kExpP5));
    p = Fma(p, Mul(r, r), Add(r, Set1(1.0f)));
    // n is in [-126, 127]: build 2^n in the exponent field.
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(zero, Mul(p, _mm256_castsi256_ps(e)));
  }
};
#else
struct Vec {
  using T = float;
  static constexpr int kW = 1;
  static constexpr int kMaxNV = 4;
  static T Zero() { return 0.0f; }
  static T Set1(float x) { return x; }
  static T Load(const float* p) { return *p; }
  static void Store(float* p, T v) { *p = v; }
  static T Add(T a, T b) { return a + b; }
  static T Sub(T a, T b) { return a - b; }
  static T Mul(T a, T b) { return a * b; }
  static T Div(T a, T b) { return a / b; }
  static T Max(T a, T b) { return std::max(a, b); }
  static T Fma(T a, T b, T c) { return std::fma(a, b, c); }
  static T SelectLt(T a, T b, T x, T y) { return a < b ? y : x; }
  static float ReduceAdd(T v) { return v; }
  static T Exp(T x) { return x < kExpZeroBelow ? 0.0f : std::exp(std::min(x, kExpMax)); }
};
#endif

using V = Vec;
using VT = Vec::T;
constexpr int kW = Vec::kW;
constexpr int kMaxNV = Vec::kMaxNV;
constexpr int kC = 6;        // keys (score kernel) or dims (PV kernel) per micro-tile
constexpr int64_t kBk = 64;  // keys per tile

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// 64-byte aligned scratch of n floats.
struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
using Scratch = std::unique_ptr<float[], AlignedFree>;
Scratch AllocScratch(int64_t n) {
  const size_t bytes = static_cast<size_t>(RoundUp(std::max<int64_t>(n, 1) * sizeof(float), 64));
  return Scratch(static_cast<float*>(std::aligned_alloc(64, bytes)));
}

// ---------------------------------------------------------------------------
// Attention micro-kernels. Row chunk [r0, r0 + NV·kW) of an item's Mp rows.

// st[c][r] = Σ_dd k[c][dd] · qt[dd][r] for the C keys at k (key stride ks).
template <int NV, int C>
inline void ScoreBlock(const float* qt, int64_t mp, const float* k, int64_t ks, int64_t d,
                       float* st, int64_t r0) {
  VT acc[C][NV];
  for (int c = 0; c < C; ++c)
    for (int n = 0; n < NV; ++n) acc[c][n] = V::Zero();
  const float* qp = qt + r0;
  for (int64_t dd = 0; dd < d; ++dd, qp += mp) {
    VT qv[NV];
    for (int n = 0; n < NV; ++n) qv[n] = V::Load(qp + n * kW);
    for (int c = 0; c < C; ++c) {
      const VT kb = V::Set1(k[c * ks + dd]);
      for (int n = 0; n < NV; ++n) acc[c][n] = V::Fma(kb, qv[n], acc[c][n]);
    }
  }
  for (int c = 0; c < C; ++c)
    for (int n = 0; n < NV; ++n) V::Store(st + c * mp + r0 + n * kW, acc[c][n]);
}

// ot[c][r] = ot[c][r] · alpha[r] + Σ_{j<jn} v[j][c] · pt[j][r] for the C dims
// at v (key stride vs); ot rows are dims (stride mp).
template <int NV, int C>
inline void PvBlock(const float* pt, int64_t mp, const float* v, int64_t vs, int64_t jn,
                    const float* alpha, float* ot, int64_t r0) {
  VT acc[C][NV];
  VT a[NV];
  for (int n = 0; n < NV; ++n) a[n] = V::Load(alpha + r0 + n * kW);
  for (int c = 0; c < C; ++c)
    for (int n = 0; n < NV; ++n) acc[c][n] = V::Mul(V::Load(ot + c * mp + r0 + n * kW), a[n]);
  const float* pp = pt + r0;
  for (int64_t j = 0; j < jn; ++j, pp += mp) {
    VT pv[NV];
    for (int n = 0; n < NV; ++n) pv[n] = V::Load(pp + n * kW);
    for (int c = 0; c < C; ++c) {
      const VT vb = V::Set1(v[j * vs + c]);
      for (int n = 0; n < NV; ++n) acc[c][n] = V::Fma(vb, pv[n], acc[c][n]);
    }
  }
  for (int c = 0; c < C; ++c)
    for (int n = 0; n < NV; ++n) V::Store(ot + c * mp + r0 + n * kW, acc[c][n]);
}

// Compile-time dispatch on the runtime (nv, c) of a ragged edge.
template <int NV, int C = kC>
inline void ScoreDispatchC(int c, const float* qt, int64_t mp, const float* k, int64_t ks,
                           int64_t d, float* st, int64_t r0) {
  if constexpr (C >= 1) {
    if (c == C) return ScoreBlock<NV, C>(qt, mp, k, ks, d, st, r0);
    ScoreDispatchC<NV, C - 1>(c, qt, mp, k, ks, d, st, r0);
  }
}
template <int NV = kMaxNV>
inline void ScoreDispatch(int nv, int c, const float* qt, int64_t mp, const float* k, int64_t ks,
                          int64_t d, float* st, int64_t r0) {
  if constexpr (NV >= 1) {
    if (nv == NV) return ScoreDispatchC<NV>(c, qt, mp, k, ks, d, st, r0);
    ScoreDispatch<NV - 1>(nv, c, qt, mp, k, ks, d, st, r0);
  }
}
template <int NV, int C = kC>
inline void PvDispatchC(int c, const float* pt, int64_t mp, const float* v, int64_t vs, int64_t jn,
                        const float* alpha, float* ot, int64_t r0) {
  if constexpr (C >= 1) {
    if (c == C) return PvBlock<NV, C>(pt, mp, v, vs, jn, alpha, ot, r0);
    PvDispatchC<NV, C - 1>(c, pt, mp, v, vs, jn, alpha, ot, r0);
  }
}
template <int NV = kMaxNV>
inline void PvDispatch(int nv, int c, const float* pt, int64_t mp, const float* v, int64_t vs,
                       int64_t jn, const float* alpha, float* ot, int64_t r0) {
  if constexpr (NV >= 1) {
    if (nv == NV) return PvDispatchC<NV>(c, pt, mp, v, vs, jn, alpha, ot, r0);
    PvDispatch<NV - 1>(nv, c, pt, mp, v, vs, jn, alpha, ot, r0);
  }
}

// St[j][r] (j < jn, r < mp) = Σ_d K[j0 + j][d] · Qt[d][r].
void ScoreTile(const float* qt, int64_t mp, const float* k, int64_t ks, int64_t jn, int64_t d,
               float* st) {
  const int64_t nvec = mp / kW;
  for (int64_t rv = 0; rv < nvec; rv += kMaxNV) {
    const int nv = static_cast<int>(std::min<int64_t>(kMaxNV, nvec - rv));
    int64_t j = 0;
    for (; j + kC <= jn; j += kC)
      ScoreDispatch(nv, kC, qt, mp, k + j * ks, ks, d, st + j * mp, rv * kW);
    if (j < jn)
      ScoreDispatch(nv, static_cast<int>(jn - j), qt, mp, k + j * ks, ks, d, st + j * mp, rv * kW);
  }
}

// Ot[d][r] = Ot[d][r] · alpha[r] + Σ_{j<jn} V[j][d] · Pt[j][r].
void PvTile(const float* pt, int64_t mp, const float* v, int64_t vs, int64_t jn, int64_t d,
            const float* alpha, float* ot) {
  const int64_t nvec = mp / kW;
  for (int64_t rv = 0; rv < nvec; rv += kMaxNV) {
    const int nv = static_cast<int>(std::min<int64_t>(kMaxNV, nvec - rv));
    int64_t c = 0;
    for (; c + kC <= d; c += kC)
      PvDispatch(nv, kC, pt, mp, v + c, vs, jn, alpha, ot + c * mp, rv * kW);
    if (c < d)
      PvDispatch(nv, static_cast<int>(d - c), pt, mp, v + c, vs, jn, alpha, ot + c * mp, rv * kW);
  }
}

// Sets St[j][r] = -inf where key j0 + j is past row r's last visible key
// limit[r] (limits stored as floats; exact below 2^24 keys).
void MaskTile(float* st, int64_t mp, int64_t jn, int64_t j0, const float* limit) {
  const VT neg_inf = V::Set1(kNegInf);
  for (int64_t j = 0; j < jn; ++j) {
    const VT key = V::Set1(static_cast<float>(j0 + j));
    for (int64_t r = 0; r < mp; r += kW) {
      V::Store(st + j * mp + r,
               V::SelectLt(V::Load(limit + r), key, V::Load(st + j * mp + r), neg_inf));
    }
  }
}

// Fills qt[dd][r] = scale · q of row r (r = gi · nq + qi: head g0 + gi,
// query q0 + qi) and zeroes the padded rows [m, mp).
void TransposeQ(const float* q, int64_t q_stride, int64_t head_dim, int64_t g0, int64_t ng,
                int64_t q0, int64_t nq, int64_t mp, float scale, float* qt) {
  for (int64_t gi = 0; gi < ng; ++gi) {
    for (int64_t qi = 0; qi < nq; ++qi) {
      const float* src = q + (q0 + qi) * q_stride + (g0 + gi) * head_dim;
      const int64_t r = gi * nq + qi;
      for (int64_t dd = 0; dd < head_dim; ++dd) qt[dd * mp + r] = src[dd] * scale;
    }
  }
  for (int64_t dd = 0; dd < head_dim; ++dd) {
    for (int64_t r = ng * nq; r < mp; ++r) qt[dd * mp + r] = 0.0f;
  }
}

}  // namespace

// ---------------------------------------------------------------------------

void RmsNorm(const float* x, int64_t x_stride, const float* weight, float* y, int64_t y_stride,
             int64_t rows, int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (rows * dim >= (1 << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_stride;
    float* yr = y + r * y_stride;
    // ggml: sum += (ggml_float)(x[i] * x[i]) with ggml_float = double.
    double sum = 0.0;
    int64_t i = 0;
#if defined(__AVX512F__)
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (; i + 16 <= dim; i += 16) {
      const __m512 v = _mm512_loadu_ps(xr + i);
      const __m512 sq = _mm512_mul_ps(v, v);
      s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(sq)));
      s1 = _mm512_add_pd(
          s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sq), 1))));
    }
    sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
#elif defined(__AVX2__)
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    for (; i + 8 <= dim; i += 8) {
      const __m256 v = _mm256_loadu_ps(xr + i);
      const __m256 sq = _mm256_mul_ps(v, v);
      s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
      s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
    }
    const __m256d s = _mm256_add_pd(s0, s1);
    alignas(32) double parts[4];
    _mm256_store_pd(parts, s);
    sum = (parts[0] + parts[1]) + (parts[2] + parts[3]);
#endif
    for (; i < dim; ++i) sum += static_cast<double>(xr[i] * xr[i]);
    const float mean = static_cast<float>(sum / static_cast<double>(dim));
    const float scale = 1.0f / std::sqrt(mean + eps);
    for (int64_t t = 0; t < dim; ++t) yr[t] = (xr[t] * scale) * weight[t];
  }
}

namespace {

// cos/sin of ggml's RoPE angles for one token position: theta_0 = pos,
// theta_{i+1} = theta_i * theta_scale, angle_i = freq_scale * theta_i,
// all in f32 in this order (cs[0..half) = cos, cs[half..2 half) = sin).
void RopeAngles(int32_t pos, int64_t half, float theta_scale, float freq_scale, float* cs) {
  float theta = static_cast<float>(pos);
  for (int64_t i = 0; i < half; ++i) {
    const float angle = freq_scale * theta;
    cs[i] = std::cos(angle);
    cs[half + i] = std::sin(angle);
    theta *= theta_scale;
  }
}

// The angles of positions [0, n) for one (base, scale, rot_dim), kept per
// calling thread: the chunk loop rotates the same positions 0..m+c in every
// layer of every step, and cos/sin cost more than the rotation itself.
// Entries are computed by RopeAngles, so results are the same with or
// without the table.
struct RopeTable {
  float freq_base = 0, freq_scale = 0;
  int64_t rot_dim = 0;
  int64_t size = 0;        // positions covered
  std::vector<float> cs;   // [size][rot_dim]
};
constexpr int32_t kRopeTableMax = 1 << 16;

const float* RopeTableFor(int64_t max_pos, int64_t rot_dim, float freq_base, float freq_scale,
                          float theta_scale) {
  thread_local RopeTable t;
  if (t.freq_base != freq_base || t.freq_scale != freq_scale || t.rot_dim != rot_dim) {
    t = RopeTable{freq_base, freq_scale, rot_dim, 0, {}};
  }
  if (max_pos >= t.size) {
    const int64_t n = std::min<int64_t>(kRopeTableMax, std::max<int64_t>(max_pos + 1, 2 * t.size));
    t.cs.resize(n * rot_dim);
    for (int64_t p = t.size; p < n; ++p) {
      RopeAngles(static_cast<int32_t>(p), rot_dim / 2, theta_scale, freq_scale, &t.cs[p * rot_dim]);
    }
    t.size = n;
  }
  return t.cs.data();
}

}  // namespace

void Rope(float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim, int64_t token_stride,
          const int32_t* pos, int64_t rot_dim, float freq_base, float freq_scale, bool neox) {
  assert(rot_dim % 2 == 0 && rot_dim <= head_dim);
  const int64_t half = rot_dim / 2;
  // ggml: theta_scale = powf(freq_base, -2.0f/n_dims); theta_0 = p;
  // theta_{i+1} = theta_i * theta_scale; cos/sin of freq_scale * theta_i.
  const float theta_scale = std::pow(freq_base, -2.0f / static_cast<float>(rot_dim));
  int32_t min_pos = 0, max_pos = 0;
  for (int64_t t = 0; t < num_tokens; ++t) {
    min_pos = std::min(min_pos, pos[t]);
    max_pos = std::max(max_pos, pos[t]);
  }
  const float* table = nullptr;
  if (min_pos >= 0 && max_pos < kRopeTableMax) {
    table = RopeTableFor(max_pos, rot_dim, freq_base, freq_scale, theta_scale);
  }
#pragma omp parallel if (num_tokens * num_heads * half >= (1 << 14))
  {
    std::vector<float> cs(table == nullptr ? 2 * half : 0);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t) {
      const float* cos_t;
      if (table != nullptr) {
        cos_t = table + static_cast<int64_t>(pos[t]) * rot_dim;
      } else {
        RopeAngles(pos[t], half, theta_scale, freq_scale, cs.data());
        cos_t = cs.data();
      }
      const float* sin_t = cos_t + half;
      for (int64_t h = 0; h < num_heads; ++h) {
        float* xh = x + t * token_stride + h * head_dim;
        if (neox) {
          float* a = xh;
          float* b = xh + half;
          for (int64_t i = 0; i < half; ++i) {
            const float x0 = a[i], x1 = b[i];
            a[i] = x0 * cos_t[i] - x1 * sin_t[i];
            b[i] = x0 * sin_t[i] + x1 * cos_t[i];
          }
        } else {
          for (int64_t i = 0; i < half; ++i) {
            const float x0 = xh[2 * i], x1 = xh[2 * i + 1];
            xh[2 * i] = x0 * cos_t[i] - x1 * sin_t[i];
            xh[2 * i + 1] = x0 * sin_t[i] + x1 * cos_t[i];
          }
        }
      }
    }
  }
}

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  constexpr int64_t kBlock = 4096;
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (num_blocks >= 8)
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t end = std::min(n, (b + 1) * kBlock);
    int64_t i = b * kBlock;
    const VT one = V::Set1(1.0f);
    const VT zero = V::Zero();
    for (; i + kW <= end; i += kW) {
      const VT g = V::Load(gate + i);
      const VT sig_den = V::Add(one, V::Exp(V::Sub(zero, g)));
      V::Store(out + i, V::Mul(V::Div(g, sig_den), V::Load(up + i)));
    }
    for (; i < end; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  }
}

namespace {

// Decoding (one query, every key visible), flash-decoding style: the keys
// are split into ranges, each (KV head, range) item runs its whole group of
// query heads over the range with an online softmax, and the partial results
// (max, sum, unnormalized output) are merged at the end. The tiled kernel
// above pads the group of 3 heads to a whole row vector (16 lanes) and
// splits work only over KV heads, which made a decode step's attention over
// an 800-key cache take 180 µs; here vector lanes run over head dims and
// tile keys instead, and every core gets work whatever the head count.
constexpr int64_t kDecodeTile = 64;
// Below this many keys × KV heads one decode attention runs on the calling
// thread (waking the team costs more). 1024: a 1,155-entry compressed cache
// (3 KV heads) is worth both cores (BM_DecodeAttention_Cpu: 3.3 ms per step
// on one thread, see docs/BENCHMARKS.md sitting 6).
constexpr int64_t kDecodeParallelKeys = 1024;

// max(init, x[0..n)): vector lanes first (a scalar max chain is bound by its
// latency: it cost a quarter of the decode attention's time).
float MaxOf(const float* x, int64_t n, float init) {
  float mx = init;
  int64_t i = 0;
  if (n >= kW) {
    VT vm = V::Load(x);
    for (i = kW; i + kW <= n; i += kW) vm = V::Max(vm, V::Load(x + i));
    alignas(64) float lanes[kW];
    V::Store(lanes, vm);
    for (float l : lanes) mx = std::max(mx, l);
  }
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  return mx;
}

// x[i] = exp(x[i] - mx) in place; returns their f32 sum (lanes, then the tail).
float ExpShiftInPlace(float* x, int64_t n, float mx) {
  const VT vmx = V::Set1(mx);
  VT vsum = V::Zero();
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {
    const VT p = V::Exp(V::Sub(V::Load(x + i), vmx));
    V::Store(x + i, p);
    vsum = V::Add(vsum, p);
  }
  float sum = V::ReduceAdd(vsum);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  return sum;
}

#if defined(__AVX512F__)
// Lane i of the result = the sum of the 16 lanes of a[i]. Two shuffle-add
// levels fold each group of four vectors {a[i], a[i+4], a[i+8], a[i+12]}
// into one vector of four 4-lane partial sums (128-bit block b holds
// a[i + 4b]'s); a 4x4 transpose-add per block then finishes, so lane 4b + i
// is a[i + 4b]'s total. About 2 shuffles per sum instead of 4.
inline __m512 Sum16(const __m512 a[16]) {
  __m512 u[4];
  for (int i = 0; i < 4; ++i) {
    const __m512 x = a[i], y = a[i + 4], z = a[i + 8], w = a[i + 12];
    const __m512 t0 = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 t1 = _mm512_add_ps(_mm512_shuffle_f32x4(z, w, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_f32x4(z, w, _MM_SHUFFLE(3, 2, 3, 2)));
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t0, t1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(t0, t1, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(u[0], u[1]), _mm512_unpackhi_ps(u[0], u[1]));
  const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(u[2], u[3]), _mm512_unpackhi_ps(u[2], u[3]));
  const __m512d d01 = _mm512_castps_pd(s01), d23 = _mm512_castps_pd(s23);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(d01, d23)),
                       _mm512_castpd_ps(_mm512_unpackhi_pd(d01, d23)));
}
#endif

struct DecodePartial {
  float max, sum;  // running max and Σ exp(s - max) of one query head over a range
};

// Keys [j0, j1) of one KV head for the `group` query heads at q (already
// scaled; head g at qs + g * head_dim). Writes part[g] and o[g * head_dim + dd]
// (Σ_j exp(s_j - max) v_j). s: scratch of group * kDecodeTile floats.
void DecodeRange(const float* qs, const float* kh, const float* vh, int64_t ks, int64_t j0,
                 int64_t j1, int64_t group, int64_t head_dim, float* s, DecodePartial* part,
                 float* o) {
  const int64_t dv = head_dim / kW * kW;  // vectorized dims; the rest scalar
  for (int64_t g = 0; g < group; ++g) {
    part[g] = {kNegInf, 0.0f};
    std::fill(o + g * head_dim, o + (g + 1) * head_dim, 0.0f);
  }
  for (int64_t t0 = j0; t0 < j1; t0 += kDecodeTile) {
    const int64_t tn = std::min(kDecodeTile, j1 - t0);
    // Scores.
    for (int64_t j = 0; j < tn; ++j) {
      const float* kj = kh + (t0 + j) * ks;
      for (int64_t dd = 0; dd < head_dim; dd += 16) {
        __builtin_prefetch(kj + 8 * ks + dd);
        __builtin_prefetch(vh + (t0 + j + 8) * ks + dd);
      }
    }
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = qs + g * head_dim;
      float* sg = s + g * kDecodeTile;
      int64_t j = 0;
#if defined(__AVX512F__)
      if (head_dim == 64) {
        const __m512 q0 = _mm512_loadu_ps(qg), q1 = _mm512_loadu_ps(qg + 16),
                     q2 = _mm512_loadu_ps(qg + 32), q3 = _mm512_loadu_ps(qg + 48);
        for (; j + 16 <= tn; j += 16) {
          __m512 acc[16];
          for (int c = 0; c < 16; ++c) {
            const float* kj = kh + (t0 + j + c) * ks;
            __m512 a = _mm512_mul_ps(q0, _mm512_loadu_ps(kj));
            __m512 b = _mm512_mul_ps(q1, _mm512_loadu_ps(kj + 16));
            a = _mm512_fmadd_ps(q2, _mm512_loadu_ps(kj + 32), a);
            b = _mm512_fmadd_ps(q3, _mm512_loadu_ps(kj + 48), b);
            acc[c] = _mm512_add_ps(a, b);
          }
          _mm512_storeu_ps(sg + j, Sum16(acc));
        }
      }
#endif
      for (; j < tn; ++j) {
        const float* kj = kh + (t0 + j) * ks;
        VT acc = V::Zero();
        int64_t dd = 0;
        for (; dd < dv; dd += kW) acc = V::Fma(V::Load(qg + dd), V::Load(kj + dd), acc);
        float sc = V::ReduceAdd(acc);
        for (; dd < head_dim; ++dd) sc += qg[dd] * kj[dd];
        sg[j] = sc;
      }
    }
    // Online softmax and the weighted sum of values, per query head.
    for (int64_t g = 0; g < group; ++g) {
      float* sg = s + g * kDecodeTile;
      const float mx = MaxOf(sg, tn, part[g].max);
      const float sum = ExpShiftInPlace(sg, tn, mx);
      const float alpha = part[g].max == kNegInf ? 0.0f : std::exp(part[g].max - mx);
      part[g] = {mx, part[g].sum * alpha + sum};
      float* og = o + g * head_dim;
      int64_t d0 = 0;
      // Four dim vectors at a time, even and odd keys in separate
      // accumulators: 8 independent FMA chains.
      for (; d0 + 4 * kW <= dv; d0 += 4 * kW) {
        VT a0[4], a1[4];
        for (int i = 0; i < 4; ++i) {
          a0[i] = V::Mul(V::Load(og + d0 + i * kW), V::Set1(alpha));
          a1[i] = V::Zero();
        }
        const float* vp = vh + t0 * ks + d0;
        int64_t jj = 0;
        for (; jj + 2 <= tn; jj += 2, vp += 2 * ks) {
          const VT p0 = V::Set1(sg[jj]), p1 = V::Set1(sg[jj + 1]);
          for (int i = 0; i < 4; ++i) {
            a0[i] = V::Fma(p0, V::Load(vp + i * kW), a0[i]);
            a1[i] = V::Fma(p1, V::Load(vp + ks + i * kW), a1[i]);
          }
        }
        if (jj < tn) {
          const VT p0 = V::Set1(sg[jj]);
          for (int i = 0; i < 4; ++i) a0[i] = V::Fma(p0, V::Load(vp + i * kW), a0[i]);
        }
        for (int i = 0; i < 4; ++i) V::Store(og + d0 + i * kW, V::Add(a0[i], a1[i]));
      }
      for (; d0 < dv; d0 += kW) {
        VT acc = V::Mul(V::Load(og + d0), V::Set1(alpha));
        for (int64_t jj = 0; jj < tn; ++jj) {
          acc = V::Fma(V::Set1(sg[jj]), V::Load(vh + (t0 + jj) * ks + d0), acc);
        }
        V::Store(og + d0, acc);
      }
      for (int64_t dd = dv; dd < head_dim; ++dd) {
        float acc = og[dd] * alpha;
        for (int64_t jj = 0; jj < tn; ++jj) acc += sg[jj] * vh[(t0 + jj) * ks + dd];
        og[dd] = acc;
      }
    }
  }
}

void AttentionDecode(const float* q, const float* k, const float* v, int64_t kv_head_stride,
                     int64_t kv_key_stride, float* out, int64_t num_keys, int64_t num_heads,
                     int64_t num_kv_heads, int64_t head_dim, float scale) {
  const int64_t group = num_heads / num_kv_heads;
  // Ranges of at least 512 keys, at most 16 per KV head: a function of the
  // shape only, so the result does not depend on the thread count.
  const int64_t splits = std::clamp<int64_t>(num_keys / 512, 1, 16);
  const int64_t range = RoundUp((num_keys + splits - 1) / splits, kDecodeTile);
  const int64_t num_items = num_kv_heads * splits;
  std::vector<float> qs(num_heads * head_dim);
  for (int64_t i = 0; i < num_heads * head_dim; ++i) qs[i] = q[i] * scale;
  std::vector<DecodePartial> parts(num_items * group);
  std::vector<float> partial_out(num_items * group * head_dim);
#pragma omp parallel if (num_items > 1 && num_keys * num_kv_heads >= kDecodeParallelKeys)
  {
    std::vector<float> s(group * kDecodeTile);
#pragma omp for schedule(static)
    for (int64_t item = 0; item < num_items; ++item) {
      const int64_t kvh = item / splits, sp = item % splits;
      const int64_t j0 = std::min(num_keys, sp * range), j1 = std::min(num_keys, j0 + range);
      DecodeRange(qs.data() + kvh * group * head_dim, k + kvh * kv_head_stride,
                  v + kvh * kv_head_stride, kv_key_stride, j0, j1, group, head_dim, s.data(),
                  parts.data() + item * group, partial_out.data() + item * group * head_dim);
    }
  }
  // Merge the ranges of each query head (in range order, so the result does
  // not depend on the thread count).
  for (int64_t kvh = 0; kvh < num_kv_heads; ++kvh) {
    for (int64_t g = 0; g < group; ++g) {
      float mx = kNegInf;
      for (int64_t sp = 0; sp < splits; ++sp) mx = std::max(mx, parts[(kvh * splits + sp) * group + g].max);
      float* dst = out + (kvh * group + g) * head_dim;
      std::fill(dst, dst + head_dim, 0.0f);
      float sum = 0.0f;
      for (int64_t sp = 0; sp < splits; ++sp) {
        const int64_t item = kvh * splits + sp;
        const DecodePartial& p = parts[item * group + g];
        if (p.max == kNegInf) continue;  // an empty range
        const float w = std::exp(p.max - mx);
        sum += p.sum * w;
        const float* src = partial_out.data() + (item * group + g) * head_dim;
        for (int64_t dd = 0; dd < head_dim; ++dd) dst[dd] += w * src[dd];
      }
      const float inv = 1.0f / sum;
      for (int64_t dd = 0; dd < head_dim; ++dd) dst[dd] *= inv;
    }
  }
}


// ---------------------------------------------------------------------------
// AMX-BF16 prefill attention (head_dim 64, where the CPU has AMX-BF16): the
// same items as the f32 path, the two products on the tile unit.
//
// Per call, K and V of every KV head are converted once (all threads) into
// tile operands: K as B tiles of Q·Kᵀ (per 16 keys and 32 dims: row p holds
// dims (2p, 2p+1) of the 16 keys, a 16 × 16 dword transpose) and V as B
// tiles of P·V (per 32 keys and 16 dims: row p holds keys (2p, 2p+1) of the
// 16 dims). Per item, the query rows (scaled) become bf16 A tiles, and each
// group of 16 rows makes one pass over its visible keys, per 32 keys:
// S = Q·Kᵀ (4 tile ops), masked; P = exp(S − μ) in f32 (row sums from it),
// rounded to bf16 as an A tile; O += P·V (4 tile ops, O in 4 tiles over all
// keys). μ is each row's max so far, updated lazily (AmxAttentionRows), so O
// leaves the tiles only when a row's scores jump.
// Numerics: bf16 q·scale, k, v and p, exact products, f32 sums (ref
// twin: ref::AttentionBf16, which takes p against the exact max: the same
// values up to one f32 rescale and the bf16 rounding of scaled p).
#if defined(__AVX512F__) && defined(__x86_64__) && defined(__GNUC__)
#define SNAPFILL_ATTN_AMX 1
#define SNAPFILL_ATTN_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512bf16,avx512bw,avx512vl,avx512dq")))

constexpr int64_t kAmxHeadDim = 64;

// 32 f32 at p as 32 bf16 (vcvtne2ps2bf16).
SNAPFILL_ATTN_AMX_TARGET inline __m512i Bf16x32(const float* p) {
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p)));
}

// K tiles of keys [16·kb, 16·kb + 16) of one KV head: 2 × 1 KiB (dims 0-31,
// 32-63); keys >= num_keys are zero.
SNAPFILL_ATTN_AMX_TARGET void PackKTiles(const float* kh, int64_t ks, int64_t kb, int64_t num_keys, uint8_t* out) {
  __m512i v[2][16];
  for (int j = 0; j < 16; ++j) {
    const int64_t key = kb * 16 + j;
    for (int t = 0; t < 2; ++t) v[t][j] = key < num_keys ? Bf16x32(kh + key * ks + 32 * t) : _mm512_setzero_si512();
  }
  for (int t = 0; t < 2; ++t) {
    __m512i o[16];
    internal::Transpose16x16Dwords(v[t], o);
    for (int p = 0; p < 16; ++p) _mm512_storeu_si512(out + t * 1024 + p * 64, o[p]);
  }
}

// V tiles of keys [32·kb, 32·kb + 32) of one KV head: 4 × 1 KiB (dims
// 16t..16t+15), row p = words (v[2p][d], v[2p+1][d]) for the 16 dims.
// Word i of a V tile row, from the 16-dim half h of two 32-dim key vectors
// a and b: even i from a, odd i from b, dim 16h + i/2 (vpermt2w indices).
struct alignas(64) VPairIndex {
  uint16_t ix[2][32];
  constexpr VPairIndex() : ix() {
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < 32; ++i) ix[h][i] = static_cast<uint16_t>((i % 2 ? 32 : 0) + 16 * h + i / 2);
    }
  }
};
constexpr VPairIndex kVPairIndex;

SNAPFILL_ATTN_AMX_TARGET void PackVTiles(const float* vh, int64_t vs, int64_t kb, int64_t num_keys, uint8_t* out) {
  const __m512i idx[2] = {_mm512_load_si512(kVPairIndex.ix[0]), _mm512_load_si512(kVPairIndex.ix[1])};
  for (int p = 0; p < 16; ++p) {
    const int64_t k0 = kb * 32 + 2 * p, k1 = k0 + 1;
    for (int c = 0; c < 2; ++c) {  // dims 32c..32c+31
      const __m512i a = k0 < num_keys ? Bf16x32(vh + k0 * vs + 32 * c) : _mm512_setzero_si512();
      const __m512i b = k1 < num_keys ? Bf16x32(vh + k1 * vs + 32 * c) : _mm512_setzero_si512();
      for (int h = 0; h < 2; ++h) {
        _mm512_storeu_si512(out + (2 * c + h) * 1024 + p * 64, _mm512_permutex2var_epi16(a, idx[h], b));
      }
    }
  }
}

struct AmxAttnArgs {
  const uint8_t* kt;   // this KV head's K tiles, [16-key block][2][1024]
  const uint8_t* vt;   // V tiles, [32-key block][4][1024]
  const uint16_t* qb;  // 16 rows × 64 bf16 (scaled queries)
  const float* limit;  // last visible key of each of the 16 rows
  float* out_rows;     // 16 rows × 64 f32 (normalized)
};

// exp(x) for a probability about to be rounded to bf16 (8 significant bits):
// x = n·ln2 + r, |r| <= ln2/2, and e^r by its Taylor polynomial of degree 4
// (relative error below r^5/120 = 4.2e-5, against bf16's 2^-9 half step),
// so 10 vector ops instead of Vec::Exp's 17. 0 below -87 and for -inf (masked
// scores); x is at most kAmxMaxSlack here.
SNAPFILL_ATTN_AMX_TARGET inline __m512 ExpForBf16(__m512 x) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpZeroBelow), _CMP_GE_OQ);
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693147180559945f), x);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.0f / 24.0f), r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

// Scores may exceed the max used for the probabilities by this much (in
// natural-log units: p <= e^8 ~ 2981, far inside f32 and bf16) before the
// rows concerned are rescaled.
constexpr float kAmxMaxSlack = 8.0f;

// One group of 16 rows over keys [0, key_end), in one pass with a lazily
// updated max: the running O stays in tiles 0-3 and is only stored, rescaled
// and reloaded when a row's scores rise more than kAmxMaxSlack above the max
// its probabilities use (rare after the first block; per row, so a row's
// result does not depend on the other rows of its group).
// Tiles: O 0-3, Q 4-5 (dims 0-31, 32-63), S then P 6, K then V 7.
SNAPFILL_ATTN_AMX_TARGET void AmxAttentionRows(const AmxAttnArgs& a, int64_t key_end, float min_limit) {
  alignas(64) float st[16 * 32];
  alignas(64) uint16_t pb[16 * 32];
  alignas(64) float ob[16 * 64];
  __m512 lim[16], sum[16];
  float mu[16];  // the max each row's probabilities are taken against
  for (int r = 0; r < 16; ++r) {
    lim[r] = _mm512_set1_ps(a.limit[r]);
    sum[r] = _mm512_setzero_ps();
  }
  const __m512 lane = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  auto mask = [&](float* row, int r, int64_t key0) {  // -inf past the row's limit
    const __m512 keys = _mm512_add_ps(lane, _mm512_set1_ps(static_cast<float>(key0)));
    const __mmask16 past = _mm512_cmp_ps_mask(lim[r], keys, _CMP_LT_OQ);
    _mm512_storeu_ps(row, _mm512_mask_mov_ps(_mm512_loadu_ps(row), past, _mm512_set1_ps(kNegInf)));
  };
  SNAPFILL_TILE_LOAD(4, a.qb, 128);
  SNAPFILL_TILE_LOAD(5, a.qb + 32, 128);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int64_t nkb32 = (key_end + 31) / 32;
  for (int64_t kb = 0; kb < nkb32; ++kb) {
    for (int h = 0; h < 2; ++h) {  // S of keys 32kb + 16h .. + 15
      const uint8_t* kt = a.kt + (2 * kb + h) * 2048;
      _tile_zero(6);
      SNAPFILL_TILE_LOAD(7, kt, 64);
      _tile_dpbf16ps(6, 4, 7);
      SNAPFILL_TILE_LOAD(7, kt + 1024, 64);
      _tile_dpbf16ps(6, 5, 7);
      SNAPFILL_TILE_STORE(6, st + 16 * h, 128);
    }
    const bool masked = static_cast<float>(kb * 32 + 31) > min_limit;
    float bm[16];
    uint32_t rescale = 0;  // bit r: row r's scores rose past mu[r] + slack
    for (int r = 0; r < 16; ++r) {
      float* row = st + 32 * r;
      if (masked) {
        mask(row, r, kb * 32);
        mask(row + 16, r, kb * 32 + 16);
      }
      const __m512 hi = _mm512_max_ps(_mm512_load_ps(row), _mm512_load_ps(row + 16));
      if (kb == 0) {
        mu[r] = _mm512_reduce_max_ps(hi);  // every row sees key 0; O and the sums are still zero
      } else if (_mm512_cmp_ps_mask(hi, _mm512_set1_ps(mu[r] + kAmxMaxSlack), _CMP_GT_OQ) != 0) {
        bm[r] = _mm512_reduce_max_ps(hi);  // the exact max only when it is needed
        rescale |= 1u << r;
      }
    }
    if (rescale != 0) {
      SNAPFILL_TILE_STORE(0, ob, 256);
      SNAPFILL_TILE_STORE(1, ob + 16, 256);
      SNAPFILL_TILE_STORE(2, ob + 32, 256);
      SNAPFILL_TILE_STORE(3, ob + 48, 256);
      for (int r = 0; r < 16; ++r) {
        if (!((rescale >> r) & 1)) continue;
        const __m512 f = _mm512_set1_ps(std::exp(mu[r] - bm[r]));
        sum[r] = _mm512_mul_ps(sum[r], f);
        for (int c = 0; c < 4; ++c) {
          _mm512_store_ps(ob + 64 * r + 16 * c, _mm512_mul_ps(_mm512_load_ps(ob + 64 * r + 16 * c), f));
        }
        mu[r] = bm[r];
      }
      SNAPFILL_TILE_LOAD(0, ob, 256);
      SNAPFILL_TILE_LOAD(1, ob + 16, 256);
      SNAPFILL_TILE_LOAD(2, ob + 32, 256);
      SNAPFILL_TILE_LOAD(3, ob + 48, 256);
    }
    for (int r = 0; r < 16; ++r) {
      const float* row = st + 32 * r;
      const __m512 m = _mm512_set1_ps(mu[r]);
      const __m512 p0 = ExpForBf16(_mm512_sub_ps(_mm512_load_ps(row), m));
      const __m512 p1 = ExpForBf16(_mm512_sub_ps(_mm512_load_ps(row + 16), m));
      sum[r] = _mm512_add_ps(sum[r], _mm512_add_ps(p0, p1));
      _mm512_store_si512(pb + 32 * r, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p1, p0)));
    }
    SNAPFILL_TILE_LOAD(6, pb, 64);
    const uint8_t* vt = a.vt + kb * 4096;
    SNAPFILL_TILE_LOAD(7, vt, 64);
    _tile_dpbf16ps(0, 6, 7);
    SNAPFILL_TILE_LOAD(7, vt + 1024, 64);
    _tile_dpbf16ps(1, 6, 7);
    SNAPFILL_TILE_LOAD(7, vt + 2048, 64);
    _tile_dpbf16ps(2, 6, 7);
    SNAPFILL_TILE_LOAD(7, vt + 3072, 64);
    _tile_dpbf16ps(3, 6, 7);
  }
  SNAPFILL_TILE_STORE(0, ob, 256);
  SNAPFILL_TILE_STORE(1, ob + 16, 256);
  SNAPFILL_TILE_STORE(2, ob + 32, 256);
  SNAPFILL_TILE_STORE(3, ob + 48, 256);
  for (int r = 0; r < 16; ++r) {
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum[r]));
    for (int c = 0; c < 4; ++c) {
      _mm512_storeu_ps(a.out_rows + 64 * r + 16 * c, _mm512_mul_ps(_mm512_load_ps(ob + 64 * r + 16 * c), inv));
    }
  }
}

// The same pass on the vector units, for CPUs with AVX512-BF16 and no AMX:
// vdpbf16ps (16 f32 lanes, each += the products of one pair of bf16) on the
// tile operands above. S = Q·Kᵀ: a K tile row p is dims (2p, 2p+1) of 16 keys,
// so with the lanes as keys each row's S is 32 vdpbf16ps per 16 keys, against
// the row's query pair p broadcast. O += P·V: a V tile row p is keys (2p,
// 2p+1) of 16 dims, so with the lanes as dims each row's O is 4 × 16
// vdpbf16ps per 32 keys, against its probability pair p broadcast. O stays
// in L1 (16 rows × 64 f32) and is rescaled there when a row's max moves.
// Same operands, masks, lazily updated max and exp as AmxAttentionRows;
// only the f32 summation order of the products differs.
#define SNAPFILL_ATTN_BF16_TARGET __attribute__((target("avx512bf16,avx512bw,avx512vl,avx512dq")))

// Rows of S at a time in Q·Kᵀ (2 accumulators each: keys 0-15, 16-31), rows
// of O in P·V (4 accumulators each: dims 0-63).
constexpr int kBf16ScoreRows = 8, kBf16PvRows = 4;

SNAPFILL_ATTN_BF16_TARGET void Avx512Bf16AttentionRows(const AmxAttnArgs& a, int64_t key_end, float min_limit) {
  alignas(64) float st[16 * 32];
  alignas(64) uint16_t pb[16 * 32];
  alignas(64) float ob[16 * 64];
  std::fill(ob, ob + 16 * 64, 0.0f);
  __m512 lim[16], sum[16];
  float mu[16];
  for (int r = 0; r < 16; ++r) {
    lim[r] = _mm512_set1_ps(a.limit[r]);
    sum[r] = _mm512_setzero_ps();
  }
  const __m512 lane = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  auto mask = [&](float* row, int r, int64_t key0) {  // -inf past the row's limit
    const __m512 keys = _mm512_add_ps(lane, _mm512_set1_ps(static_cast<float>(key0)));
    const __mmask16 past = _mm512_cmp_ps_mask(lim[r], keys, _CMP_LT_OQ);
    _mm512_storeu_ps(row, _mm512_mask_mov_ps(_mm512_loadu_ps(row), past, _mm512_set1_ps(kNegInf)));
  };
  const auto* q32 = reinterpret_cast<const int32_t*>(a.qb);  // row r, dims pair p at [32 r + p]
  const auto* p32 = reinterpret_cast<const int32_t*>(pb);    // row r, keys pair p at [16 r + p]
  const int64_t nkb32 = (key_end + 31) / 32;
  for (int64_t kb = 0; kb < nkb32; ++kb) {
    const uint8_t* kt = a.kt + 2 * kb * 2048;  // 64 dims pairs × 64 bytes, keys 0-15 then 16-31
    for (int r0 = 0; r0 < 16; r0 += kBf16ScoreRows) {
      __m512 acc[kBf16ScoreRows][2];
      for (int r = 0; r < kBf16ScoreRows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
      for (int p = 0; p < 32; ++p) {
        const __m512bh k0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(kt + 64 * p));
        const __m512bh k1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(kt + 2048 + 64 * p));
        for (int r = 0; r < kBf16ScoreRows; ++r) {
          const __m512bh qp = reinterpret_cast<__m512bh>(_mm512_set1_epi32(q32[32 * (r0 + r) + p]));
          acc[r][0] = _mm512_dpbf16_ps(acc[r][0], k0, qp);
          acc[r][1] = _mm512_dpbf16_ps(acc[r][1], k1, qp);
        }
      }
      for (int r = 0; r < kBf16ScoreRows; ++r) {
        _mm512_store_ps(st + 32 * (r0 + r), acc[r][0]);
        _mm512_store_ps(st + 32 * (r0 + r) + 16, acc[r][1]);
      }
    }
    const bool masked = static_cast<float>(kb * 32 + 31) > min_limit;
    for (int r = 0; r < 16; ++r) {
      float* row = st + 32 * r;
      if (masked) {
        mask(row, r, kb * 32);
        mask(row + 16, r, kb * 32 + 16);
      }
      const __m512 hi = _mm512_max_ps(_mm512_load_ps(row), _mm512_load_ps(row + 16));
      if (kb == 0) {
        mu[r] = _mm512_reduce_max_ps(hi);  // every row sees key 0; O and the sums are still zero
      } else if (_mm512_cmp_ps_mask(hi, _mm512_set1_ps(mu[r] + kAmxMaxSlack), _CMP_GT_OQ) != 0) {
        const float bm = _mm512_reduce_max_ps(hi);  // the exact max only when it is needed
        const __m512 f = _mm512_set1_ps(std::exp(mu[r] - bm));
        sum[r] = _mm512_mul_ps(sum[r], f);
        for (int c = 0; c < 4; ++c) {
          _mm512_store_ps(ob + 64 * r + 16 * c, _mm512_mul_ps(_mm512_load_ps(ob + 64 * r + 16 * c), f));
        }
        mu[r] = bm;
      }
      const __m512 m = _mm512_set1_ps(mu[r]);
      const __m512 p0 = ExpForBf16(_mm512_sub_ps(_mm512_load_ps(row), m));
      const __m512 p1 = ExpForBf16(_mm512_sub_ps(_mm512_load_ps(row + 16), m));
      sum[r] = _mm512_add_ps(sum[r], _mm512_add_ps(p0, p1));
      _mm512_store_si512(pb + 32 * r, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p1, p0)));
    }
    const uint8_t* vt = a.vt + kb * 4096;  // 4 dims tiles × 16 key pairs × 64 bytes
    for (int r0 = 0; r0 < 16; r0 += kBf16PvRows) {
      __m512 o[kBf16PvRows][4];
      for (int r = 0; r < kBf16PvRows; ++r)
        for (int c = 0; c < 4; ++c) o[r][c] = _mm512_load_ps(ob + 64 * (r0 + r) + 16 * c);
      for (int p = 0; p < 16; ++p) {
        __m512bh vv[4];
        for (int c = 0; c < 4; ++c) vv[c] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(vt + 1024 * c + 64 * p));
        for (int r = 0; r < kBf16PvRows; ++r) {
          const __m512bh pp = reinterpret_cast<__m512bh>(_mm512_set1_epi32(p32[16 * (r0 + r) + p]));
          for (int c = 0; c < 4; ++c) o[r][c] = _mm512_dpbf16_ps(o[r][c], vv[c], pp);
        }
      }
      for (int r = 0; r < kBf16PvRows; ++r)
        for (int c = 0; c < 4; ++c) _mm512_store_ps(ob + 64 * (r0 + r) + 16 * c, o[r][c]);
    }
  }
  for (int r = 0; r < 16; ++r) {
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum[r]));
    for (int c = 0; c < 4; ++c) {
      _mm512_storeu_ps(a.out_rows + 64 * r + 16 * c, _mm512_mul_ps(_mm512_load_ps(ob + 64 * r + 16 * c), inv));
    }
  }
}

// Per-call tile operands (grown, never shrunk; one set per calling thread).
struct AmxAttnScratch {
  std::vector<uint8_t> kt, vt;
};
AmxAttnScratch& CallerAttnScratch() {
  static thread_local AmxAttnScratch s;
  return s;
}

// kAmx: the rows on the tile unit (AmxAttentionRows); else on AVX512-BF16
// (Avx512Bf16AttentionRows, which touches no tile state).
template <bool kAmx>
SNAPFILL_ATTN_AMX_TARGET void AttentionBf16Tiles(const float* q, int64_t q_stride, const float* k, const float* v,
                                                int64_t kv_head_stride, int64_t kv_key_stride, float* out,
                                                int64_t out_stride, int64_t num_q, int64_t num_keys,
                                                int64_t num_heads, int64_t num_kv_heads, float scale) {
  constexpr int64_t d = kAmxHeadDim;
  const int64_t group = num_heads / num_kv_heads;
  const int64_t nkb16 = (num_keys + 31) / 32 * 2;  // whole 32-key blocks
  const int64_t nkb32 = nkb16 / 2;
  const int64_t kt_head = nkb16 * 2048, vt_head = nkb32 * 4096;
  AmxAttnScratch& sc = CallerAttnScratch();
  if (sc.kt.size() < static_cast<size_t>(num_kv_heads * kt_head)) sc.kt.resize(num_kv_heads * kt_head);
  if (sc.vt.size() < static_cast<size_t>(num_kv_heads * vt_head)) sc.vt.resize(num_kv_heads * vt_head);
  uint8_t* const kt = sc.kt.data();
  uint8_t* const vt = sc.vt.data();
  // Items as in the f32 path: ~64 rows (query heads × queries) per item.
  const int64_t bq = std::min(num_q, std::max<int64_t>(1, 64 / group));
  const int64_t num_qb = (num_q + bq - 1) / bq;
  const int64_t num_items = num_kv_heads * num_qb;
  const int64_t memory = num_keys - num_q;
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < num_kv_heads * nkb16; ++i) {
      const int64_t h = i / nkb16, kb = i % nkb16;
      PackKTiles(k + h * kv_head_stride, kv_key_stride, kb, num_keys, kt + h * kt_head + kb * 2048);
    }
#pragma omp for schedule(static)
    for (int64_t i = 0; i < num_kv_heads * nkb32; ++i) {
      const int64_t h = i / nkb32, kb = i % nkb32;
      PackVTiles(v + h * kv_head_stride, kv_key_stride, kb, num_keys, vt + h * vt_head + kb * 4096);
    }
    const int64_t mp = RoundUp(group * bq, 16);
    std::vector<uint16_t> qb(mp * d);
    std::vector<float> limit(mp), orows(mp * d);
    if constexpr (kAmx) internal::ConfigureBf16Tiles();
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < num_items; ++item) {
      const int64_t qblk = num_qb - 1 - item / num_kv_heads;  // later blocks see more keys: first
      const int64_t kvh = item % num_kv_heads;
      const int64_t q0 = qblk * bq, nq = std::min(bq, num_q - q0);
      const int64_t m = group * nq, g0 = kvh * group;
      for (int64_t r = 0; r < mp; ++r) {
        uint16_t* dst = qb.data() + r * d;
        if (r >= m) {
          std::fill(dst, dst + d, uint16_t{0});
          limit[r] = static_cast<float>(num_keys - 1);  // padded rows see every key
          continue;
        }
        const int64_t gi = r / nq, qi = r % nq;
        const float* src = q + (q0 + qi) * q_stride + (g0 + gi) * d;
        for (int c = 0; c < 2; ++c) {
          const __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(src + 32 * c), _mm512_set1_ps(scale));
          const __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(src + 32 * c + 16), _mm512_set1_ps(scale));
          _mm512_storeu_si512(dst + 32 * c, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
        }
        limit[r] = static_cast<float>(memory + q0 + qi);
      }
      for (int64_t r0 = 0; r0 < mp; r0 += 16) {
        float lo = limit[r0], hi = limit[r0];
        for (int r = 1; r < 16; ++r) {
          lo = std::min(lo, limit[r0 + r]);
          hi = std::max(hi, limit[r0 + r]);
        }
        AmxAttnArgs a;
        a.kt = kt + kvh * kt_head;
        a.vt = vt + kvh * vt_head;
        a.qb = qb.data() + r0 * d;
        a.limit = limit.data() + r0;
        a.out_rows = orows.data() + r0 * d;
        if constexpr (kAmx) {
          AmxAttentionRows(a, static_cast<int64_t>(hi) + 1, lo);
        } else {
          Avx512Bf16AttentionRows(a, static_cast<int64_t>(hi) + 1, lo);
        }
      }
      for (int64_t r = 0; r < m; ++r) {
        const int64_t gi = r / nq, qi = r % nq;
        std::copy(orows.data() + r * d, orows.data() + (r + 1) * d, out + (q0 + qi) * out_stride + (g0 + gi) * d);
      }
    }
    if constexpr (kAmx) internal::ReleaseBf16Tiles();
  }
}
#else
#define SNAPFILL_ATTN_AMX 0
#endif

}  // namespace

namespace {
std::atomic<int> g_attention_impl{static_cast<int>(AttentionImpl::kAuto)};
}  // namespace

void SetAttentionImplForTesting(AttentionImpl impl) {
  g_attention_impl.store(static_cast<int>(impl), std::memory_order_relaxed);
}

bool AttentionHasAmx() {
#if SNAPFILL_ATTN_AMX
  return g_attention_impl.load(std::memory_order_relaxed) == static_cast<int>(AttentionImpl::kAuto) &&
         internal::AmxBf16Available();
#else
  return false;
#endif
}

bool AttentionHasAvx512Bf16() {
#if SNAPFILL_ATTN_AMX
  static const bool cpu_has = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const int impl = g_attention_impl.load(std::memory_order_relaxed);
  return cpu_has && (impl == static_cast<int>(AttentionImpl::kAvx512Bf16) ||
                     (impl == static_cast<int>(AttentionImpl::kAuto) && !internal::AmxBf16Available()));
#else
  return false;
#endif
}

void Attention(const float* q, int64_t q_stride, const float* k, const float* v,
               int64_t kv_head_stride, int64_t kv_key_stride, float* out, int64_t out_stride,
               int64_t num_q, int64_t num_keys, int64_t num_heads, int64_t num_kv_heads,
               int64_t head_dim, float scale) {
#if SNAPFILL_ATTN_AMX
  if (num_q > 1 && head_dim == kAmxHeadDim && AttentionHasAmx()) {
    assert(num_kv_heads > 0 && num_heads % num_kv_heads == 0 && num_keys >= num_q);
    AttentionBf16Tiles<true>(q, q_stride, k, v, kv_head_stride, kv_key_stride, out, out_stride, num_q, num_keys,
                             num_heads, num_kv_heads, scale);
    return;
  }
  if (num_q > 1 && head_dim == kAmxHeadDim && AttentionHasAvx512Bf16()) {
    assert(num_kv_heads > 0 && num_heads % num_kv_heads == 0 && num_keys >= num_q);
    AttentionBf16Tiles<false>(q, q_stride, k, v, kv_head_stride, kv_key_stride, out, out_stride, num_q, num_keys,
                              num_heads, num_kv_heads, scale);
    return;
  }
#endif
  AttentionF32(q, q_stride, k, v, kv_head_stride, kv_key_stride, out, out_stride, num_q, num_keys, num_heads,
               num_kv_heads, head_dim, scale);
}

void AttentionF32(const float* q, int64_t q_stride, const float* k, const float* v,
                  int64_t kv_head_stride, int64_t kv_key_stride, float* out, int64_t out_stride,
                  int64_t num_q, int64_t num_keys, int64_t num_heads, int64_t num_kv_heads,
                  int64_t head_dim, float scale) {
  assert(num_kv_heads > 0 && num_heads % num_kv_heads == 0);
  assert(num_q >= 0 && num_keys >= num_q);
  if (num_q == 0) return;
  if (num_q == 1) {
    AttentionDecode(q, k, v, kv_head_stride, kv_key_stride, out, num_keys, num_heads,
                    num_kv_heads, head_dim, scale);
    return;
  }
  const int64_t group = num_heads / num_kv_heads;
  // About 64 score rows per item (4 AVX-512 row vectors): the whole group of
  // query heads shares each K/V tile, and so do bq queries of each head.
  const int64_t bq = std::min(num_q, std::max<int64_t>(1, 64 / group));
  const int64_t num_qb = (num_q + bq - 1) / bq;
  const int64_t num_items = num_kv_heads * num_qb;
  const int64_t mp = RoundUp(group * bq, kW);
  const int64_t memory = num_keys - num_q;  // keys before the chunk, all visible

#pragma omp parallel if (num_items > 1)
  {
    Scratch qt = AllocScratch(head_dim * mp);
    Scratch ot = AllocScratch(head_dim * mp);
    Scratch st = AllocScratch(kBk * mp);
    Scratch row_max = AllocScratch(mp);
    Scratch row_sum = AllocScratch(mp);
    Scratch alpha = AllocScratch(mp);
    Scratch limit = AllocScratch(mp);

    // Later query blocks see more keys: hand them out first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < num_items; ++item) {
      const int64_t qb = num_qb - 1 - item / num_kv_heads;
      const int64_t kvh = item % num_kv_heads;
      const int64_t q0 = qb * bq;
      const int64_t nq = std::min(bq, num_q - q0);
      const int64_t m = group * nq;
      const int64_t g0 = kvh * group;
      const float* kh = k + kvh * kv_head_stride;
      const float* vh = v + kvh * kv_head_stride;

      TransposeQ(q, q_stride, head_dim, g0, group, q0, nq, mp, scale, qt.get());
      std::fill(ot.get(), ot.get() + head_dim * mp, 0.0f);
      for (int64_t r = 0; r < mp; ++r) {
        row_max[r] = kNegInf;
        row_sum[r] = 0.0f;
        // Padded rows see every key, so they never hold an all -inf row.
        limit[r] = r < m ? static_cast<float>(memory + q0 + r % nq) : 3e38f;
      }
      const int64_t first_masked = memory + q0 + 1;  // first key not seen by row q0
      const int64_t key_end = memory + q0 + nq;      // keys seen by the last row

      for (int64_t j0 = 0; j0 < key_end; j0 += kBk) {
        const int64_t jn = std::min(kBk, key_end - j0);
        ScoreTile(qt.get(), mp, kh + j0 * kv_key_stride, kv_key_stride, jn, head_dim, st.get());
        if (j0 + jn > first_masked) MaskTile(st.get(), mp, jn, j0, limit.get());
        // Online softmax per row vector: new max, rescale factor, P, sums.
        for (int64_t r = 0; r < mp; r += kW) {
          const VT old_max = V::Load(row_max.get() + r);
          VT mx = old_max;
          for (int64_t j = 0; j < jn; ++j) mx = V::Max(mx, V::Load(st.get() + j * mp + r));
          const VT a = V::Exp(V::Sub(old_max, mx));
          VT sum = V::Zero();
          for (int64_t j = 0; j < jn; ++j) {
            const VT p = V::Exp(V::Sub(V::Load(st.get() + j * mp + r), mx));
            V::Store(st.get() + j * mp + r, p);
            sum = V::Add(sum, p);
          }
          V::Store(row_sum.get() + r, V::Fma(V::Load(row_sum.get() + r), a, sum));
          V::Store(row_max.get() + r, mx);
          V::Store(alpha.get() + r, a);
        }
        PvTile(st.get(), mp, vh + j0 * kv_key_stride, kv_key_stride, jn, head_dim, alpha.get(),
               ot.get());
      }

      for (int64_t gi = 0; gi < group; ++gi) {
        for (int64_t qi = 0; qi < nq; ++qi) {
          const int64_t r = gi * nq + qi;
          const float inv = 1.0f / row_sum[r];
          float* dst = out + (q0 + qi) * out_stride + (g0 + gi) * head_dim;
          for (int64_t dd = 0; dd < head_dim; ++dd) dst[dd] = ot[dd * mp + r] * inv;
        }
      }
    }
  }
}

void WindowScores(const float* q, int64_t q_stride, const float* k, int64_t kv_head_stride,
                  int64_t kv_key_stride, float* votes, int64_t votes_stride, int64_t num_q,
                  int64_t num_keys, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                  float scale) {
  assert(num_kv_heads > 0 && num_heads % num_kv_heads == 0);
  assert(num_q >= 0 && num_keys >= num_q);
  if (num_q == 0) {  // an empty window casts no votes
    for (int64_t h = 0; h < num_kv_heads; ++h)
      std::fill(votes + h * votes_stride, votes + h * votes_stride + num_keys, 0.0f);
    return;
  }
  const int64_t group = num_heads / num_kv_heads;
  const int64_t m = group * num_q;  // rows: every (query head, window query) of a KV head
  const int64_t mp = RoundUp(m, kW);
  const int64_t memory = num_keys - num_q;
  // Key chunks are the unit of parallel work in both passes.
  constexpr int64_t kChunk = 4 * kBk;
  const int64_t num_chunks = (num_keys + kChunk - 1) / kChunk;
  const int64_t num_items = num_kv_heads * num_chunks;

  // Shared, read-only: Qt per KV head and the row limits.
  Scratch qt_all = AllocScratch(num_kv_heads * head_dim * mp);
  Scratch limit = AllocScratch(mp);
  for (int64_t kvh = 0; kvh < num_kv_heads; ++kvh) {
    TransposeQ(q, q_stride, head_dim, kvh * group, group, 0, num_q, mp, scale,
               qt_all.get() + kvh * head_dim * mp);
  }
  for (int64_t r = 0; r < mp; ++r)
    limit[r] = r < m ? static_cast<float>(memory + r % num_q) : 3e38f;
  // Per (KV head, chunk) partial row max and row sum; then per KV head the
  // combined row max and 1 / row sum (0 for padded rows, so they add nothing).
  Scratch part_max = AllocScratch(num_items * mp);
  Scratch part_sum = AllocScratch(num_items * mp);
  Scratch row_max = AllocScratch(num_kv_heads * mp);
  Scratch row_inv = AllocScratch(num_kv_heads * mp);

#pragma omp parallel if (num_items > 1)
  {
    Scratch st = AllocScratch(kBk * mp);

    // Pass 1: per chunk, row max and Σ exp(s - max) over the visible keys.
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < num_items; ++item) {
      const int64_t kvh = item / num_chunks;
      const int64_t c0 = (item % num_chunks) * kChunk;
      const int64_t c1 = std::min(num_keys, c0 + kChunk);
      const float* qt = qt_all.get() + kvh * head_dim * mp;
      float* pm = part_max.get() + item * mp;
      float* ps = part_sum.get() + item * mp;
      for (int64_t r = 0; r < mp; ++r) {
        pm[r] = kNegInf;
        ps[r] = 0.0f;
      }
      for (int64_t j0 = c0; j0 < c1; j0 += kBk) {
        const int64_t jn = std::min(kBk, c1 - j0);
        ScoreTile(qt, mp, k + kvh * kv_head_stride + j0 * kv_key_stride, kv_key_stride, jn,
                  head_dim, st.get());
        if (j0 + jn > memory + 1) MaskTile(st.get(), mp, jn, j0, limit.get());
        for (int64_t r = 0; r < mp; r += kW) {
          const VT old_max = V::Load(pm + r);
          VT mx = old_max;
          for (int64_t j = 0; j < jn; ++j) mx = V::Max(mx, V::Load(st.get() + j * mp + r));
          // A row with no visible key yet keeps max -inf; use 0 as the
          // shift so that exp(-inf - 0) = 0 instead of exp(NaN).
          const VT shift = V::SelectLt(mx, V::Set1(-3e38f), mx, V::Zero());
          VT sum = V::Zero();
          for (int64_t j = 0; j < jn; ++j)
            sum = V::Add(sum, V::Exp(V::Sub(V::Load(st.get() + j * mp + r), shift)));
          V::Store(ps + r, V::Fma(V::Load(ps + r), V::Exp(V::Sub(old_max, shift)), sum));
          V::Store(pm + r, mx);
        }
      }
    }

    // Combine the chunks of each KV head (row vectors split across threads).
#pragma omp for schedule(static)
    for (int64_t kvh = 0; kvh < num_kv_heads; ++kvh) {
      for (int64_t r = 0; r < mp; ++r) {
        float mx = kNegInf;
        for (int64_t c = 0; c < num_chunks; ++c)
          mx = std::max(mx, part_max[(kvh * num_chunks + c) * mp + r]);
        float sum = 0.0f;
        for (int64_t c = 0; c < num_chunks; ++c) {
          const int64_t idx = (kvh * num_chunks + c) * mp + r;
          if (part_sum[idx] > 0.0f) sum += part_sum[idx] * std::exp(part_max[idx] - mx);
        }
        row_max[kvh * mp + r] = mx;
        row_inv[kvh * mp + r] = r < m ? 1.0f / sum : 0.0f;
      }
    }

    // Pass 2: votes[j] = Σ_rows exp(s - max) / sum, divided by group.
    const float inv_group = 1.0f / static_cast<float>(group);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < num_items; ++item) {
      const int64_t kvh = item / num_chunks;
      const int64_t c0 = (item % num_chunks) * kChunk;
      const int64_t c1 = std::min(num_keys, c0 + kChunk);
      const float* qt = qt_all.get() + kvh * head_dim * mp;
      const float* rm = row_max.get() + kvh * mp;
      const float* ri = row_inv.get() + kvh * mp;
      float* out = votes + kvh * votes_stride;
      for (int64_t j0 = c0; j0 < c1; j0 += kBk) {
        const int64_t jn = std::min(kBk, c1 - j0);
        ScoreTile(qt, mp, k + kvh * kv_head_stride + j0 * kv_key_stride, kv_key_stride, jn,
                  head_dim, st.get());
        if (j0 + jn > memory + 1) MaskTile(st.get(), mp, jn, j0, limit.get());
        for (int64_t j = 0; j < jn; ++j) {
          VT acc = V::Zero();
          for (int64_t r = 0; r < mp; r += kW) {
            const VT p = V::Exp(V::Sub(V::Load(st.get() + j * mp + r), V::Load(rm + r)));
            acc = V::Fma(p, V::Load(ri + r), acc);
          }
          out[j0 + j] = V::ReduceAdd(acc) * inv_group;
        }
      }
    }
  }
}

void AvgPool1d(const float* in, float* out, int64_t n, int64_t kernel) {
  assert(kernel % 2 == 1 && in != out);
  const int64_t pad = kernel / 2;
  const float inv = 1.0f / static_cast<float>(kernel);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t lo = std::max<int64_t>(0, i - pad);
    const int64_t hi = std::min(n - 1, i + pad);
    float sum = 0.0f;
    for (int64_t t = lo; t <= hi; ++t) sum += in[t];
    out[i] = sum * inv;
  }
}

void MaxPool1d(const float* in, float* out, int64_t n, int64_t kernel) {
  assert(kernel % 2 == 1 && in != out);
  const int64_t pad = kernel / 2;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t lo = std::max<int64_t>(0, i - pad);
    const int64_t hi = std::min(n - 1, i + pad);
    float mx = in[lo];
    for (int64_t t = lo + 1; t <= hi; ++t) mx = std::max(mx, in[t]);
    out[i] = mx;
  }
}

void TopKIndices(const float* scores, int64_t n, int64_t k, int32_t* out_sorted_positions) {
  k = std::min(k, n);
  if (k <= 0) return;
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  if (k < n) {
    std::nth_element(idx.begin(), idx.begin() + (k - 1), idx.end(), [scores](int32_t a, int32_t b) {
      return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
    });
  }
  std::sort(idx.begin(), idx.begin() + k);
  std::copy(idx.begin(), idx.begin() + k, out_sorted_positions);
}

void Softmax(float* x, int64_t n) {
  const float sum = ExpShiftInPlace(x, n, MaxOf(x, n, kNegInf));
  const float inv = 1.0f / sum;
  for (int64_t t = 0; t < n; ++t) x[t] *= inv;
}

int64_t Argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

}  // namespace snapfill::cpu
