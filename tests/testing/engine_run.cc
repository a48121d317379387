#include "tests/testing/engine_run.h"

#include <algorithm>
#include <memory>

#include "gtest/gtest.h"
#include "snapfill/engine.h"
#include "snapfill/status.h"
#include "src/compress/gate.h"
#include "src/engine/generate.h"
#include "src/engine/recall.h"
#include "src/kv/kv_cache.h"
#include "src/kv/recall_store.h"
#include "src/model/llama_forward.h"
#include "tests/testing/files.h"
#include "tests/testing/tiny_model.h"
#include "tools/testmodel/tiny_llama.h"

namespace snapfill::testing {

EngineOutcome PrefillAndDecode(const LlamaModel& model, Backend* backend, EngineScores scores) {
  const LlamaConfig& c = model.config();
  const int n = 300;
  const std::vector<int32_t> ids = TestTokens(n, c.vocab_size);
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
  if (scores == EngineScores::kGate) {
    config.pruner.kind = PrunerKind::kGate;
    config.gate = &gates;
  } else if (scores == EngineScores::kReconstruct) {
    config.pruner.kind = PrunerKind::kReconstruct;
    config.pruner.score_span = 3;
    config.repeat_prompt = {5, 9, 2, 11};
  } else if (scores == EngineScores::kWindow) {
    config.schedule.sink_tokens = 4;
  } else {
    config.query_tokens = TestTokens(6, c.vocab_size);
  }
  if (scores == EngineScores::kGuidedShareMax) {
    config.pruner.query_share = 0.5;
    config.pruner.query_votes = QueryVotes::kMax;
  }
  if (scores == EngineScores::kGuidedRecall) config.recall_budget = 24;
  auto engine = PrefillEngine::Create(model, backend, config, n);
  SNAPFILL_CHECK(engine.ok()) << engine.status();
  EngineOutcome out;
  std::unique_ptr<RecallStore> store;
  if (scores == EngineScores::kGuidedRecall) {
    auto made = RecallStore::Create(MakeTempDir("backend_memory") + "/store",
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
  int64_t next = (*engine)->next_position();
  if (scores == EngineScores::kGuidedRecall) {
    // A later question recalls into the decoder's cache too (generate
    // --cache with the store): its rows come from the forward pass's buffers.
    RecallOptions later;
    later.budget = 4;  // (within the cache's room, beside the decoded tokens)
    auto got = RecallForQuestion(model, backend, **kv, &next, *store, TestTokens(5, c.vocab_size), later);
    SNAPFILL_CHECK(got.ok()) << got.status();
    SNAPFILL_CHECK(*got > 0) << "the later question recalled nothing";
  }
  // (The cache may be in the backend's buffers: read through CopyOut.)
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      const KvCache& cache = **kv;
      const size_t at = out.k.size(), n = cache.size(l) * c.head_dim;
      out.k.resize(at + n);
      out.v.resize(at + n);
      SNAPFILL_CHECK(cache.CopyOut(l, h, cache.size(l), out.k.data() + at, out.v.data() + at).ok());
    }
  }
  auto decoder = LlamaForward::Create(model, backend, 1);
  SNAPFILL_CHECK(decoder.ok()) << decoder.status();
  GenerateOptions g;
  g.max_new_tokens = 8;
  auto r = GenerateFromLogits(**decoder, **kv, next, out.last_logits, g, nullptr);
  SNAPFILL_CHECK(r.ok()) << r.status();
  out.generated = r->tokens;
  return out;
}

std::unique_ptr<LlamaModel> EngineRunModel(const std::string& architecture) {
  TinyLlamaOptions opts;
  opts.architecture = architecture;
  opts.num_layers = 3;
  opts.context_length = 4096;
  if (architecture == "gemma3") {
    opts.sliding_window = 64;
    opts.swa_pattern = 3;
  }
  return LoadTinyModel(opts);
}

void ExpectSameOutcome(const EngineOutcome& want, const EngineOutcome& got) {
  EXPECT_EQ(got.last_logits, want.last_logits);
  EXPECT_EQ(got.k, want.k);
  EXPECT_EQ(got.v, want.v);
  ASSERT_EQ(want.generated.size(), 8u);
  EXPECT_EQ(got.generated, want.generated);
  EXPECT_EQ(got.recalled, want.recalled);
}

}  // namespace snapfill::testing
