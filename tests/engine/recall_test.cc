// The recall tier on a tiny random Llama: every evicted entry reaches the
// store and nothing else changes; at the last step the question brings
// back `recall_budget` stored entries per layer and KV head, merged by
// position with the values they had; a run stopped and resumed with its
// store cut back to the checkpoint ends with the same memory bit for bit.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <numeric>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "snapfill/engine.h"
#include "src/model/llama_forward.h"
#include "snapfill/status.h"
#include "src/base/half.h"
#include "src/engine/recall.h"
#include "src/kv/kv_cache.h"
#include "src/kv/recall_store.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_model.h"
#include "tools/testmodel/tiny_llama.h"

namespace snapfill {
namespace {

using ::testing::HasSubstr;

class RecallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TinyLlamaOptions opts;
    opts.num_layers = 3;
    opts.context_length = 4096;
    model_ = testing::LoadTinyModel(opts);
    auto backend = CreateBackend(Device::kCpu, {});
    SNAPFILL_ASSERT_OK(backend);
    backend_ = std::move(*backend);
    ids_ = testing::TestTokens(kTokens, model_->config().vocab_size);
    std::string tmpl = ::testing::TempDir() + "/recall_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + root_ + "'").c_str()); }

  PrefillConfig Config() const {
    PrefillConfig config;
    config.schedule.kind = ScheduleKind::kFixed;
    config.schedule.chunk = 128;
    config.schedule.memory = 96;
    config.schedule.window = 16;
    // The question: the input's first tokens again, which its queries find.
    config.query_tokens.assign(ids_.begin(), ids_.begin() + 24);
    return config;
  }
  RecallStoreInfo Info() const {
    RecallStoreInfo info = RecallShape(model_->config(), RecallFormat::kF16);
    info.input_tokens = kTokens;
    return info;
  }
  std::unique_ptr<RecallStore> NewStore(const std::string& name) {
    auto store = RecallStore::Create(root_ + "/" + name, Info());
    SNAPFILL_CHECK(store.ok()) << store.status();
    return std::move(*store);
  }
  std::unique_ptr<PrefillEngine> Run(const PrefillConfig& config, RecallStore* store = nullptr) {
    auto engine = PrefillEngine::Create(*model_, backend_.get(), config, kTokens);
    SNAPFILL_CHECK(engine.ok()) << engine.status();
    SNAPFILL_CHECK((*engine)->AttachRecallStore(store).ok());
    const absl::Status s = (*engine)->Run(ids_, nullptr);
    SNAPFILL_CHECK(s.ok()) << s;
    return std::move(*engine);
  }
  static std::vector<int32_t> Positions(const KvCache& m, int64_t l, int64_t h) {
    return std::vector<int32_t>(m.pos(l, h), m.pos(l, h) + m.size(l));
  }

  static constexpr int64_t kTokens = 1100;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Backend> backend_;
  std::vector<int32_t> ids_;
  std::string root_;
};

void ExpectSameMemory(const KvCache& a, const KvCache& b) {
  const KvCacheShape& s = a.shape();
  for (int64_t l = 0; l < s.num_layers; ++l) {
    ASSERT_EQ(a.size(l), b.size(l)) << "layer " << l;
    for (int64_t h = 0; h < s.num_kv_heads; ++h) {
      const int64_t n = a.size(l);
      ASSERT_TRUE(std::equal(a.pos(l, h), a.pos(l, h) + n, b.pos(l, h))) << "layer " << l << " head " << h;
      ASSERT_EQ(std::memcmp(a.k(l, h), b.k(l, h), n * s.head_dim * sizeof(float)), 0) << "layer " << l;
      ASSERT_EQ(std::memcmp(a.v(l, h), b.v(l, h), n * s.head_dim * sizeof(float)), 0) << "layer " << l;
    }
  }
}

// Storing changes nothing; every position of the input is either in the
// final memory or in the store, once.
TEST_F(RecallTest, AStoreAloneChangesNothingAndHoldsEveryEvictedEntry) {
  const auto plain = Run(Config());
  auto store = NewStore("s");
  PrefillConfig storing = Config();
  storing.store_evicted = true;
  const auto stored = Run(storing, store.get());
  ExpectSameMemory(plain->memory(), stored->memory());
  const LlamaConfig& mc = model_->config();
  for (int64_t l = 0; l < mc.num_layers; ++l) {
    const int64_t slots = store->slots(l);
    EXPECT_EQ(slots + stored->memory().size(l), kTokens) << "layer " << l;
    std::vector<int32_t> pos(mc.num_kv_heads * slots);
    SNAPFILL_ASSERT_OK(store->ReadPositions(l, 0, slots, pos.data()));
    for (int64_t h = 0; h < mc.num_kv_heads; ++h) {
      std::vector<int32_t> all = Positions(stored->memory(), l, h);
      for (int64_t i = 0; i < slots; ++i) all.push_back(pos[i * mc.num_kv_heads + h]);
      std::sort(all.begin(), all.end());
      ASSERT_EQ(static_cast<int64_t>(all.size()), kTokens);
      for (int64_t t = 0; t < kTokens; ++t) ASSERT_EQ(all[t], t) << "layer " << l << " head " << h;
    }
  }
}

// The recalled entries join the memory in position order, `budget` per
// layer and KV head, each from the store; in layer 0 (whose keys and
// values depend on the token alone) they hold what a run that keeps every
// entry holds there, to f16 rounding.
TEST_F(RecallTest, TheQuestionBringsBackStoredEntriesByPosition) {
  const LlamaConfig& mc = model_->config();
  const auto plain = Run(Config());
  PrefillConfig full_config = Config();
  full_config.pruner.kind = PrunerKind::kFull;
  full_config.query_tokens.clear();
  const auto full = Run(full_config);
  for (Selection select : {Selection::kToken, Selection::kSpan}) {
    SCOPED_TRACE(SelectionName(select));
    auto store = NewStore(SelectionName(select));
    PrefillConfig config = Config();
    config.pruner.query_select = select;
    config.pruner.span = 8;
    config.recall_budget = 40;
    auto guided_plain_config = Config();
    guided_plain_config.pruner.query_select = select;
    guided_plain_config.pruner.span = 8;
    const auto without = Run(guided_plain_config);
    const auto with = Run(config, store.get());
    for (int64_t l = 0; l < mc.num_layers; ++l) {
      ASSERT_EQ(with->memory().size(l), without->memory().size(l) + 40) << "layer " << l;
      for (int64_t h = 0; h < mc.num_kv_heads; ++h) {
        const std::vector<int32_t> pos = Positions(with->memory(), l, h);
        const std::vector<int32_t> base = Positions(without->memory(), l, h);
        for (size_t j = 1; j < pos.size(); ++j) ASSERT_LT(pos[j - 1], pos[j]) << "layer " << l << " head " << h;
        // Everything the run kept is still there, and 40 more.
        std::vector<int32_t> recalled;
        std::set_difference(pos.begin(), pos.end(), base.begin(), base.end(), std::back_inserter(recalled));
        ASSERT_EQ(recalled.size(), 40u) << "layer " << l << " head " << h;
        ASSERT_TRUE(std::includes(pos.begin(), pos.end(), base.begin(), base.end()));
        if (l != 0) continue;
        const int64_t d = mc.head_dim;
        for (int32_t p : recalled) {
          const int64_t j = std::lower_bound(pos.begin(), pos.end(), p) - pos.begin();
          ASSERT_EQ(full->memory().pos(0, h)[p], p);
          const float* k = with->memory().k(0, h) + j * d;
          const float* v = with->memory().v(0, h) + j * d;
          const float* fk = full->memory().k(0, h) + p * d;
          const float* fv = full->memory().v(0, h) + p * d;
          for (int64_t t = 0; t < d; ++t) {
            ASSERT_NEAR(k[t], fk[t], 2e-3 * std::abs(fk[t]) + 1e-4) << "position " << p;
            ASSERT_NEAR(v[t], fv[t], 2e-3 * std::abs(fv[t]) + 1e-4) << "position " << p;
            ASSERT_EQ(k[t], Fp16ToFp32(Fp32ToFp16(k[t]))) << "an f16 value from the store";
          }
        }
      }
    }
    // (The plain run's memory differs from `without` only by the question.)
    EXPECT_EQ(plain->memory().size(0), without->memory().size(0));
  }
}

// Stopped after step 4 with a checkpoint taken after step 2: the store is
// cut back to step 2's slots and the resumed run ends as one never stopped.
TEST_F(RecallTest, AResumedRunEndsWithTheSameMemory) {
  auto whole_store = NewStore("whole");
  PrefillConfig config = Config();
  config.recall_budget = 16;
  const auto whole = Run(config, whole_store.get());

  auto store = NewStore("stopped");
  auto first = PrefillEngine::Create(*model_, backend_.get(), config, kTokens);
  SNAPFILL_ASSERT_OK(first);
  SNAPFILL_ASSERT_OK((*first)->AttachRecallStore(store.get()));
  std::unique_ptr<KvCache> saved;
  std::vector<double> retention;
  std::vector<int64_t> slots;
  const absl::Status stopped = (*first)->Run(ids_, [&](const StepTelemetry& t) {
    if (t.step == 2) {
      saved = (*first)->memory().Clone();
      retention = (*first)->retention();
      slots = store->all_slots();
    }
    return t.step < 4;
  });
  ASSERT_TRUE(absl::IsCancelled(stopped)) << stopped;
  ASSERT_GT(store->slots(0), slots[0]) << "steps after the checkpoint wrote more";
  store.reset();

  auto reopened = RecallStore::Reopen(root_ + "/stopped", Info(), slots);
  SNAPFILL_ASSERT_OK(reopened);
  auto second = PrefillEngine::Create(*model_, backend_.get(), config, kTokens);
  SNAPFILL_ASSERT_OK(second);
  SNAPFILL_ASSERT_OK((*second)->AttachRecallStore(reopened->get()));
  SNAPFILL_ASSERT_OK((*second)->Restore(3, retention, *saved));
  SNAPFILL_ASSERT_OK((*second)->Run(ids_, nullptr));
  ExpectSameMemory(whole->memory(), (*second)->memory());
  EXPECT_EQ((*reopened)->all_slots(), whole_store->all_slots());
}

// generate --cache: a cache saved without a question (the store filled by
// the prefill) gets, from the question run over it, `budget` stored entries
// per layer and KV head, each key rotated at its new index; the entries
// already there that move are rotated on to theirs.
TEST_F(RecallTest, AQuestionOverASavedCacheBringsBackStoredEntries) {
  const LlamaConfig& mc = model_->config();
  const int64_t d = mc.head_dim;
  PrefillConfig config = Config();
  config.query_tokens.clear();
  config.store_evicted = true;
  PrefillConfig full_config = config;
  full_config.pruner.kind = PrunerKind::kFull;
  const auto full = Run(full_config);  // layer 0's keys before RoPE, every position
  auto store = NewStore("saved");
  const auto engine = Run(config, store.get());
  const int64_t kept = engine->memory().size(0);
  auto cache = engine->MakeDecoderCache(64);
  SNAPFILL_ASSERT_OK(cache);
  int64_t next = engine->next_position();
  const std::vector<int32_t> question(ids_.begin(), ids_.begin() + 24);
  RecallOptions options;
  options.budget = 40;
  options.span = 8;
  auto added = RecallForQuestion(*model_, backend_.get(), **cache, &next, *store, question, options);
  SNAPFILL_ASSERT_OK(added);
  EXPECT_EQ(*added, 40);
  EXPECT_EQ(next, kept + 40);
  for (int64_t l = 0; l < mc.num_layers; ++l) {
    ASSERT_EQ((*cache)->size(l), engine->memory().size(l) + 40) << "layer " << l;
    for (int64_t h = 0; h < mc.num_kv_heads; ++h) {
      const std::vector<int32_t> pos = Positions(**cache, l, h);
      const std::vector<int32_t> base = Positions(engine->memory(), l, h);
      for (size_t j = 1; j < pos.size(); ++j) ASSERT_LT(pos[j - 1], pos[j]);
      ASSERT_TRUE(std::includes(pos.begin(), pos.end(), base.begin(), base.end()));
      if (l != 0) continue;
      // Every key as layer 0 computes it for its token, rotated at its index.
      std::vector<float> want(pos.size() * d);
      for (size_t j = 0; j < pos.size(); ++j) {
        std::memcpy(want.data() + j * d, full->memory().k(0, h) + pos[j] * d, d * sizeof(float));
      }
      std::vector<int32_t> index(pos.size());
      std::iota(index.begin(), index.end(), 0);
      SNAPFILL_ASSERT_OK(backend_->Rope(want.data(), pos.size(), 1, d, d, index.data(), mc.rope(0)));
      const float* got = (*cache)->k(0, h);
      for (size_t t = 0; t < want.size(); ++t) {
        ASSERT_NEAR(got[t], want[t], 3e-3 * std::abs(want[t]) + 2e-3) << "entry " << t / d << " position "
                                                                        << pos[t / d];
      }
    }
  }
}

// Ranked across layers, every layer and KV head brings back the same
// positions first: walking the ranked positions in order, each with its
// stored neighbours nearest first, it takes those its own store holds
// (the rest are in its memory), until the budget fills.
TEST_F(RecallTest, SummedRankingBringsBackTheSamePositionsInEveryLayer) {
  const LlamaConfig& mc = model_->config();
  PrefillConfig config = Config();
  config.query_tokens.clear();
  config.store_evicted = true;
  auto store = NewStore("summed");
  const auto engine = Run(config, store.get());
  const std::vector<int32_t> question(ids_.begin() + 300, ids_.begin() + 324);
  for (const int64_t span : {0, 8}) {
    std::vector<std::vector<std::set<int32_t>>> recalled[2];  // [summed][layer][head]
    for (const bool summed : {true, false}) {
      auto cache = engine->MakeDecoderCache(64);
      SNAPFILL_ASSERT_OK(cache);
      int64_t next = engine->next_position();
      RecallOptions options;
      options.budget = 40;
      options.span = span;
      options.summed = summed;
      std::vector<int32_t> ranked;
      auto added = RecallForQuestion(*model_, backend_.get(), **cache, &next, *store, question, options, &ranked);
      SNAPFILL_ASSERT_OK(added);
      ASSERT_EQ(*added, 40);
      ASSERT_EQ(ranked.size(), summed ? 80u : 0u) << "the best 2 * budget positions";
      auto& got = recalled[summed ? 0 : 1];
      got.assign(mc.num_layers, std::vector<std::set<int32_t>>(mc.num_kv_heads));
      for (int64_t l = 0; l < mc.num_layers; ++l) {
        std::vector<int32_t> stored(store->slots(l) * mc.num_kv_heads);
        SNAPFILL_ASSERT_OK(store->ReadPositions(l, 0, store->slots(l), stored.data()));
        for (int64_t h = 0; h < mc.num_kv_heads; ++h) {
          const std::vector<int32_t> base = Positions(engine->memory(), l, h);
          for (const int32_t p : Positions(**cache, l, h)) {
            if (!std::binary_search(base.begin(), base.end(), p)) got[l][h].insert(p);
          }
          ASSERT_EQ(got[l][h].size(), 40u) << "layer " << l << " head " << h;
          if (!summed) continue;
          // The walk over the ranked positions, for this head's store.
          std::set<int32_t> holds;
          for (int64_t i = 0; i < store->slots(l); ++i) holds.insert(stored[i * mc.num_kv_heads + h]);
          std::vector<int32_t> want;
          auto take = [&](int32_t p) {
            if (static_cast<int64_t>(want.size()) < 40 && holds.count(p) &&
                std::find(want.begin(), want.end(), p) == want.end()) {
              want.push_back(p);
            }
          };
          for (const int32_t p : ranked) {
            take(p);
            for (int32_t o = 1; o <= span / 2; ++o) {
              take(p - o);
              take(p + o);
            }
          }
          ASSERT_EQ(want.size(), 40u) << "the ranked positions fill the budget here";
          EXPECT_EQ(got[l][h], std::set<int32_t>(want.begin(), want.end())) << "layer " << l << " head " << h;
        }
      }
    }
    // Each head's own ranking brings back other positions somewhere.
    EXPECT_NE(recalled[0], recalled[1]) << "span " << span;
  }
}

TEST(RecallRankTest, SumsEachPositionsSquaredScoresOverLayersAndHeads) {
  // Squared and summed: 7 is no head's best but the best (9 + 12.25 +
  // 8.41); 3 and 9 tie (25 = 16 + 9: the lower first); 11 has the most
  // score summed (6 × 1.6 = 9.6, against 7's 9.4), but many heads' weak
  // attention counts for less than one head's strong attention (15.36).
  const std::vector<Recaller::HeadPeaks> layers = {
      {{{5.0f, 3, 0}, {3.0f, 7, 1}, {1.6f, 11, 5}}, {{4.0f, 9, 0}, {3.5f, 7, 4}, {1.6f, 11, 7}}},
      {{{3.0f, 9, 2}, {2.9f, 7, 3}, {1.6f, 11, 3}}, {{1.6f, 11, 8}}},
      {{{1.6f, 11, 9}}, {{1.6f, 11, 1}, {0.5f, 13, 2}}},
  };
  EXPECT_EQ(Recaller::RankAcrossLayers(layers, 10), (std::vector<int32_t>{7, 3, 9, 11, 13}));
  EXPECT_EQ(Recaller::RankAcrossLayers(layers, 2), (std::vector<int32_t>{7, 3}));
  EXPECT_TRUE(Recaller::RankAcrossLayers({}, 4).empty());
}

// At the input's last step the chunk's own last rows vote and recall, not
// the question's copy after the chunk: in a one-step plan, questions of the
// same length but other tokens leave the same memory, recall included.
TEST_F(RecallTest, TheLastStepAsksInPlace) {
  PrefillConfig config = Config();
  config.schedule.chunk = 2048;  // one step: the whole input
  config.schedule.memory = 300;
  config.recall_budget = 30;
  std::vector<std::unique_ptr<PrefillEngine>> runs;
  for (int offset : {0, 500}) {
    config.query_tokens.assign(ids_.begin() + offset, ids_.begin() + offset + 24);
    auto store = NewStore("one_step_" + std::to_string(offset));
    runs.push_back(Run(config, store.get()));
    EXPECT_EQ(runs.back()->plan().steps.size(), 1u);
    EXPECT_EQ(runs.back()->memory().size(0), 300 + config.schedule.sink_tokens + 30);
  }
  ExpectSameMemory(runs[0]->memory(), runs[1]->memory());
}

TEST_F(RecallTest, IsCountedAndChecked) {
  const LlamaConfig& mc = model_->config();
  PrefillConfig config = Config();
  auto plain = PrefillEngine::Footprint(mc, config, kTokens);
  SNAPFILL_ASSERT_OK(plain);
  config.recall_budget = 40;
  auto recall = PrefillEngine::Footprint(mc, config, kTokens);
  SNAPFILL_ASSERT_OK(recall);
  EXPECT_EQ(recall->final_entries, plain->final_entries + 40);
  EXPECT_GT(recall->memory_bytes, plain->memory_bytes);
  EXPECT_GT(recall->recall_bytes, 0u);
  EXPECT_EQ(recall->recall_disk_bytes, mc.num_layers * kTokens * RecallStore::SlotBytes(Info()));
  EXPECT_GT(recall->resident_peak, plain->resident_peak);

  // Without a store, a question or SnapKV: refused before anything runs.
  auto no_store = PrefillEngine::Create(*model_, backend_.get(), config, kTokens);
  SNAPFILL_ASSERT_OK(no_store);
  EXPECT_TRUE(absl::IsFailedPrecondition((*no_store)->Run(ids_, nullptr))) << "no store attached";
  PrefillConfig no_question = config;
  no_question.query_tokens.clear();
  auto q = PrefillEngine::Footprint(mc, no_question, kTokens);
  ASSERT_FALSE(q.ok());
  EXPECT_THAT(q.status().message(), HasSubstr("needs the question"));
  PrefillConfig streaming = config;
  streaming.pruner.kind = PrunerKind::kStreaming;
  EXPECT_TRUE(absl::IsInvalidArgument(PrefillEngine::Footprint(mc, streaming, kTokens).status()));
  // A store shaped for another model.
  RecallStoreInfo other = Info();
  other.head_dim *= 2;
  auto wrong = RecallStore::Create(root_ + "/wrong", other);
  SNAPFILL_ASSERT_OK(wrong);
  const absl::Status shaped = (*no_store)->AttachRecallStore(wrong->get());
  ASSERT_FALSE(shaped.ok());
  EXPECT_THAT(shaped.message(), HasSubstr("is shaped"));
  // A store for an engine planned without one (no budget, no
  // store_evicted): its footprint left the store's copies out.
  auto unplanned = PrefillEngine::Create(*model_, backend_.get(), Config(), kTokens);
  SNAPFILL_ASSERT_OK(unplanned);
  auto store = NewStore("unplanned");
  const absl::Status refused = (*unplanned)->AttachRecallStore(store.get());
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("store_evicted"));
  SNAPFILL_EXPECT_OK((*unplanned)->AttachRecallStore(nullptr));
}

}  // namespace
}  // namespace snapfill
