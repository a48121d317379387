// Context reconstruction (--pruner=reconstruct, DESIGN.md §9) on the tiny
// model: the score each entry gets from its chunk's repetition, against a
// naive loop that runs [input so far; prompt; repetition] in one causal
// pass and takes the attention weights from their definition; the scores
// travel with the entries through eviction and a saved cache; and the
// configuration checks.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ref/ops_ref.h"
#include "snapfill/engine.h"
#include "snapfill/status.h"
#include "src/gguf/fingerprint.h"
#include "src/kv/cache_file.h"
#include "src/kv/kv_cache.h"
#include "src/model/llama_forward.h"
#include "tests/testing/ref_backend.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_model.h"

namespace snapfill {
namespace {

std::unique_ptr<LlamaModel> TinyModel() {
  TinyLlamaOptions opts;
  opts.num_layers = 2;
  opts.context_length = 4096;
  return testing::LoadTinyModel(opts);
}

// scores[layer][kv_head][j] for the keys j in [key_begin, key_end) of
// `seq`, from the rows [score_begin, seq.size()): the largest softmax weight
// any of those rows' query heads of the KV group pays key j. One causal
// pass at positions 0..n-1, attention in double from its definition.
std::vector<std::vector<std::vector<double>>> NaiveScores(const LlamaModel& model, Backend* backend,
                                                          const std::vector<int32_t>& seq, int64_t key_begin,
                                                          int64_t key_end, int64_t score_begin) {
  const LlamaConfig& c = model.config();
  const int64_t n = seq.size(), d = c.head_dim, group = c.num_heads / c.num_kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<std::vector<std::vector<double>>> scores(
      c.num_layers, std::vector<std::vector<double>>(c.num_kv_heads, std::vector<double>(key_end - key_begin, 0.0)));
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  auto attend = [&](int64_t layer, float* q, int64_t q_stride, float* k, float* v, int64_t kv_stride, int64_t rows,
                    int64_t out_rows, float* out) -> absl::Status {
    SNAPFILL_CHECK(rows == n);
    ref::Rope(q, n, c.num_heads, d, q_stride, pos.data(), c.rope_dim, c.rope_freq_base, c.rope_freq_scale, c.rope_neox);
    ref::Rope(k, n, c.num_kv_heads, d, kv_stride, pos.data(), c.rope_dim, c.rope_freq_base, c.rope_freq_scale,
              c.rope_neox);
    std::vector<double> p;
    for (int64_t i = 0; i < n; ++i) {
      const bool wanted = i >= n - out_rows;
      if (!wanted && i < score_begin) continue;
      for (int64_t h = 0; h < c.num_heads; ++h) {
        const int64_t kvh = h / group;
        p.assign(i + 1, 0.0);
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t t = 0; t < d; ++t) dot += double(q[i * q_stride + h * d + t]) * k[j * kv_stride + kvh * d + t];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (double& x : p) sum += (x = std::exp(x - mx));
        for (double& x : p) x /= sum;
        if (i >= score_begin) {
          for (int64_t j = key_begin; j < key_end; ++j) {
            double& s = scores[layer][kvh][j - key_begin];
            s = std::max(s, p[j]);
          }
        }
        if (wanted) {
          for (int64_t t = 0; t < d; ++t) {
            double acc = 0;
            for (int64_t j = 0; j <= i; ++j) acc += p[j] * v[j * kv_stride + kvh * d + t];
            out[i * q_stride + h * d + t] = static_cast<float>(acc);
          }
        }
      }
    }
    return absl::OkStatus();
  };
  auto fwd = LlamaForward::Create(model, backend, n);
  SNAPFILL_CHECK(fwd.ok()) << fwd.status();
  std::vector<float> logits(c.vocab_size);
  SNAPFILL_CHECK((*fwd)->ForwardWithAttention(seq.data(), n, attend, 1, logits.data(), 1).ok());
  return scores;
}

// With a memory that holds everything, every entry's stored score is the one
// its own chunk's repetition gave it: the naive loop over [tokens up to the
// chunk's end; prompt; every stride-th token of the chunk], scored by the
// repeated rows only (not the prompt's); within rel · w + abs of it. (Every
// layer takes the repetition's log-denominators from its attention,
// Backend::AttentionWithLse, the last one attending the repetition for them
// alone.)
void ExpectScoresOfTheNaiveLoop(const LlamaModel* model, Backend* backend, int64_t stride, double rel, double abs) {
  const LlamaConfig& mc = model->config();
  const int n = 150;
  const auto ids = testing::TestTokens(n, mc.vocab_size);
  PrefillConfig config;
  config.pruner.kind = PrunerKind::kReconstruct;
  config.pruner.repeat_stride = stride;
  config.repeat_prompt = {7, 3, 19, 4, 11};
  config.schedule.kind = ScheduleKind::kFixed;
  config.schedule.chunk = 48;
  config.schedule.memory = 512;  // nothing is evicted
  config.schedule.window = 8;
  auto engine = PrefillEngine::Create(*model, backend, config, n);
  SNAPFILL_ASSERT_OK(engine);
  std::vector<int64_t> rows;
  SNAPFILL_ASSERT_OK((*engine)->Run(ids, [&](const StepTelemetry& t) {
    rows.push_back(t.query_rows);
    return true;
  }));
  const KvCache& memory = (*engine)->memory();
  ASSERT_TRUE(memory.has_scores());
  const auto& steps = (*engine)->plan().steps;
  ASSERT_GE(steps.size(), 3u);
  for (size_t i = 0; i < steps.size(); ++i) {
    const int64_t begin = steps[i].start_token, end = begin + steps[i].chunk_tokens;
    EXPECT_EQ(rows[i], 5 + (steps[i].chunk_tokens + stride - 1) / stride) << "step " << i;
    std::vector<int32_t> seq(ids.begin(), ids.begin() + end);
    seq.insert(seq.end(), config.repeat_prompt.begin(), config.repeat_prompt.end());
    for (int64_t t = begin; t < end; t += stride) seq.push_back(ids[t]);
    const auto want = NaiveScores(*model, backend, seq, begin, end, end + 5);
    for (int64_t l = 0; l < mc.num_layers; ++l) {
      ASSERT_EQ(memory.size(l), n);
      for (int64_t h = 0; h < mc.num_kv_heads; ++h) {
        for (int64_t j = begin; j < end; ++j) {
          ASSERT_EQ(memory.pos(l, h)[j], j);
          const double w = want[l][h][j - begin];
          ASSERT_NEAR(memory.score(l, h)[j], w, rel * w + abs)
              << "step " << i << " layer " << l << " KV head " << h << " entry " << j;
        }
      }
    }
  }
}

class ReconstructScoreTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(ReconstructScoreTest, EveryEntryKeepsItsOwnChunksScore) {
  auto model = TinyModel();
  auto backend = testing::CreateRefBackend(/*quantized_activations=*/false);
  ExpectScoresOfTheNaiveLoop(model.get(), backend.get(), GetParam(), 1e-4, 1e-7);
}

// A backend whose attention does not keep the denominators
// (Backend::AttentionKeepsLse false: the default AttentionWithLse's second
// pass, as on a GPU): the engine takes them from QueryLogSumExp instead, and
// the scores are the same.
TEST_P(ReconstructScoreTest, ABackendWhoseAttentionKeepsNoDenominatorsScoresTheSame) {
  auto model = TinyModel();
  auto backend = testing::CreateRefBackend(/*quantized_activations=*/false, /*bf16_products=*/false,
                                           /*attention_keeps_lse=*/false);
  ExpectScoresOfTheNaiveLoop(model.get(), backend.get(), GetParam(), 1e-4, 1e-7);
}

// The CPU backend at head_dim 64, where a chunk's attention runs on bf16
// operands (AMX or AVX512-BF16, where the CPU has them; else f32): its
// log-denominators are those of the bf16 scores and the layers' inputs
// carry its roundings, so each weight is within a few percent (a wrong row
// or head of log-denominators moves it by a factor e^Δ, Δ of order 1).
TEST_P(ReconstructScoreTest, TheCpuBackendsScoresAreTheNaiveLoopsWithinItsRoundings) {
  TinyLlamaOptions opts;
  opts.num_layers = 3;
  opts.num_heads = 4;
  opts.num_kv_heads = 2;
  opts.head_dim = 64;
  opts.context_length = 4096;
  auto model = testing::LoadTinyModel(opts);
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  ExpectScoresOfTheNaiveLoop(model.get(), backend->get(), GetParam(), 0.05, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Strides, ReconstructScoreTest, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return "stride" + std::to_string(info.param);
                         });

// Reconstruction under eviction: FM, chunks of 100, a memory of 64 and 2 sinks.
PrefillConfig EvictingConfig() {
  PrefillConfig config;
  config.pruner.kind = PrunerKind::kReconstruct;
  config.repeat_prompt = {7, 3, 19};
  config.schedule.kind = ScheduleKind::kFixed;
  config.schedule.chunk = 100;
  config.schedule.memory = 64;
  config.schedule.window = 8;
  config.schedule.sink_tokens = 2;
  return config;
}

// Under eviction the memory keeps, beside each entry, the score it was
// given when its chunk was repeated (never judged again).
// A saved cache carries the scores, bit for bit.
TEST(ReconstructTest, ScoresTravelWithTheirEntries) {
  auto model = TinyModel();
  const LlamaConfig& mc = model->config();
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  const int n = 600;
  const auto ids = testing::TestTokens(n, mc.vocab_size);
  PrefillConfig config = EvictingConfig();
  config.pruner.pool_kernel = 1;
  auto engine = PrefillEngine::Create(*model, backend->get(), config, n);
  SNAPFILL_ASSERT_OK(engine);
  // score of (layer, head, position) when first seen; checked on later steps.
  std::vector<std::vector<std::vector<float>>> first(
      mc.num_layers, std::vector<std::vector<float>>(mc.num_kv_heads, std::vector<float>(n, -1.0f)));
  int64_t checked = 0;
  SNAPFILL_ASSERT_OK((*engine)->Run(ids, [&](const StepTelemetry& t) {
    const KvCache& m = (*engine)->memory();
    for (int64_t l = 0; l < mc.num_layers; ++l) {
      EXPECT_EQ(m.size(l), 64 + 2);
      for (int64_t h = 0; h < mc.num_kv_heads; ++h) {
        for (int64_t j = 0; j < m.size(l); ++j) {
          const int32_t p = m.pos(l, h)[j];
          const float s = m.score(l, h)[j];
          EXPECT_TRUE(std::isfinite(s) && s >= 0.0f && s <= 1.0f) << s;
          if (p < t.start_token) {
            EXPECT_EQ(s, first[l][h][p]) << "an older entry's score changed";
            ++checked;
          } else {
            first[l][h][p] = s;
          }
        }
      }
    }
    return true;
  }));
  EXPECT_GT(checked, 0);

  PromptCache cache;
  cache.model_fingerprint = ModelFingerprint(model->gguf());
  cache.next_position = (*engine)->next_position();
  cache.input_tokens = n;
  auto kv = (*engine)->MakeDecoderCache(0);
  SNAPFILL_ASSERT_OK(kv);
  ASSERT_TRUE((*kv)->has_scores());
  cache.kv = std::move(*kv);
  const std::string path = ::testing::TempDir() + "/reconstruct_cache.kv";
  std::remove(path.c_str());
  SNAPFILL_ASSERT_OK(SaveCacheFile(path, cache, /*overwrite=*/false));
  auto loaded = LoadCacheFile(path, cache.model_fingerprint, 4);
  SNAPFILL_ASSERT_OK(loaded);
  ASSERT_TRUE(loaded->kv->has_scores());
  for (int64_t l = 0; l < mc.num_layers; ++l) {
    for (int64_t h = 0; h < mc.num_kv_heads; ++h) {
      const int64_t size = cache.kv->size(l);
      EXPECT_EQ(std::vector<float>(loaded->kv->score(l, h), loaded->kv->score(l, h) + size),
                std::vector<float>(cache.kv->score(l, h), cache.kv->score(l, h) + size));
    }
  }
  std::remove(path.c_str());
}

// A last step that keeps its chunk whole (--keep_last_chunk) evicts
// nothing, so it runs no repetition: its chunk's entries join with a score
// of 0, the memory before them keeps its scores, and every step before is
// the run's without the flag, bit for bit.
TEST(ReconstructTest, ALastStepThatKeepsItsChunkRepeatsNothing) {
  auto model = TinyModel();
  const LlamaConfig& mc = model->config();
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  const int n = 600;
  const auto ids = testing::TestTokens(n, mc.vocab_size);
  struct Snapshot {
    int64_t query_rows = 0, start = 0;
    std::vector<std::vector<int32_t>> pos;  // [layer · heads + head]
    std::vector<std::vector<float>> score;
  };
  auto run = [&](bool keep, bool adaptive) {
    PrefillConfig config = EvictingConfig();
    if (adaptive) {  // (IM, each layer's budget by its measured retention)
      config.schedule.kind = ScheduleKind::kIncremental;
      config.schedule.growth = Growth::kAdaptive;
    }
    config.schedule.keep_last_chunk = keep;
    auto engine = PrefillEngine::Create(*model, backend->get(), config, n);
    SNAPFILL_CHECK(engine.ok()) << engine.status();
    std::vector<Snapshot> steps;
    SNAPFILL_CHECK((*engine)
                       ->Run(ids,
                             [&](const StepTelemetry& t) {
                               const KvCache& m = (*engine)->memory();
                               Snapshot s{t.query_rows, t.start_token, {}, {}};
                               for (int64_t l = 0; l < mc.num_layers; ++l) {
                                 for (int64_t h = 0; h < mc.num_kv_heads; ++h) {
                                   s.pos.emplace_back(m.pos(l, h), m.pos(l, h) + m.size(l));
                                   s.score.emplace_back(m.score(l, h), m.score(l, h) + m.size(l));
                                 }
                               }
                               steps.push_back(std::move(s));
                               return true;
                             })
                       .ok());
    return steps;
  };
  for (const bool adaptive : {false, true}) {
    SCOPED_TRACE(adaptive ? "IM, adaptive" : "FM");
    const std::vector<Snapshot> plain = run(false, adaptive), kept = run(true, adaptive);
    ASSERT_EQ(plain.size(), kept.size());
    const size_t last = kept.size() - 1;
    ASSERT_GE(last, 2u);
    for (size_t i = 0; i < last; ++i) {
      EXPECT_EQ(kept[i].query_rows, plain[i].query_rows) << "step " << i;
      EXPECT_GT(kept[i].query_rows, 0);
      EXPECT_EQ(kept[i].pos, plain[i].pos) << "step " << i;
      EXPECT_EQ(kept[i].score, plain[i].score) << "step " << i;
    }
    EXPECT_EQ(kept[last].query_rows, 0);
    EXPECT_GT(plain[last].query_rows, 0);
    for (size_t lh = 0; lh < kept[last].pos.size(); ++lh) {
      const std::vector<int32_t>& before = kept[last - 1].pos[lh];
      const std::vector<int32_t>& pos = kept[last].pos[lh];
      ASSERT_EQ(pos.size(), before.size() + (n - kept[last].start)) << "layer and head " << lh;
      for (size_t j = 0; j < pos.size(); ++j) {
        if (j < before.size()) {
          EXPECT_EQ(pos[j], before[j]);
          EXPECT_EQ(kept[last].score[lh][j], kept[last - 1].score[lh][j]) << "an older entry's score changed";
        } else {
          EXPECT_EQ(pos[j], kept[last].start + static_cast<int32_t>(j - before.size()));
          EXPECT_EQ(kept[last].score[lh][j], 0.0f);
        }
      }
    }
  }
}

TEST(ReconstructTest, ConfigurationChecks) {
  auto model = TinyModel();
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  PrefillConfig config;
  config.pruner.kind = PrunerKind::kReconstruct;
  config.schedule.chunk = 64;
  config.schedule.memory = 64;
  config.schedule.window = 8;
  config.query_tokens = {1, 2, 3};
  EXPECT_TRUE(absl::IsInvalidArgument(PrefillEngine::Create(*model, backend->get(), config, 400).status()));
  config.query_tokens.clear();
  config.repeat_prompt = {1, static_cast<int32_t>(model->config().vocab_size)};
  EXPECT_TRUE(absl::IsInvalidArgument(PrefillEngine::Create(*model, backend->get(), config, 400).status()));
  config.repeat_prompt = {1, 2};
  config.pruner.repeat_stride = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(PrefillEngine::Create(*model, backend->get(), config, 400).status()));
  config.pruner.repeat_stride = 2;
  SNAPFILL_EXPECT_OK(PrefillEngine::Create(*model, backend->get(), config, 400).status());
  // The footprint counts the repetition's rows and the entries' scores.
  PrefillConfig plain = config;
  plain.pruner.kind = PrunerKind::kSnapKv;
  auto with = PrefillEngine::Footprint(model->config(), config, 400);
  auto without = PrefillEngine::Footprint(model->config(), plain, 400);
  SNAPFILL_ASSERT_OK(with);
  SNAPFILL_ASSERT_OK(without);
  EXPECT_GT(with->memory_bytes, without->memory_bytes);
  EXPECT_GT(with->activation_bytes, without->activation_bytes);
  EXPECT_EQ(ParsePrunerKind("reconstruct").value(), PrunerKind::kReconstruct);
}

}  // namespace
}  // namespace snapfill
