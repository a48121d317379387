// Golden end-to-end check on a tiny random Llama (llama2.c's stories260K
// idea, without downloads): the optimized CPU backend against the scalar
// reference backend (double accumulators), through the same forward pass,
// for a prefill and then several decode steps.
#include <cmath>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "snapfill/status.h"
#include "src/model/llama_forward.h"
#include "src/model/tiny_llama.h"
#include "tests/testing/ref_backend.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

struct Case {
  bool f16;
  int num_heads;
  int num_kv_heads;
  int head_dim;
};

class GoldenTinyTest : public ::testing::TestWithParam<Case> {};

TEST_P(GoldenTinyTest, CpuBackendMatchesReference) {
  const Case& p = GetParam();
  TinyLlamaOptions opts;
  opts.f16_matrices = p.f16;
  opts.num_layers = 3;
  opts.num_heads = p.num_heads;
  opts.num_kv_heads = p.num_kv_heads;
  opts.head_dim = p.head_dim;
  opts.model_dim = 64;
  auto bytes = MakeTinyLlamaGguf(opts);
  SNAPFILL_ASSERT_OK(bytes);
  auto file = GgufFile::FromBytes(std::move(*bytes));
  SNAPFILL_ASSERT_OK(file);
  auto model = LlamaModel::Load(std::move(*file));
  SNAPFILL_ASSERT_OK(model);
  const int64_t vocab = (*model)->config().vocab_size;

  auto cpu = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(cpu);
  // F16 prefill products run on AMX-BF16 where the CPU has it: the reference
  // rounds their operands to bf16 where the CPU does.
  auto ref = testing::CreateRefBackend(/*quantized_activations=*/false, /*bf16_products=*/true);
  const int n = 41, decode_steps = 4;
  std::vector<int32_t> ids(n + decode_steps);
  for (int i = 0; i < n + decode_steps; ++i) ids[i] = (i * 53 + 7) % vocab;
  std::vector<int32_t> pos(ids.size());
  std::iota(pos.begin(), pos.end(), 0);

  std::vector<std::vector<float>> outputs;
  for (Backend* b : {cpu->get(), ref.get()}) {
    auto fwd = LlamaForward::Create(**model, b, 16);  // 41 tokens in 3 pieces
    SNAPFILL_ASSERT_OK(fwd);
    auto kv = (*fwd)->NewKvCache(ids.size());
    SNAPFILL_ASSERT_OK(kv);
    std::vector<float> all;
    std::vector<float> logits(vocab);
    SNAPFILL_ASSERT_OK((*fwd)->Forward(ids.data(), n, pos.data(), **kv, 1, logits.data()));
    all.insert(all.end(), logits.begin(), logits.end());
    for (int s = 0; s < decode_steps; ++s) {
      SNAPFILL_ASSERT_OK(
          (*fwd)->Forward(&ids[n + s], 1, &pos[n + s], **kv, 1, logits.data()));
      all.insert(all.end(), logits.begin(), logits.end());
    }
    outputs.push_back(std::move(all));
  }
  // f32 accumulation in the optimized kernels against double in the
  // reference: each logit is a chain of ~10 dot products of length <= 128
  // over 3 layers; relative error a few times 128 * 2^-24 per product, so
  // NMSE well under 1e-9. Bound the NMSE at 1e-8 and each logit at 1e-3 of
  // the row's scale.
  double err = 0, norm = 0, scale = 0;
  for (size_t i = 0; i < outputs[0].size(); ++i) {
    const double d = outputs[0][i] - outputs[1][i];
    err += d * d;
    norm += double(outputs[1][i]) * outputs[1][i];
    scale = std::max(scale, std::fabs(double(outputs[1][i])));
  }
  EXPECT_LT(err / norm, 1e-8);
  for (size_t i = 0; i < outputs[0].size(); ++i) {
    ASSERT_NEAR(outputs[0][i], outputs[1][i], 1e-3 * scale) << "logit " << i;
  }
  EXPECT_GT(scale, 0.1);  // logits are not degenerate
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GoldenTinyTest,
    ::testing::Values(Case{false, 4, 2, 16}, Case{true, 4, 2, 16}, Case{false, 4, 4, 16},
                      Case{false, 6, 2, 24}, Case{true, 8, 1, 8}),
    [](const auto& info) {
      const Case& c = info.param;
      return std::string(c.f16 ? "F16" : "F32") + "_h" + std::to_string(c.num_heads) + "_kv" +
             std::to_string(c.num_kv_heads) + "_d" + std::to_string(c.head_dim);
    });

}  // namespace
}  // namespace snapfill
