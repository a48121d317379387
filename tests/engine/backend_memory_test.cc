// The forward pass and the chunk loop keep their activations in the
// backend's buffers and touch them only through its ops: with
// BackendOptions::guard_buffers the CPU backend's buffers fault outside its
// ops, as a device's memory is out of the host's reach, and a prefill
// (question-guided, with eviction) and the decoding after it compute the
// same bits with the guard as without, for each architecture's extra ops
// (Qwen's biases, Gemma's embedding scale and sliding-window layers).
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "snapfill/backend.h"
#include "snapfill/engine.h"
#include "snapfill/status.h"
#include "src/engine/generate.h"
#include "src/kv/kv_cache.h"
#include "src/model/llama_forward.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_model.h"
#include "tools/testmodel/tiny_llama.h"

namespace snapfill {
namespace {

struct Outcome {
  std::vector<float> last_logits;
  std::vector<float> k, v;  // the decoder cache's entries, layer by layer
  std::vector<int32_t> generated;
};

Outcome PrefillAndDecode(const LlamaModel& model, bool guard) {
  BackendOptions o;
  o.guard_buffers = guard;
  o.half_decode_kv = true;  // the decode copy through ToHalf as well
  auto backend = CreateBackend(Device::kCpu, o);
  SNAPFILL_CHECK(backend.ok()) << backend.status();
  const LlamaConfig& c = model.config();
  const int n = 300;
  const std::vector<int32_t> ids = testing::TestTokens(n, c.vocab_size);
  PrefillConfig config;
  config.pruner.kind = PrunerKind::kSnapKv;
  config.schedule.kind = ScheduleKind::kIncrementalDecremental;
  config.schedule.chunk = 48;
  config.schedule.memory = 40;
  config.schedule.window = 8;
  config.query_tokens = testing::TestTokens(6, c.vocab_size);
  config.decode_reserve = 16;
  auto engine = PrefillEngine::Create(model, backend->get(), config, n);
  SNAPFILL_CHECK(engine.ok()) << engine.status();
  const absl::Status run = (*engine)->Run(ids, nullptr);
  SNAPFILL_CHECK(run.ok()) << run;
  Outcome out;
  out.last_logits = (*engine)->last_logits();
  auto kv = (*engine)->TakeDecoderCache();  // (as run does: the engine's buffers go back)
  SNAPFILL_CHECK(kv.ok()) << kv.status();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      const KvCache& cache = **kv;
      const float* k = cache.k(l, h);
      const float* v = cache.v(l, h);
      out.k.insert(out.k.end(), k, k + cache.size(l) * c.head_dim);
      out.v.insert(out.v.end(), v, v + cache.size(l) * c.head_dim);
    }
  }
  auto decoder = LlamaForward::Create(model, backend->get(), 1);
  SNAPFILL_CHECK(decoder.ok()) << decoder.status();
  GenerateOptions g;
  g.max_new_tokens = 8;
  auto r = GenerateFromLogits(**decoder, **kv, (*engine)->next_position(), out.last_logits, g, nullptr);
  SNAPFILL_CHECK(r.ok()) << r.status();
  out.generated = r->tokens;
  return out;
}

class BackendMemoryTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BackendMemoryTest, TheModelTouchesItsActivationsOnlyThroughTheBackend) {
  TinyLlamaOptions opts;
  opts.architecture = GetParam();
  opts.num_layers = 3;
  opts.context_length = 4096;
  if (opts.architecture == "gemma3") {
    opts.sliding_window = 64;
    opts.swa_pattern = 3;
  }
  const std::unique_ptr<LlamaModel> model = testing::LoadTinyModel(opts);
  const Outcome plain = PrefillAndDecode(*model, /*guard=*/false);
  const Outcome guarded = PrefillAndDecode(*model, /*guard=*/true);
  EXPECT_EQ(plain.last_logits, guarded.last_logits);
  EXPECT_EQ(plain.k, guarded.k);
  EXPECT_EQ(plain.v, guarded.v);
  ASSERT_EQ(plain.generated.size(), 8u);
  EXPECT_EQ(plain.generated, guarded.generated);
}

INSTANTIATE_TEST_SUITE_P(Architectures, BackendMemoryTest, ::testing::Values("llama", "qwen2", "gemma3"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace snapfill
