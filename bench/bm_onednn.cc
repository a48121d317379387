// oneDNN's bf16 matmul (libdnnl) at SmolLM2-135M's prefill shapes, the
// rate of a well-kept library beside cpu::MatMul's (bm_matmul_amx, whose
// BM_AmxPeak gives the tile peak both are held to).
//   BM_Dnnl_Bf16/m/k/n/conv: Y[m, n] = X[m, k] · W[n, k]ᵀ with the weights
//     in bf16, reordered once into the layout oneDNN picks
//     (format_tag::any, outside the timed loop), f32 outputs. conv 0 takes
//     X already in bf16; conv 1 reorders X from f32 to bf16 inside the loop,
//     as cpu::MatMul converts it. The label names the implementation oneDNN
//     chose (brg:avx512_core_amx_bf16 where the CPU has AMX). oneDNN needs
//     the weights in bf16 (3.6x the bytes of Q4_1); ours unpack Q4_1 in
//     every call. Counter GFLOP/s = 2·m·n·k per call.
// Built only where CMake finds oneDNN (tools/install_deps.sh installs it);
// a binary of its own because, linked into bm_matmul_amx, libdnnl made some
// of the products there 20-25% slower (2,048 × 576 → 192, two runs) without
// a call into it (docs/history/BENCHMARKS-log.md). Threads: oneDNN's OpenMP
// runtime, omp_get_max_threads() (OMP_NUM_THREADS pins it).
#include <omp.h>

#include <cstdint>
#include <random>
#include <string>

#include "benchmark/benchmark.h"
#include "dnnl.hpp"

namespace {

void BM_Dnnl_Bf16(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  const bool conv = state.range(3) != 0;
  using dnnl::memory;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const memory::desc x32({m, k}, memory::data_type::f32, memory::format_tag::ab);
  const memory::desc x16({m, k}, memory::data_type::bf16, memory::format_tag::ab);
  // W[n, k] row-major is the [k, n] weights operand in layout ba.
  const memory::desc w_plain({k, n}, memory::data_type::f32, memory::format_tag::ba);
  const memory::desc w_any({k, n}, memory::data_type::bf16, memory::format_tag::any);
  const memory::desc y32({m, n}, memory::data_type::f32, memory::format_tag::ab);
  dnnl::matmul::primitive_desc pd;
  try {
#if DNNL_VERSION_MAJOR >= 3
    pd = dnnl::matmul::primitive_desc(eng, x16, w_any, y32);
#else
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(x16, w_any, y32), eng);
#endif
  } catch (const dnnl::error& e) {
    state.SkipWithError((std::string("oneDNN has no bf16 matmul here: ") + e.what()).c_str());
    return;
  }
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  memory xf(x32, eng), xb(x16, eng), wf(w_plain, eng), wb(pd.weights_desc(), eng), y(y32, eng);
  for (int64_t i = 0; i < m * k; ++i) static_cast<float*>(xf.get_data_handle())[i] = nd(rng);
  for (int64_t i = 0; i < n * k; ++i) static_cast<float*>(wf.get_data_handle())[i] = 0.05f * nd(rng);
  dnnl::reorder(wf, wb).execute(strm, wf, wb);
  dnnl::reorder to_bf16(xf, xb);
  to_bf16.execute(strm, xf, xb);
  dnnl::matmul mm(pd);
  auto run = [&] {
    if (conv) to_bf16.execute(strm, xf, xb);
    mm.execute(strm, {{DNNL_ARG_SRC, xb}, {DNNL_ARG_WEIGHTS, wb}, {DNNL_ARG_DST, y}});
    strm.wait();
  };
  for (int i = 0; i < 2; ++i) run();
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(y.get_data_handle());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * m);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * n * k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = omp_get_max_threads();
  state.SetLabel(std::string("onednn ") + pd.impl_info_str() + (conv ? " +X f32->bf16" : ""));
}

void DnnlShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"m", "k", "n", "conv"});
  const int64_t shapes[][2] = {{576, 576}, {576, 192}, {576, 1536}, {1536, 576}};
  for (int64_t m : {512, 2048}) {
    for (const auto& s : shapes) {
      for (int64_t conv : {0, 1}) b->Args({m, s[0], s[1], conv});
    }
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_Dnnl_Bf16)->Apply(DnnlShapes);

}  // namespace

BENCHMARK_MAIN();
