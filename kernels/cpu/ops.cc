// Element-wise and attention kernels on the CPU (f32, and bf16 products where
// the CPU has them); see ops.h. The kernels are in ops_variant.inc, compiled
// here once per x86-64 level (cpu_variants.h); the functions of ops.h forward
// to the active level's copy.
#include "kernels/cpu/ops.h"

#include <algorithm>
#include <chrono>

// GCC 12 reports (maybe-)uninitialized inside its own AVX-512 intrinsic
// headers (the _mm512_undefined_* pass-through operands, GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_variants.h"
#include "kernels/cpu/thread_scratch.h"
#if SNAPFILL_CPU_HAS_VARIANTS
#include <immintrin.h>

#include "kernels/cpu/amx_tiles.h"
#endif
#include "kernels/cpu/matmul_amx.h"
#include "kernels/cpu/spin_team.h"
#include "kernels/quant_blocks.h"
#include "src/base/int8_rows.h"

namespace snapfill::cpu::internal {
// AttentionImpl, for every level's copy.
std::atomic<int> g_attention_impl{static_cast<int>(AttentionImpl::kAuto)};
std::atomic<int64_t> g_window_scores_kept{kDefaultWindowScoresKeptFloats};

// WindowScores' kept scores: address space reserved once per calling
// thread for WindowScoresKeptFloats() floats (mmap: resident only where
// written), so a growing memory (IM) touches more of one mapping instead
// of allocating a larger buffer at each step. (Those reallocations left
// freed blocks in the heap: IM's peak RSS rose 18 MiB over a 5.6 MiB buffer,
// above FM's.) nullptr if the mapping fails; the caller then recomputes.
float* KeptScores(int64_t floats) {
  struct Mapping {
    void* p = nullptr;
    size_t size = 0;
    size_t asked = 0;  // the most a call asked for: what can be resident
    ~Mapping() {
      if (p != nullptr) munmap(p, size);
    }
    uint64_t bytes() const { return asked; }
  };
  Mapping& m = CurrentScratch().Get<Mapping>();
  const size_t need = static_cast<size_t>(floats) * sizeof(float);
  if (need > m.size) {
    if (m.p != nullptr) munmap(m.p, m.size);
    const size_t bytes = std::max(need, static_cast<size_t>(g_window_scores_kept.load()) * sizeof(float));
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    m.p = p == MAP_FAILED ? nullptr : p;
    m.size = m.p == nullptr ? 0 : bytes;
  }
  if (m.p != nullptr) m.asked = std::max(m.asked, need);
  return static_cast<float*>(m.p);
}
}  // namespace snapfill::cpu::internal

#define SNAPFILL_CPU_VARIANT_BODY "kernels/cpu/ops_variant.inc"
#include "kernels/cpu/cpu_variants_foreach.inc"
#undef SNAPFILL_CPU_VARIANT_BODY

namespace snapfill::cpu {

void SetAttentionImpl(AttentionImpl impl) {
  internal::g_attention_impl.store(static_cast<int>(impl), std::memory_order_relaxed);
}

AttentionImpl ActiveAttentionImpl() {
  return static_cast<AttentionImpl>(internal::g_attention_impl.load(std::memory_order_relaxed));
}

const char* AttentionImplName(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::kAuto: return "auto";
    case AttentionImpl::kF32: return "f32";
    case AttentionImpl::kAvx512Bf16: return "avx512-bf16";
    case AttentionImpl::kAmxBf16: return "amx-bf16";
  }
  return "?";
}

std::optional<AttentionImpl> AttentionImplFromName(std::string_view name) {
  for (AttentionImpl impl :
       {AttentionImpl::kAuto, AttentionImpl::kF32, AttentionImpl::kAvx512Bf16, AttentionImpl::kAmxBf16}) {
    if (name == AttentionImplName(impl)) return impl;
  }
  return std::nullopt;
}

std::vector<AttentionImpl> AvailableAttentionImpls() {
  const AttentionImpl was = ActiveAttentionImpl();
  std::vector<AttentionImpl> out = {AttentionImpl::kF32};
  SetAttentionImpl(AttentionImpl::kAvx512Bf16);
  if (AttentionHasAvx512Bf16()) out.push_back(AttentionImpl::kAvx512Bf16);
  SetAttentionImpl(AttentionImpl::kAmxBf16);
  if (AttentionHasAmx()) out.push_back(AttentionImpl::kAmxBf16);
  SetAttentionImpl(was);
  return out;
}

std::vector<AttentionRate> MeasureAttentionImpls(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim) {
  constexpr int64_t kQ = 512, kKeys = 1536;
  const int64_t kHeads = num_heads, kKvHeads = num_kv_heads, kDim = head_dim;
  std::vector<float> q(kQ * kHeads * kDim), k(kKvHeads * kKeys * kDim), v(k.size()), out(q.size());
  // Deterministic values of a realistic spread (the kernels' speed does not
  // depend on them).
  uint32_t x = 12345;
  auto next = [&x] {
    x = x * 1664525u + 1013904223u;
    return static_cast<float>(x >> 8) / 16777216.0f - 0.5f;
  };
  for (float& f : q) f = next();
  for (float& f : k) f = next();
  for (float& f : v) f = next();
  const double visible = (kKeys - kQ) + (kQ + 1) / 2.0;
  const double ops = 4.0 * kQ * visible * kDim * kHeads;
  const AttentionImpl was = ActiveAttentionImpl();
  std::vector<AttentionRate> rates;
  for (AttentionImpl impl : AvailableAttentionImpls()) {
    SetAttentionImpl(impl);
    rates.push_back({impl, BestRateGops(ops, [&] {
                       Attention(q.data(), kHeads * kDim, k.data(), v.data(), kKeys * kDim, kDim, out.data(),
                                 kHeads * kDim, kQ, kKeys, kHeads, kKvHeads, kDim,
                                 1.0f / std::sqrt(static_cast<float>(kDim)));
                     })});
  }
  SetAttentionImpl(was);
  return rates;
}

double BestRateGops(double ops, const std::function<void()>& fn, int runs) {
  fn();  // warm-up
  double best = 0;
  for (int run = 0; run < runs; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, ops / s * 1e-9);
  }
  return best;
}

int64_t WindowScoresKeptFloats() { return internal::g_window_scores_kept.load(std::memory_order_relaxed); }
void SetWindowScoresKeptFloatsForTesting(int64_t floats) {
  internal::g_window_scores_kept.store(floats < 0 ? kDefaultWindowScoresKeptFloats : floats,
                                       std::memory_order_relaxed);
}

void RmsNorm(const float* x, int64_t x_stride, const float* weight, float* y, int64_t y_stride, int64_t rows,
             int64_t dim, float eps) {
  SNAPFILL_CPU_DISPATCH(RmsNorm, x, x_stride, weight, y, y_stride, rows, dim, eps);
}

void ParallelFor(int64_t n, const std::function<void(int64_t)>& f) {
  if (n <= 0) return;
  internal::DynamicItems items(n);
  internal::SpinTeam::Current().Run(static_cast<int>(std::min<int64_t>(n, internal::SpinTeam::CurrentThreads())),
                                [&](int, int) { items.ForEach(f); });
}

std::string ThreadWaits() {
  if (internal::SpinTeam::PassiveWaits()) {
    return "the kernels' team sleeps at once between regions (passive)";
  }
  return "the kernels' team spins (pause, sched_yield), sleeps after " +
         std::to_string(internal::SpinTeam::kIdleBeforeSleep.count() / 1000) + " ms without work";
}

void Rope(float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim, int64_t token_stride,
          const int32_t* pos, int64_t rot_dim, float freq_base, float freq_scale, bool neox,
          const float* freq_factors) {
  SNAPFILL_CPU_DISPATCH(Rope, x, num_tokens, num_heads, head_dim, token_stride, pos, rot_dim, freq_base,
                        freq_scale, neox, freq_factors);
}

void ToFp16(const float* x, uint16_t* y, int64_t n) { SNAPFILL_CPU_DISPATCH(ToFp16, x, y, n); }
void FromFp16(const uint16_t* x, float* y, int64_t n) { SNAPFILL_CPU_DISPATCH(FromFp16, x, y, n); }
void ToInt8Rows(const float* x, uint8_t* y, int64_t rows, int64_t dim) {
  SNAPFILL_CPU_DISPATCH(ToInt8Rows, x, y, rows, dim);
}
void FromInt8Rows(const uint8_t* y, float* x, int64_t rows, int64_t dim) {
  SNAPFILL_CPU_DISPATCH(FromInt8Rows, y, x, rows, dim);
}

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  SNAPFILL_CPU_DISPATCH(SwiGlu, gate, up, out, n);
}

void GeluGlu(const float* gate, const float* up, float* out, int64_t n) {
  SNAPFILL_CPU_DISPATCH(GeluGlu, gate, up, out, n);
}

void Attention(const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_head_stride,
               int64_t kv_key_stride, float* out, int64_t out_stride, int64_t num_q, int64_t num_keys,
               int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale, int64_t window, float* lse) {
  SNAPFILL_CPU_DISPATCH(Attention, q, q_stride, k, v, kv_head_stride, kv_key_stride, out, out_stride, num_q, num_keys,
                        num_heads, num_kv_heads, head_dim, scale, window, lse);
}

void AttentionF32(const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_head_stride,
                  int64_t kv_key_stride, float* out, int64_t out_stride, int64_t num_q, int64_t num_keys,
                  int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale, int64_t window, float* lse) {
  SNAPFILL_CPU_DISPATCH(AttentionF32, q, q_stride, k, v, kv_head_stride, kv_key_stride, out, out_stride, num_q,
                        num_keys, num_heads, num_kv_heads, head_dim, scale, window, lse);
}

void AttentionDecodeF16(const float* q, const uint16_t* k, const uint16_t* v, int64_t kv_head_stride,
                        int64_t kv_key_stride, float* out, int64_t num_keys, int64_t num_heads,
                        int64_t num_kv_heads, int64_t head_dim, float scale) {
  SNAPFILL_CPU_DISPATCH(AttentionDecodeF16, q, k, v, kv_head_stride, kv_key_stride, out, num_keys, num_heads,
                        num_kv_heads, head_dim, scale);
}

bool AttentionHasAmx() { SNAPFILL_CPU_DISPATCH(AttentionHasAmx); }
bool AttentionHasAvx512Bf16() { SNAPFILL_CPU_DISPATCH(AttentionHasAvx512Bf16); }
uint64_t AttentionScratchBytes(int64_t num_q, int64_t num_keys, int64_t num_kv_heads, int64_t head_dim,
                               int64_t window) {
  SNAPFILL_CPU_DISPATCH(AttentionScratchBytes, num_q, num_keys, num_kv_heads, head_dim, window);
}

void WindowScores(const float* q, int64_t q_stride, const float* k, int64_t kv_head_stride,
                  int64_t kv_key_stride, float* votes, int64_t votes_stride, int64_t num_q, int64_t num_keys,
                  int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale) {
  SNAPFILL_CPU_DISPATCH(WindowScores, q, q_stride, k, kv_head_stride, kv_key_stride, votes, votes_stride, num_q,
                        num_keys, num_heads, num_kv_heads, head_dim, scale);
}

void QueryLogSumExp(const float* q, int64_t q_stride, const float* k, int64_t kv_head_stride,
                    int64_t kv_key_stride, int64_t num_q, int64_t num_keys, int64_t num_heads,
                    int64_t num_kv_heads, int64_t head_dim, float scale, float* lse) {
  SNAPFILL_CPU_DISPATCH(QueryLogSumExp, q, q_stride, k, kv_head_stride, kv_key_stride, num_q, num_keys, num_heads,
                        num_kv_heads, head_dim, scale, lse);
}

void RecallScores(const float* q, int64_t q_stride, int64_t num_q, const float* lse, const float* k,
                  int64_t kv_head_stride, int64_t kv_key_stride, int64_t num_keys, float* scores,
                  int64_t scores_stride, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                  float scale, bool max_weight) {
  SNAPFILL_CPU_DISPATCH(RecallScores, q, q_stride, num_q, lse, k, kv_head_stride, kv_key_stride, num_keys, scores,
                        scores_stride, num_heads, num_kv_heads, head_dim, scale, max_weight);
}

bool RecallMaxWeightsBf16(const float* q, int64_t q_stride, int64_t num_q, const float* lse, const float* k,
                          int64_t kv_head_stride, int64_t kv_key_stride, int64_t num_keys, float* scores,
                          int64_t scores_stride, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                          float scale) {
  SNAPFILL_CPU_DISPATCH(RecallMaxWeightsBf16, q, q_stride, num_q, lse, k, kv_head_stride, kv_key_stride, num_keys,
                        scores, scores_stride, num_heads, num_kv_heads, head_dim, scale);
}

void AvgPool1d(const float* in, float* out, int64_t n, int64_t kernel) {
  SNAPFILL_CPU_DISPATCH(AvgPool1d, in, out, n, kernel);
}
void MaxPool1d(const float* in, float* out, int64_t n, int64_t kernel) {
  SNAPFILL_CPU_DISPATCH(MaxPool1d, in, out, n, kernel);
}
void TopKIndices(const float* scores, int64_t n, int64_t k, int32_t* out_sorted_positions) {
  SNAPFILL_CPU_DISPATCH(TopKIndices, scores, n, k, out_sorted_positions);
}
namespace {

// Scores as unsigned keys in the same order, -0 with +0; none is 0, the
// mark of a taken entry (kernels/cuda's OrderedKey).
inline uint32_t OrderedKey(float v) {
  uint32_t u = 0;
  if (v != 0.0f) std::memcpy(&u, &v, sizeof(u));
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

}  // namespace

void TopSpanIndices(const float* scores, int64_t n, int64_t k, int64_t span, int32_t* out_sorted_positions) {
  k = std::min(k, n);
  if (k <= 0) return;
  if (span <= 1 || k == n) {
    TopKIndices(scores, n, k, out_sorted_positions);
    return;
  }
  // Walking the ranking and skipping what is taken is taking, again and
  // again, the largest score not taken (the lowest position among
  // equals): each tile's largest key is kept, the best tile's first entry
  // with it is the peak, and only the tiles a span touched are searched
  // again. No sort; the same tiles as the CUDA kernel (at most
  // kSpanTiles of a multiple of 32 entries), whose walk this is.
  constexpr int64_t kSpanTiles = 2048;
  std::vector<uint32_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = OrderedKey(scores[i]);
  const int64_t words = (n + 31) / 32;
  const int64_t tile = 32 * ((words + kSpanTiles - 1) / kSpanTiles);
  const int64_t tiles = (n + tile - 1) / tile;
  std::vector<uint32_t> tile_max(tiles);
  const auto largest = [&](int64_t t) {
    uint32_t m = 0;
    for (int64_t i = t * tile, end = std::min(n, (t + 1) * tile); i < end; ++i) m = std::max(m, keys[i]);
    return m;
  };
  for (int64_t t = 0; t < tiles; ++t) tile_max[t] = largest(t);
  const int64_t half = span / 2;
  for (int64_t left = k; left > 0;) {
    int64_t t = 0;
    for (int64_t u = 1; u < tiles; ++u) {
      if (tile_max[u] > tile_max[t]) t = u;
    }
    int64_t peak = t * tile;
    while (keys[peak] != tile_max[t]) ++peak;
    keys[peak] = 0;
    --left;
    for (int64_t d = 1; d <= half && left > 0; ++d) {
      if (peak - d >= 0 && keys[peak - d] != 0) {
        keys[peak - d] = 0;
        --left;
      }
      if (left > 0 && peak + d < n && keys[peak + d] != 0) {
        keys[peak + d] = 0;
        --left;
      }
    }
    const int64_t lo = std::max<int64_t>(0, peak - half), hi = std::min(n - 1, peak + half);
    for (int64_t u = lo / tile; u <= hi / tile; ++u) tile_max[u] = largest(u);
  }
  int64_t o = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (keys[i] == 0) out_sorted_positions[o++] = static_cast<int32_t>(i);
  }
}

void Softmax(float* x, int64_t n) { SNAPFILL_CPU_DISPATCH(Softmax, x, n); }
int64_t Argmax(const float* x, int64_t n) { SNAPFILL_CPU_DISPATCH(Argmax, x, n); }

}  // namespace snapfill::cpu
