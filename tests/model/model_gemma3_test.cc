// Gemma 3 270M (Q4_K_M, `tools/fetch_model.sh gemma3-270m`) against
// llama.cpp 84f7129 (tests/data/gemma3/): the tokenizer on the 121 KB corpus,
// and the forward pass on 5 prompts of 8 to 4,000 tokens (the longer ones
// past the local layers' 512-token window): top-10 logits at the last
// position and greedy continuations. Skipped where the file is absent.
//
// Tolerances: llama.cpp's own two settings (F16 KV cache with flash
// attention, and F32 KV without) differ by up to 0.69 on these logits
// (tests/data/gemma3/README.md), and both engines quantize activations to
// 8 bits for the products and round GELU differently (ggml reads an f16
// table), so a logit may move by about one; a wrong norm, scale, window or
// RoPE base moves them by several and changes the top-1.
#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "snapfill/engine.h"
#include "snapfill/status.h"
#include "src/engine/generate.h"
#include "src/engine/sampler.h"
#include "src/gguf/gguf_reader.h"
#include "src/kv/kv_cache.h"
#include "src/model/llama_forward.h"
#include "src/model/llama_model.h"
#include "src/tokenizer/tokenizer.h"
#include "tests/testing/files.h"
#include "tests/testing/real_model.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_model.h"

namespace snapfill {
namespace {

constexpr double kLogitTol = 1.25;
constexpr double kTieGap = 0.75;

// KL(p || q) of the softmaxes of two logit rows, in nats.
double KlDivergence(const std::vector<float>& p_logits, const std::vector<float>& q_logits) {
  auto log_softmax = [](const std::vector<float>& x) {
    const double max = *std::max_element(x.begin(), x.end());
    double sum = 0;
    for (float v : x) sum += std::exp(double(v) - max);
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = double(x[i]) - max - std::log(sum);
    return out;
  };
  const std::vector<double> lp = log_softmax(p_logits), lq = log_softmax(q_logits);
  double kl = 0;
  for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return kl;
}

std::string GemmaPath() { return testing::SourcePath("models/gemma-3-270m-q4_k_m.gguf"); }

class ModelGemma3Test : public testing::RealModelTest<ModelGemma3Test> {
 public:
  static std::string Path() { return GemmaPath(); }
  static const char* Fetch() { return "run tools/fetch_model.sh gemma3-270m"; }

 protected:
  static nlohmann::json Reference() {
    std::ifstream in(testing::SourcePath("tests/data/gemma3/logits.json"));
    SNAPFILL_CHECK(in.good());
    return nlohmann::json::parse(in);
  }
};

TEST_F(ModelGemma3Test, ConfigIsLlamaCpps) {
  const LlamaConfig& c = model_->config();
  EXPECT_EQ(c.architecture, "gemma3");
  EXPECT_EQ(c.num_layers, 18);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_TRUE(c.IsLocal(0));
  EXPECT_FALSE(c.IsLocal(5));
  EXPECT_FALSE(c.IsLocal(17));
  EXPECT_FLOAT_EQ(c.rope(0).freq_base, 10000.0f);
  EXPECT_FLOAT_EQ(c.rope(5).freq_base, 1000000.0f);
  EXPECT_FLOAT_EQ(c.embedding_scale, std::sqrt(640.0f));
}

TEST_F(ModelGemma3Test, TokensMatchLlamaCpp) {
  auto tok = Tokenizer::FromGguf(model_->gguf());
  SNAPFILL_ASSERT_OK(tok);
  const std::string text = testing::ReadAll(testing::SourcePath("tests/data/tokenizer_corpus.txt"));
  std::istringstream want_in(testing::ReadAll(testing::SourcePath("tests/data/gemma3/tokenizer_corpus.ids")));
  std::vector<int32_t> want;
  for (int32_t id; want_in >> id;) want.push_back(id);
  // The reference has no BOS (llama-tokenize --no-bos).
  const std::vector<int32_t> got = (*tok)->Encode(text, /*add_special=*/false, /*parse_special=*/false);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want);
}

TEST_F(ModelGemma3Test, LogitsAndGreedyMatchLlamaCpp) {
  const nlohmann::json ref = Reference();
  const int64_t vocab = model_->config().vocab_size;
  int prompts = 0, identical = 0;
  double worst = 0;
  for (const auto& p : ref.at("prompts")) {
    const std::string name = p.at("name").get<std::string>();
    const std::vector<int32_t> ids = p.at("ids").get<std::vector<int32_t>>();
    const int64_t n = ids.size();
    auto fwd = LlamaForward::Create(*model_, backend_, 512);
    SNAPFILL_ASSERT_OK(fwd);
    auto kv = (*fwd)->NewKvCache(n + 16);
    SNAPFILL_ASSERT_OK(kv);
    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), 0);
    std::vector<float> logits(vocab);
    SNAPFILL_ASSERT_OK((*fwd)->Forward(ids.data(), n, pos.data(), **kv, 1, logits.data()));
    const auto& top10 = p.at("top10");
    const int32_t top1 = Argmax(logits.data(), vocab);
    const double their_gap = top10[0][1].get<double>() - top10[1][1].get<double>();
    if (top1 != top10[0][0].get<int32_t>()) {
      EXPECT_LT(their_gap, kTieGap) << name << ": top-1 " << top1 << " against llama.cpp's "
                                    << top10[0][0].get<int32_t>() << " beyond a near tie";
    }
    double local_worst = 0;
    for (const auto& e : top10) {
      const double d = std::fabs(logits[e[0].get<int32_t>()] - e[1].get<double>());
      local_worst = std::max(local_worst, d);
    }
    worst = std::max(worst, local_worst);
    EXPECT_LE(local_worst, kLogitTol) << name;
    // Greedy: equal until a step where both engines are near a tie.
    (*kv)->Clear();
    GenerateOptions g;
    g.max_new_tokens = 16;
    auto r = Generate(**fwd, **kv, 0, ids, g, nullptr);
    SNAPFILL_ASSERT_OK(r);
    const auto& steps = p.at("greedy");
    size_t i = 0;
    while (i < steps.size() && r->tokens[i] == steps[i][0].get<int32_t>()) ++i;
    std::printf("%s (%lld tokens): worst |logit - llama.cpp| %.3f, greedy identical for %zu of %zu steps\n",
                name.c_str(), static_cast<long long>(n), local_worst, i, steps.size());
    if (i == steps.size()) {
      ++identical;
    } else {
      EXPECT_LT(steps[i][1].get<double>() - steps[i][3].get<double>(), kTieGap)
          << name << " step " << i << ": llama.cpp was not near a tie";
    }
    ++prompts;
  }
  EXPECT_EQ(prompts, 5);
  // Every parting above is at a near tie of llama.cpp's (asserted); at
  // least one of the five runs to the end identical. How many depends on
  // the summation order of the CPU's kernels: docs/RESULTS.md has AVX2's,
  // three, with kjv_1000 parting at step 0; AMX's attention tiles (same
  // operands, same error against the exact result as the AVX512-BF16 rows)
  // parted four at llama.cpp's gaps of 0.002-0.137, where those rows ran
  // four to the end and f32 three.
  EXPECT_GE(identical, 1);
  std::printf("worst |logit - llama.cpp| over the top-10s: %.3f\n", worst);
}

// The chunk loop with nothing evicted gives one-shot prefill's logits,
// within the window (every layer sees all it is given) and past it (the
// local layers keep their last 512 entries, a ring, and attend within the
// window over it and the chunk): each layer's RoPE base, Gemma's norms and
// scale on the chunk path too. At original positions the arithmetic is
// one-shot's; re-encoded positions past the window rotate a local layer's
// keys at other absolute angles (the same relative ones), and this model
// carries the rounding of those angles far: measured 1.05-1.72 on single
// last logits after 1,500 tokens (by CPU), where the loss of the 1,499
// scored tokens moves by 0.04-0.12%.
TEST_F(ModelGemma3Test, ChunkLoopEqualsOneShot) {
  const nlohmann::json ref = Reference();
  std::vector<int32_t> all;
  for (const auto& p : ref.at("prompts")) {
    if (p.at("name") == "kjv_4000") all = p.at("ids").get<std::vector<int32_t>>();
  }
  ASSERT_GE(all.size(), 1500u);
  const int64_t vocab = model_->config().vocab_size;
  for (const auto& [n, chunk] : {std::pair<int64_t, int64_t>{500, 96}, std::pair<int64_t, int64_t>{1500, 256}}) {
    const std::vector<int32_t> ids(all.begin(), all.begin() + n);
    const std::vector<float> want = testing::OneShotLogits(*model_, backend_, ids);
    std::vector<float> sorted = want;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    double loss[2] = {0, 0};
    for (const bool original : {true, false}) {
      for (const bool scored : {false, true}) {
        PrefillConfig config;
        config.pruner.kind = PrunerKind::kFull;
        config.keep_original_positions = original;
        config.schedule.kind = ScheduleKind::kFixed;
        config.schedule.chunk = chunk;
        // (Scoring every token runs the last layer's products over the whole
        // chunk, which takes other kernels than one row's: the logits are
        // compared without it.)
        config.score_tokens = scored;
        auto engine = PrefillEngine::Create(*model_, backend_, config, n);
        SNAPFILL_ASSERT_OK(engine);
        ASSERT_GE((*engine)->plan().steps.size(), 5u);
        double nll = 0;
        int64_t count = 0;
        SNAPFILL_ASSERT_OK((*engine)->Run(ids, [&](const StepTelemetry& t) {
          nll += t.nll_sum;
          count += t.scored_tokens;
          return true;
        }));
        if (n > 512) {
          EXPECT_EQ((*engine)->memory().size(0), 512) << "a local layer's ring";
        }
        if (scored) {
          ASSERT_EQ(count, n - 1);
          loss[original] = nll / count;
          continue;
        }
        const std::vector<float>& got = (*engine)->last_logits();
        ASSERT_EQ(got.size(), want.size());
        double worst = 0;
        for (int64_t v = 0; v < vocab; ++v) worst = std::max(worst, std::fabs(double(got[v]) - want[v]));
        const double kl = KlDivergence(want, got);
        std::printf("%lld tokens in chunks of %lld (%s positions): worst |logit - one-shot| %.4f, KL %.5f\n",
                    static_cast<long long>(n), static_cast<long long>(chunk),
                    original ? "original" : "re-encoded", worst, kl);
        // The same arithmetic in other batch shapes: 8-bit activations are
        // quantized per row, so only the attention's summation order differs.
        const bool same_angles = original || n <= 512;
        if (same_angles) {
          EXPECT_LT(worst, 0.05);
        } else {
          // Other absolute angles: the rounding moves single logits by 1.05
          // (Intel AVX-512) to 1.72 (AMD AVX2), as much as llama.cpp's own
          // spread; the distribution stays put (KL 0.016 measured on AVX2).
          EXPECT_LT(kl, 0.1);
        }
        if (same_angles || sorted[0] - sorted[1] > kTieGap) {
          EXPECT_EQ(Argmax(got.data(), vocab), Argmax(want.data(), vocab));
        }
      }
    }
    std::printf("%lld tokens: loss %.5f at original positions, %.5f re-encoded\n", static_cast<long long>(n),
                loss[1], loss[0]);
    EXPECT_NEAR(loss[0], loss[1], 0.002 * loss[1]) << "re-encoded positions against original ones";
  }
}

// llama-perplexity's statistic on the same 512 tokens (perplexity.txt: one
// window of 512, the predictions of tokens 257..511 from their prefixes):
// the loss within 1.5% of its (perplexity 13.1149 with an F16 KV cache,
// 13.1880 with F32).
TEST_F(ModelGemma3Test, PerplexityOf512TokensMatchesLlamaCpp) {
  std::istringstream in(testing::ReadAll(testing::SourcePath("tests/data/gemma3/perplexity.txt")));
  std::vector<int32_t> ids;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream row(line);
    for (int32_t id; row >> id;) ids.push_back(id);
  }
  ASSERT_EQ(ids.size(), 512u);
  const int64_t vocab = model_->config().vocab_size;
  auto fwd = LlamaForward::Create(*model_, backend_, 512);
  SNAPFILL_ASSERT_OK(fwd);
  auto kv = (*fwd)->NewKvCache(512);
  SNAPFILL_ASSERT_OK(kv);
  std::vector<int32_t> pos(512);
  std::iota(pos.begin(), pos.end(), 0);
  // Two pieces, each with the logits of its last 128 rows: 256..383, 384..511.
  std::vector<float> logits(128 * vocab);
  double nll = 0;
  int64_t count = 0;
  for (int64_t start : {0, 384}) {
    const int64_t len = start == 0 ? 384 : 128;
    SNAPFILL_ASSERT_OK((*fwd)->Forward(ids.data() + start, len, pos.data() + start, **kv, 128, logits.data()));
    for (int64_t r = 0; r < 128; ++r) {
      const int64_t j = start + len - 128 + r;  // the row's position
      if (j < 256 || j > 510) continue;
      const float* row = logits.data() + r * vocab;
      const float mx = *std::max_element(row, row + vocab);
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(row[v]) - mx);
      nll += std::log(sum) + mx - row[ids[j + 1]];
      ++count;
    }
  }
  ASSERT_EQ(count, 255);
  // The bound is on the loss (nats a token); perplexity, its
  // exponential, moves 2.6 times as much here.
  const double loss = nll / count;
  std::printf("tokens 257..511: loss %.4f, perplexity %.4f (llama.cpp: %.4f and 13.1149 with an F16 KV cache, "
              "%.4f and 13.1880 with F32)\n",
              loss, std::exp(loss), std::log(13.1149), std::log(13.1880));
  EXPECT_NEAR(loss / std::log(13.1149), 1.0, 0.015);
  EXPECT_NEAR(loss / std::log(13.1880), 1.0, 0.015);
}

}  // namespace
}  // namespace snapfill
