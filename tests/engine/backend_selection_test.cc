// SnapKV's selection as one backend op (PrefillConfig::select_in_backend,
// Backend::SelectHeads, DESIGN.md §14): the votes (the window's, or a
// question's) and the kept indices stay in the backend's memory, the kept
// rows are gathered by them there, and the positions and telemetry follow
// at the chunk's end. The run must be the host selection's, bit for bit:
// the memory (keys, values, positions), the logits, and every step's
// telemetry (the adaptive schedule's budgets follow its retention), with
// sinks, original or re-encoded positions, every schedule, a hybrid
// model's sliding-window layers beside its global ones, a question's
// spans or single tokens (each head's votes, or their sum; its summed or
// largest weights; alone, or with the window's votes picking after them),
// the stored scores of gate and reconstruct (made where the keys are, kept
// in the backend's copy of the memory's and brought to the host at the
// chunk's end), the recall tier (with its buffers on a device, the evicted
// rows found and gathered there and copied to the host a layer behind; the
// store must hold the host selection's entries, and a question recall
// from it as there), and with the backend's buffers guarded (the host
// reads the kept indices and scores through a copy, as from a device; its
// queued copies hold garbage until waited for).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "snapfill/backend.h"
#include "snapfill/engine.h"
#include "snapfill/status.h"
#include "src/compress/gate.h"
#include "src/engine/recall.h"
#include "src/kv/kv_cache.h"
#include "src/kv/recall_store.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_model.h"
#include "tools/testmodel/tiny_llama.h"

namespace snapfill {
namespace {

struct Case {
  std::string name;
  std::string architecture = "llama";
  ScheduleKind schedule = ScheduleKind::kIncrementalDecremental;
  Growth growth = Growth::kLinear;
  int64_t sinks = 0;
  bool original_positions = false;
  Pooling pooling = Pooling::kAvg;
  // A question of this many tokens guides the compression (its defaults:
  // its votes alone, spans of `span`); 0: none.
  int question = 0;
  Selection select = Selection::kSpan;
  int64_t span = 32;
  bool shared_votes = false;  // --query_heads shared
  double share = 1.0;         // --query_share
  QueryVotes votes = QueryVotes::kSum;
  // gate or reconstruct: SnapKV's rule over the entries' stored scores,
  // picked in spans of score_span.
  PrunerKind pruner = PrunerKind::kSnapKv;
  int64_t score_span = 1;
  // A recall store takes what every step evicts (-1: none), and at the
  // last step the question brings back this many per layer and KV head.
  int64_t recall = -1;
  // The store's format: f16 rows leave a device converted there.
  RecallFormat format = RecallFormat::kF16;
};

struct Outcome {
  std::vector<float> last_logits;
  std::vector<float> k, v;
  std::vector<int32_t> pos;
  std::vector<float> scores;  // the memory's stored scores (gate, reconstruct)
  std::vector<std::vector<int64_t>> memory, origin;
  std::vector<std::vector<double>> retention;
  std::vector<int64_t> attention_length, window_attention_length, backend_selections;
  // The recall store: each layer's slots, and every slot's positions, keys
  // and values (as stored); the entries recalled.
  std::vector<int64_t> store_slots;
  std::vector<int32_t> store_pos;
  std::vector<float> store_k, store_v;
  int64_t recalled = 0;
};

Outcome Prefill(const LlamaModel& model, const Case& c, bool in_backend, bool guard) {
  const LlamaConfig& mc = model.config();
  const int n = 700;
  const std::vector<int32_t> ids = testing::TestTokens(n, mc.vocab_size);
  BackendOptions o;
  o.guard_buffers = guard;
  auto backend = CreateBackend(Device::kCpu, o);
  SNAPFILL_CHECK(backend.ok()) << backend.status();
  PrefillConfig config;
  config.pruner.kind = c.pruner;
  config.pruner.score_span = c.score_span;
  if (c.pruner == PrunerKind::kReconstruct) config.repeat_prompt = {5, 9, 2, 11};
  // Gates with random weights, so that entries are ranked apart.
  GateModel gates = GateModel::Create(mc.num_layers, mc.num_kv_heads, mc.head_dim, 8).value();
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t l = 0; l < mc.num_layers; ++l) {
    for (int64_t h = 0; h < mc.num_kv_heads; ++h) {
      GateParams& p = gates.params(l, h);
      for (std::vector<float>* part : {&p.mean, &p.w1, &p.b1, &p.w2}) {
        for (float& x : *part) x = dist(rng);
      }
      p.b2 = dist(rng);
    }
  }
  if (c.pruner == PrunerKind::kGate) config.gate = &gates;
  config.pruner.pooling = c.pooling;
  config.schedule.kind = c.schedule;
  config.schedule.growth = c.growth;
  config.schedule.chunk = 64;
  config.schedule.memory = 48;
  config.schedule.window = 8;
  config.schedule.sink_tokens = c.sinks;
  config.keep_original_positions = c.original_positions;
  config.select_in_backend = in_backend;
  if (c.question > 0) {
    config.query_tokens = testing::TestTokens(c.question + 5, mc.vocab_size);
    config.query_tokens.erase(config.query_tokens.begin(), config.query_tokens.begin() + 5);
    config.pruner.query_select = c.select;
    config.pruner.span = c.span;
    config.pruner.shared_query_votes = c.shared_votes;
    config.pruner.query_share = c.share;
    config.pruner.query_votes = c.votes;
  }
  config.store_evicted = c.recall >= 0;
  config.recall_format = c.format;
  config.recall_budget = std::max<int64_t>(c.recall, 0);
  auto engine = PrefillEngine::Create(model, backend->get(), config, n);
  SNAPFILL_CHECK(engine.ok()) << engine.status();
  std::unique_ptr<RecallStore> store;
  if (c.recall >= 0) {
    RecallStoreInfo info = RecallShape(mc, c.format);
    info.input_tokens = n;
    auto made = RecallStore::Create(testing::MakeTempDir("backend_selection") + "/store", info);
    SNAPFILL_CHECK(made.ok()) << made.status();
    store = std::move(*made);
    SNAPFILL_CHECK((*engine)->AttachRecallStore(store.get()).ok());
  }
  Outcome r;
  const absl::Status run = (*engine)->Run(ids, [&](const StepTelemetry& t) {
    r.recalled = std::max(r.recalled, t.recalled);
    r.memory.push_back(t.memory);
    r.retention.push_back(t.retention);
    for (const std::vector<int64_t>& o : t.origin) r.origin.push_back(o);
    r.attention_length.push_back(t.attention_length);
    r.window_attention_length.push_back(t.window_attention_length);
    r.backend_selections.push_back(t.backend_selections);
    return true;
  });
  SNAPFILL_CHECK(run.ok()) << run;
  r.last_logits = (*engine)->last_logits();
  const KvCache& memory = (*engine)->memory();
  for (int64_t l = 0; l < mc.num_layers; ++l) {
    for (int64_t h = 0; h < mc.num_kv_heads; ++h) {
      const size_t at = r.k.size(), count = memory.size(l) * mc.head_dim;
      r.k.resize(at + count);
      r.v.resize(at + count);
      SNAPFILL_CHECK(memory.CopyOut(l, h, memory.size(l), r.k.data() + at, r.v.data() + at).ok());
      const int32_t* pos = memory.pos(l, h);
      r.pos.insert(r.pos.end(), pos, pos + memory.size(l));
      if (memory.has_scores()) r.scores.insert(r.scores.end(), memory.score(l, h), memory.score(l, h) + memory.size(l));
    }
  }
  if (store != nullptr) {
    const int64_t d = mc.head_dim;
    for (int64_t l = 0; l < mc.num_layers; ++l) {
      const int64_t slots = store->slots(l);
      r.store_slots.push_back(slots);
      std::vector<int32_t> pos(slots * mc.num_kv_heads);
      std::vector<float> k(pos.size() * d), v(d);
      SNAPFILL_CHECK(store->ReadKeys(l, 0, slots, k.data(), pos.data()).ok());
      r.store_pos.insert(r.store_pos.end(), pos.begin(), pos.end());
      r.store_k.insert(r.store_k.end(), k.begin(), k.end());
      int32_t p = 0;
      for (int64_t i = 0; i < slots; ++i) {
        for (int64_t h = 0; h < mc.num_kv_heads; ++h) {
          SNAPFILL_CHECK(store->ReadEntry(l, h, i, k.data(), v.data(), &p).ok());
          r.store_v.insert(r.store_v.end(), v.begin(), v.end());
        }
      }
    }
  }
  return r;
}

class BackendSelectionTest : public ::testing::TestWithParam<Case> {};

TEST_P(BackendSelectionTest, TheBackendOpRunsAsTheHostSelection) {
  const Case& c = GetParam();
  TinyLlamaOptions opts;
  opts.architecture = c.architecture;
  opts.num_layers = 3;
  opts.context_length = 4096;
  if (c.architecture == "gemma3") {
    opts.sliding_window = 40;
    opts.swa_pattern = 3;
  }
  const std::unique_ptr<LlamaModel> model = testing::LoadTinyModel(opts);
  const Outcome host = Prefill(*model, c, /*in_backend=*/false, /*guard=*/false);
  int64_t selections = 0;
  for (int64_t s : host.backend_selections) EXPECT_EQ(s, 0);
  if (c.recall >= 0) {  // (a store that holds what the steps evicted)
    int64_t stored = 0;
    for (int64_t slots : host.store_slots) stored += slots;
    EXPECT_GT(stored, 500);  // (one global layer of 700 tokens at least)
    if (c.recall > 0) {
      EXPECT_GT(host.recalled, 0);
    }
  }
  if (c.pruner != PrunerKind::kSnapKv) {  // (scores that are there to compare)
    EXPECT_EQ(host.scores.size(), host.pos.size());
    EXPECT_GT(std::count_if(host.scores.begin(), host.scores.end(), [](float x) { return x != 0.0f; }),
              static_cast<int64_t>(host.scores.size() / 4));  // (a local layer's are 0)
  }
  for (const bool guard : {false, true}) {
    const Outcome op = Prefill(*model, c, /*in_backend=*/true, guard);
    SCOPED_TRACE(guard ? "guarded" : "plain");
    EXPECT_EQ(op.last_logits, host.last_logits);
    EXPECT_EQ(op.k, host.k);
    EXPECT_EQ(op.v, host.v);
    EXPECT_EQ(op.pos, host.pos);
    EXPECT_EQ(op.scores, host.scores);
    EXPECT_EQ(op.memory, host.memory);
    EXPECT_EQ(op.retention, host.retention);
    EXPECT_EQ(op.origin, host.origin);
    EXPECT_EQ(op.attention_length, host.attention_length);
    EXPECT_EQ(op.window_attention_length, host.window_attention_length);
    EXPECT_EQ(op.store_slots, host.store_slots);
    EXPECT_EQ(op.store_pos, host.store_pos);
    EXPECT_EQ(op.store_k, host.store_k);
    EXPECT_EQ(op.store_v, host.store_v);
    EXPECT_EQ(op.recalled, host.recalled);
    selections = 0;
    for (int64_t s : op.backend_selections) selections += s;
    // With a store, the CPU's own buffers keep the host's selection, which
    // hands the store its rows in place; a device's (guarded) take the op.
    if (c.recall >= 0 && !guard) {
      EXPECT_EQ(selections, 0);
    }
  }
  // Every evicting step of every global layer took the op: 700 tokens in
  // chunks of 64 evict from the second step on (the first keeps at most
  // its chunk where the memory holds more); with a recall budget, all but
  // the last step, which recalls on the host.
  const int64_t global_layers = c.architecture == "gemma3" ? 1 : 3;
  EXPECT_GE(selections, global_layers * (static_cast<int64_t>(host.memory.size()) - 2)) << c.name;
}

// Where the evicted rows come from a device, they reach the host in the
// format the engine was planned for (PrefillConfig::recall_format): a store
// of the other is refused, naming both.
TEST(BackendSelection, RefusesAStoreOfAnotherFormatThanPlanned) {
  TinyLlamaOptions opts;
  opts.num_layers = 2;
  const std::unique_ptr<LlamaModel> model = testing::LoadTinyModel(opts);
  const LlamaConfig& mc = model->config();
  BackendOptions o;
  o.guard_buffers = true;
  auto backend = CreateBackend(Device::kCpu, o);
  SNAPFILL_ASSERT_OK(backend);
  for (RecallFormat planned : {RecallFormat::kF16, RecallFormat::kQ8}) {
    const RecallFormat other = planned == RecallFormat::kF16 ? RecallFormat::kQ8 : RecallFormat::kF16;
    PrefillConfig config;
    config.schedule.chunk = 64;
    config.schedule.memory = 48;
    config.select_in_backend = true;
    config.store_evicted = true;
    config.recall_format = planned;
    auto engine = PrefillEngine::Create(*model, backend->get(), config, 300);
    SNAPFILL_ASSERT_OK(engine);
    RecallStoreInfo info = RecallShape(mc, other);
    info.input_tokens = 300;
    auto store = RecallStore::Create(testing::MakeTempDir("backend_selection_format") + "/store", info);
    SNAPFILL_ASSERT_OK(store);
    const absl::Status refused = (*engine)->AttachRecallStore(store->get());
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_THAT(refused.message(), ::testing::HasSubstr(std::string("keeps ") + RecallFormatName(other)));
    info.format = planned;
    auto right = RecallStore::Create(testing::MakeTempDir("backend_selection_format") + "/store", info);
    SNAPFILL_ASSERT_OK(right);
    SNAPFILL_ASSERT_OK((*engine)->AttachRecallStore(right->get()));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BackendSelectionTest,
    ::testing::Values(
        Case{.name = "imdc"}, Case{.name = "imdc_sinks", .sinks = 4},
        Case{.name = "fm_original_max",
             .schedule = ScheduleKind::kFixed,
             .original_positions = true,
             .pooling = Pooling::kMax},
        Case{.name = "im_adaptive_sinks",
             .schedule = ScheduleKind::kIncremental,
             .growth = Growth::kAdaptive,
             .sinks = 2},
        Case{.name = "gemma3_hybrid", .architecture = "gemma3", .sinks = 4},
        Case{.name = "qwen2", .architecture = "qwen2"}, Case{.name = "question_spans", .question = 9},
        Case{.name = "question_tokens_sinks", .sinks = 4, .question = 6, .select = Selection::kToken},
        Case{.name = "question_fm_original",
             .schedule = ScheduleKind::kFixed,
             .original_positions = true,
             .question = 12,
             .span = 5},
        Case{.name = "question_gemma3_hybrid", .architecture = "gemma3", .sinks = 4, .question = 7, .span = 8},
        Case{.name = "question_shared_sinks", .sinks = 4, .question = 8, .span = 6, .shared_votes = true},
        // The window's votes pick after the question's (a second row).
        Case{.name = "question_share_half", .sinks = 4, .question = 9, .span = 5, .share = 0.5},
        Case{.name = "question_share_tokens_im",
             .schedule = ScheduleKind::kIncremental,
             .question = 6,
             .select = Selection::kToken,
             .share = 0.3},
        // The largest weights: log-denominators in the backend's buffer,
        // and at the last step the question's own 12 keys (more than the
        // window of 8) voted 1 by Backend::Fill.
        Case{.name = "question_max", .question = 12, .span = 4, .votes = QueryVotes::kMax},
        Case{.name = "question_max_shared_share",
             .architecture = "gemma3",
             .sinks = 2,
             .question = 10,
             .span = 3,
             .shared_votes = true,
             .share = 0.6,
             .votes = QueryVotes::kMax},
        // Stored scores: the gate's predictions (one op for every head)
        // and reconstruction's largest weights, each kept with its entry.
        Case{.name = "gate", .pruner = PrunerKind::kGate},
        Case{.name = "gate_sinks_spans_im",
             .schedule = ScheduleKind::kIncremental,
             .sinks = 4,
             .pruner = PrunerKind::kGate,
             .score_span = 5},
        Case{.name = "gate_gemma3_hybrid",
             .architecture = "gemma3",
             .sinks = 2,
             .pruner = PrunerKind::kGate,
             .score_span = 3},
        Case{.name = "reconstruct", .pruner = PrunerKind::kReconstruct, .score_span = 4},
        Case{.name = "reconstruct_fm_original_sinks",
             .schedule = ScheduleKind::kFixed,
             .sinks = 4,
             .original_positions = true,
             .pruner = PrunerKind::kReconstruct},
        Case{.name = "reconstruct_gemma3_hybrid",
             .architecture = "gemma3",
             .sinks = 4,
             .pruner = PrunerKind::kReconstruct,
             .score_span = 2},
        // The recall tier: a store alone (the window's votes; f16, and q8,
        // whose rows travel as f32), a question that recalls (spans; single
        // tokens with the window's votes after the question's), a hybrid
        // model's global layer, and the gate's
        // stored scores beside a store.
        Case{.name = "store", .sinks = 4, .recall = 0},
        Case{.name = "store_q8", .sinks = 4, .recall = 0, .format = RecallFormat::kQ8},
        Case{.name = "recall_question_spans", .question = 9, .recall = 12},
        Case{.name = "recall_tokens_share_im",
             .schedule = ScheduleKind::kIncremental,
             .question = 6,
             .select = Selection::kToken,
             .share = 0.5,
             .recall = 20},
        Case{.name = "recall_gemma3_hybrid",
             .architecture = "gemma3",
             .sinks = 4,
             .question = 7,
             .span = 8,
             .recall = 10},
        Case{.name = "store_gate", .pruner = PrunerKind::kGate, .score_span = 3, .recall = 0}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace snapfill
