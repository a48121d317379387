// The AMX-INT8 tile path of cpu::MatMul beside the AVX-512 VNNI path, on
// SmolLM2-135M's prefill shapes, plus the tile unit's instruction peak.
//   BM_MatMul_Prefill/impl/type/m/k/n: Y[m, n] = X[m, k] · W[n, k]ᵀ with
//     impl 0 = kAuto (AMX where available), 1 = kNoAmx (VNNI). Shapes:
//     q/o 576->576, k/v 576->192, FFN up/gate 576->1536, FFN down 1536->576;
//     m = 512 and 2048 tokens. Counter GFLOP/s = 2·m·n·k per call.
//   BM_AmxPeak/K: a loop of independent tdpbssd (4 C tiles, 2 A, 2 B) on
//     every OpenMP thread; K = 64 bytes per A row (the full tile) or 32 (the
//     shape the MatMul kernel issues: one 32-element block per op). Counter
//     GOP/s = 2·16·16·K per op, all threads.
// Threads: omp_get_max_threads() (OMP_NUM_THREADS pins it). No correctness
// checks here: tests/kernels/matmul_amx_test.cc covers them.
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/matmul.h"
#include "kernels/quant_blocks.h"
#include "kernels/ref/quant_ref.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SNAPFILL_BM_AMX 1
#else
#define SNAPFILL_BM_AMX 0
#endif

namespace snapfill {
namespace {

std::vector<uint8_t> RandomWeights(GgmlType type, int64_t n, int64_t k) {
  const int64_t row_bytes = RowBytes(type, k);
  std::vector<uint8_t> w(n * row_bytes);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> row(k);
  for (int64_t j = 0; j < n; ++j) {
    for (auto& v : row) v = nd(rng);
    ref::QuantizeRow(type, row.data(), w.data() + j * row_bytes, k);
  }
  return w;
}

void BM_MatMul_Prefill(benchmark::State& state) {
  const bool amx = state.range(0) == 0;
  const auto type = static_cast<GgmlType>(state.range(1));
  const int64_t m = state.range(2), k = state.range(3), n = state.range(4);
  if (amx && !cpu::MatMulHasAmx()) {
    state.SkipWithError("AMX-INT8 unavailable on this CPU/OS (or SNAPFILL_AMX=0)");
    return;
  }
  cpu::SetMatMulImplForTesting(amx ? cpu::MatMulImpl::kAuto : cpu::MatMulImpl::kNoAmx);
  const auto w = RandomWeights(type, n, k);
  std::vector<float> x(m * k), y(m * n);
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  const size_t row_bytes = RowBytes(type, k);
  for (int i = 0; i < 2; ++i) cpu::MatMul(x.data(), m, k, k, w.data(), type, n, row_bytes, y.data(), n);
  for (auto _ : state) {
    cpu::MatMul(x.data(), m, k, k, w.data(), type, n, row_bytes, y.data(), n);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAuto);
  state.SetItemsProcessed(state.iterations() * m);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * n * k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = omp_get_max_threads();
  state.SetLabel(std::string(amx ? "amx " : "vnni ") + GetTypeTraits(type).name);
}

void PrefillShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"impl", "type", "m", "k", "n"});
  const int64_t shapes[][2] = {{576, 576}, {576, 192}, {576, 1536}, {1536, 576}};
  for (int64_t m : {512, 2048}) {
    for (const auto& s : shapes) {
      for (int64_t impl : {0, 1}) b->Args({impl, static_cast<int64_t>(GgmlType::kQ4_1), m, s[0], s[1]});
    }
  }
  // The other two tile-path types on the largest product.
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ8_0}) {
    for (int64_t impl : {0, 1}) b->Args({impl, static_cast<int64_t>(t), 512, 576, 1536});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_MatMul_Prefill)->Apply(PrefillShapes);

#if SNAPFILL_BM_AMX
struct alignas(64) PeakConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// `iters` rounds of 4 independent tdpbssd (C0..C3 += A{4,5} · B{6,7}) with
// A rows of `kb` bytes. Returns C0[0] so the work is observable.
__attribute__((target("amx-tile,amx-int8"))) int32_t AmxPeakLoop(int64_t iters, int kb) {
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
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  _tile_release();
  return c[0];
}

void BM_AmxPeak(benchmark::State& state) {
  if (!cpu::MatMulHasAmx()) {  // also makes the process ask for the tile state
    state.SkipWithError("AMX-INT8 unavailable on this CPU/OS (or SNAPFILL_AMX=0)");
    return;
  }
  const int kb = static_cast<int>(state.range(0));
  constexpr int64_t kIters = 1 << 18;
  const int threads = omp_get_max_threads();
  for (auto _ : state) {
    int32_t sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += AmxPeakLoop(kIters, kb);
    benchmark::DoNotOptimize(sink);
  }
  const double ops_per_call = 4.0 * kIters * threads * 2 * 16 * 16 * kb;
  state.counters["GOP/s"] = benchmark::Counter(ops_per_call * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = threads;
}
BENCHMARK(BM_AmxPeak)->ArgName("K")->Arg(64)->Arg(32)->Unit(benchmark::kMillisecond)->UseRealTime();
#endif

}  // namespace
}  // namespace snapfill

BENCHMARK_MAIN();
