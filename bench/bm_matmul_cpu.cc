// Benchmarks of cpu::MatMul on SmolLM2-135M's linear-layer shapes.
//   BM_MatMul_Cpu/<type>/m/k/n: Y[m, n] = X[m, k] · W[n, k]ᵀ, W in <type>.
// Shapes: q/o projections (576 -> 576), FFN up/gate (576 -> 1536), FFN down
// (1536 -> 576), output head (576 -> 49152); m = 1 (decode) and 512 (prefill);
// k/v projection (576 -> 192) at m = 1; and a Llama-sized FFN in Q4_K / Q6_K
// (2048 -> 5632 -> 2048) at m = 512.
// Counters: GFLOP/s = 2·m·n·k per iteration; items = tokens. Threads: whatever
// OMP_NUM_THREADS / omp_get_max_threads() gives (set it to pin the count).
// No correctness checks here: tests/kernels/matmul_test.cc covers them.
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "bench/bench_weights.h"
#include "benchmark/benchmark.h"
#include "kernels/cpu/matmul.h"
#include "kernels/quant_blocks.h"
#include "kernels/ref/quant_ref.h"

namespace snapfill {
namespace {

using bench::RandomWeights;

void BM_MatMul_Cpu(benchmark::State& state) {
  const auto type = static_cast<GgmlType>(state.range(0));
  const int64_t m = state.range(1), k = state.range(2), n = state.range(3);
  const auto w = RandomWeights(type, n, k);
  const std::vector<float> x = bench::RandomActivations(m * k);
  std::vector<float> y(m * n);
  const size_t row_bytes = RowBytes(type, k);
  for (int i = 0; i < 3; ++i) cpu::MatMul(x.data(), m, k, k, w.data(), type, n, row_bytes, y.data(), n);
  for (auto _ : state) {
    cpu::MatMul(x.data(), m, k, k, w.data(), type, n, row_bytes, y.data(), n);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * m);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n * row_bytes));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * m * n * k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = omp_get_max_threads();
  state.SetLabel(GetTypeTraits(type).name);
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "m", "k", "n"});
  const GgmlType types[] = {GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kQ4_0,
                            GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kF32,
                            GgmlType::kF16,  GgmlType::kQ5_0};
  const int64_t shapes[][2] = {{576, 1536}, {1536, 576}, {576, 576}, {576, 49152}};
  for (GgmlType t : types) {
    for (const auto& s : shapes) {
      for (int64_t m : {1, 512}) {
        if ((t == GgmlType::kQ4_K || t == GgmlType::kQ6_K) && s[0] % 256 != 0) continue;
        if (m == 512 && s[1] == 49152 && t != GgmlType::kQ8_0) continue;  // output head is Q8_0
        b->Args({static_cast<int64_t>(t), m, s[0], s[1]});
      }
    }
  }
  // k/v projections at decode (576 -> 192): the smallest product of a token.
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ8_0}) b->Args({static_cast<int64_t>(t), 1, 576, 192});
  // A Llama-family K-quant file's FFN (TinyLlama / Llama-2: 2048 -> 5632 ->
  // 2048; llama.cpp's Q4_K_M has Q4_K gate/up and Q6_K down), prefill.
  b->Args({static_cast<int64_t>(GgmlType::kQ4_K), 512, 2048, 5632});
  b->Args({static_cast<int64_t>(GgmlType::kQ6_K), 512, 5632, 2048});
  // Gemma 3 270M's prefill (Q4_K_M: Q5_0 q / k / gate / up from 640, Q8_0
  // or Q5_0 v, Q4_K attn_output from 1024, Q6_K or Q4_K ffn_down from 2048).
  for (const auto& [t, k, n] : {std::tuple{GgmlType::kQ5_0, 640, 2048}, std::tuple{GgmlType::kQ5_0, 640, 1024},
                                std::tuple{GgmlType::kQ8_0, 640, 256}, std::tuple{GgmlType::kQ4_K, 1024, 640},
                                std::tuple{GgmlType::kQ6_K, 2048, 640}, std::tuple{GgmlType::kQ4_K, 2048, 640}}) {
    b->Args({static_cast<int64_t>(t), 512, k, n});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_MatMul_Cpu)->Apply(Shapes);

// One decode step's products as the model runs them: 30 layers of
// q/k/v/o (576 -> 576/192/192/576) and gate/up/down (576 -> 1536 -> 576) in
// Q4_1, then the Q8_0 output head (576 -> 49152), each with its own weights
// (92 MiB in all, far beyond L2), so the weights stream from L3 or DRAM as in
// a real decode, not from a hot L2 as in BM_MatMul_Cpu. items = tokens.
//   packed: 0 = the GGUF rows (cpu::MatMul), 1 = the decode layout
//           (cpu::MatMulDecodePacked, one product per call), 2 = the
//           decode layout as the backend runs it: q/k/v and gate/up each
//           in one cpu::MatMulDecodePackedShared (one parallel region)
//   copies: the 30 layers repeated (each copy its own weights): 1 = the
//           model; 2 = twice its footprint, which no longer fits this VM's
//           share of L3, as in a real decode whose KV streams through too
// bytes_per_second counts the bytes each path reads.
void BM_DecodeStep_Cpu(benchmark::State& state) {
  const bool packed = state.range(0) != 0, shared = state.range(0) == 2;
  const int copies = static_cast<int>(state.range(1));
  struct Product {
    int64_t k, n;
    GgmlType type;
    std::vector<uint8_t> w;
    std::vector<uint8_t> p;  // decode layout
  };
  std::vector<Product> products;
  const int64_t layer_shapes[][2] = {{576, 576}, {576, 192}, {576, 192}, {576, 576},
                                     {576, 1536}, {576, 1536}, {1536, 576}};
  for (int layer = 0; layer < 30 * copies; ++layer) {
    for (const auto& s : layer_shapes) products.push_back({s[0], s[1], GgmlType::kQ4_1, {}, {}});
  }
  products.push_back({576, 49152, GgmlType::kQ8_0, {}, {}});
  int64_t bytes = 0, flops = 0;
  for (auto& p : products) {
    p.w = RandomWeights(p.type, p.n, p.k);
    if (packed) {
      const size_t size = cpu::DecodePackedBytes(p.type, p.n, p.k);
      if (size == 0) {
        state.SkipWithError("no decode layout kernel in this build");
        return;
      }
      p.p.resize(size);
      cpu::PackForDecode(p.w.data(), p.type, p.n, p.k, RowBytes(p.type, p.k), p.p.data());
      std::vector<uint8_t>().swap(p.w);
      bytes += static_cast<int64_t>(p.p.size());
    } else {
      bytes += static_cast<int64_t>(p.w.size());
    }
    flops += 2 * p.n * p.k;
  }
  std::vector<float> x(1536, 0.5f), y(49152);
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  // With `shared`, runs of products of one k that the model runs together:
  // per layer q/k/v (3), o (1), gate/up (2), down (1); then the head.
  std::vector<int> runs;
  for (int layer = 0; layer < 30 * copies; ++layer) runs.insert(runs.end(), {3, 1, 2, 1});
  runs.push_back(1);
  auto step = [&] {
    if (shared) {
      size_t i = 0;
      for (int run : runs) {
        cpu::DecodeOut outs[3];
        for (int c = 0; c < run; ++c) outs[c] = {products[i + c].p.data(), products[i + c].n, y.data() + 2048 * c};
        cpu::MatMulDecodePackedShared(x.data(), products[i].k, products[i].type, outs, run);
        i += run;
      }
      return;
    }
    for (const auto& p : products) {
      if (packed) {
        cpu::MatMulDecodePacked(x.data(), p.k, p.p.data(), p.type, p.n, y.data());
      } else {
        cpu::MatMul(x.data(), 1, p.k, p.k, p.w.data(), p.type, p.n, RowBytes(p.type, p.k), y.data(), p.n);
      }
    }
  };
  step();
  for (auto _ : state) {
    step();
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = omp_get_max_threads();
}
BENCHMARK(BM_DecodeStep_Cpu)
    ->ArgNames({"packed", "copies"})
    ->ArgsProduct({{0, 1, 2}, {1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// One token times a large matrix in the decode layout, in bytes streamed
// per second: model 0, SmolLM2's Q8_0 output head (49,152 × 576); 1, Gemma 3
// 270M's (262,144 × 640, 178 MB, more than half of its decode samples); 2,
// Gemma 3 270M's Q5_0 products of all 18 layers (Q, K, gate and up: 5,376 ×
// 640 each, 42 MB) as one matrix. avx2:1 forces the AVX2 kernels
// (MatMulImpl::kAvx2) where the AVX-512 ones would run.
void BM_DecodeHead_Cpu(benchmark::State& state) {
  const int64_t model = state.range(0);
  const GgmlType type = model == 2 ? GgmlType::kQ5_0 : GgmlType::kQ8_0;
  const int64_t k = model == 0 ? 576 : 640, n = model == 0 ? 49152 : model == 1 ? 262144 : 18 * 5376;
  if (state.range(1) == 1) {
    if (!cpu::MatMulHasAvx2() || !cpu::MatMulHasSimd()) {
      state.SkipWithError("no AVX-512 kernels to set aside here");
      return;
    }
    cpu::SetMatMulImpl(cpu::MatMulImpl::kAvx2);
  }
  const size_t size = cpu::DecodePackedBytes(type, n, k);
  if (size == 0) {
    cpu::SetMatMulImpl(cpu::MatMulImpl::kAuto);
    state.SkipWithError("no decode layout kernel in this build");
    return;
  }
  std::vector<uint8_t> p(size);
  {
    const auto w = RandomWeights(type, n, k);
    cpu::PackForDecode(w.data(), type, n, k, RowBytes(type, k), p.data());
  }
  std::vector<float> x(k), y(n);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x) v = nd(rng);
  cpu::MatMulDecodePacked(x.data(), k, p.data(), type, n, y.data());
  for (auto _ : state) {
    cpu::MatMulDecodePacked(x.data(), k, p.data(), type, n, y.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  cpu::SetMatMulImpl(cpu::MatMulImpl::kAuto);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(size));
  state.counters["threads"] = omp_get_max_threads();
}
BENCHMARK(BM_DecodeHead_Cpu)
    ->ArgNames({"model", "avx2"})
    ->ArgsProduct({{0, 1, 2}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Rewriting the default model's decode matrices (92 MiB) into the decode
// layout: what the backend pays once, at the first one-token product.
void BM_PackForDecode_Cpu(benchmark::State& state) {
  struct Matrix {
    int64_t k, n;
    GgmlType type;
    std::vector<uint8_t> w;
  };
  std::vector<Matrix> ms;
  const int64_t layer_shapes[][2] = {{576, 576}, {576, 192}, {576, 192}, {576, 576},
                                     {576, 1536}, {576, 1536}, {1536, 576}};
  for (int layer = 0; layer < 30; ++layer) {
    for (const auto& s : layer_shapes) ms.push_back({s[0], s[1], GgmlType::kQ4_1, {}});
  }
  ms.push_back({576, 49152, GgmlType::kQ8_0, {}});
  int64_t bytes = 0;
  for (auto& m : ms) {
    m.w = RandomWeights(m.type, m.n, m.k);
    bytes += static_cast<int64_t>(m.w.size());
  }
  if (cpu::DecodePackedBytes(GgmlType::kQ4_1, 16, 576) == 0) {
    state.SkipWithError("no decode layout kernel in this build");
    return;
  }
  std::vector<std::vector<uint8_t>> out(ms.size());
  for (size_t i = 0; i < ms.size(); ++i) out[i].resize(cpu::DecodePackedBytes(ms[i].type, ms[i].n, ms[i].k));
  for (auto _ : state) {
    for (size_t i = 0; i < ms.size(); ++i) {
      cpu::PackForDecode(ms[i].w.data(), ms[i].type, ms[i].n, ms[i].k, RowBytes(ms[i].type, ms[i].k),
                         out[i].data());
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["threads"] = omp_get_max_threads();
}
BENCHMARK(BM_PackForDecode_Cpu)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace snapfill
