// cpu::MatMul's token-block paths (AMX-BF16, AMX-INT8, AVX-512 VNNI, AVX2) on
// SmolLM2-135M's prefill shapes, plus the instruction peaks they are held to.
//   BM_MatMul_Prefill/impl/type/m/k/n: Y[m, n] = X[m, k] · W[n, k]ᵀ with
//     impl 0 = kAuto (AMX-BF16 where available), 1 = kNoAmx (AVX-512 VNNI,
//     or AVX2 without AVX-512), 2 = kAmxInt8 (the AMX-INT8 path), 3 = kAvx2
//     (the AVX2 kernels), 4 = kGeneric (the portable scalar tiles, only on
//     the largest product). The label names the path that ran. Shapes:
//     q/o 576->576, k/v 576->192, FFN up/gate 576->1536, FFN down 1536->576;
//     m = 512 and 2048 tokens. Counter GFLOP/s = 2·m·n·k per call. copy 1
//     (impl 1, Q4_1): the weight is passed with its decode-layout copy
//     (cpu::MatMulOut::packed), as the CPU backend passes it once the copy
//     exists; copy 0: cpu::MatMul on the GGUF rows alone.
//   BM_MatMulShared_Prefill/impl/outs/m/copy: Q, K and V (outs 0) or gate
//     and up (outs 1) in one cpu::MatMulShared, as the model runs them
//     (copy as above).
//   BM_MatMulSwiGlu_Prefill/fused/m: the down projection with its SwiGLU
//     in front (cpu::MatMulSwiGlu) against SwiGlu then MatMul.
//   BM_MatMulAdd_Prefill/fused/m: the attention output product with the
//     residual add fused (cpu::MatMulAdd) against MatMul then the add.
//   BM_FeedForward_Prefill/fused/m: the whole feed-forward block
//     (cpu::FeedForward) against gate,up then the fused SwiGLU + down.
//   BM_AmxPeak/bf16/bytes: a loop of independent tile ops (4 C tiles, 2 A,
//     2 B) on every OpenMP thread: tdpbssd (bf16 = 0) with 64 bytes per A
//     row (the full tile) or 32 (the AMX-INT8 kernel's shape: one 32-element
//     block per op), and tdpbf16ps (bf16 = 1, 64 bytes = 32 bf16, the
//     AMX-BF16 kernel's shape). Counter GOP/s = 2·16·16·K per op (K
//     elements per A row), all threads.
//   BM_VectorPeak/kind: the other instructions' peaks, 12 independent zmm
//     accumulators per thread: 0 = vfmadd231ps (fp32, 32 FLOP each), 1 =
//     vpdpbusd (int8, 128 OP), 2 = vdpbf16ps (bf16, 64 FLOP); and in ymm
//     (AVX2): 3 = vfmadd231ps (16 FLOP), 4 = vpmaddubsw (32 u8·s8 products
//     summed in pairs, 64 OP), 5 = vpmaddubsw + vpmaddwd (the AVX2 int8 dot
//     of the AVX2 kernels: 32 products summed to 8 int32 lanes, 64 OP per
//     pair of instructions), 6 = AVX-VNNI {vex} vpdpbusd ymm (the same dot
//     in one instruction, the avxvnni level's kernels; 64 OP).
//   BM_Sgemm_OpenBlas/m/k/n: cblas_sgemm at the same shapes (f32 weights),
//     where OpenBLAS was found at configure time. This machine may set
//     OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE for old OpenBLAS builds; main()
//     re-runs the binary without them (and says so) unless
//     SNAPFILL_BM_KEEP_OPENBLAS_ENV=1, so OpenBLAS picks its kernels for this
//     CPU itself. Only this benchmark does that; tests never touch them.
//   oneDNN's bf16 matmul at the same shapes is in bm_onednn (a binary of
//     its own: linked into this one, libdnnl made some of our products
//     here 20-25% slower (2,048 × 576 → 192, two runs) without a call into
//     it; docs/history/BENCHMARKS-log.md).
// Threads: omp_get_max_threads() (OMP_NUM_THREADS pins it; OpenBLAS gets the
// same count). No correctness checks here: tests/kernels/matmul_amx_test.cc
// covers them.
#include <omp.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_weights.h"
#include "kernels/cpu/peak.h"
#include "benchmark/benchmark.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/quant_blocks.h"
#include "kernels/ref/quant_ref.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SNAPFILL_BM_AMX 1
#else
#define SNAPFILL_BM_AMX 0
#endif

#if SNAPFILL_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace snapfill {
namespace {

using bench::RandomWeights;

void BM_MatMul_Prefill(benchmark::State& state) {
  const int64_t impl = state.range(0);
  const auto type = static_cast<GgmlType>(state.range(1));
  const int64_t m = state.range(2), k = state.range(3), n = state.range(4);
  if (impl == 2 && !cpu::MatMulHasAmx()) {
    state.SkipWithError("AMX unavailable on this CPU/OS (or SNAPFILL_AMX=0)");
    return;
  }
  if (impl == 3 && !cpu::MatMulHasAvx2()) {
    state.SkipWithError("the AVX2 kernels are not compiled in");
    return;
  }
  cpu::SetMatMulImplForTesting(impl == 0   ? cpu::MatMulImpl::kAuto
                               : impl == 1 ? cpu::MatMulImpl::kNoAmx
                               : impl == 2 ? cpu::MatMulImpl::kAmxInt8
                               : impl == 3 ? cpu::MatMulImpl::kAvx2
                                           : cpu::MatMulImpl::kGeneric);
  const auto w = RandomWeights(type, n, k);
  const std::vector<float> x = bench::RandomActivations(m * k);
  std::vector<float> y(m * n);
  const size_t row_bytes = RowBytes(type, k);
  // copy: the weight comes with its decode-layout copy, as the CPU backend
  // passes it once the copy exists (cpu::MatMulOut::packed).
  const bool copy = state.range(5) != 0;
  std::vector<uint8_t> packed(copy ? cpu::DecodePackedBytes(type, n, k) : 0);
  if (copy && packed.empty()) {
    state.SkipWithError("no decode layout for this type here");
    return;
  }
  if (copy) cpu::PackForDecode(w.data(), type, n, k, row_bytes, packed.data());
  const cpu::MatMulOut out{w.data(), n, row_bytes, y.data(), n, copy ? packed.data() : nullptr};
  auto product = [&] {
    if (copy) {
      cpu::MatMulShared(x.data(), m, k, k, type, &out, 1);
    } else {
      cpu::MatMul(x.data(), m, k, k, w.data(), type, n, row_bytes, y.data(), n);
    }
  };
  for (int i = 0; i < 2; ++i) product();
  for (auto _ : state) {
    product();
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAuto);
  state.SetItemsProcessed(state.iterations() * m);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * n * k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = omp_get_max_threads();
  const char* avx2 = cpu::MatMulHasAvxVnni() ? "avx-vnni " : "avx2 ";
  const bool float_w = type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16;
  const char* simd = !cpu::MatMulHasSimd() ? (cpu::MatMulHasAvx2() ? avx2 : "generic ")
                     : float_w             ? "avx512-fma "
                                           : "avx512-vnni ";
  const char* path = impl == 4                      ? "generic "
                     : impl == 3                    ? avx2
                     : impl == 1                    ? simd
                     : impl == 2                    ? "amx-int8 "
                     : cpu::MatMulFuses(type, m, k, row_bytes) ? "amx-bf16 "
                     : cpu::MatMulHasAmx() && !float_w && type != GgmlType::kQ4_K && type != GgmlType::kQ6_K
                         ? "amx-int8 "
                         : simd;
  state.SetLabel(std::string(path) + GetTypeTraits(type).name);
}

void PrefillShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"impl", "type", "m", "k", "n", "copy"});
  const int64_t shapes[][2] = {{576, 576}, {576, 192}, {576, 1536}, {1536, 576}};
  const auto q4_1 = static_cast<int64_t>(GgmlType::kQ4_1);
  for (int64_t m : {512, 2048}) {
    for (const auto& s : shapes) {
      for (int64_t impl : {0, 2, 1, 3}) b->Args({impl, q4_1, m, s[0], s[1], 0});
      b->Args({1, q4_1, m, s[0], s[1], 1});
    }
  }
  b->Args({4, q4_1, 512, 576, 1536, 0});
  // The other two tile-path types on the largest product.
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ8_0}) {
    for (int64_t impl : {0, 2, 1, 3}) b->Args({impl, static_cast<int64_t>(t), 512, 576, 1536, 0});
  }
  // Float weights (SmolLM2's shapes) and the K-quants (the down projection,
  // the only one of SmolLM2's products whose k is a multiple of 256, and a
  // 2,048-wide model's q / o): on AMX-BF16 (impl 0) and without AMX (impl 1:
  // f32 FMA, or the K-quants' 256-element integer kernels).
  for (GgmlType t : {GgmlType::kF16, GgmlType::kBF16}) {
    for (int64_t impl : {0, 1}) {
      for (int64_t m : {512, 2048}) b->Args({impl, static_cast<int64_t>(t), m, 576, 1536, 0});
    }
  }
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    for (int64_t impl : {0, 1}) {
      for (int64_t m : {512, 2048}) {
        b->Args({impl, static_cast<int64_t>(t), m, 1536, 576, 0});
        b->Args({impl, static_cast<int64_t>(t), m, 2048, 2048, 0});
      }
    }
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_MatMul_Prefill)->Apply(PrefillShapes);

// The products as the model runs them at prefill: Q, K and V (576 -> 576,
// 192, 192) and gate and up (576 -> 1536, 1536) share one quantized X and
// one parallel region (cpu::MatMulShared); o (576 -> 576) and down (1536 ->
// 576) are BM_MatMul_Prefill's. GOP/s counts all outputs. impl as above
// (0 auto, 1 no AMX, 3 the AVX2 kernels).
void BM_MatMulShared_Prefill(benchmark::State& state) {
  const int64_t impl = state.range(0), which = state.range(1), m = state.range(2);
  if (impl == 3 && !cpu::MatMulHasAvx2()) {
    state.SkipWithError("the AVX2 kernels are not compiled in");
    return;
  }
  cpu::SetMatMulImplForTesting(impl == 0 ? cpu::MatMulImpl::kAuto
                               : impl == 1 ? cpu::MatMulImpl::kNoAmx
                                           : cpu::MatMulImpl::kAvx2);
  const int64_t k = 576;
  const std::vector<int64_t> ns =
      which == 0 ? std::vector<int64_t>{576, 192, 192} : std::vector<int64_t>{1536, 1536};
  const GgmlType type = GgmlType::kQ4_1;
  const size_t row_bytes = RowBytes(type, k);
  std::vector<std::vector<uint8_t>> ws;
  std::vector<std::vector<float>> ys;
  std::vector<cpu::MatMulOut> outs;
  int64_t total_n = 0;
  for (int64_t n : ns) {
    ws.push_back(RandomWeights(type, n, k));
    ys.emplace_back(m * n);
    total_n += n;
  }
  // copy: each weight with its decode-layout copy (as BM_MatMul_Prefill).
  const bool copy = state.range(3) != 0;
  std::vector<std::vector<uint8_t>> packed(ns.size());
  for (size_t i = 0; i < ns.size(); ++i) {
    if (copy) {
      packed[i].resize(cpu::DecodePackedBytes(type, ns[i], k));
      if (packed[i].empty()) {
        state.SkipWithError("no decode layout for this type here");
        return;
      }
      cpu::PackForDecode(ws[i].data(), type, ns[i], k, row_bytes, packed[i].data());
    }
    outs.push_back({ws[i].data(), ns[i], row_bytes, ys[i].data(), ns[i], copy ? packed[i].data() : nullptr});
  }
  const std::vector<float> x = bench::RandomActivations(m * k);
  const int64_t count = static_cast<int64_t>(outs.size());
  for (int i = 0; i < 2; ++i) cpu::MatMulShared(x.data(), m, k, k, type, outs.data(), count);
  for (auto _ : state) {
    cpu::MatMulShared(x.data(), m, k, k, type, outs.data(), count);
    benchmark::ClobberMemory();
  }
  cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAuto);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * total_n * k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = omp_get_max_threads();
  state.SetLabel(which == 0 ? "q,k,v Q4_1" : "gate,up Q4_1");
}
BENCHMARK(BM_MatMulShared_Prefill)
    ->ArgNames({"impl", "outs", "m", "copy"})
    ->ArgsProduct({{0, 1, 3}, {0, 1}, {512, 2048}, {0}})
    ->ArgsProduct({{1}, {0, 1}, {512, 2048}, {1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The fused steps against the unfused ones: fused 0 / 1 at 512, 1,024 and
// 2,048 tokens.
void FusedOrNotShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"fused", "m"})
      ->ArgsProduct({{0, 1}, {512, 1024, 2048}})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

// The feed-forward block's end at SmolLM2's shapes (gate and up 1536 wide,
// down 1536 -> 576, Q4_1): fused 1 = cpu::MatMulSwiGlu (its SwiGLU inside the
// product's conversion on AMX-BF16), 0 = cpu::SwiGlu over the whole [m, 1536]
// then cpu::MatMul, as the model ran it before. GFLOP/s counts the product's
// 2·m·n·k only.
void BM_MatMulSwiGlu_Prefill(benchmark::State& state) {
  const bool fused = state.range(0) != 0;
  const int64_t m = state.range(1), k = 1536, n = 576;
  const GgmlType type = GgmlType::kQ4_1;
  const size_t row_bytes = RowBytes(type, k);
  const std::vector<uint8_t> w = RandomWeights(type, n, k);
  const std::vector<float> gate0 = bench::RandomActivations(m * k), up = bench::RandomActivations(m * k);
  std::vector<float> gate = gate0, y(m * n);
  auto once = [&] {
    if (fused) {
      cpu::MatMulSwiGlu(gate.data(), up.data(), m, k, k, w.data(), type, n, row_bytes, y.data(), n);
    } else {
      cpu::SwiGlu(gate.data(), up.data(), gate.data(), m * k);
      cpu::MatMul(gate.data(), m, k, k, w.data(), type, n, row_bytes, y.data(), n);
    }
  };
  for (int i = 0; i < 2; ++i) once();
  for (auto _ : state) {
    state.PauseTiming();
    std::memcpy(gate.data(), gate0.data(), gate.size() * sizeof(float));  // the unfused path overwrote it
    state.ResumeTiming();
    once();
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * n * k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = omp_get_max_threads();
  state.SetLabel(fused ? (cpu::MatMulFuses(type, m, k, row_bytes) ? "fused" : "fused (falls back here)")
                       : "swiglu then matmul");
}
BENCHMARK(BM_MatMulSwiGlu_Prefill)->Apply(FusedOrNotShapes);

// The attention output product and the residual add after it (576 -> 576,
// Q4_1): fused 1 = cpu::MatMulAdd (each output tile added to Y as it leaves
// the tiles where AMX-BF16 runs), 0 = cpu::MatMul into a buffer, then the
// add over [m, 576] in an OpenMP loop, as the model does where the backend
// does not fuse. GFLOP/s counts the product's 2·m·n·k only.
void BM_MatMulAdd_Prefill(benchmark::State& state) {
  const bool fused = state.range(0) != 0;
  const int64_t m = state.range(1), k = 576, n = 576;
  const GgmlType type = GgmlType::kQ4_1;
  const size_t row_bytes = RowBytes(type, k);
  const std::vector<uint8_t> w = RandomWeights(type, n, k);
  const std::vector<float> x = bench::RandomActivations(m * k);
  std::vector<float> y = bench::RandomActivations(m * n), t(m * n);
  auto once = [&] {
    if (fused) {
      cpu::MatMulAdd(x.data(), m, k, k, w.data(), type, n, row_bytes, y.data(), n);
    } else {
      cpu::MatMul(x.data(), m, k, k, w.data(), type, n, row_bytes, t.data(), n);
      float* yp = y.data();
      const float* tp = t.data();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < m * n; ++i) yp[i] += tp[i];
    }
  };
  for (int i = 0; i < 2; ++i) once();
  for (auto _ : state) {
    once();
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * n * k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = omp_get_max_threads();
  state.SetLabel(fused ? (cpu::MatMulFuses(type, m, k, row_bytes) ? "fused" : "fused (falls back here)")
                       : "matmul then add");
}
BENCHMARK(BM_MatMulAdd_Prefill)->Apply(FusedOrNotShapes);

// The whole feed-forward block as the model runs it (576 -> 1536 -> 576,
// Q4_1, the residual add in the down projection's store): fused 1 =
// cpu::FeedForward (gate and up into L1, through the SwiGLU, into the down
// projection's bf16 input where AMX-BF16 runs), 0 = cpu::MatMulShared over
// gate and up into [m, 1536] buffers, then cpu::MatMulSwiGlu(add), as the
// model ran it before. GFLOP/s counts the three products, 2·m·3·576·1536.
void BM_FeedForward_Prefill(benchmark::State& state) {
  const bool fused = state.range(0) != 0;
  const int64_t m = state.range(1), dim = 576, ff = 1536;
  const GgmlType type = GgmlType::kQ4_1;
  const size_t gu_bytes = RowBytes(type, dim), d_bytes = RowBytes(type, ff);
  const std::vector<uint8_t> wg = RandomWeights(type, ff, dim), wu = RandomWeights(type, ff, dim),
                             wd = RandomWeights(type, dim, ff);
  const std::vector<float> x = bench::RandomActivations(m * dim);
  std::vector<float> y = bench::RandomActivations(m * dim), g(m * ff), u(m * ff);
  auto once = [&] {
    if (fused) {
      cpu::FeedForward(x.data(), m, dim, dim, wg.data(), wu.data(), type, ff, gu_bytes, wd.data(), type, dim, d_bytes,
                       y.data(), dim, /*add=*/true);
    } else {
      const cpu::MatMulOut gu[2] = {{wg.data(), ff, gu_bytes, g.data(), ff}, {wu.data(), ff, gu_bytes, u.data(), ff}};
      cpu::MatMulShared(x.data(), m, dim, dim, type, gu, 2);
      cpu::MatMulSwiGlu(g.data(), u.data(), m, ff, ff, wd.data(), type, dim, d_bytes, y.data(), dim, /*add=*/true);
    }
  };
  for (int i = 0; i < 2; ++i) once();
  for (auto _ : state) {
    once();
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * 3 * dim * ff * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = omp_get_max_threads();
  state.SetLabel(fused ? (cpu::FeedForwardFuses(type, type, m, dim, ff, gu_bytes, d_bytes) ? "fused"
                                                                                            : "fused (falls back here)")
                       : "gate,up then swiglu+down");
}
BENCHMARK(BM_FeedForward_Prefill)->Apply(FusedOrNotShapes);

#if SNAPFILL_BM_AMX
struct alignas(64) PeakConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// `iters` rounds of 4 independent tile ops (C0..C3 += A{4,5} · B{6,7}) with
// A rows of `kb` bytes: tdpbssd (int8) or tdpbf16ps (bf16, the A and B
// bytes read as bf16). Returns C0[0]'s bits so the work is observable.
template <bool kBf16>
__attribute__((target("amx-tile,amx-int8,amx-bf16"))) int32_t AmxPeakLoop(int64_t iters, int kb) {
  PeakConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 4; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  for (int t = 4; t < 6; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = static_cast<uint16_t>(kb);
  }
  for (int t = 6; t < 8; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(kb / 4);
    cfg.colsb[t] = 64;
  }
  __asm__ volatile("" ::: "memory");
  _tile_loadconfig(&cfg);
  alignas(64) int8_t a[16 * 64], b[16 * 64];
  alignas(64) int32_t c[16 * 16];
  for (int i = 0; i < 16 * 64; ++i) {
    a[i] = static_cast<int8_t>(i % 7 - 3);
    b[i] = static_cast<int8_t>(i % 5 - 2);
  }
  __asm__ volatile("" ::: "memory");
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a, 64);
  _tile_loadd(6, b, 64);
  _tile_loadd(7, b, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iters; ++i) {
    if constexpr (kBf16) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    } else {
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
      _tile_dpbssd(2, 5, 6);
      _tile_dpbssd(3, 5, 7);
    }
  }
  _tile_stored(0, c, 64);
  _tile_release();
  return c[0];
}

void BM_AmxPeak(benchmark::State& state) {
  const bool bf16 = state.range(0) == 1;
  if (!cpu::MatMulHasAmx() || (bf16 && !cpu::MatMulHasAmxBf16())) {  // also asks for the tile state
    state.SkipWithError(bf16 ? "AMX-BF16 unavailable on this CPU/OS (or SNAPFILL_AMX=0/int8)"
                             : "AMX-INT8 unavailable on this CPU/OS (or SNAPFILL_AMX=0)");
    return;
  }
  const int kb = static_cast<int>(state.range(1));
  constexpr int64_t kIters = 1 << 18;
  const int threads = omp_get_max_threads();
  for (auto _ : state) {
    int32_t sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += bf16 ? AmxPeakLoop<true>(kIters, kb) : AmxPeakLoop<false>(kIters, kb);
    benchmark::DoNotOptimize(sink);
  }
  const int k_elems = bf16 ? kb / 2 : kb;
  const double ops_per_call = 4.0 * kIters * threads * 2 * 16 * 16 * k_elems;
  state.counters["GOP/s"] = benchmark::Counter(ops_per_call * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
}
BENCHMARK(BM_AmxPeak)
    ->ArgNames({"bf16", "bytes"})
    ->Args({0, 64})
    ->Args({0, 32})
    ->Args({1, 64})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The peak loops are kernels/cpu/peak.h's (12 independent chains of one
// instruction on each thread), but for kind 5, the AVX2 kernels' dot of two
// instructions, which is measured only here.
__attribute__((target("avx2,fma"), always_inline)) inline __m256i DotStep256(__m256i a) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_set1_epi8(-2)), _mm256_set1_epi16(1));
}
__attribute__((target("avx2,fma"), noinline)) float DotPeakLoop256(int64_t iters) {
  __m256i a0 = _mm256_set1_epi8(0), a1 = _mm256_set1_epi8(1), a2 = _mm256_set1_epi8(2), a3 = _mm256_set1_epi8(3),
          a4 = _mm256_set1_epi8(4), a5 = _mm256_set1_epi8(5), a6 = _mm256_set1_epi8(6), a7 = _mm256_set1_epi8(7),
          a8 = _mm256_set1_epi8(8), a9 = _mm256_set1_epi8(9), a10 = _mm256_set1_epi8(10), a11 = _mm256_set1_epi8(11);
  for (int64_t it = 0; it < iters; ++it) {
    a0 = DotStep256(a0), a1 = DotStep256(a1), a2 = DotStep256(a2), a3 = DotStep256(a3);
    a4 = DotStep256(a4), a5 = DotStep256(a5), a6 = DotStep256(a6), a7 = DotStep256(a7);
    a8 = DotStep256(a8), a9 = DotStep256(a9), a10 = DotStep256(a10), a11 = DotStep256(a11);
  }
  const __m256i all[12] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11};
  float sink = 0;
  for (const __m256i& v : all) sink += static_cast<float>(_mm256_extract_epi32(v, 0));
  return sink;
}

// BM_VectorPeak's kinds as peak.h's instructions (kNone: kind 5).
constexpr PeakInstruction kPeakKinds[7] = {PeakInstruction::kFmaZmm,    PeakInstruction::kDpbusdZmm,
                                           PeakInstruction::kDpbf16Zmm, PeakInstruction::kFmaYmm,
                                           PeakInstruction::kMaddubsYmm, PeakInstruction::kNone,
                                           PeakInstruction::kDpbusdYmm};

float RunPeakLoop(int kind, int64_t iters) {
  if (kind == 5) return DotPeakLoop256(iters);
  uint32_t lane0[12];
  cpu::PeakChains(kPeakKinds[kind], iters, lane0);
  float sink = 0;
  for (uint32_t v : lane0) sink += static_cast<float>(v & 0xFF);
  return sink;
}

void BM_VectorPeak(benchmark::State& state) {
  const int kind = static_cast<int>(state.range(0));
  const bool supported = kind == 5 ? cpu::PeakSupported(PeakInstruction::kMaddubsYmm)
                                   : cpu::PeakSupported(kPeakKinds[kind]);
  const std::string name = kind == 5 ? "vpmaddubsw+vpmaddwd ymm" : PeakInstructionName(kPeakKinds[kind]);
  if (!supported) {
    state.SkipWithError((name + " unavailable on this CPU").c_str());
    return;
  }
  constexpr int64_t kIters = 1 << 20;
  const int threads = omp_get_max_threads();
  for (auto _ : state) {
    float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += RunPeakLoop(kind, kIters);
    benchmark::DoNotOptimize(sink);
  }
  const double ops_per_instr = kind == 5 ? 64 : PeakOpsPerInstruction(kPeakKinds[kind]);  // per step
  state.counters["GOP/s"] = benchmark::Counter(12.0 * kIters * threads * ops_per_instr * 1e-9,
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
  state.SetLabel(name);
}
BENCHMARK(BM_VectorPeak)->ArgName("kind")->DenseRange(0, 6)->Unit(benchmark::kMillisecond)->UseRealTime();
#endif

#if SNAPFILL_HAVE_OPENBLAS
void BM_Sgemm_OpenBlas(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  openblas_set_num_threads(omp_get_max_threads());
  std::vector<float> x(m * k), w(n * k), y(m * n);
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  for (auto& v : w) v = 0.05f * nd(rng);
  auto run = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, x.data(), static_cast<int>(k), w.data(),
                static_cast<int>(k), 0.0f, y.data(), static_cast<int>(n));
  };
  for (int i = 0; i < 2; ++i) run();
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * m);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * n * k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = openblas_get_num_threads();
  state.SetLabel(std::string("openblas ") + openblas_get_corename());
}

void SgemmShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"m", "k", "n"});
  const int64_t shapes[][2] = {{576, 576}, {576, 192}, {576, 1536}, {1536, 576}};
  for (int64_t m : {512, 2048}) {
    for (const auto& s : shapes) b->Args({m, s[0], s[1]});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_Sgemm_OpenBlas)->Apply(SgemmShapes);
#endif

}  // namespace
}  // namespace snapfill

int main(int argc, char** argv) {
#if SNAPFILL_HAVE_OPENBLAS
  // OpenBLAS reads these when it is loaded, before main: re-run without them.
  const char* keep = std::getenv("SNAPFILL_BM_KEEP_OPENBLAS_ENV");
  if ((keep == nullptr || std::strcmp(keep, "1") != 0) &&
      (std::getenv("OPENBLAS_CORETYPE") != nullptr || std::getenv("OPENBLAS_L2_SIZE") != nullptr)) {
    std::fprintf(stderr,
                 "bm_matmul_amx: unsetting OPENBLAS_CORETYPE=%s and OPENBLAS_L2_SIZE=%s for this "
                 "benchmark's OpenBLAS comparison (SNAPFILL_BM_KEEP_OPENBLAS_ENV=1 keeps them)\n",
                 std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "(unset)",
                 std::getenv("OPENBLAS_L2_SIZE") ? std::getenv("OPENBLAS_L2_SIZE") : "(unset)");
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("OPENBLAS_L2_SIZE");
    execv("/proc/self/exe", argv);
    std::perror("bm_matmul_amx: re-running without the OpenBLAS variables failed");
    return 1;
  }
#endif
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
