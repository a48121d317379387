// The chunk loop on a hybrid model (Gemma 3's blocks: layers 0 and 2 attend
// within a sliding window, 1 and 3 are global; DESIGN.md §10): a local
// layer keeps exactly its last W entries (a ring) whatever the schedule, the
// schedule's memory applies to the global layers only, and with nothing
// evicted from those the chunked prefill and the decoder that continues it
// compute one-shot prefill's logits.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "snapfill/engine.h"
#include "src/model/llama_forward.h"
#include "snapfill/status.h"
#include "src/compress/gate.h"
#include "src/engine/generate.h"
#include "src/kv/kv_cache.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_model.h"

namespace snapfill {
namespace {

// Every KV head of local layer `l` holds the last min(W, read) positions, in order.
void ExpectRing(const KvCache& memory, const LlamaConfig& c, int64_t l, int64_t read) {
  const int64_t w = std::min<int64_t>(c.sliding_window, read);
  ASSERT_EQ(memory.size(l), w) << "layer " << l;
  for (int64_t h = 0; h < c.num_kv_heads; ++h) {
    for (int64_t j = 0; j < w; ++j) ASSERT_EQ(memory.pos(l, h)[j], read - w + j) << "layer " << l << " entry " << j;
  }
}

struct Case {
  const char* name;
  PrunerKind pruner;
  bool original_positions;
  ScheduleKind kind;
  int64_t chunk;
  int window;
  bool question = false;
};

class HybridNoEvictionTest : public ::testing::TestWithParam<Case> {};

// Nothing is evicted from the global layers (their memory holds the whole
// input) and each local layer attends within its window over its ring and
// the chunk: the same attention as one shot, whether the ring is shorter
// than a chunk or spans several.
TEST_P(HybridNoEvictionTest, ChunkedEqualsOneShot) {
  const Case& p = GetParam();
  auto model = testing::LoadTinyModel(testing::TinyHybridOptions(p.window));
  const LlamaConfig& c = model->config();
  ASSERT_TRUE(c.IsLocal(0) && !c.IsLocal(1) && c.IsLocal(2) && !c.IsLocal(3));
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  const int n = 300;
  const auto ids = testing::TestTokens(n, c.vocab_size);
  PrefillConfig config;
  config.pruner.kind = p.pruner;
  config.keep_original_positions = p.original_positions;
  const GateModel gates = GateModel::Create(c.num_layers, c.num_kv_heads, c.head_dim, 4).value();
  if (p.pruner == PrunerKind::kGate) config.gate = &gates;
  if (p.pruner == PrunerKind::kReconstruct) config.repeat_prompt = {5, 9, 2, 11};
  // The question's rows run after every chunk, within the window in the
  // local layers; the input ends with the question, as a prompt does.
  if (p.question) config.query_tokens.assign(ids.end() - 6, ids.end());
  config.schedule.kind = p.kind;
  config.schedule.chunk = p.chunk;
  config.schedule.memory = 512;  // >= n: SnapKV keeps everything
  config.schedule.first_memory = 512;
  config.schedule.window = 8;
  auto engine = PrefillEngine::Create(*model, backend->get(), config, n);
  SNAPFILL_ASSERT_OK(engine);
  ASSERT_GT((*engine)->plan().steps.size(), 3u);
  EXPECT_EQ((*engine)->plan().config.num_layers, 2) << "the schedule plans the global layers";
  SNAPFILL_ASSERT_OK((*engine)->Run(ids, nullptr));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (c.IsLocal(l)) {
      ExpectRing((*engine)->memory(), c, l, n);
    } else {
      EXPECT_EQ((*engine)->memory().size(l), n) << "layer " << l;
    }
  }
  testing::ExpectLogitsClose((*engine)->last_logits(), testing::OneShotLogits(*model, backend->get(), ids, 128), 2e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Pruners, HybridNoEvictionTest,
    ::testing::Values(Case{"full_original", PrunerKind::kFull, true, ScheduleKind::kFixed, 64, 24},
                      Case{"full_reencoded_small_chunks", PrunerKind::kFull, false, ScheduleKind::kFixed, 16, 24},
                      Case{"full_original_wide_window", PrunerKind::kFull, true, ScheduleKind::kFixed, 48, 100},
                      Case{"full_reencoded_wide_window", PrunerKind::kFull, false, ScheduleKind::kFixed, 48, 100},
                      Case{"snapkv_original", PrunerKind::kSnapKv, true, ScheduleKind::kFixed, 64, 24},
                      Case{"snapkv_imdc", PrunerKind::kSnapKv, false, ScheduleKind::kIncrementalDecremental, 64, 24},
                      Case{"snapkv_question", PrunerKind::kSnapKv, false, ScheduleKind::kFixed, 64, 24, true},
                      Case{"reconstruct", PrunerKind::kReconstruct, false, ScheduleKind::kFixed, 64, 24},
                      Case{"gate", PrunerKind::kGate, false, ScheduleKind::kFixed, 64, 24}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// The decoder continues from the prefill's memory as from one shot's cache:
// each layer's entries end right before the next position, so a local
// layer's ring (24 entries beside the global layers' 200) sits at the
// positions its tokens had, and decoding past more tokens than the window
// keeps attending within it.
TEST(HybridDecodeTest, DecoderContinuesLikeOneShot) {
  auto model = testing::LoadTinyModel(testing::TinyHybridOptions(24));
  const LlamaConfig& c = model->config();
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  const int n = 200;
  const auto ids = testing::TestTokens(n, c.vocab_size);
  const std::vector<int32_t> next = {17, 40, 3, 99, 12};
  for (bool original : {false, true}) {
    for (bool take : {false, true}) {
      SCOPED_TRACE(std::string(original ? "original" : "re-encoded") + (take ? ", taken" : ", copied"));
      PrefillConfig config;
      config.pruner.kind = PrunerKind::kFull;
      config.keep_original_positions = original;
      config.schedule.chunk = 48;
      config.schedule.window = 8;
      config.decode_reserve = static_cast<int64_t>(next.size());
      auto engine = PrefillEngine::Create(*model, backend->get(), config, n);
      SNAPFILL_ASSERT_OK(engine);
      SNAPFILL_ASSERT_OK((*engine)->Run(ids, nullptr));
      EXPECT_EQ((*engine)->next_position(), n);
      auto kv = take ? (*engine)->TakeDecoderCache() : (*engine)->MakeDecoderCache(next.size());
      SNAPFILL_ASSERT_OK(kv);
      EXPECT_GE((*kv)->room(), static_cast<int64_t>(next.size()));
      if (take) {
        EXPECT_EQ((*kv)->capacity(0), 24 + static_cast<int64_t>(next.size())) << "a ring and the reserve";
      }
      auto fwd = LlamaForward::Create(*model, backend->get(), 1);
      SNAPFILL_ASSERT_OK(fwd);
      std::vector<int32_t> all = ids;
      for (size_t i = 0; i < next.size(); ++i) {
        std::vector<float> got(c.vocab_size);
        int32_t pos = static_cast<int32_t>(n + i);
        SNAPFILL_ASSERT_OK((*fwd)->Forward(&next[i], 1, &pos, **kv, 1, got.data()));
        all.push_back(next[i]);
        testing::ExpectLogitsClose(got, testing::OneShotLogits(*model, backend->get(), all, 128), 2e-4);
      }
    }
  }
}

// With eviction: the global layers follow the plan (which counts them
// only), every local layer holds the last W positions read after each step
// (its ring, here larger than the global memory), the telemetry keeps the
// two apart, and no local layer attends past W + chunk keys.
TEST(HybridEvictionTest, LocalLayersKeepTheirWindow) {
  auto model = testing::LoadTinyModel(testing::TinyHybridOptions(24));
  const LlamaConfig& c = model->config();
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  const int n = 400;
  const auto ids = testing::TestTokens(n, c.vocab_size);
  PrefillConfig config;
  config.schedule.kind = ScheduleKind::kIncrementalDecremental;
  config.schedule.chunk = 40;
  config.schedule.memory = 16;
  config.schedule.window = 8;
  auto engine = PrefillEngine::Create(*model, backend->get(), config, n);
  SNAPFILL_ASSERT_OK(engine);
  const SchedulePlan& plan = (*engine)->plan();
  ASSERT_EQ(plan.config.num_layers, 2);
  int64_t steps = 0;
  SNAPFILL_ASSERT_OK((*engine)->Run(ids, [&](const StepTelemetry& t) {
    const ScheduleStep& s = plan.steps[t.step];
    const int64_t read = s.start_token + s.chunk_tokens;
    EXPECT_EQ(t.window_attention_length, std::min<int64_t>(24, s.start_token) + s.chunk_tokens) << "step " << t.step;
    EXPECT_EQ(t.attention_length, s.attention_length) << "step " << t.step;
    for (int64_t l = 0; l < c.num_layers; ++l) {
      if (c.IsLocal(l)) {
        EXPECT_EQ(t.memory[l], std::min<int64_t>(24, read)) << "step " << t.step << " layer " << l;
        ExpectRing((*engine)->memory(), c, l, read);
      } else {
        EXPECT_EQ(t.memory[l], std::min<int64_t>(s.budget[l / 2], read)) << "step " << t.step << " layer " << l;
      }
    }
    ++steps;
    return true;
  }));
  EXPECT_EQ(steps, static_cast<int64_t>(plan.steps.size()));
  EXPECT_EQ((*engine)->memory().size(1), plan.steps.back().budget[0]);
  // The decoder continues every layer from the same next position.
  EXPECT_EQ((*engine)->next_position(), 24);
}

}  // namespace
}  // namespace snapfill
