// The gates' training labels (src/engine/gate_labels.h) on the tiny model,
// against a naive loop over every attention weight; and the gate pruner in
// the chunk loop.
#include "src/compress/gate.h"
#include "src/engine/gate_labels.h"
#include "src/kv/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/ref/ops_ref.h"
#include "snapfill/engine.h"
#include "snapfill/status.h"
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

TEST(GateLabelsTest, MatchTheirDefinition) {
  auto model = TinyModel();
  const LlamaConfig& c = model->config();
  auto backend = testing::CreateRefBackend(/*quantized_activations=*/false);
  const int64_t n = 120, d = c.head_dim, group = c.num_heads / c.num_kv_heads;
  const auto ids = testing::TestTokens(n, c.vocab_size);
  GateLabelOptions options;
  options.tau = 1.5f;
  options.alive_margin = 10;
  options.skip_first = 3;
  std::vector<GateSamples> samples;
  SNAPFILL_ASSERT_OK(CollectGateSamples(*model, backend.get(), ids.data(), n, options, &samples));
  ASSERT_EQ(samples.size(), static_cast<size_t>(c.num_layers * c.num_kv_heads));

  // The naive loop: the same forward, every weight from its definition.
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  int64_t compared = 0, differ = 0, long_lived = 0;
  auto attend = [&](int64_t layer, float* q, int64_t q_stride, float* k, float* v, int64_t kv_stride, int64_t rows,
                    int64_t out_rows, float* out) -> absl::Status {
    // The features first: keys before RoPE.
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      const GateSamples& s = samples[layer * c.num_kv_heads + h];
      EXPECT_EQ(s.size(), n - 3);
      for (int64_t j = 3; j < n; ++j) {
        for (int64_t t = 0; t < d; ++t) EXPECT_EQ(s.keys[(j - 3) * d + t], k[j * kv_stride + h * d + t]);
      }
    }
    ref::Rope(q, rows, c.num_heads, d, q_stride, pos.data(), c.rope_dim, c.rope_freq_base, c.rope_freq_scale,
              c.rope_neox);
    ref::Rope(k, rows, c.num_kv_heads, d, kv_stride, pos.data(), c.rope_dim, c.rope_freq_base, c.rope_freq_scale,
              c.rope_neox);
    ref::Attention(q + (rows - out_rows) * q_stride, q_stride, k, v, d, kv_stride, out + (rows - out_rows) * q_stride,
                   q_stride, out_rows, rows, c.num_heads, c.num_kv_heads, d, 1.0f / std::sqrt(float(d)));
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      std::vector<int64_t> last(n);
      std::iota(last.begin(), last.end(), 0);
      std::vector<bool> alive(n, false);
      for (int64_t g = h * group; g < (h + 1) * group; ++g) {
        for (int64_t t = 0; t < n; ++t) {
          std::vector<double> p(t + 1);
          double mx = -1e300, sum = 0;
          for (int64_t j = 0; j <= t; ++j) {
            double dot = 0;
            for (int64_t x = 0; x < d; ++x) dot += double(q[t * q_stride + g * d + x]) * k[j * kv_stride + h * d + x];
            mx = std::max(mx, p[j] = dot / std::sqrt(double(d)));
          }
          for (double& x : p) sum += (x = std::exp(x - mx));
          for (int64_t j = 0; j <= t; ++j) {
            if (p[j] / sum > options.tau / (t + 1)) {
              last[j] = std::max(last[j], t);
              if (t >= n - options.alive_margin) alive[j] = true;
            }
          }
        }
      }
      const GateSamples& s = samples[layer * c.num_kv_heads + h];
      for (int64_t j = 3; j < n; ++j) {
        const float want = std::log1p(float(last[j] - j)) / std::log(4.0f);
        ++compared;
        // A weight within rounding of the threshold may fall either side.
        if (std::fabs(s.label[j - 3] - want) > 1e-5 || s.censored[j - 3] != alive[j]) ++differ;
        long_lived += last[j] - j > 20;
      }
    }
    return absl::OkStatus();
  };
  auto fwd = LlamaForward::Create(*model, backend.get(), n);
  SNAPFILL_ASSERT_OK(fwd);
  std::vector<float> logits(c.vocab_size);
  SNAPFILL_ASSERT_OK((*fwd)->ForwardWithAttention(ids.data(), n, attend, 0, logits.data(), 0));
  EXPECT_EQ(compared, c.num_layers * c.num_kv_heads * (n - 3));
  EXPECT_LE(differ, compared / 100) << differ << " of " << compared << " labels differ";
  EXPECT_GT(long_lived, 0) << "the labels must not all be short";
  // Options out of range and sequences beyond the context.
  GateLabelOptions bad = options;
  bad.tau = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(CollectGateSamples(*model, backend.get(), ids.data(), n, bad, &samples)));
  EXPECT_TRUE(absl::IsInvalidArgument(CollectGateSamples(*model, backend.get(), ids.data(), 1, options, &samples)));
}

// A hybrid model's sliding-window layers keep their windows in the chunk
// loop, whatever a gate says: they give no samples; the global layers give
// one per key as before, from a forward pass whose local layers attend
// within their windows (the chunk loop's and llama.cpp's).
TEST(GateLabelsTest, SlidingWindowLayersGiveNoSamples) {
  auto model = testing::LoadTinyModel(testing::TinyHybridOptions(16));
  const LlamaConfig& c = model->config();
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  const int64_t n = 80;
  const auto ids = testing::TestTokens(n, c.vocab_size);
  GateLabelOptions options;
  options.skip_first = 3;
  std::vector<GateSamples> samples;
  SNAPFILL_ASSERT_OK(CollectGateSamples(*model, backend->get(), ids.data(), n, options, &samples));
  ASSERT_EQ(samples.size(), static_cast<size_t>(c.num_layers * c.num_kv_heads));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      EXPECT_EQ(samples[l * c.num_kv_heads + h].size(), c.IsLocal(l) ? 0 : n - 3) << "layer " << l;
    }
  }
}

// On a device the host cannot reach the forward pass's rows: they are
// downloaded, and the samples are the host's. (guard_buffers stands in for a
// device: its buffers fault outside the backend's ops.)
TEST(GateLabelsTest, RowsOnADeviceGiveTheHostsSamples) {
  auto model = TinyModel();
  const LlamaConfig& c = model->config();
  BackendOptions guarded;
  guarded.guard_buffers = true;
  auto device = CreateBackend(Device::kCpu, guarded);
  auto host = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(device);
  SNAPFILL_ASSERT_OK(host);
  ASSERT_FALSE((*device)->HostReachesBuffers());
  const int64_t n = 90;
  const auto ids = testing::TestTokens(n, c.vocab_size);
  GateLabelOptions options;
  options.skip_first = 2;
  std::vector<GateSamples> want, got;
  SNAPFILL_ASSERT_OK(CollectGateSamples(*model, host->get(), ids.data(), n, options, &want));
  SNAPFILL_ASSERT_OK(CollectGateSamples(*model, device->get(), ids.data(), n, options, &got));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(want[i].size(), n - 2);
    EXPECT_EQ(got[i].keys, want[i].keys) << "layer and head " << i;
    EXPECT_EQ(got[i].label, want[i].label) << "layer and head " << i;
    EXPECT_EQ(got[i].censored, want[i].censored) << "layer and head " << i;
  }
}

// In the chunk loop every kept entry carries its gate's prediction on its
// key before RoPE (the score the selection ranked it by); gates of another
// shape, or none, are refused.
TEST(GatePrunerTest, KeepsTheLongestPredictedLives) {
  auto model = TinyModel();
  const LlamaConfig& c = model->config();
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(backend);
  // Random gates: predictions differ from entry to entry.
  GateModel gates = GateModel::Create(c.num_layers, c.num_kv_heads, c.head_dim, 8).value();
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      for (float& x : gates.params(l, h).w1) x = dist(rng);
      for (float& x : gates.params(l, h).w2) x = dist(rng);
    }
  }
  const int n = 500;
  const auto ids = testing::TestTokens(n, c.vocab_size);
  PrefillConfig config;
  config.pruner.kind = PrunerKind::kGate;
  config.pruner.pool_kernel = 1;  // rank by the predictions themselves
  config.gate = &gates;
  config.schedule.kind = ScheduleKind::kFixed;
  config.schedule.chunk = 100;
  config.schedule.memory = 40;
  config.schedule.window = 8;
  config.schedule.sink_tokens = 2;
  auto engine = PrefillEngine::Create(*model, backend->get(), config, n);
  SNAPFILL_ASSERT_OK(engine);
  int64_t steps = 0;
  SNAPFILL_ASSERT_OK((*engine)->Run(ids, [&](const StepTelemetry& t) {
    const KvCache& m = (*engine)->memory();
    for (int64_t l = 0; l < c.num_layers; ++l) {
      EXPECT_EQ(m.size(l), 40 + 2);
      for (int64_t h = 0; h < c.num_kv_heads; ++h) {
        for (int64_t j = 0; j < m.size(l); ++j) {
          float y;
          gates.Predict(l, h, m.k(l, h) + j * c.head_dim, c.head_dim, 1, &y);
          EXPECT_NEAR(m.score(l, h)[j], y, 1e-4 * (1 + std::fabs(y))) << "step " << t.step;
        }
      }
    }
    ++steps;
    return true;
  }));
  EXPECT_EQ(steps, 5);
  // Gates shaped for another model are refused.
  GateModel wrong = GateModel::Create(c.num_layers + 1, c.num_kv_heads, c.head_dim, 8).value();
  config.gate = &wrong;
  EXPECT_TRUE(absl::IsInvalidArgument(PrefillEngine::Create(*model, backend->get(), config, n).status()));
  config.gate = nullptr;
  EXPECT_TRUE(absl::IsInvalidArgument(PrefillEngine::Create(*model, backend->get(), config, n).status()));
}

}  // namespace
}  // namespace snapfill
