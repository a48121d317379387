// The chunk loop on the default model, short versions of the long runs
// (the 1M-token run is a benchmark, docs/BENCHMARKS.md, not a test).
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "gtest/gtest.h"
#include "snapfill/engine.h"
#include "src/model/llama_forward.h"
#include "snapfill/status.h"
#include "src/base/sys_stats.h"
#include "src/engine/generate.h"
#include "src/engine/prompt.h"
#include "src/kv/kv_cache.h"
#include "src/tokenizer/tokenizer.h"
#include "tests/testing/status_matchers.h"
#include "tools/cli/environment.h"

namespace snapfill {
namespace {

// The noise floor of Q8-activation engines on this model; see
// model_llama_test.cc for how it was measured.
constexpr double kLogitTol = 0.75;

// --model's resolution without the flag: $SNAPFILL_MODEL, else models/.
std::string ModelPath() { return cli::ResolveModelPath(""); }

class ModelPrefillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(ModelPath())) {
      GTEST_SKIP() << "default model not found at " << ModelPath();
    }
    auto m = LlamaModel::Open(ModelPath());
    SNAPFILL_ASSERT_OK(m);
    model_ = std::move(*m);
    auto t = Tokenizer::FromGguf(model_->gguf());
    SNAPFILL_ASSERT_OK(t);
    tokenizer_ = std::move(*t);
    auto b = CreateBackend(Device::kCpu, {});
    SNAPFILL_ASSERT_OK(b);
    backend_ = std::move(*b);
    std::ifstream in(testing::SourcePath("tests/data/tokenizer_corpus.txt"), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    corpus_ = ss.str();
    ASSERT_GT(corpus_.size(), 100000u);
  }
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Backend> backend_;
  std::string corpus_;
};

// Inside the model's context, chunks that evict nothing give the logits of
// one prefill (original positions, the full pruner).
TEST_F(ModelPrefillTest, FullPrunerChunkedEqualsOneShot) {
  std::vector<int32_t> ids = tokenizer_->Encode(corpus_, false, false);
  ids.resize(3000);
  PrefillConfig config;
  config.pruner.kind = PrunerKind::kFull;
  config.keep_original_positions = true;
  config.schedule.chunk = 700;
  auto engine = PrefillEngine::Create(*model_, backend_.get(), config, ids.size());
  SNAPFILL_ASSERT_OK(engine);
  SNAPFILL_ASSERT_OK((*engine)->Run(ids, nullptr));

  auto fwd = LlamaForward::Create(*model_, backend_.get(), 512);
  auto kv = (*fwd)->NewKvCache(ids.size());
  std::vector<int32_t> pos(ids.size());
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<float> want(model_->config().vocab_size);
  SNAPFILL_ASSERT_OK((*fwd)->Forward(ids.data(), ids.size(), pos.data(), **kv, 1, want.data()));
  const std::vector<float>& got = (*engine)->last_logits();
  std::vector<int32_t> order(want.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 10, order.end(),
                    [&](int32_t a, int32_t b) { return want[a] > want[b]; });
  for (int i = 0; i < 10; ++i) {
    EXPECT_NEAR(got[order[i]], want[order[i]], kLogitTol) << "token " << order[i];
  }
  EXPECT_EQ(Argmax(got.data(), got.size()), order[0]);
}

// Tens of thousands of tokens with IMDC: memory follows the plan, no
// position passes memory + chunk, and the process stays small.
TEST_F(ModelPrefillTest, ImdcOverTheCorpusAnswers) {
  auto prompt = BuildDocumentPrompt(*tokenizer_, ChatTemplate{ChatTemplateKind::kNone, ""},
                                    corpus_, "Summarize the text above in one sentence.", "");
  SNAPFILL_ASSERT_OK(prompt);
  ASSERT_GT(prompt->tokens.size(), 30000u);
  PrefillConfig config;
  config.schedule.kind = ScheduleKind::kIncrementalDecremental;
  config.schedule.memory = 1024;
  config.schedule.chunk = 1024;
  auto engine = PrefillEngine::Create(*model_, backend_.get(), config, prompt->tokens.size());
  SNAPFILL_ASSERT_OK(engine);
  const SchedulePlan& plan = (*engine)->plan();
  int64_t steps = 0;
  SNAPFILL_ASSERT_OK((*engine)->Run(prompt->tokens, [&](const StepTelemetry& t) {
    EXPECT_LE(t.attention_length, plan.peak_attention_length);
    EXPECT_EQ(t.memory[0], std::min<int64_t>(plan.steps[t.step].budget[0],
                                             t.start_token + t.chunk_tokens));
    ++steps;
    return true;
  }));
  EXPECT_EQ(steps, static_cast<int64_t>(plan.steps.size()));
  // Positions are re-encoded: the largest is below memory + chunk, far below
  // the input length (and the model's 8K context).
  EXPECT_LE(plan.peak_attention_length, 1024 + 2 * 1024);
  for (int64_t l = 0; l < model_->config().num_layers; ++l) {
    EXPECT_EQ((*engine)->memory().size(l), 1024);
  }
  auto kv = (*engine)->MakeDecoderCache(16);
  SNAPFILL_ASSERT_OK(kv);
  auto fwd = LlamaForward::Create(*model_, backend_.get(), 1);
  GenerateOptions opts;
  opts.max_new_tokens = 16;
  auto r = GenerateFromLogits(**fwd, **kv, (*engine)->next_position(),
                              (*engine)->last_logits(), opts, nullptr);
  SNAPFILL_ASSERT_OK(r);
  EXPECT_EQ(r->tokens.size(), 16u);
  EXPECT_LT(PeakRssBytes(), uint64_t{1536} << 20);
}

}  // namespace
}  // namespace snapfill
