// Google Benchmarks of the element-wise and attention CPU kernels
// (kernels/cpu/ops.h) at SmolLM2-135M shapes (9 heads, 3 KV heads,
// head_dim 64, model_dim 576, ffn_dim 1536, 30 layers). Timing only: correctness is in
// tests/kernels/{ops,attention}_test.cc. Threads: OMP_NUM_THREADS.
//
// Attention FLOPs: 2 (q·k) + 2 (p·v) per head_dim element per visible
// (query, key) pair per head: 4 · num_q · avg_visible · head_dim · num_heads,
// with avg_visible = num_keys - num_q + (num_q + 1) / 2 (causal chunk after
// num_keys - num_q memory keys).
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/ops.h"
#include "kernels/quant_blocks.h"

namespace snapfill {
namespace {

struct ModelShape {
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  int64_t model_dim;
  int64_t ffn_dim;
  int64_t num_layers;
};
constexpr ModelShape kSmolLM2_135M = {9, 3, 64, 576, 1536, 30};
// Other Llama-family shapes for the decode attention: 8 query heads per KV
// head (TinyLlama-1.1B), and head_dim 128 (Llama-3-8B).
constexpr ModelShape kTinyLlama_1_1B = {32, 4, 64, 2048, 5632, 22};
constexpr ModelShape kLlama3_8B = {32, 8, 128, 4096, 14336, 32};
// Gemma 3 270M: 4 query heads on one KV head of head_dim 256.
constexpr ModelShape kGemma3_270M = {4, 1, 256, 640, 2048, 18};

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// One chunk's attention. Third argument, where given: the implementation
// (cpu::AttentionImpl: 0 auto, 1 f32, 2 AVX-512 BF16); the fourth, the model's
// shape (0 SmolLM2-135M, 1 Gemma 3 270M: head_dim 256, 4 heads on 1 KV head);
// the fifth, a sliding window (Gemma's local layers: 512).
void BM_Attention_Cpu(benchmark::State& state) {
  const cpu::AttentionImpl was = cpu::ActiveAttentionImpl();
  if (state.range(2) >= 0) cpu::SetAttentionImplForTesting(static_cast<cpu::AttentionImpl>(state.range(2)));
  const ModelShape m = state.range(3) == 1 ? kGemma3_270M : kSmolLM2_135M;
  const int64_t window = state.range(4);
  const int64_t num_q = state.range(0);
  const int64_t num_keys = state.range(1);
  const int64_t q_stride = m.num_heads * m.head_dim;
  const std::vector<float> q = Random(num_q * q_stride, 1);
  const std::vector<float> k = Random(m.num_kv_heads * num_keys * m.head_dim, 2);
  const std::vector<float> v = Random(m.num_kv_heads * num_keys * m.head_dim, 3);
  std::vector<float> out(num_q * q_stride);
  const float scale = 1.0f / std::sqrt(static_cast<float>(m.head_dim));
  auto run = [&] {
    cpu::Attention(q.data(), q_stride, k.data(), v.data(), num_keys * m.head_dim, m.head_dim, out.data(), q_stride,
                   num_q, num_keys, m.num_heads, m.num_kv_heads, m.head_dim, scale, window);
  };
  for (int i = 0; i < 3; ++i) run();  // warm-up
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  double visible = 0;  // keys seen, summed over the queries
  for (int64_t i = 0; i < num_q; ++i) {
    const int64_t end = num_keys - num_q + i + 1;
    visible += static_cast<double>(window > 0 ? std::min(end, window) : end);
  }
  const double flops = 4.0 * visible * m.head_dim * m.num_heads;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetItemsProcessed(state.iterations() * num_q);
  state.SetBytesProcessed(state.iterations() * 2 * m.num_kv_heads * num_keys * m.head_dim *
                          static_cast<int64_t>(sizeof(float)));
  cpu::SetAttentionImplForTesting(was);
}
BENCHMARK(BM_Attention_Cpu)
    ->ArgNames({"q", "keys", "impl", "model", "window"})
    ->Args({1, 512, -1, 0, 0})
    ->Args({1, 2048, -1, 0, 0})
    ->Args({1, 4096, -1, 0, 0})
    ->Args({512, 512, -1, 0, 0})
    ->Args({512, 2048, -1, 0, 0})
    ->Args({512, 4096, -1, 0, 0})
    ->Args({1024, 2048, 1, 0, 0})
    ->Args({1024, 2048, 2, 0, 0})
    ->Args({1024, 2048, 0, 0, 0})
    ->Args({1024, 4096, -1, 0, 0})
    // Gemma 3 270M's prefill: a 512-token prompt (global and local layers
    // alike: the window covers it) and a 512-token chunk over a ring of 512
    // keys (a local layer) or 1,536 (a global one), on each implementation
    // (AMX-BF16 falls back to f32 where the CPU has none).
    ->ArgsProduct({{512}, {512}, {1, 2, 3}, {1}, {0}})
    ->ArgsProduct({{512}, {1024}, {1, 2, 3}, {1}, {512}})
    ->ArgsProduct({{512}, {2048}, {1, 2, 3}, {1}, {0}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// One decode step's attention: a query per layer against that layer's KV
// (num_layers separate buffers, 45 KiB per key in all for this model), so
// the KV streams from memory as in a real decode instead of sitting in L2
// (BM_Attention_Cpu/q:1 reuses one buffer). keys = 1155 is what IMDC with
// memory 1024 leaves of a 64K-token input; 768, a cache of fewer than
// 1,024 keys (one range per KV head before cab249f). bytes/s counts K and
// V once.
// E = uint16_t: the same step over fp16 K and V (cpu::AttentionDecodeF16,
// the decode copy of the cache), bytes/s counting the fp16 bytes read.
template <typename E>
void DecodeAttentionStep(benchmark::State& state, const ModelShape& m = kSmolLM2_135M, int64_t layers = 0) {
  const int64_t num_keys = state.range(0);
  if (layers == 0) layers = m.num_layers;
  const int64_t q_stride = m.num_heads * m.head_dim;
  const int64_t kv_elems = m.num_kv_heads * num_keys * m.head_dim;
  const std::vector<float> q = Random(q_stride, 1);
  auto as_e = [](std::vector<float> x) {
    std::vector<E> e(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      if constexpr (std::is_same_v<E, float>) {
        e[i] = x[i];
      } else {
        e[i] = Fp32ToFp16(x[i]);
      }
    }
    return e;
  };
  std::vector<std::vector<E>> k, v;
  for (int64_t l = 0; l < layers; ++l) {
    k.push_back(as_e(Random(kv_elems, 10 + l)));
    v.push_back(as_e(Random(kv_elems, 100 + l)));
  }
  std::vector<float> out(q_stride);
  const float scale = 1.0f / std::sqrt(static_cast<float>(m.head_dim));
  auto run = [&] {
    for (int64_t l = 0; l < layers; ++l) {
      if constexpr (std::is_same_v<E, float>) {
        cpu::Attention(q.data(), q_stride, k[l].data(), v[l].data(), num_keys * m.head_dim, m.head_dim,
                       out.data(), q_stride, 1, num_keys, m.num_heads, m.num_kv_heads, m.head_dim, scale);
      } else {
        cpu::AttentionDecodeF16(q.data(), k[l].data(), v[l].data(), num_keys * m.head_dim, m.head_dim,
                                out.data(), num_keys, m.num_heads, m.num_kv_heads, m.head_dim, scale);
      }
    }
  };
  run();
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * layers * 2 * kv_elems * static_cast<int64_t>(sizeof(E)));
  state.counters["threads"] = omp_get_max_threads();
}
void BM_DecodeAttention_Cpu(benchmark::State& state) { DecodeAttentionStep<float>(state); }
void BM_DecodeAttentionF16_Cpu(benchmark::State& state) { DecodeAttentionStep<uint16_t>(state); }
BENCHMARK(BM_DecodeAttention_Cpu)->ArgName("keys")->Arg(1155)->Arg(8356)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DecodeAttentionF16_Cpu)->ArgName("keys")->Arg(768)->Arg(1155)->Arg(8356)->Unit(benchmark::kMillisecond)->UseRealTime();
// The same step for other shapes (model: 1 = TinyLlama-1.1B, 2 = Llama-3-8B,
// 3 = Gemma 3 270M), fp16 K and V as decode reads them by default.
void BM_DecodeAttentionF16Shapes_Cpu(benchmark::State& state) {
  const int64_t model = state.range(1);
  DecodeAttentionStep<uint16_t>(state, model == 1 ? kTinyLlama_1_1B : model == 2 ? kLlama3_8B : kGemma3_270M);
}
BENCHMARK(BM_DecodeAttentionF16Shapes_Cpu)
    ->ArgNames({"keys", "model"})
    ->Args({1155, 1})
    ->Args({1155, 2})
    ->Args({1155, 3})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// One layer's attention over fp16 K and V, run again and again: the KV (3
// KV heads × 256 B per key: 197 KiB at 256 keys, 887 KiB at 1,155) stays in
// L2, so this measures the kernel's arithmetic rather than the memory it
// streams (the rate decode reaches once memory is fast enough). On one
// thread (OMP_NUM_THREADS=1), cycles per key and KV head = 256 B × clock /
// bytes_per_second.
void BM_DecodeAttentionF16InCache_Cpu(benchmark::State& state) {
  DecodeAttentionStep<uint16_t>(state, kSmolLM2_135M, 1);
}
BENCHMARK(BM_DecodeAttentionF16InCache_Cpu)->ArgName("keys")->Arg(256)->Arg(1155)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The step over a compressed cache's 1,155 keys, but with 8 times the
// model's layers (213 MiB of fp16 K and V), so that each layer's KV comes
// from DRAM as in a real decode step, where the weights the products stream
// push it out of L3 (BM_DecodeAttentionF16_Cpu/keys:1155 reads it from L3):
// short ranges (578 keys, 3 per thread and layer), each layer a parallel
// region of its own.
void BM_DecodeAttentionF16FromMemory_Cpu(benchmark::State& state) {
  DecodeAttentionStep<uint16_t>(state, kSmolLM2_135M, 8 * kSmolLM2_135M.num_layers);
}
BENCHMARK(BM_DecodeAttentionF16FromMemory_Cpu)->ArgName("keys")->Arg(1155)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_WindowScores_Cpu(benchmark::State& state) {
  const ModelShape m = kSmolLM2_135M;
  const int64_t window = state.range(0);
  const int64_t num_keys = state.range(1);
  const int64_t q_stride = m.num_heads * m.head_dim;
  const std::vector<float> q = Random(window * q_stride, 4);
  const std::vector<float> k = Random(m.num_kv_heads * num_keys * m.head_dim, 5);
  std::vector<float> votes(m.num_kv_heads * num_keys);
  const float scale = 1.0f / std::sqrt(static_cast<float>(m.head_dim));
  auto run = [&] {
    cpu::WindowScores(q.data(), q_stride, k.data(), num_keys * m.head_dim, m.head_dim, votes.data(),
                      num_keys, window, num_keys, m.num_heads, m.num_kv_heads, m.head_dim, scale);
  };
  for (int i = 0; i < 3; ++i) run();
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(votes.data());
    benchmark::ClobberMemory();
  }
  // Two q·k passes over (nearly) all keys.
  const double flops = 2.0 * 2.0 * window * num_keys * m.head_dim * m.num_heads;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_WindowScores_Cpu)
    ->ArgNames({"window", "keys"})
    ->ArgsProduct({{32}, {512, 2048, 4096}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// The recall tier's scan: a block of stored keys scored by the question's
// queries (num_q tokens x the model's heads), as at the last step of `run
// --recall_dir`; at 1M tokens it scores about 1M keys per layer.
// The queries (num_q tokens x SmolLM2's heads), their log-denominators and
// num_keys stored keys that the recall tier's and reconstruction's scorings
// read, and the scores they write.
struct ScoringOperands {
  ScoringOperands(int64_t num_q, int64_t num_keys, uint32_t seed)
      : num_q(num_q),
        num_keys(num_keys),
        q(Random(num_q * q_stride, seed)),
        k(Random(m.num_kv_heads * num_keys * m.head_dim, seed + 1)),
        lse(m.num_heads * num_q, 8.0f),
        scores(m.num_kv_heads * num_keys) {}
  // cpu::RecallScores over them.
  void RecallScores(bool max_weight) {
    cpu::RecallScores(q.data(), q_stride, num_q, lse.data(), k.data(), num_keys * m.head_dim, m.head_dim, num_keys,
                      scores.data(), num_keys, m.num_heads, m.num_kv_heads, m.head_dim, scale, max_weight);
  }
  // Times run() after a warm-up, with the scoring's GFLOP/s.
  template <typename Run>
  void Time(benchmark::State& state, Run run) {
    for (int i = 0; i < 3; ++i) run();
    for (auto _ : state) {
      run();
      benchmark::DoNotOptimize(scores.data());
      benchmark::ClobberMemory();
    }
    const double flops = 2.0 * num_q * num_keys * m.head_dim * m.num_heads;
    state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  }
  const ModelShape m = kSmolLM2_135M;
  const int64_t q_stride = m.num_heads * m.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(m.head_dim));
  const int64_t num_q, num_keys;
  const std::vector<float> q, k;
  std::vector<float> lse, scores;
};

void BM_RecallScores_Cpu(benchmark::State& state) {
  ScoringOperands o(state.range(0), state.range(1), 4);
  o.Time(state, [&] { o.RecallScores(/*max_weight=*/false); });
  state.counters["keys/s"] =
      benchmark::Counter(static_cast<double>(o.num_keys), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_RecallScores_Cpu)
    ->ArgNames({"q", "keys"})
    ->ArgsProduct({{16, 32}, {2048}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// Context reconstruction's scoring of a chunk's keys: its repetition's rows
// (a chunk of 1,024, repeated whole or every other token) against the
// chunk's 1,024 keys, the largest weight per key; in f32 (arg bf16 0:
// cpu::RecallScores) or on the chunk attention's bf16 operands (1:
// cpu::RecallMaxWeightsBf16, where this CPU's attention takes them; skipped
// elsewhere).
void BM_ReconstructWeights_Cpu(benchmark::State& state) {
  ScoringOperands o(state.range(0), 1024, 6);
  if (state.range(1) == 0) {
    o.Time(state, [&] { o.RecallScores(/*max_weight=*/true); });
    return;
  }
  auto bf16 = [&] {
    return cpu::RecallMaxWeightsBf16(o.q.data(), o.q_stride, o.num_q, o.lse.data(), o.k.data(),
                                     o.num_keys * o.m.head_dim, o.m.head_dim, o.num_keys, o.scores.data(), o.num_keys,
                                     o.m.num_heads, o.m.num_kv_heads, o.m.head_dim, o.scale);
  };
  if (!bf16()) {
    state.SkipWithError("this CPU's chunk attention takes f32 operands");
    return;
  }
  o.Time(state, bf16);
}
BENCHMARK(BM_ReconstructWeights_Cpu)
    ->ArgNames({"rows", "bf16"})
    ->ArgsProduct({{512, 1024}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_RmsNorm_Cpu(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const int64_t dim = state.range(1);
  const std::vector<float> x = Random(tokens * dim, 6);
  const std::vector<float> w = Random(dim, 7);
  std::vector<float> y(tokens * dim);
  for (auto _ : state) {
    cpu::RmsNorm(x.data(), dim, w.data(), y.data(), dim, tokens, dim, 1e-5f);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * tokens);
  state.SetBytesProcessed(state.iterations() * 2 * tokens * dim *
                          static_cast<int64_t>(sizeof(float)));
}
BENCHMARK(BM_RmsNorm_Cpu)
    ->ArgNames({"tokens", "dim"})
    ->ArgsProduct({{1, 512}, {576, 4096}})
    ->UseRealTime();

void BM_Rope_Cpu(benchmark::State& state) {
  const ModelShape m = kSmolLM2_135M;
  const int64_t tokens = state.range(0);
  const int64_t heads = state.range(1);
  std::vector<float> x = Random(tokens * heads * m.head_dim, 8);
  std::vector<int32_t> pos(tokens);
  for (int64_t t = 0; t < tokens; ++t) pos[t] = static_cast<int32_t>(1000 + t);
  for (auto _ : state) {
    cpu::Rope(x.data(), tokens, heads, m.head_dim, heads * m.head_dim, pos.data(), m.head_dim,
              100000.0f, 1.0f, /*neox=*/false);
    benchmark::DoNotOptimize(x.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * tokens);
}
BENCHMARK(BM_Rope_Cpu)
    ->ArgNames({"tokens", "heads"})
    ->ArgsProduct({{1, 512}, {9, 3}})
    ->UseRealTime();

void BM_SwiGlu_Cpu(benchmark::State& state) {
  const int64_t n = state.range(0) * kSmolLM2_135M.ffn_dim;
  const std::vector<float> gate = Random(n, 9);
  const std::vector<float> up = Random(n, 10);
  std::vector<float> out(n);
  for (auto _ : state) {
    cpu::SwiGlu(gate.data(), up.data(), out.data(), n);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_SwiGlu_Cpu)->ArgNames({"tokens"})->Arg(1)->Arg(512)->UseRealTime();

}  // namespace
}  // namespace snapfill
