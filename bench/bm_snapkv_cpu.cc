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

// Uniform votes in [0, 1), the same for every benchmark (a question's,
// seed 1; the window's beside them, seed 2).
std::vector<float> RandomVotes(int64_t count, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unif(0.0f, 1.0f);
  std::vector<float> votes(count);
  for (float& v : votes) v = unif(rng);
  return votes;
}

// The selection's input: span 0, the window's votes; from 1, a question's
// (the defaults: spans of 32; 1, single tokens), before the input's last
// step, which picks `share` percent of what is kept (100, the default:
// alone; less, the window's votes pick the rest after it).
struct SelectionCase {
  PrunerConfig config;  // window 32, avg kernel 7, no sinks
  std::vector<float> votes, window_votes;
  SelectionInput in;
};
SelectionCase MakeSelection(const benchmark::State& state) {
  const int64_t memory = state.range(0), chunk = state.range(1), kv_heads = state.range(2), span = state.range(3);
  const int64_t n = memory + chunk;
  SelectionCase s;
  s.votes = RandomVotes(kv_heads * n);
  s.window_votes = RandomVotes(kv_heads * n, 2);
  if (span > 0) {
    s.config.query_select = span == 1 ? Selection::kToken : Selection::kSpan;
    s.config.span = span;
    s.config.query_share = static_cast<double>(state.range(4)) / 100.0;
  }
  s.in.num_kv_heads = kv_heads;
  s.in.num_candidates = n;
  s.in.num_memory = memory;
  s.in.budget = memory;  // fixed memory: evict one chunk's worth
  s.in.votes = s.window_votes.data();
  s.in.votes_stride = n;
  if (span > 0) {
    s.in.query_votes = s.votes.data();
    s.in.query_votes_stride = n;
  }
  return s;
}

void BM_SnapKvSelect_Cpu(benchmark::State& state) {
  const int64_t n = state.range(0) + state.range(1), kv_heads = state.range(2);
  const SelectionCase s = MakeSelection(state);
  auto backend = CreateBackend(Device::kCpu);
  if (!backend.ok()) {
    state.SkipWithError(backend.status().ToString().c_str());
    return;
  }
  auto pruner = CreatePruner(s.config, **backend);
  if (!pruner.ok()) {
    state.SkipWithError(pruner.status().ToString().c_str());
    return;
  }
  std::vector<std::vector<int32_t>> keep;
  for (int i = 0; i < 10; ++i) (void)(*pruner)->Select(s.in, &keep);  // warm-up
  for (auto _ : state) {
    absl::Status st = (*pruner)->Select(s.in, &keep);
    benchmark::DoNotOptimize(st);
    benchmark::DoNotOptimize(keep.data());
  }
  state.SetItemsProcessed(state.iterations() * n * kv_heads);  // candidates ranked
}
// kv_heads 3: SmolLM2-135M; 8: Llama-3-8B. A question's spans with half
// the share: the window's votes pick the other half after them.
BENCHMARK(BM_SnapKvSelect_Cpu)
    ->ArgNames({"memory", "chunk", "kv_heads", "span", "share"})
    ->ArgsProduct({{1024, 4096, 8192}, {512, 2048}, {3, 8}, {0, 32}, {100}})
    ->ArgsProduct({{1024, 8192}, {2048}, {8}, {32}, {50}});

// The same selection as the engine runs it now, one backend op for every
// head (Backend::SelectHeads, as SnapKV's PlanInBackend makes it: no
// SelectionInput, no keep vectors); span 0 the window's rule.
void BM_SelectHeads_Cpu(benchmark::State& state) {
  const int64_t n = state.range(0) + state.range(1), kv_heads = state.range(2);
  const SelectionCase s = MakeSelection(state);
  auto backend = CreateBackend(Device::kCpu);
  if (!backend.ok()) {
    state.SkipWithError(backend.status().ToString().c_str());
    return;
  }
  auto pruner = CreatePruner(s.config, **backend);
  Backend::HeadSelection op;
  if (!pruner.ok() || !(*pruner)->PlanInBackend(s.in, &op)) {
    state.SkipWithError("not one backend op");
    return;
  }
  op.votes = s.in.query_votes != nullptr ? s.votes.data() : s.window_votes.data();
  op.votes_stride = n;
  if (op.then_pick > 0) {
    op.then_votes = s.window_votes.data();
    op.then_votes_stride = n;
  }
  op.keep_stride = op.count() + 1;
  std::vector<int32_t> keep(kv_heads * op.keep_stride);
  op.keep = keep.data();
  for (int i = 0; i < 10; ++i) (void)(*backend)->SelectHeads(op);  // warm-up
  for (auto _ : state) {
    absl::Status st = (*backend)->SelectHeads(op);
    benchmark::DoNotOptimize(st);
    benchmark::DoNotOptimize(keep.data());
  }
  state.SetItemsProcessed(state.iterations() * n * kv_heads);
}
BENCHMARK(BM_SelectHeads_Cpu)
    ->ArgNames({"memory", "chunk", "kv_heads", "span", "share"})
    ->ArgsProduct({{1024, 4096, 8192}, {512, 2048}, {3, 8}, {0, 32}, {100}})
    ->ArgsProduct({{1024, 8192}, {2048}, {8}, {32}, {50}});

}  // namespace
}  // namespace snapfill
