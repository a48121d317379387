// The forward pass and the chunk loop keep their activations in the
// backend's buffers and touch them only through its ops: with
// BackendOptions::guard_buffers the CPU backend's buffers fault outside its
// ops, as a device's memory is out of the host's reach, and a prefill
// (question-guided, with eviction) and the decoding after it compute the
// same bits with the guard as without, for each architecture's extra ops
// (Qwen's biases, Gemma's embedding scale and sliding-window layers), and
// where the host reads the candidates (SmartKV's gates, the recall tier's
// store) through copies.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "snapfill/backend.h"
#include "snapfill/engine.h"
#include "snapfill/status.h"
#include "src/compress/gate.h"
#include "src/engine/generate.h"
#include "src/engine/recall.h"
#include "src/kv/recall_store.h"
#include "src/kv/kv_cache.h"
#include "src/model/llama_forward.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_model.h"
#include "tools/testmodel/tiny_llama.h"

namespace snapfill {
namespace {

struct Outcome {
  std::vector<float> last_logits;
  std::vector<float> k, v;  // the decoder cache's entries, layer by layer
  std::vector<int32_t> generated;
  int64_t recalled = 0;  // entries the recall tier brought back (per layer and KV head, the most)
};

enum class Scores { kGuided, kGuidedRecall, kGate };

Outcome PrefillAndDecode(const LlamaModel& model, bool guard, Scores scores) {
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
  config.decode_reserve = 16;
  // Zero gates: the chunk's entries tie, and the keys still go through the
  // gate's arithmetic on the host.
  const GateModel gates = GateModel::Create(c.num_layers, c.num_kv_heads, c.head_dim, 4).value();
  if (scores == Scores::kGate) {
    config.pruner.kind = PrunerKind::kGate;
    config.gate = &gates;
  } else {
    config.query_tokens = testing::TestTokens(6, c.vocab_size);
  }
  if (scores == Scores::kGuidedRecall) config.recall_budget = 24;
  auto engine = PrefillEngine::Create(model, backend->get(), config, n);
  SNAPFILL_CHECK(engine.ok()) << engine.status();
  Outcome out;
  std::unique_ptr<RecallStore> store;
  if (scores == Scores::kGuidedRecall) {
    auto made = RecallStore::Create(testing::MakeTempDir("backend_memory") + "/store",
                                    RecallShape(c, RecallFormat::kF16));
    SNAPFILL_CHECK(made.ok()) << made.status();
    store = std::move(*made);
    SNAPFILL_CHECK((*engine)->AttachRecallStore(store.get()).ok());
  }
  const absl::Status run = (*engine)->Run(ids, [&](const StepTelemetry& t) {
    out.recalled = std::max(out.recalled, t.recalled);
    return true;
  });
  SNAPFILL_CHECK(run.ok()) << run;
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

struct Case {
  std::string architecture;
  Scores scores;
};

class BackendMemoryTest : public ::testing::TestWithParam<Case> {};

TEST_P(BackendMemoryTest, TheEngineTouchesTheBackendsMemoryOnlyThroughIt) {
  TinyLlamaOptions opts;
  opts.architecture = GetParam().architecture;
  opts.num_layers = 3;
  opts.context_length = 4096;
  if (opts.architecture == "gemma3") {
    opts.sliding_window = 64;
    opts.swa_pattern = 3;
  }
  const std::unique_ptr<LlamaModel> model = testing::LoadTinyModel(opts);
  const Outcome plain = PrefillAndDecode(*model, /*guard=*/false, GetParam().scores);
  const Outcome guarded = PrefillAndDecode(*model, /*guard=*/true, GetParam().scores);
  EXPECT_EQ(plain.last_logits, guarded.last_logits);
  EXPECT_EQ(plain.k, guarded.k);
  EXPECT_EQ(plain.v, guarded.v);
  ASSERT_EQ(plain.generated.size(), 8u);
  EXPECT_EQ(plain.generated, guarded.generated);
  EXPECT_EQ(plain.recalled, guarded.recalled);
  if (GetParam().scores == Scores::kGuidedRecall) EXPECT_GT(plain.recalled, 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, BackendMemoryTest,
                         ::testing::Values(Case{"llama", Scores::kGuided}, Case{"qwen2", Scores::kGuided},
                                           Case{"gemma3", Scores::kGuided}, Case{"llama", Scores::kGuidedRecall},
                                           Case{"llama", Scores::kGate}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return i.param.architecture + (i.param.scores == Scores::kGuidedRecall ? "_recall"
                                                          : i.param.scores == Scores::kGate      ? "_gate"
                                                                                                 : "_guided");
                         });

}  // namespace
}  // namespace snapfill
