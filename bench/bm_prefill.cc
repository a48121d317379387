// End-to-end speed of the default model on this machine: dense prefill of
// 512 and 2048 tokens (llama-bench's pp512 / pp2048) and decoding 128 tokens
// after a short prompt (tg128), so the figures sit beside llama-bench's.
// The model is $SNAPFILL_MODEL or models/SmolLM2-135M-Instruct.Q4_1.gguf;
// threads from $OMP_NUM_THREADS (default: all cores). No correctness checks
// here: the tests do that.
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "snapfill/backend.h"
#include "src/base/sys_stats.h"
#include "src/model/llama_forward.h"

namespace snapfill {
namespace {

std::string ModelPath() {
  if (const char* env = std::getenv("SNAPFILL_MODEL"); env && *env) return env;
  return std::filesystem::path(__FILE__).parent_path().parent_path() /
         "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

struct Loaded {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Backend> backend;
};

Loaded* Get() {
  static Loaded* loaded = [] {
    auto* l = new Loaded();
    auto m = LlamaModel::Open(ModelPath());
    if (!m.ok()) return l;
    l->model = std::move(*m);
    l->backend = std::move(*CreateBackend(Device::kCpu, {}));
    return l;
  }();
  return loaded;
}

// Token ids spread over the vocabulary (the default model's 49,152 ids:
// 1,000..30,999; a smaller vocabulary, such as a make_tiny_gguf model's,
// wraps).
std::vector<int32_t> Tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((1000 + (i * 7919) % 30000) % vocab);
  return ids;
}

// Prompt processing: n tokens in one batch, logits of the last one (as
// llama-bench's pp test does).
void BM_Prefill_Cpu(benchmark::State& state) {
  Loaded* l = Get();
  if (!l->model) {
    state.SkipWithError("default model not found; run tools/fetch_model.sh");
    return;
  }
  const int64_t n = state.range(0);
  auto ids = Tokens(n, l->model->config().vocab_size);
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  auto fwd = LlamaForward::Create(*l->model, l->backend.get(), n);
  auto kv = (*fwd)->NewKvCache(n);
  std::vector<float> logits(l->model->config().vocab_size);
  // One untimed run first, as llama-bench's warm-up: the weights' pages
  // faulted in and the kernels' buffers grown before the timed ones.
  (*kv)->Clear();
  if (auto s = (*fwd)->Forward(ids.data(), n, pos.data(), **kv, 1, logits.data()); !s.ok()) {
    state.SkipWithError(std::string(s.message()).c_str());
    return;
  }
  for (auto _ : state) {
    (*kv)->Clear();
    auto s = (*fwd)->Forward(ids.data(), n, pos.data(), **kv, 1, logits.data());
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(logits.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["tokens/s"] = benchmark::Counter(n, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_rss_MiB"] = PeakRssBytes() / double(1 << 20);
}
BENCHMARK(BM_Prefill_Cpu)->ArgName("tokens")->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)
    ->UseRealTime()->Iterations(3);

// Text generation: 128 tokens one at a time after a 16-token prompt.
void BM_Decode_Cpu(benchmark::State& state) {
  Loaded* l = Get();
  if (!l->model) {
    state.SkipWithError("default model not found; run tools/fetch_model.sh");
    return;
  }
  const int64_t n = state.range(0);
  const int64_t prompt = 16;
  auto ids = Tokens(prompt + n, l->model->config().vocab_size);
  std::vector<int32_t> pos(prompt + n);
  std::iota(pos.begin(), pos.end(), 0);
  auto fwd = LlamaForward::Create(*l->model, l->backend.get(), prompt);
  auto kv = (*fwd)->NewKvCache(prompt + n);
  std::vector<float> logits(l->model->config().vocab_size);
  // Untimed warm-up, as llama-bench's: the prompt and one token (the decode
  // layout of the weights is made at the first token).
  (*kv)->Clear();
  absl::Status warm = (*fwd)->Forward(ids.data(), prompt, pos.data(), **kv, 1, logits.data());
  if (warm.ok()) warm = (*fwd)->Forward(&ids[prompt], 1, &pos[prompt], **kv, 1, logits.data());
  if (!warm.ok()) {
    state.SkipWithError(std::string(warm.message()).c_str());
    return;
  }
  for (auto _ : state) {
    state.PauseTiming();
    (*kv)->Clear();
    absl::Status s = (*fwd)->Forward(ids.data(), prompt, pos.data(), **kv, 1, logits.data());
    state.ResumeTiming();
    for (int64_t i = prompt; i < prompt + n && s.ok(); ++i) {
      s = (*fwd)->Forward(&ids[i], 1, &pos[i], **kv, 1, logits.data());
    }
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(logits.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["tokens/s"] = benchmark::Counter(n, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Decode_Cpu)->ArgName("tokens")->Arg(128)->Unit(benchmark::kMillisecond)
    ->UseRealTime()->Iterations(3);

}  // namespace
}  // namespace snapfill
