// Google Benchmark of Backend::Gather as the chunk loop calls it once a
// layer: each KV head's memory and chunk rows copied into the candidates
// (runs of rows), then the kept candidates back into the memory (rows by
// indices in the backend's memory, as SelectHeads leaves them). The copies
// go in one Gather call each, as the engine makes them, or one call a copy
// (the CUDA backend launched one copy per gather before it batched them:
// that second form measures what batching saves).
//
// Arguments: KV heads, head_dim, memory entries (= chunk tokens = kept
// entries), and 1 for the engine's calls or 0 for a call a copy. On cuda
// every iteration ends with the device's work done (Synchronize); the
// CUDA rows report why no CUDA backend could be made where none can.
//
//   build/bench/bm_gather --benchmark_filter=Cuda
#include <cstdint>
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "snapfill/backend.h"
#include "snapfill/status.h"

namespace snapfill {
namespace {

void GatherLayer(benchmark::State& state, Device device) {
  const int64_t heads = state.range(0), d = state.range(1), m = state.range(2), n = m;
  const bool one_call = state.range(3) != 0;
  auto made = CreateBackend(device, BackendOptions{});
  if (!made.ok()) {
    state.SkipWithError(made.status().ToString().c_str());
    return;
  }
  Backend& b = **made;
  const int64_t capacity = m + n;  // candidates a head
  const size_t row = d * sizeof(float), batch_row = heads * d * sizeof(float);
  auto memory_k = b.NewBuffer(heads * m * row), memory_v = b.NewBuffer(heads * m * row);
  auto cand_k = b.NewBuffer(heads * capacity * row), cand_v = b.NewBuffer(heads * capacity * row);
  auto chunk_k = b.NewBuffer(n * batch_row), chunk_v = b.NewBuffer(n * batch_row);
  auto keep = b.NewBuffer(heads * m * sizeof(int32_t));
  for (auto* buffer : {&memory_k, &memory_v, &cand_k, &cand_v, &chunk_k, &chunk_v, &keep}) {
    if (!buffer->ok()) {
      state.SkipWithError(buffer->status().ToString().c_str());
      return;
    }
  }
  // The kept candidates: every other one, ascending.
  std::vector<int32_t> kept(heads * m);
  for (int64_t i = 0; i < heads * m; ++i) kept[i] = static_cast<int32_t>(2 * (i % m) + (i / m) % 2);
  if (!b.Upload(kept.data(), (*keep)->data(), kept.size() * sizeof(int32_t)).ok()) {
    state.SkipWithError("upload");
    return;
  }
  auto f = [](std::unique_ptr<BackendBuffer>& buffer) { return static_cast<char*>(buffer->data()); };
  std::vector<Backend::RowGather> fill, compact;
  for (int64_t h = 0; h < heads; ++h) {
    char* kr = f(*cand_k) + h * capacity * row;
    char* vr = f(*cand_v) + h * capacity * row;
    fill.push_back({f(*memory_k) + h * m * row, row, nullptr, kr, row, m, row});
    fill.push_back({f(*memory_v) + h * m * row, row, nullptr, vr, row, m, row});
    fill.push_back({f(*chunk_k) + h * row, batch_row, nullptr, kr + m * row, row, n, row});
    fill.push_back({f(*chunk_v) + h * row, batch_row, nullptr, vr + m * row, row, n, row});
    const auto* idx = reinterpret_cast<const int32_t*>(f(*keep)) + h * m;
    compact.push_back({kr, row, idx, f(*memory_k) + h * m * row, row, m, row});
    compact.push_back({vr, row, idx, f(*memory_v) + h * m * row, row, m, row});
  }
  auto run = [&](const std::vector<Backend::RowGather>& copies) -> absl::Status {
    if (one_call) return b.Gather(copies);
    for (const Backend::RowGather& c : copies) SNAPFILL_RETURN_IF_ERROR(b.Gather({c}));
    return absl::OkStatus();
  };
  for (auto _ : state) {
    absl::Status s = run(fill);
    if (s.ok()) s = run(compact);
    if (s.ok()) s = b.Synchronize();
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
  }
  const int64_t copies = static_cast<int64_t>(fill.size() + compact.size());
  state.counters["copies"] = static_cast<double>(copies);
  // Seconds a copy (printed with an SI prefix: 2.5u is 2.5 µs).
  state.counters["per_copy"] = benchmark::Counter(
      static_cast<double>(copies), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  // Bytes read and written.
  state.SetBytesProcessed(state.iterations() * 2 * heads * (2 * (m + n) + 2 * m) * static_cast<int64_t>(row));
}

void BM_GatherLayer_Cpu(benchmark::State& state) { GatherLayer(state, Device::kCpu); }
void BM_GatherLayer_Cuda(benchmark::State& state) { GatherLayer(state, Device::kCuda); }

// SmolLM2-135M's shape (3 KV heads of 64) and Llama-2-7B's (32 of 128), a
// 1,024-entry memory and 1,024-token chunks; the engine's calls, then a
// call a copy.
void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"heads", "d", "m", "one_call"});
  for (int64_t one_call : {1, 0}) {
    b->Args({3, 64, 1024, one_call});
    b->Args({32, 128, 1024, one_call});
  }
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}
BENCHMARK(BM_GatherLayer_Cpu)->Apply(Shapes);
BENCHMARK(BM_GatherLayer_Cuda)->Apply(Shapes);

}  // namespace
}  // namespace snapfill

BENCHMARK_MAIN();
