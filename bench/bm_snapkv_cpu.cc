// SnapKV selection cost on the CPU (src/compress): pooling + top-k + merge
// per KV head over memory + chunk candidates, with random votes. The window
// votes themselves are BM_WindowScores_Cpu in bm_ops_cpu.cc. No reference:
// correctness is tests/compress/snapkv_reference_test.cc (the pruner) and
// tests/backend/cpu_backend_ops_test.cc (the backend op).
#include <cstdint>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "snapfill/backend.h"
#include "src/compress/pruner.h"

namespace snapfill {
namespace {

// Uniform votes in [0, 1), the same for every benchmark.
std::vector<float> RandomVotes(int64_t count) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> unif(0.0f, 1.0f);
  std::vector<float> votes(count);
  for (float& v : votes) v = unif(rng);
  return votes;
}

// span 0: the window's votes; from 1, a question's alone (the defaults:
// spans of 32; 1, single tokens), before the input's last step.
void BM_SnapKvSelect_Cpu(benchmark::State& state) {
  const int64_t memory = state.range(0), chunk = state.range(1), kv_heads = state.range(2), span = state.range(3);
  const int64_t n = memory + chunk;
  const std::vector<float> votes = RandomVotes(kv_heads * n);
  auto backend = CreateBackend(Device::kCpu);
  if (!backend.ok()) {
    state.SkipWithError(backend.status().ToString().c_str());
    return;
  }
  PrunerConfig config;  // window 32, avg kernel 7, no sinks
  if (span > 0) {
    config.query_select = span == 1 ? Selection::kToken : Selection::kSpan;
    config.span = span;
  }
  auto pruner = CreatePruner(config, **backend);
  if (!pruner.ok()) {
    state.SkipWithError(pruner.status().ToString().c_str());
    return;
  }
  SelectionInput in;
  in.num_kv_heads = kv_heads;
  in.num_candidates = n;
  in.num_memory = memory;
  in.budget = memory;  // fixed memory: evict one chunk's worth
  in.votes = votes.data();
  in.votes_stride = n;
  if (span > 0) {
    in.query_votes = votes.data();
    in.query_votes_stride = n;
  }
  std::vector<std::vector<int32_t>> keep;
  for (int i = 0; i < 10; ++i) (void)(*pruner)->Select(in, &keep);  // warm-up
  for (auto _ : state) {
    absl::Status s = (*pruner)->Select(in, &keep);
    benchmark::DoNotOptimize(s);
    benchmark::DoNotOptimize(keep.data());
  }
  state.SetItemsProcessed(state.iterations() * n * kv_heads);  // candidates ranked
}
// kv_heads 3: SmolLM2-135M; 8: Llama-3-8B.
BENCHMARK(BM_SnapKvSelect_Cpu)
    ->ArgNames({"memory", "chunk", "kv_heads", "span"})
    ->ArgsProduct({{1024, 4096, 8192}, {512, 2048}, {3, 8}, {0, 32}});

// The same selection as the engine runs it now, one backend op for every
// head (Backend::SelectHeads: no SelectionInput, no keep vectors); span 1
// the window's rule, 32 a question's (its votes pick R whole: no window).
void BM_SelectHeads_Cpu(benchmark::State& state) {
  const int64_t memory = state.range(0), chunk = state.range(1), kv_heads = state.range(2), span = state.range(3);
  const int64_t n = memory + chunk, window = 32;
  const std::vector<float> votes = RandomVotes(kv_heads * n);
  auto backend = CreateBackend(Device::kCpu);
  if (!backend.ok()) {
    state.SkipWithError(backend.status().ToString().c_str());
    return;
  }
  const int64_t pinned = span > 1 ? 0 : window;
  Backend::HeadSelection op{.votes = votes.data(),
                            .votes_stride = n,
                            .num_heads = kv_heads,
                            .num_candidates = n,
                            .window_begin = n - pinned,
                            .pick = memory - pinned,
                            .pool_kernel = 7,
                            .span = span};
  op.keep_stride = op.count() + 1;
  std::vector<int32_t> keep(kv_heads * op.keep_stride);
  op.keep = keep.data();
  for (int i = 0; i < 10; ++i) (void)(*backend)->SelectHeads(op);  // warm-up
  for (auto _ : state) {
    absl::Status s = (*backend)->SelectHeads(op);
    benchmark::DoNotOptimize(s);
    benchmark::DoNotOptimize(keep.data());
  }
  state.SetItemsProcessed(state.iterations() * n * kv_heads);
}
BENCHMARK(BM_SelectHeads_Cpu)
    ->ArgNames({"memory", "chunk", "kv_heads", "span"})
    ->ArgsProduct({{1024, 4096, 8192}, {512, 2048}, {3, 8}, {1, 32}});

}  // namespace
}  // namespace snapfill

BENCHMARK_MAIN();
