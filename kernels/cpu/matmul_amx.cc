// AMX-INT8 tile path of cpu::MatMul for token blocks; see matmul_amx.h.
//
// Y[t, j] = Σ_b dx[t,b]·dw[j,b] · I[t,j,b]  (+ Q4_1: Σ_b sx[t,b]·mw[j,b])
// where I[t,j,b] is the exact int32 dot of 32-element block b of token t's
// Q8 activations (s8) with weight row j's block b:
//   Q4_0: weights q - 8 (s8), tdpbssd; ggml's Σ(q-8)·qx directly, no aux.
//   Q4_1: weights q (u8 0..15), tdpbsud; aux mw·sx (sx = fp16(d·Σqx) of Q8_1).
//   Q8_0: weights qw (s8), tdpbssd; no aux.
// dx·dw is a product of two fp16 values (exact in f32), so as in the packed
// VNNI path the only rounding is the f32 accumulation: per output one FMA
// chain over the blocks (k/32 terms, 2·k/32 with Q4_1's aux), and the result
// equals ref::MatMulQuantizedActivations up to summation order.
//
// One tile op covers one 32-element K block, because the scales change every
// block:
//   A (tmm2/3): 16 tokens × 32 bytes (s8), the qs of the ggml Q8_0/Q8_1
//               blocks of 16 consecutive tokens, regrouped so that one tile is
//               512 contiguous bytes: [token group][block][token][32] (one
//               stream for the hardware prefetcher instead of 16).
//   B (tmm4/5): 8 rows × 64 bytes, VNNI layout of 16 weight rows: row g holds
//               elements 4g..4g+3 of each weight row (16 × 4 bytes), built
//               once per weight row group with dword gathers straight from the
//               ggml blocks (nibbles masked/shifted in place).
//   C (tmm0/1): 16 tokens × 16 int32 (one weight row per lane), zeroed per
//               block, stored to a 1 KiB buffer and folded into 16 zmm f32
//               accumulators (one per token, lanes = weight rows):
//                 acc[t] = fma(f32(C[t]), dx[t,b]·dw_b, acc[t])   (+ fma(sx[t,b], mw_b, acc[t]))
// Two C/A/B sets alternate (block b+1's tile ops are issued before block b
// is folded). Lanes = weight rows, so each token's 16 outputs are one
// (masked) store into Y's row. Measured per 16×16×32 block on one core: tile
// op ~5 ns, tile store ~5 ns, tile loads ~2 ns, f32 fold ~12.5 ns (3-4
// vector ops per 16 outputs); they do not overlap on this CPU (deeper
// pipelining changed nothing), so ~27 ns per block, ~15% of the tile peak.
//
// Work split: units of (up to 4 weight row groups × up to 16 token groups of
// 16), n-major, static over units on the kernels' team; a thread builds the B tiles of its
// current row groups once and reuses them for every token group of the unit.
// Each output is computed by one kernel call with a fixed operation order, so
// the result does not depend on the thread count.
#include "kernels/cpu/matmul_amx.h"
#include "kernels/cpu/spin_team.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernel_config.h"
#include "kernels/cpu/matmul.h"
#include "kernels/quant_blocks.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define SNAPFILL_AMX_COMPILED 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "kernels/cpu/amx_tiles.h"
#else
#define SNAPFILL_AMX_COMPILED 0
#endif

namespace snapfill::cpu::internal {

#if SNAPFILL_AMX_COMPILED
namespace {

#define SNAPFILL_AMX_TARGET \
  __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))

constexpr int64_t kTile = 16;          // tokens per A tile, weight rows per B tile
constexpr int64_t kBTileBytes = 512;   // one K block of 16 weight rows (8 × 64)
constexpr int kMaxRowGroupsPerUnit = 4;
constexpr int kMaxTokenGroupsPerUnit = 16;

SNAPFILL_AMX_TARGET void ConfigureTiles() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int c = 0; c < 2; ++c) {  // C: 16 tokens × 16 int32
    cfg.rows[c] = 16;
    cfg.colsb[c] = 64;
  }
  for (int a = 2; a < 4; ++a) {  // A: 16 tokens × 32 s8
    cfg.rows[a] = 16;
    cfg.colsb[a] = 32;
  }
  for (int b = 4; b < 6; ++b) {  // B: 8 × (16 rows × 4 bytes)
    cfg.rows[b] = 8;
    cfg.colsb[b] = 64;
  }
  // gcc's _tile_loadconfig tells the compiler it reads only 8 bytes.
  __asm__ volatile("" ::: "memory");
  _tile_loadconfig(&cfg);
}

SNAPFILL_AMX_TARGET void ReleaseTiles() { _tile_release(); }

// B tiles, dw and mw of one group of `rows` (<= 16) weight rows for all nb
// blocks: bq [nb][8][16][4], wd / wm [nb][16] f32 (absent rows: zero scales).
SNAPFILL_AMX_TARGET void PackWeightGroup(AmxWeightKind kind, const uint8_t* w, size_t row_bytes, int rows,
                                         int64_t nb, uint8_t* bq, float* wd, float* wm) {
  const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                         _mm512_set1_epi32(static_cast<int>(row_bytes)));
  const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1);
  const __m512i zero = _mm512_setzero_si512();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i eight = _mm512_set1_epi8(8);
  const int64_t blk = AmxWeightBlockBytes(kind);
  const int qs_off = kind == AmxWeightKind::kQ4_1 ? 4 : 2;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* base = w + b * blk;
    uint8_t* out = bq + b * kBTileBytes;
    // First dword of each row's block: fp16 d (and Q4_1's fp16 m above it).
    const __m512i hdr = _mm512_mask_i32gather_epi32(zero, mask, idx, base, 1);
    _mm512_storeu_ps(wd + 16 * b, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr)));
    if (kind == AmxWeightKind::kQ4_1) {
      _mm512_storeu_ps(wm + 16 * b, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hdr, 16))));
    }
    if (kind == AmxWeightKind::kQ8_0) {
      for (int g = 0; g < 8; ++g) {
        const __m512i v = _mm512_mask_i32gather_epi32(zero, mask, idx, base + qs_off + 4 * g, 1);
        _mm512_storeu_si512(out + 64 * g, v);
      }
    } else {
      // qs byte j holds element j (low nibble) and j + 16 (high nibble), so
      // dword d gives B rows d (elements 4d..4d+3) and 4 + d (16+4d..).
      for (int d = 0; d < 4; ++d) {
        const __m512i v = _mm512_mask_i32gather_epi32(zero, mask, idx, base + qs_off + 4 * d, 1);
        __m512i lo = _mm512_and_si512(v, low4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), low4);
        if (kind == AmxWeightKind::kQ4_0) {
          lo = _mm512_sub_epi8(lo, eight);
          hi = _mm512_sub_epi8(hi, eight);
        }
        _mm512_storeu_si512(out + 64 * d, lo);
        _mm512_storeu_si512(out + 64 * (4 + d), hi);
      }
    }
  }
}

// 16 vectors -> one: lane i = op over the 16 lanes of v[i] (max or int add;
// both exact whatever the order). Four levels of 128-bit / in-lane shuffles
// halve the vector count; the last permute restores block order.
template <bool kMax>
SNAPFILL_AMX_TARGET inline __attribute__((always_inline)) __m512 ReduceOp(__m512 a, __m512 b) {
  if constexpr (kMax) {
    return _mm512_max_ps(a, b);
  } else {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  }
}

template <bool kMax>
SNAPFILL_AMX_TARGET inline __attribute__((always_inline)) __m512 TransposeReduce(__m512* v) {
  constexpr auto op = ReduceOp<kMax>;
  __m512 w[8], u[4], y[2];
  for (int j = 0; j < 8; ++j) {  // chunks 0-1: block 2j, 2-3: block 2j+1
    w[j] = op(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0x44), _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], 0xEE));
  }
  for (int j = 0; j < 4; ++j) {  // chunk c: block 4j + c
    u[j] = op(_mm512_shuffle_f32x4(w[2 * j], w[2 * j + 1], 0x88), _mm512_shuffle_f32x4(w[2 * j], w[2 * j + 1], 0xDD));
  }
  for (int j = 0; j < 2; ++j) {  // chunk c: lanes 0-1 block 8j + c, lanes 2-3 block 8j + 4 + c
    y[j] = op(_mm512_shuffle_ps(u[2 * j], u[2 * j + 1], 0x44), _mm512_shuffle_ps(u[2 * j], u[2 * j + 1], 0xEE));
  }
  // Lane 4c + i: block 4i + c.
  const __m512 z = op(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xDD));
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(order, z);
}

}  // namespace

// Up to 16 blocks at a time: per-block |x| maxima and Σq reduced across
// blocks with TransposeReduce instead of one horizontal reduction per block;
// the scalar formulas of ref::QuantizeRowQ8_0 / Q8_1 evaluated lane-wise
// (IEEE division, roundf as truncate + step away from zero at >= 0.5,
// vcvtps2ph with round-to-nearest-even = Fp32ToFp16).
SNAPFILL_AMX_TARGET void QuantizeRowQ8Tiles(const float* x, int64_t k, uint8_t* q, int64_t q_stride, float* dx,
                                            float* sx, int64_t s_stride) {
  const int64_t nb = k / 32;
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  const __m512 half = _mm512_set1_ps(0.5f);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 sign_mask = _mm512_set1_ps(-0.0f);
  for (int64_t b0 = 0; b0 < nb; b0 += 16) {
    const int cnt = static_cast<int>(std::min<int64_t>(16, nb - b0));
    const float* xb = x + 32 * b0;
    __m512 v[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      v[i] = i < cnt ? _mm512_max_ps(_mm512_and_ps(_mm512_loadu_ps(xb + 32 * i), abs_mask),
                                     _mm512_and_ps(_mm512_loadu_ps(xb + 32 * i + 16), abs_mask))
                     : _mm512_setzero_ps();
    }
    const __m512 amax = TransposeReduce<true>(v);
    const __m512 d = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
    const __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_OQ), one, d);
    alignas(64) float ids[16];
    _mm512_store_ps(ids, id);
    __m512 sums[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      if (i >= cnt) {
        sums[i] = _mm512_setzero_ps();
        continue;
      }
      const __m512 scale = _mm512_set1_ps(ids[i]);
      __m512i qi[2];
      for (int h = 0; h < 2; ++h) {
        const __m512 val = _mm512_mul_ps(_mm512_loadu_ps(xb + 32 * i + 16 * h), scale);
        __m512 t = _mm512_roundscale_ps(val, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __mmask16 up = _mm512_cmp_ps_mask(_mm512_and_ps(_mm512_sub_ps(val, t), abs_mask), half, _CMP_GE_OQ);
        t = _mm512_mask_add_ps(t, up, t, _mm512_or_ps(one, _mm512_and_ps(val, sign_mask)));
        qi[h] = _mm512_cvttps_epi32(t);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + (b0 + i) * q_stride + 16 * h), _mm512_cvtepi32_epi8(qi[h]));
      }
      sums[i] = _mm512_castsi512_ps(_mm512_add_epi32(qi[0], qi[1]));
    }
    alignas(64) float dxs[16], sxs[16];
    constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    _mm512_store_ps(dxs, _mm512_cvtph_ps(_mm512_cvtps_ph(d, kRne)));
    if (sx != nullptr) {
      const __m512i sum = _mm512_castps_si512(TransposeReduce<false>(sums));
      // Q8_1's s = fp16(Σq · d) with the unrounded f32 d.
      _mm512_store_ps(sxs, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), d), kRne)));
    }
    for (int i = 0; i < cnt; ++i) {
      dx[(b0 + i) * s_stride] = dxs[i];
      if (sx != nullptr) sx[(b0 + i) * s_stride] = sxs[i];
    }
  }
}

namespace {

// Quantized activations of the call, per 16-token group g and block b: the
// 32 s8 values of token t at q[((g * nb + b) * 16 + t) * 32] and dx (and
// Q4_1's sx) at [(g * nb + b) * 16 + t]; tokens past m are zero.
struct ActPack {
  std::vector<uint8_t> q;
  std::vector<float> d, s;
  uint64_t bytes() const { return CapacityBytes(q, d, s); }
};

struct KernelArgs {
  const uint8_t* xq;   // [nb][16][32] s8
  const float* xd;     // [nb][16]
  const float* xs;     // [nb][16] (Q4_1)
  const uint8_t* bq;   // [nb][512]
  const float* wd;     // [nb][16]
  const float* wm;     // [nb][16] (Q4_1)
  int64_t nb;
  float* y;            // Y[first token, first row]
  int64_t y_stride;
  int toks;            // valid tokens (<= 16)
  __mmask16 row_mask;  // valid weight rows
};

// Tile ops of block `b` into C tile `tc` (A `ta`, B `tb`), stored to `buf`.
#define SNAPFILL_AMX_BLOCK(kind, tc, ta, tb, b, buf)                         \
  do {                                                                       \
    _tile_zero(tc);                                                          \
    SNAPFILL_TILE_LOAD(ta, a.xq + (b) * kBTileBytes, 32);                    \
    SNAPFILL_TILE_LOAD(tb, a.bq + (b) * kBTileBytes, 64);                    \
    if constexpr (kind == AmxWeightKind::kQ4_1) {                                     \
      _tile_dpbsud(tc, ta, tb);                                              \
    } else {                                                                 \
      _tile_dpbssd(tc, ta, tb);                                              \
    }                                                                        \
    _tile_stored(tc, buf, 64);                                               \
  } while (0)

template <AmxWeightKind kKind>
SNAPFILL_AMX_TARGET inline __attribute__((always_inline)) void Fold(const KernelArgs& a, int64_t b,
                                                                    const int32_t* buf, __m512* acc) {
  const __m512 dw = _mm512_loadu_ps(a.wd + 16 * b);
  const float* xd = a.xd + 16 * b;
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) {
    const __m512 c = _mm512_cvtepi32_ps(_mm512_load_si512(buf + 16 * t));
    acc[t] = _mm512_fmadd_ps(c, _mm512_mul_ps(_mm512_set1_ps(xd[t]), dw), acc[t]);
  }
  if constexpr (kKind == AmxWeightKind::kQ4_1) {
    const __m512 mw = _mm512_loadu_ps(a.wm + 16 * b);
    const float* xs = a.xs + 16 * b;
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t) acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(xs[t]), mw, acc[t]);
  }
}

// 16 tokens × 16 weight rows over all nb blocks.
template <AmxWeightKind kKind>
SNAPFILL_AMX_TARGET void Kernel(const KernelArgs& a) {
  alignas(64) int32_t buf[2][256];
  __m512 acc[16];
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();
  SNAPFILL_AMX_BLOCK(kKind, 0, 2, 4, 0, buf[0]);
  for (int64_t b = 0; b < a.nb; b += 2) {
    if (b + 1 < a.nb) SNAPFILL_AMX_BLOCK(kKind, 1, 3, 5, b + 1, buf[1]);
    Fold<kKind>(a, b, buf[0], acc);
    if (b + 1 < a.nb) {
      if (b + 2 < a.nb) SNAPFILL_AMX_BLOCK(kKind, 0, 2, 4, b + 2, buf[0]);
      Fold<kKind>(a, b + 1, buf[1], acc);
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) {
    if (t < a.toks) _mm512_mask_storeu_ps(a.y + t * a.y_stride, a.row_mask, acc[t]);
  }
}

#undef SNAPFILL_AMX_BLOCK

using KernelFn = void (*)(const KernelArgs&);

KernelFn PickKernel(AmxWeightKind kind) {
  switch (kind) {
    case AmxWeightKind::kQ4_0: return Kernel<AmxWeightKind::kQ4_0>;
    case AmxWeightKind::kQ4_1: return Kernel<AmxWeightKind::kQ4_1>;
    default: return Kernel<AmxWeightKind::kQ8_0>;
  }
}

bool DetectAmx() {
  if (ActiveKernelConfig().amx == AmxMode::kOff) return false;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool fma = (c >> 12) & 1, f16c = (c >> 29) & 1, osxsave = (c >> 27) & 1;
  if (!fma || !f16c || !osxsave) return false;
  // XCR0: SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM state enabled by the OS.
  uint32_t xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0xE6) != 0xE6) return false;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool avx512 = ((b >> 16) & 1) && ((b >> 17) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1);  // F DQ BW VL
  const bool amx = ((d >> 24) & 1) && ((d >> 25) & 1);  // AMX-TILE, AMX-INT8
  if (!avx512 || !amx) return false;
  // Linux >= 5.16 keeps the 8 KiB tile state off until the process asks.
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

ActPack& CallerActPack() { return CurrentScratch().Get<ActPack>(); }

struct WeightScratch {
  std::vector<uint8_t> bq;
  std::vector<float> wd, wm;
  uint64_t bytes() const { return CapacityBytes(bq, wd, wm); }
};
WeightScratch& ThreadWeightScratch() { return CurrentScratch().Get<WeightScratch>(); }

}  // namespace

bool AmxAvailable() {
  static const bool available = DetectAmx();  // once per process, thread-safe
  return available;
}

bool AmxSupportsType(GgmlType type) {
  return type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1 || type == GgmlType::kQ8_0;
}

void MatMulAmx(const float* x, int64_t m, int64_t k, int64_t x_stride, const uint8_t* w, GgmlType type,
               int64_t n, size_t w_row_bytes, float* y, int64_t y_stride) {
  const AmxWeightKind kind = AmxWeightKindOf(type);
  const int64_t nb = k / 32;
  const int64_t num_tg = (m + kTile - 1) / kTile;
  const int64_t num_rg = (n + kTile - 1) / kTile;
  const int64_t m_pad = num_tg * kTile;

  ActPack& ap = CallerActPack();
  if (ap.q.size() < static_cast<size_t>(m_pad * k)) ap.q.resize(m_pad * k);
  if (ap.d.size() < static_cast<size_t>(m_pad * nb)) ap.d.resize(m_pad * nb);
  if (kind == AmxWeightKind::kQ4_1 && ap.s.size() < static_cast<size_t>(m_pad * nb)) ap.s.resize(m_pad * nb);
  uint8_t* const xq = ap.q.data();
  float* const xd = ap.d.data();
  float* const xs = ap.s.data();

  // Units: up to 4 row groups × up to 16 token groups, enough of them that
  // every thread gets several.
  SpinTeam& team = SpinTeam::Current();  // (SpinTeam says why not OpenMP)
  const int threads = team.Threads(internal::SpinTeam::CurrentThreads());
  const int64_t tg_per_unit = std::min<int64_t>(num_tg, kMaxTokenGroupsPerUnit);
  const int64_t num_mu = (num_tg + tg_per_unit - 1) / tg_per_unit;
  const int64_t want_nu = std::max<int64_t>(1, (4 * threads + num_mu - 1) / num_mu);
  const int64_t rg_per_unit = std::clamp<int64_t>((num_rg + want_nu - 1) / want_nu, 1, kMaxRowGroupsPerUnit);
  const int64_t num_nu = (num_rg + rg_per_unit - 1) / rg_per_unit;
  const int64_t num_units = num_nu * num_mu;
  const KernelFn kernel = PickKernel(kind);

  team.Run(threads, [&](int th, int nth) {
    // Activations: ggml's Q8_0 / Q8_1 (bit-identical to ref), written
    // straight into the tile layout.
    const StaticRange rows(m_pad, th, nth);
    for (int64_t i = rows.first; i < rows.last; ++i) {
      const int64_t g = i / kTile, t = i % kTile;
      uint8_t* q = xq + (g * nb * kTile + t) * 32;  // block b at q + b * 512
      float* d = xd + g * nb * kTile + t;            // block b at d[b * 16]
      float* s = xs + g * nb * kTile + t;
      if (i >= m) {
        for (int64_t b = 0; b < nb; ++b) {
          std::memset(q + b * kBTileBytes, 0, 32);
          d[b * kTile] = 0.0f;
          if (kind == AmxWeightKind::kQ4_1) s[b * kTile] = 0.0f;
        }
        continue;
      }
      QuantizeRowQ8Tiles(x + i * x_stride, k, q, kBTileBytes, d, kind == AmxWeightKind::kQ4_1 ? s : nullptr, kTile);
    }
    team.Barrier(nth);
    WeightScratch& ws = ThreadWeightScratch();
    const size_t groups = kMaxRowGroupsPerUnit;
    if (ws.bq.size() < groups * nb * kBTileBytes) ws.bq.resize(groups * nb * kBTileBytes);
    if (ws.wd.size() < groups * nb * kTile) ws.wd.resize(groups * nb * kTile);
    if (ws.wm.size() < groups * nb * kTile) ws.wm.resize(groups * nb * kTile);
    bool configured = false;
    int64_t packed_nu = -1;
    const StaticRange units(num_units, th, nth);
    for (int64_t u = units.first; u < units.last; ++u) {
      if (!configured) {
        ConfigureTiles();
        configured = true;
      }
      const int64_t nu = u / num_mu, mu = u % num_mu;
      const int64_t rg0 = nu * rg_per_unit, rg1 = std::min(num_rg, rg0 + rg_per_unit);
      const int64_t tg0 = mu * tg_per_unit, tg1 = std::min(num_tg, tg0 + tg_per_unit);
      if (packed_nu != nu) {
        for (int64_t rg = rg0; rg < rg1; ++rg) {
          const int rows = static_cast<int>(std::min<int64_t>(kTile, n - rg * kTile));
          const int64_t slot = rg - rg0;
          PackWeightGroup(kind, w + rg * kTile * w_row_bytes, w_row_bytes, rows, nb,
                          ws.bq.data() + slot * nb * kBTileBytes, ws.wd.data() + slot * nb * kTile,
                          ws.wm.data() + slot * nb * kTile);
        }
        packed_nu = nu;
      }
      for (int64_t tg = tg0; tg < tg1; ++tg) {
        KernelArgs a;
        a.xq = xq + tg * nb * kBTileBytes;
        a.xd = xd + tg * nb * kTile;
        a.xs = kind == AmxWeightKind::kQ4_1 ? xs + tg * nb * kTile : nullptr;
        a.nb = nb;
        a.y_stride = y_stride;
        a.toks = static_cast<int>(std::min<int64_t>(kTile, m - tg * kTile));
        for (int64_t rg = rg0; rg < rg1; ++rg) {
          const int64_t slot = rg - rg0;
          const int rows = static_cast<int>(std::min<int64_t>(kTile, n - rg * kTile));
          a.bq = ws.bq.data() + slot * nb * kBTileBytes;
          a.wd = ws.wd.data() + slot * nb * kTile;
          a.wm = ws.wm.data() + slot * nb * kTile;
          a.y = y + tg * kTile * y_stride + rg * kTile;
          a.row_mask = static_cast<__mmask16>((1u << rows) - 1);
          kernel(a);
        }
      }
    }
    if (configured) ReleaseTiles();
  });
}

#else  // !SNAPFILL_AMX_COMPILED

bool AmxAvailable() { return false; }
bool AmxSupportsType(GgmlType) { return false; }
void MatMulAmx(const float*, int64_t, int64_t, int64_t, const uint8_t*, GgmlType, int64_t, size_t, float*,
               int64_t) {}
void QuantizeRowQ8Tiles(const float*, int64_t, uint8_t*, int64_t, float*, float*, int64_t) {}

#endif  // SNAPFILL_AMX_COMPILED

}  // namespace snapfill::cpu::internal
