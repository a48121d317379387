// The chunk loop on a tiny random Llama: with nothing evicted it must give
// the logits of a one-shot prefill; with eviction, memory sizes follow the
// plan and the telemetry adds up.
#include "snapfill/engine.h"
#include "src/model/llama_forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "snapfill/status.h"
#include "src/compress/gate.h"
#include "src/engine/generate.h"
#include "src/gguf/fingerprint.h"
#include "src/kv/cache_file.h"
#include "src/kv/kv_cache.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_model.h"
#include "tools/testmodel/tiny_llama.h"

namespace snapfill {
namespace {

std::unique_ptr<LlamaModel> TinyModel(int layers = 3, const std::string& architecture = "llama") {
  TinyLlamaOptions opts;
  opts.architecture = architecture;
  opts.num_layers = layers;
  opts.context_length = 4096;
  return testing::LoadTinyModel(opts);
}

std::vector<int32_t> Tokens(int n, int vocab) { return testing::TestTokens(n, vocab); }

struct NoEvictionCase {
  PrunerKind pruner;
  bool original_positions;
  ScheduleKind kind;
  // qwen2 (Q/K/V biases) and qwen3 (per-head Q/K norms): the chunk loop
  // keeps their keys after both, before RoPE, and rotates them as llama's.
  std::string architecture = "llama";
};

class NoEvictionTest : public ::testing::TestWithParam<NoEvictionCase> {};

// Nothing is evicted, so [memory; chunk] is the whole prefix in order and
// the chunked prefill computes the same attention as one shot (re-encoded
// position j of the j-th kept entry is then its original position too).
TEST_P(NoEvictionTest, ChunkedEqualsOneShot) {
  auto model = TinyModel(3, GetParam().architecture);
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  const int n = 300;
  auto ids = Tokens(n, model->config().vocab_size);
  PrefillConfig config;
  config.pruner.kind = GetParam().pruner;
  config.keep_original_positions = GetParam().original_positions;
  // Zero gates: every entry ties, and nothing is evicted anyway.
  const GateModel gates =
      GateModel::Create(model->config().num_layers, model->config().num_kv_heads, model->config().head_dim, 4).value();
  if (config.pruner.kind == PrunerKind::kGate) config.gate = &gates;
  config.schedule.kind = GetParam().kind;
  config.schedule.chunk = 64;
  config.schedule.memory = 512;  // >= n: SnapKV keeps everything
  config.schedule.first_memory = 512;
  config.schedule.window = 8;
  auto engine = PrefillEngine::Create(*model, backend->get(), config, n);
  SNAPFILL_ASSERT_OK(engine);
  ASSERT_GT((*engine)->plan().steps.size(), 3u);
  SNAPFILL_ASSERT_OK((*engine)->Run(ids, nullptr));
  for (int64_t l = 0; l < model->config().num_layers; ++l) {
    EXPECT_EQ((*engine)->memory().size(l), n);
  }
  testing::ExpectLogitsClose((*engine)->last_logits(), testing::OneShotLogits(*model, backend->get(), ids, 256), 2e-4);
  EXPECT_EQ((*engine)->next_position(), n);
}

INSTANTIATE_TEST_SUITE_P(
    Pruners, NoEvictionTest,
    ::testing::Values(NoEvictionCase{PrunerKind::kFull, true, ScheduleKind::kFixed},
                      NoEvictionCase{PrunerKind::kFull, false, ScheduleKind::kFixed},
                      NoEvictionCase{PrunerKind::kSnapKv, true, ScheduleKind::kFixed},
                      NoEvictionCase{PrunerKind::kSnapKv, false, ScheduleKind::kFixed},
                      NoEvictionCase{PrunerKind::kReconstruct, true, ScheduleKind::kFixed},
                      NoEvictionCase{PrunerKind::kReconstruct, false, ScheduleKind::kIncrementalDecremental},
                      NoEvictionCase{PrunerKind::kGate, false, ScheduleKind::kFixed},
                      NoEvictionCase{PrunerKind::kFull, true, ScheduleKind::kFixed, "qwen2"},
                      NoEvictionCase{PrunerKind::kSnapKv, false, ScheduleKind::kIncrementalDecremental, "qwen2"},
                      NoEvictionCase{PrunerKind::kFull, true, ScheduleKind::kFixed, "qwen3"},
                      NoEvictionCase{PrunerKind::kSnapKv, false, ScheduleKind::kIncrementalDecremental, "qwen3"}));

// Generating from the decoder cache continues the text like a one-shot
// prefill followed by decoding (nothing evicted).
TEST(PrefillEngineTest, DecoderCacheContinuesLikeOneShot) {
  auto model = TinyModel();
  auto backend = CreateBackend(Device::kCpu, {});
  const int n = 200;
  auto ids = Tokens(n, model->config().vocab_size);
  PrefillConfig config;
  config.pruner.kind = PrunerKind::kFull;
  config.schedule.chunk = 48;
  config.schedule.window = 8;
  auto engine = PrefillEngine::Create(*model, backend->get(), config, n);
  SNAPFILL_ASSERT_OK(engine);
  SNAPFILL_ASSERT_OK((*engine)->Run(ids, nullptr));
  auto kv = (*engine)->MakeDecoderCache(8);
  SNAPFILL_ASSERT_OK(kv);
  auto fwd = LlamaForward::Create(*model, backend->get(), 1);
  // Feed the same next token to both and compare the logits.
  const int32_t next = 17;
  std::vector<float> got(model->config().vocab_size);
  int32_t pos = static_cast<int32_t>((*engine)->next_position());
  SNAPFILL_ASSERT_OK((*fwd)->Forward(&next, 1, &pos, **kv, 1, got.data()));
  std::vector<int32_t> all = ids;
  all.push_back(next);
  testing::ExpectLogitsClose(got, testing::OneShotLogits(*model, backend->get(), all, 256), 2e-4);
}

// With eviction: every layer holds the plan's budget after each step, the
// largest position used is below memory + chunk, origins add up, and the
// retention ratio is a fraction.
TEST(PrefillEngineTest, CompressionFollowsThePlan) {
  auto model = TinyModel();
  auto backend = CreateBackend(Device::kCpu, {});
  const int n = 1500;
  auto ids = Tokens(n, model->config().vocab_size);
  for (ScheduleKind kind : {ScheduleKind::kFixed, ScheduleKind::kIncremental,
                            ScheduleKind::kIncrementalDecremental}) {
    PrefillConfig config;
    config.schedule.kind = kind;
    config.schedule.chunk = 128;
    config.schedule.memory = 96;
    config.schedule.window = 16;
    auto engine = PrefillEngine::Create(*model, backend->get(), config, n);
    SNAPFILL_ASSERT_OK(engine);
    const SchedulePlan& plan = (*engine)->plan();
    int64_t steps = 0;
    std::vector<int64_t> prev(model->config().num_layers, 0);
    auto on_step = [&](const StepTelemetry& t) {
      const ScheduleStep& s = plan.steps[t.step];
      EXPECT_EQ(t.start_token, s.start_token);
      for (int64_t l = 0; l < model->config().num_layers; ++l) {
        const int64_t want = std::min<int64_t>(s.budget[l], prev[l] + s.chunk_tokens);
        EXPECT_EQ(t.memory[l], want) << "step " << t.step << " layer " << l;
        prev[l] = t.memory[l];
        int64_t origin = 0;
        for (int64_t c : t.origin[l]) origin += c;
        EXPECT_EQ(origin, t.memory[l] * model->config().num_kv_heads);
        EXPECT_EQ(t.origin[l][t.step] > 0, true);  // the window of the current chunk is kept
        EXPECT_GE(t.retention[l], 0.0);
        EXPECT_LE(t.retention[l], 1.0);
      }
      EXPECT_LE(t.attention_length, plan.peak_attention_length);
      ++steps;
      return true;
    };
    SNAPFILL_ASSERT_OK((*engine)->Run(ids, on_step));
    EXPECT_EQ(steps, static_cast<int64_t>(plan.steps.size()));
    for (int64_t l = 0; l < model->config().num_layers; ++l) {
      EXPECT_EQ((*engine)->memory().size(l), 96);
      // Kept positions are distinct, ascending and include the last window.
      const int32_t* pos = (*engine)->memory().pos(l, 0);
      for (int j = 1; j < 96; ++j) EXPECT_LT(pos[j - 1], pos[j]);
      EXPECT_EQ(pos[95], n - 1);
    }
    EXPECT_EQ((*engine)->next_position(), 96);
    for (float x : (*engine)->last_logits()) ASSERT_TRUE(std::isfinite(x));
  }
}

// ScheduleConfig::keep_last_chunk: every step but the last compresses as
// without it, the last evicts nothing (the memory before it and the whole
// chunk), and the input's last logits are the same bit for bit.
TEST(PrefillEngineTest, KeepLastChunkEvictsNothingAtTheLastStep) {
  auto model = TinyModel();
  auto backend = CreateBackend(Device::kCpu, {});
  const LlamaConfig& mc = model->config();
  const int n = 1000;
  auto ids = Tokens(n, mc.vocab_size);
  const GateModel gates = GateModel::Create(mc.num_layers, mc.num_kv_heads, mc.head_dim, 4).value();
  for (PrunerKind pruner : {PrunerKind::kSnapKv, PrunerKind::kStreaming, PrunerKind::kGate}) {
    // (IM with adaptive growth: each layer's budget by its measured
    // retention, up to twice the linear one; the tail beside it.)
    for (ScheduleKind kind :
         {ScheduleKind::kFixed, ScheduleKind::kIncrementalDecremental, ScheduleKind::kIncremental}) {
      const bool adaptive = kind == ScheduleKind::kIncremental;
      SCOPED_TRACE(
          absl::StrCat(PrunerKindName(pruner), " ", std::string(ScheduleKindName(kind)), adaptive ? " adaptive" : ""));
      PrefillConfig config;
      config.pruner.kind = pruner;
      if (pruner == PrunerKind::kGate) config.gate = &gates;
      config.schedule.kind = kind;
      if (adaptive) config.schedule.growth = Growth::kAdaptive;
      config.schedule.chunk = 128;
      config.schedule.memory = 96;
      config.schedule.window = 16;
      config.schedule.sink_tokens = 4;
      auto plain = PrefillEngine::Create(*model, backend->get(), config, n);
      config.schedule.keep_last_chunk = true;
      auto kept = PrefillEngine::Create(*model, backend->get(), config, n);
      SNAPFILL_ASSERT_OK(plain);
      SNAPFILL_ASSERT_OK(kept);
      std::vector<std::vector<int64_t>> plain_sizes, kept_sizes;
      SNAPFILL_ASSERT_OK((*plain)->Run(ids, [&](const StepTelemetry& t) {
        plain_sizes.push_back(t.memory);
        return true;
      }));
      SNAPFILL_ASSERT_OK((*kept)->Run(ids, [&](const StepTelemetry& t) {
        kept_sizes.push_back(t.memory);
        return true;
      }));
      const SchedulePlan& plan = (*kept)->plan();
      ASSERT_EQ(plan.adaptive, adaptive);
      const int64_t steps = static_cast<int64_t>(plan.steps.size());
      ASSERT_GT(steps, 2);
      ASSERT_EQ(static_cast<int64_t>(kept_sizes.size()), steps);
      for (int64_t i = 0; i + 1 < steps; ++i) EXPECT_EQ(kept_sizes[i], plain_sizes[i]) << "step " << i;
      const ScheduleStep& last = plan.steps.back();
      const KvCache& memory = (*kept)->memory();
      for (int64_t l = 0; l < mc.num_layers; ++l) {
        // Sinks (4) are counted beside the budget in the memory's size.
        EXPECT_EQ(kept_sizes.back()[l], kept_sizes[steps - 2][l] + last.chunk_tokens) << "layer " << l;
        EXPECT_LT(plain_sizes.back()[l], kept_sizes.back()[l]);
        ASSERT_EQ(memory.size(l), kept_sizes.back()[l]);
        for (int64_t h = 0; h < mc.num_kv_heads; ++h) {
          // The last chunk whole, in order, at the end of every head.
          const int32_t* pos = memory.pos(l, h);
          const int64_t size = memory.size(l);
          for (int64_t j = 0; j < last.chunk_tokens; ++j) {
            ASSERT_EQ(pos[size - last.chunk_tokens + j], last.start_token + j) << "layer " << l << " head " << h;
          }
          for (int64_t j = 1; j < size; ++j) ASSERT_LT(pos[j - 1], pos[j]);
        }
      }
      EXPECT_EQ((*kept)->next_position(), memory.max_size());  // (adaptive: the largest layer's)
      ASSERT_EQ((*kept)->last_logits().size(), (*plain)->last_logits().size());
      EXPECT_EQ(0, std::memcmp((*kept)->last_logits().data(), (*plain)->last_logits().data(),
                               (*plain)->last_logits().size() * sizeof(float)));
      // The decoder's cache takes it, with room to answer.
      auto kv = (*kept)->MakeDecoderCache(8);
      SNAPFILL_ASSERT_OK(kv);
      EXPECT_EQ((*kv)->size(0), memory.size(0));
    }
  }
}

// Question-guided compression (PrefillConfig::query_tokens). The
// question's rows run after each chunk and never feed the chunk's rows:
// with no share of the picks, the run is the run without a question, bit
// for bit (memory, logits, every token's score).
TEST(PrefillEngineTest, AQuestionWithNoShareLeavesTheRunAsWithout) {
  auto model = TinyModel();
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  const int n = 1100;
  const auto ids = Tokens(n, model->config().vocab_size);
  PrefillConfig config;
  config.schedule.kind = ScheduleKind::kIncrementalDecremental;
  config.schedule.chunk = 128;
  config.schedule.memory = 96;
  config.schedule.window = 16;
  config.schedule.sink_tokens = 4;
  config.score_tokens = true;
  auto run = [&](const PrefillConfig& c, std::vector<float>* nll) {
    auto engine = PrefillEngine::Create(*model, backend->get(), c, n);
    SNAPFILL_CHECK(engine.ok()) << engine.status();
    nll->clear();
    SNAPFILL_CHECK((*engine)
                       ->Run(ids,
                             [&](const StepTelemetry& t) {
                               EXPECT_EQ(t.query_rows, static_cast<int64_t>(c.query_tokens.size()));
                               nll->insert(nll->end(), t.token_nll.begin(), t.token_nll.end());
                               return true;
                             })
                       .ok());
    return std::move(engine).value();
  };
  std::vector<float> nll_plain, nll_question;
  auto plain = run(config, &nll_plain);
  PrefillConfig guided = config;
  guided.query_tokens = Tokens(21, model->config().vocab_size);
  guided.pruner.query_share = 0.0;
  auto question = run(guided, &nll_question);
  EXPECT_EQ(nll_question, nll_plain);
  EXPECT_EQ(question->last_logits(), plain->last_logits());
  const LlamaConfig& mc = model->config();
  for (int64_t l = 0; l < mc.num_layers; ++l) {
    ASSERT_EQ(question->memory().size(l), plain->memory().size(l));
    const int64_t m = plain->memory().size(l);
    for (int64_t h = 0; h < mc.num_kv_heads; ++h) {
      EXPECT_EQ(std::vector<int32_t>(question->memory().pos(l, h), question->memory().pos(l, h) + m),
                std::vector<int32_t>(plain->memory().pos(l, h), plain->memory().pos(l, h) + m));
      EXPECT_EQ(0, std::memcmp(question->memory().k(l, h), plain->memory().k(l, h), m * mc.head_dim * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(question->memory().v(l, h), plain->memory().v(l, h), m * mc.head_dim * sizeof(float)));
    }
  }
}

// With the whole share the question picks what is kept: the memory
// differs from SnapKV's own, follows the plan's sizes, and holds input
// entries only (the question's K/V, at the positions after each chunk,
// would repeat the next chunk's positions or pass the input's end).
TEST(PrefillEngineTest, TheQuestionPicksAndIsNeverKept) {
  auto model = TinyModel();
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  const int n = 1100;
  const auto ids = Tokens(n, model->config().vocab_size);
  const LlamaConfig& mc = model->config();
  // The positions the question's summed votes kept, per selection.
  std::vector<int32_t> summed[2];
  // (The summed votes first: the largest weights are compared with them.)
  for (const auto& [votes, select] :
       {std::pair{QueryVotes::kSum, Selection::kToken}, std::pair{QueryVotes::kSum, Selection::kSpan},
        std::pair{QueryVotes::kMax, Selection::kToken}, std::pair{QueryVotes::kMax, Selection::kSpan}}) {
    SCOPED_TRACE(absl::StrCat(QueryVotesName(votes), " votes, ", SelectionName(select)));
    PrefillConfig config;
    config.schedule.kind = ScheduleKind::kFixed;
    config.schedule.chunk = 128;
    config.schedule.memory = 96;
    config.schedule.window = 16;
    config.pruner.query_select = select;
    config.pruner.query_votes = votes;
    auto plain = PrefillEngine::Create(*model, backend->get(), config, n);
    SNAPFILL_ASSERT_OK(plain);
    SNAPFILL_ASSERT_OK((*plain)->Run(ids, nullptr));
    // The question: the input's first tokens again, which its queries find.
    config.query_tokens.assign(ids.begin(), ids.begin() + 24);
    auto guided = PrefillEngine::Create(*model, backend->get(), config, n);
    SNAPFILL_ASSERT_OK(guided);
    SNAPFILL_ASSERT_OK((*guided)->Run(ids, nullptr));
    int64_t differ = 0, differ_from_sum = 0;
    std::vector<int32_t>& sum_memory = summed[select == Selection::kSpan];
    for (int64_t l = 0; l < mc.num_layers; ++l) {
      ASSERT_EQ((*guided)->memory().size(l), 96);
      for (int64_t h = 0; h < mc.num_kv_heads; ++h) {
        const int32_t* pos = (*guided)->memory().pos(l, h);
        const int32_t* base = (*plain)->memory().pos(l, h);
        for (int j = 1; j < 96; ++j) ASSERT_LT(pos[j - 1], pos[j]) << "layer " << l << " head " << h;
        EXPECT_LT(pos[95], n);
        EXPECT_EQ(pos[95], n - 1);  // the window is kept
        differ += !std::equal(pos, pos + 96, base);
        if (votes == QueryVotes::kSum) {
          sum_memory.insert(sum_memory.end(), pos, pos + 96);
        } else {
          differ_from_sum += !std::equal(pos, pos + 96, sum_memory.begin() + (l * mc.num_kv_heads + h) * 96);
        }
      }
    }
    EXPECT_GT(differ, 0);
    // The largest weights rank otherwise than the sums.
    if (votes == QueryVotes::kMax) {
      EXPECT_GT(differ_from_sum, 0);
    }
  }
}

TEST(PrefillEngineTest, AQuestionIsCountedAndChecked) {
  auto model = TinyModel();
  auto backend = CreateBackend(Device::kCpu, {});
  PrefillConfig config;
  config.schedule.chunk = 128;
  config.schedule.memory = 96;
  config.schedule.window = 16;
  auto plain = PrefillEngine::Footprint(model->config(), config, 2000);
  SNAPFILL_ASSERT_OK(plain);
  config.query_tokens = Tokens(40, model->config().vocab_size);
  auto guided = PrefillEngine::Footprint(model->config(), config, 2000);
  SNAPFILL_ASSERT_OK(guided);
  // 40 more rows of activations and candidates at every step.
  EXPECT_GT(guided->activation_bytes, plain->activation_bytes);
  EXPECT_GT(guided->candidate_bytes, plain->candidate_bytes);
  EXPECT_GT(guided->resident_peak, plain->resident_peak);
  auto engine = PrefillEngine::Create(*model, backend->get(), config, 2000);
  SNAPFILL_ASSERT_OK(engine);
  EXPECT_GE((*engine)->scratch_bytes(), guided->candidate_bytes + guided->activation_bytes);
  // The question's votes select in one backend op (its votes and kept
  // indices counted).
  PrefillConfig on_host = config;
  on_host.select_in_backend = false;
  auto host_guided = PrefillEngine::Footprint(model->config(), on_host, 2000);
  SNAPFILL_ASSERT_OK(host_guided);
  EXPECT_GT(guided->candidate_bytes, host_guided->candidate_bytes);
  // The host selection's scratch: the pruner's per KV head (indices, two
  // rows of votes and a flag per candidate) outweighs the op's per thread
  // (its pooled votes), and both are in the peak.
  EXPECT_GT(guided->selection_bytes, 0u);
  EXPECT_GT(host_guided->selection_bytes, guided->selection_bytes);
  // A run that stores its evictions selects on the host where its buffers
  // are the host's; on a device it selects there but for the step that
  // recalls, which selects on the host: both scratches then.
  PrefillConfig recalling = config;
  recalling.recall_budget = 16;
  auto recalled = PrefillEngine::Footprint(model->config(), recalling, 2000);
  SNAPFILL_ASSERT_OK(recalled);
  EXPECT_EQ(recalled->selection_bytes, host_guided->selection_bytes);
  auto device = PrefillEngine::Footprint(model->config(), config, 2000, false, /*buffers_on_device=*/true);
  auto device_recalled = PrefillEngine::Footprint(model->config(), recalling, 2000, false, /*buffers_on_device=*/true);
  SNAPFILL_ASSERT_OK(device);
  SNAPFILL_ASSERT_OK(device_recalled);
  EXPECT_EQ(device->selection_bytes, guided->selection_bytes);
  EXPECT_EQ(device_recalled->selection_bytes,
            guided->selection_bytes + host_guided->selection_bytes -
                2 * model->config().num_kv_heads * guided->memory_capacity * sizeof(int32_t));
  EXPECT_EQ(guided->total(), guided->memory_bytes + guided->candidate_bytes + guided->activation_bytes +
                                 guided->recall_bytes + guided->selection_bytes + guided->plan_bytes);
  // The largest weights need each question query's log-denominator: on
  // the host, and in the op's buffer beside its votes.
  const uint64_t lse_bytes = model->config().num_heads * 40 * sizeof(float);
  config.pruner.query_votes = QueryVotes::kMax;
  auto largest = PrefillEngine::Footprint(model->config(), config, 2000);
  SNAPFILL_ASSERT_OK(largest);
  EXPECT_EQ(largest->candidate_bytes, guided->candidate_bytes + 2 * lse_bytes);
  auto largest_engine = PrefillEngine::Create(*model, backend->get(), config, 2000);
  SNAPFILL_ASSERT_OK(largest_engine);
  EXPECT_GE((*largest_engine)->scratch_bytes(), largest->candidate_bytes + largest->activation_bytes);
  EXPECT_EQ((*largest_engine)->scratch_bytes(), (*engine)->scratch_bytes() + 2 * lse_bytes);
  on_host.pruner.query_votes = QueryVotes::kMax;
  auto host_largest = PrefillEngine::Footprint(model->config(), on_host, 2000);
  SNAPFILL_ASSERT_OK(host_largest);
  EXPECT_EQ(host_largest->candidate_bytes, host_guided->candidate_bytes + lse_bytes);
  config.pruner.query_votes = QueryVotes::kSum;
  // A share for the window's votes: a second row of them per candidate in
  // the op's buffer, as predicted.
  config.pruner.query_share = 0.5;
  auto halves = PrefillEngine::Footprint(model->config(), config, 2000);
  SNAPFILL_ASSERT_OK(halves);
  auto halves_engine = PrefillEngine::Create(*model, backend->get(), config, 2000);
  SNAPFILL_ASSERT_OK(halves_engine);
  EXPECT_GT(halves->candidate_bytes, guided->candidate_bytes);
  EXPECT_EQ(halves->candidate_bytes - guided->candidate_bytes,
            (*halves_engine)->scratch_bytes() - (*engine)->scratch_bytes());
  EXPECT_EQ((halves->candidate_bytes - guided->candidate_bytes) % (model->config().num_kv_heads * sizeof(float)), 0u);
  config.pruner.query_share = 1.0;
  // Pruners that read no votes run no question.
  config.pruner.kind = PrunerKind::kStreaming;
  auto streaming = PrefillEngine::Footprint(model->config(), config, 2000);
  config.query_tokens.clear();
  auto streaming_plain = PrefillEngine::Footprint(model->config(), config, 2000);
  EXPECT_EQ(streaming->activation_bytes, streaming_plain->activation_bytes);

  config = PrefillConfig{};
  config.query_tokens.assign(5000, 1);
  auto too_long = PrefillEngine::Create(*model, backend->get(), config, 2000);
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_long.status().message()), ::testing::HasSubstr("5000 tokens"));
  config.query_tokens = {3, static_cast<int32_t>(model->config().vocab_size)};
  auto bad_id = PrefillEngine::Create(*model, backend->get(), config, 2000);
  EXPECT_EQ(bad_id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_id.status().message()), ::testing::HasSubstr("outside the vocabulary"));
}

// Full attention evicts nothing, so memory schedules do not apply: whatever
// --schedule says, it reads fixed chunks of --chunk tokens.
TEST(PrefillEngineTest, FullPrunerReadsFixedChunksUnderAnySchedule) {
  auto model = TinyModel();
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  for (ScheduleKind kind : {ScheduleKind::kFixed, ScheduleKind::kIncremental,
                            ScheduleKind::kIncrementalDecremental}) {
    PrefillConfig config;
    config.schedule.kind = kind;
    config.schedule.chunk = 100;
    config.schedule.memory = 1024;
    config.schedule.window = 8;
    config.pruner.kind = PrunerKind::kFull;
    // (Nothing is selected, so no selection scratch.)
    auto footprint = PrefillEngine::Footprint(model->config(), config, 1000);
    SNAPFILL_ASSERT_OK(footprint);
    EXPECT_EQ(footprint->selection_bytes, 0u);
    auto engine = PrefillEngine::Create(*model, backend->get(), config, 1000);
    SNAPFILL_ASSERT_OK(engine);
    const SchedulePlan& plan = (*engine)->plan();
    ASSERT_EQ(plan.steps.size(), 10u);
    for (const ScheduleStep& s : plan.steps) EXPECT_EQ(s.chunk_tokens, 100);
    // The last chunk's attention reads every token (the attention kernels'
    // scratch is predicted from this).
    auto fp = PrefillEngine::Footprint(model->config(), config, 1000);
    SNAPFILL_ASSERT_OK(fp);
    EXPECT_EQ(fp->attention_keys, 1000);
    int64_t keys = 0, previous = 0;
    SNAPFILL_ASSERT_OK((*engine)->Run(Tokens(1000, model->config().vocab_size), [&](const StepTelemetry& t) {
      keys = std::max(keys, previous + plan.steps[t.step].chunk_tokens);
      previous = *std::max_element(t.memory.begin(), t.memory.end());
      return true;
    }));
    EXPECT_EQ(keys, 1000);
    EXPECT_EQ((*engine)->memory().max_size(), 1000) << "full attention keeps every token";
  }
}

TEST(PrefillEngineTest, RefusesImpossiblePlansUpFront) {
  auto model = TinyModel();
  auto backend = CreateBackend(Device::kCpu, {});
  PrefillConfig config;
  config.schedule.window = 32;
  config.schedule.memory = 16;  // below the window
  EXPECT_TRUE(absl::IsInvalidArgument(
      PrefillEngine::Create(*model, backend->get(), config, 1000).status()));
  config.schedule.memory = 64;
  EXPECT_TRUE(absl::IsInvalidArgument(
      PrefillEngine::Create(*model, backend->get(), config, 0).status()));
  config.pruner.pool_kernel = 4;  // must be odd
  EXPECT_TRUE(absl::IsInvalidArgument(
      PrefillEngine::Create(*model, backend->get(), config, 1000).status()));
}

}  // namespace
}  // namespace snapfill

namespace snapfill {
namespace {

// prefill → save → load → generate gives the tokens of prefill → generate
// in one process (DESIGN.md §6 hand-off through a cache file). Also for a
// hybrid model, whose sliding-window layers hold their window (the file
// records each layer's capacity) and keep attending within it while
// decoding past it.
TEST(PrefillEngineTest, SavedCacheGeneratesTheSameTokens) {
  for (const bool hybrid : {false, true}) {
    SCOPED_TRACE(hybrid ? "hybrid" : "llama");
    auto model = hybrid ? testing::LoadTinyModel(testing::TinyHybridOptions(24)) : TinyModel();
    auto backend = CreateBackend(Device::kCpu, {});
    const int n = 700;
    auto ids = Tokens(n, model->config().vocab_size);
    PrefillConfig config;
    config.schedule.kind = ScheduleKind::kIncrementalDecremental;
    config.schedule.chunk = 128;
    config.schedule.memory = 64;
    config.schedule.window = 8;
    auto engine = PrefillEngine::Create(*model, backend->get(), config, n);
    SNAPFILL_ASSERT_OK(engine);
    SNAPFILL_ASSERT_OK((*engine)->Run(ids, nullptr));
    const std::vector<int32_t> prompt = {5, 77, 140, 3};
    const int64_t new_tokens = 30;
    auto fwd = LlamaForward::Create(*model, backend->get(), 16);
    SNAPFILL_ASSERT_OK(fwd);
    GenerateOptions opts;
    opts.max_new_tokens = new_tokens;

    auto direct_kv = (*engine)->MakeDecoderCache(prompt.size() + new_tokens);
    SNAPFILL_ASSERT_OK(direct_kv);
    EXPECT_EQ((*direct_kv)->room(), static_cast<int64_t>(prompt.size()) + new_tokens);
    auto direct = Generate(**fwd, **direct_kv, (*engine)->next_position(), prompt, opts, nullptr);
    SNAPFILL_ASSERT_OK(direct);

    PromptCache cache;
    cache.model_fingerprint = ModelFingerprint(model->gguf());
    cache.config = "{\"test\":true}";
    cache.next_position = (*engine)->next_position();
    cache.input_tokens = n;
    auto saved_kv = (*engine)->MakeDecoderCache(0);
    SNAPFILL_ASSERT_OK(saved_kv);
    cache.kv = std::move(*saved_kv);
    const std::string path = ::testing::TempDir() + "/snapfill_engine_cache.kv";
    std::remove(path.c_str());
    SNAPFILL_ASSERT_OK(SaveCacheFile(path, cache, /*overwrite=*/false));
    auto loaded = LoadCacheFile(path, ModelFingerprint(model->gguf()), prompt.size() + new_tokens);
    SNAPFILL_ASSERT_OK(loaded);
    EXPECT_EQ(loaded->next_position, 64);
    ASSERT_EQ(loaded->capacities.size(), static_cast<size_t>(model->config().num_layers));
    if (hybrid) {
      EXPECT_EQ(loaded->kv->size(0), 24);
      EXPECT_EQ(loaded->capacities[0], 24) << "a sliding-window layer holds its window";
      EXPECT_EQ(loaded->capacities[1], 64);
    }
    auto from_file = Generate(**fwd, *loaded->kv, loaded->next_position, prompt, opts, nullptr);
    SNAPFILL_ASSERT_OK(from_file);
    EXPECT_EQ(from_file->tokens, direct->tokens);
    EXPECT_EQ(from_file->tokens.size(), static_cast<size_t>(new_tokens));
    // A cache made for another model is refused.
    auto other = LoadCacheFile(path, "xxh3:0000000000000000", 16);
    EXPECT_TRUE(absl::IsFailedPrecondition(other.status())) << other.status();
    std::remove(path.c_str());
  }
}

}  // namespace
}  // namespace snapfill

namespace snapfill {
namespace {

// Adaptive growth redistributes each step's linear budget over the layers
// by their measured retention: per layer it may differ, in total it is the
// linear schedule's.
TEST(PrefillEngineTest, AdaptiveGrowthKeepsTheLinearTotal) {
  auto model = TinyModel(4);
  auto backend = CreateBackend(Device::kCpu, {});
  const int n = 1200;
  auto ids = Tokens(n, model->config().vocab_size);
  PrefillConfig config;
  config.schedule.kind = ScheduleKind::kIncremental;
  config.schedule.growth = Growth::kAdaptive;
  config.schedule.chunk = 100;
  config.schedule.memory = 120;
  config.schedule.window = 8;
  auto engine = PrefillEngine::Create(*model, backend->get(), config, n);
  SNAPFILL_ASSERT_OK(engine);
  const SchedulePlan& plan = (*engine)->plan();
  ASSERT_TRUE(plan.adaptive);
  auto fp = PrefillEngine::Footprint(model->config(), config, n);
  SNAPFILL_ASSERT_OK(fp);
  bool differs = false;
  int64_t keys = 0, previous = 0;  // the most keys a step's attention read
  SNAPFILL_ASSERT_OK((*engine)->Run(ids, [&](const StepTelemetry& t) {
    keys = std::max(keys, previous + plan.steps[t.step].chunk_tokens);
    previous = *std::max_element(t.memory.begin(), t.memory.end());
    int64_t total = 0;
    for (int64_t m : t.memory) {
      total += m;
      EXPECT_GE(m, 8);
      differs |= m != t.memory[0];
    }
    const int64_t linear = plan.steps[t.step].budget[0];
    EXPECT_EQ(total, linear * static_cast<int64_t>(t.memory.size())) << "step " << t.step;
    return true;
  }));
  EXPECT_TRUE(differs);  // the layers did not all get the same budget
  // So a layer's attention read more keys than the linear plan's longest,
  // and no more than the footprint sizes the attention's scratch for.
  EXPECT_GT(keys, plan.peak_attention_length);
  EXPECT_LE(keys, fp->attention_keys);
}

}  // namespace
}  // namespace snapfill
