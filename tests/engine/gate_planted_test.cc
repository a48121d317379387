// Training recovers a planted rule (issue 40's check on the gates): a
// one-layer tiny model whose weights are edited so that every query leans
// towards one key direction, which only some tokens' keys carry. Those
// entries are attended by every later query (they live as long as the
// sequence, censored); the rest die young. train-gate's path (the labels of
// CollectGateSamples, FitGate) must learn the rule from the keys alone, and
// the gate pruner must then keep mostly those entries.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "snapfill/engine.h"
#include "src/model/llama_forward.h"
#include "snapfill/status.h"
#include "src/compress/gate.h"
#include "src/engine/gate_labels.h"
#include "src/gguf/gguf_reader.h"
#include "src/kv/kv_cache.h"
#include "tests/testing/ref_backend.h"
#include "tests/testing/status_matchers.h"
#include "tools/testmodel/tiny_llama.h"

namespace snapfill {
namespace {

bool Planted(int32_t id) { return id % 8 == 0; }

// The tiny model with the rule planted. Within every head, coordinate p (the
// pair RoPE turns slowest, so the rule holds at every distance) of the query
// is beta * x[1], of the key beta * x[0]; every token's embedding carries a
// constant x[1], and the planted tokens a large x[0]: their keys alone meet
// every query's constant part.
std::unique_ptr<LlamaModel> PlantedModel(float beta) {
  TinyLlamaOptions o;
  o.num_layers = 1;
  o.context_length = 1024;
  std::string bytes = MakeTinyLlamaGguf(o).value();
  auto probe = GgufFile::FromBytes(bytes).value();
  auto tensor = [&](const char* name) {
    const GgufTensorInfo* t = probe->FindTensor(name);
    SNAPFILL_CHECK(t != nullptr && t->type == GgmlType::kF32) << name;
    return reinterpret_cast<float*>(bytes.data() + probe->OffsetOf(t->data));
  };
  const int64_t dim = o.model_dim, hd = dim / o.num_heads;
  const int64_t vocab = probe->FindTensor("token_embd.weight")->shape[1];
  float* embd = tensor("token_embd.weight");
  double ss = 0;
  for (int64_t i = 0; i < vocab * dim; ++i) ss += double(embd[i]) * embd[i];
  const float s = float(std::sqrt(ss / double(vocab * dim)));
  for (int64_t t = 0; t < vocab; ++t) {
    embd[t * dim + 1] = 3 * s;
    embd[t * dim + 0] = Planted(int32_t(t)) ? 3 * s : 0.0f;
  }
  // The llama architecture turns adjacent pairs; the last turns slowest.
  const int64_t p = hd - 2;
  auto plant = [&](float* w, int64_t heads, int64_t input) {
    for (int64_t h = 0; h < heads; ++h) {
      float* row = w + (h * hd + p) * dim;
      std::fill(row, row + dim, 0.0f);
      row[input] = beta;
    }
  };
  plant(tensor("blk.0.attn_q.weight"), o.num_heads, 1);
  plant(tensor("blk.0.attn_k.weight"), o.num_kv_heads, 0);
  probe.reset();
  auto file = GgufFile::FromBytes(std::move(bytes));
  SNAPFILL_CHECK(file.ok()) << file.status();
  auto model = LlamaModel::Load(std::move(*file));
  SNAPFILL_CHECK(model.ok()) << model.status();
  return std::move(*model);
}

std::vector<int32_t> RandomTokens(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  // Byte tokens only: the ids 0..255 all exist, and one in eight is planted.
  std::uniform_int_distribution<int32_t> id(0, std::min<int32_t>(vocab, 256) - 1);
  std::vector<int32_t> ids(n);
  for (auto& x : ids) x = id(rng);
  return ids;
}

TEST(GatePlantedRuleTest, TrainingRecoversItAndThePrunerKeepsIt) {
  auto model = PlantedModel(/*beta=*/1.6f);
  const LlamaConfig& c = model->config();
  auto backend = testing::CreateRefBackend(/*quantized_activations=*/false);
  const int64_t n = 256, d = c.head_dim;
  GateLabelOptions options;  // tau 2, the last 32 queries censor
  // Eight sequences to fit on, two held out.
  std::vector<GateSamples> train, held;
  std::vector<std::vector<int32_t>> held_ids;
  for (uint32_t seq = 0; seq < 10; ++seq) {
    const auto ids = RandomTokens(n, c.vocab_size, 100 + seq);
    if (seq >= 8) held_ids.push_back(std::vector<int32_t>(ids.begin() + options.skip_first, ids.end()));
    SNAPFILL_ASSERT_OK(CollectGateSamples(*model, backend.get(), ids.data(), n, options, seq < 8 ? &train : &held));
  }
  ASSERT_EQ(train.size(), static_cast<size_t>(c.num_kv_heads));

  GateModel gates = GateModel::Create(c.num_layers, c.num_kv_heads, d, 8).value();
  for (int64_t h = 0; h < c.num_kv_heads; ++h) {
    // The plant took: planted entries live long (and most are still
    // attended at the end), the others briefly.
    const GateSamples& s = held[h];
    double planted_label = 0, other_label = 0;
    int64_t planted = 0, other = 0, planted_censored = 0;
    for (int64_t i = 0; i < s.size(); ++i) {
      const bool is_planted = Planted(held_ids[i / (n - options.skip_first)][i % (n - options.skip_first)]);
      (is_planted ? planted_label : other_label) += s.label[i];
      (is_planted ? planted : other) += 1;
      planted_censored += is_planted && s.censored[i];
    }
    planted_label /= planted;
    other_label /= other;
    ASSERT_GT(planted, 20);
    EXPECT_GT(planted_label, other_label + 1.5) << "head " << h;
    EXPECT_GT(planted_censored, planted / 2) << "head " << h;

    GateFitOptions fit;
    const auto report = FitGate(train[h], held[h], fit, gates.params(0, h));
    SNAPFILL_ASSERT_OK(report);
    std::printf("head %lld: held-out MAE %.3f (the constant's %.3f), rank correlation %.3f, %lld samples\n",
                static_cast<long long>(h), report->mae, report->baseline_mae, report->rank_correlation,
                static_cast<long long>(report->validation));
    EXPECT_LT(report->mae, 0.5 * report->baseline_mae) << "head " << h;

    // The gate separates the held-out keys by the rule: every planted key
    // predicted above the midpoint of the two groups' mean predictions, every
    // other below, with at most 2% of keys on the wrong side.
    std::vector<float> y(s.size());
    gates.Predict(0, h, s.keys.data(), d, s.size(), y.data());
    double mp = 0, mo = 0;
    for (int64_t i = 0; i < s.size(); ++i) {
      (Planted(held_ids[i / (n - options.skip_first)][i % (n - options.skip_first)]) ? mp : mo) += y[i];
    }
    mp /= planted;
    mo /= other;
    EXPECT_GT(mp, mo + 1.0) << "head " << h;
    const double mid = 0.5 * (mp + mo);
    int64_t wrong = 0;
    for (int64_t i = 0; i < s.size(); ++i) {
      wrong += Planted(held_ids[i / (n - options.skip_first)][i % (n - options.skip_first)]) != (y[i] > mid);
    }
    std::printf("head %lld: planted keys predicted %.2f, others %.2f; %lld of %lld on the wrong side\n",
                static_cast<long long>(h), mp, mo, static_cast<long long>(wrong), static_cast<long long>(s.size()));
    EXPECT_LE(wrong, s.size() / 50) << "head " << h;
  }

  // The pruner with the trained gates: a 32-entry memory over 512 tokens
  // keeps, outside its sinks and recent window, planted entries (one token
  // in eight) almost only.
  const int64_t total = 512;
  const auto ids = RandomTokens(total, c.vocab_size, 7);
  PrefillConfig config;
  config.pruner.kind = PrunerKind::kGate;
  config.gate = &gates;
  // Ranked by the predictions themselves: no pooling, single entries (the
  // default spans would keep each planted entry's neighbours too).
  config.pruner.pool_kernel = 1;
  config.pruner.score_span = 1;
  config.schedule.kind = ScheduleKind::kFixed;
  config.schedule.chunk = 64;
  config.schedule.memory = 32;
  config.schedule.window = 4;
  config.schedule.sink_tokens = 2;
  auto cpu = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(cpu);
  auto engine = PrefillEngine::Create(*model, cpu->get(), config, total);
  SNAPFILL_ASSERT_OK(engine);
  SNAPFILL_ASSERT_OK((*engine)->Run(ids, [](const StepTelemetry&) { return true; }));
  const KvCache& m = (*engine)->memory();
  // A kept entry's key (before RoPE) tells whether its token was planted:
  // coordinate p is beta * x[0], about 5 for planted tokens, else 0.
  for (int64_t h = 0; h < c.num_kv_heads; ++h) {
    int64_t kept = 0, planted = 0;
    for (int64_t j = config.schedule.sink_tokens; j < m.size(0) - config.schedule.window; ++j) {
      ++kept;
      planted += std::fabs(m.k(0, h)[j * d + d - 2]) > 1.0f;
    }
    std::printf("head %lld: %lld of %lld selected entries planted\n", static_cast<long long>(h),
                static_cast<long long>(planted), static_cast<long long>(kept));
    EXPECT_GE(planted * 10, kept * 9) << "head " << h;
  }
}

}  // namespace
}  // namespace snapfill
