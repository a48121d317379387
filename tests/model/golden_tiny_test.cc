// Golden end-to-end check on a tiny random Llama (llama2.c's stories260K
// idea, without downloads): the optimized CPU backend against the scalar
// reference backend (double accumulators), through the same forward pass,
// for a prefill and then several decode steps.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "snapfill/backend.h"
#include "snapfill/status.h"
#include "src/gguf/gguf_reader.h"
#include "src/model/llama_forward.h"
#include "src/model/llama_model.h"
#include "tools/testmodel/tiny_llama.h"
#include "tests/testing/ref_backend.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

// The tiny model `opts` describes, loaded from memory.
absl::StatusOr<std::unique_ptr<LlamaModel>> LoadTiny(const TinyLlamaOptions& opts) {
  SNAPFILL_ASSIGN_OR_RETURN(std::string bytes, MakeTinyLlamaGguf(opts));
  SNAPFILL_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::FromBytes(std::move(bytes)));
  return LlamaModel::Load(std::move(file));
}

// The logits of a prefill of ids[0, n) (in batches of at most `batch`), then
// of one token at a time for the rest of `ids`, one after the other.
absl::StatusOr<std::vector<float>> PrefillThenDecode(const LlamaModel& model, Backend* backend,
                                                     const std::vector<int32_t>& ids, int n, int batch) {
  std::vector<int32_t> pos(ids.size());
  std::iota(pos.begin(), pos.end(), 0);
  SNAPFILL_ASSIGN_OR_RETURN(std::unique_ptr<LlamaForward> fwd, LlamaForward::Create(model, backend, batch));
  SNAPFILL_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv, fwd->NewKvCache(static_cast<int64_t>(ids.size())));
  const int64_t vocab = model.config().vocab_size;
  std::vector<float> all, logits(vocab);
  SNAPFILL_RETURN_IF_ERROR(fwd->Forward(ids.data(), n, pos.data(), *kv, 1, logits.data()));
  all.insert(all.end(), logits.begin(), logits.end());
  for (size_t s = n; s < ids.size(); ++s) {
    SNAPFILL_RETURN_IF_ERROR(fwd->Forward(&ids[s], 1, &pos[s], *kv, 1, logits.data()));
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

// The CPU backend's logits against the reference's: the NMSE below
// `max_nmse`, each logit within `max_rel` of the largest reference logit,
// and logits that are not degenerate.
void ExpectClose(const std::vector<float>& cpu, const std::vector<float>& ref, double max_nmse, double max_rel) {
  ASSERT_EQ(cpu.size(), ref.size());
  double err = 0, norm = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = cpu[i] - ref[i];
    err += d * d;
    norm += double(ref[i]) * ref[i];
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  EXPECT_LT(err / norm, max_nmse);
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(cpu[i], ref[i], max_rel * scale) << "logit " << i;
  EXPECT_GT(scale, 0.1);  // logits are not degenerate
}

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
  auto model = LoadTiny(opts);
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
  auto got = PrefillThenDecode(**model, cpu->get(), ids, n, 16);  // 41 tokens in 3 pieces
  SNAPFILL_ASSERT_OK(got);
  auto want = PrefillThenDecode(**model, ref.get(), ids, n, 16);
  SNAPFILL_ASSERT_OK(want);
  // f32 accumulation in the optimized kernels against double in the
  // reference: each logit is a chain of ~10 dot products of length <= 128
  // over 3 layers; relative error a few times 128 * 2^-24 per product, so
  // NMSE well under 1e-9. Bound the NMSE at 1e-8 and each logit at 1e-3 of
  // the row's scale.
  ExpectClose(*got, *want, 1e-8, 1e-3);
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

// The quantized types end to end: every 2-D tensor of one type (and
// ffn_down of another, as in llama.cpp's mixed files), against the reference
// that rounds where the CPU does: bf16 operands where it takes AMX-BF16,
// activations quantized to the Q8 partner on the integer paths, exact
// products of the dequantized rows for the Q5 types' small batches.
// Every product here equals ref::MatMulBf16 (or the integer reference) on
// its own inputs to f32 summation (checked while writing this test: NMSE
// 1e-13 or less per product, in the model). But the two backends' inputs to
// each product differ in their last bits (f32 against double norms,
// attention and SwiGLU), and rounding them to bf16 or to int8 then lands on
// different sides of a step now and then: one int8 step is 1/254 of a
// block's largest activation. The logits then differ by up to 1.2e-4 in
// NMSE (Q4_K, measured), not 1e-8. A wrong weight is far larger (the AMX
// path's Q4_K sub-block scales each one too large: 1.2e-2), so the bound
// below is 1e-3, with each logit within 3% of the row's scale.
struct QuantCase {
  GgmlType matrices, down;
  int model_dim, ffn_dim, num_heads;
};

class GoldenTinyQuantTest : public ::testing::TestWithParam<QuantCase> {};

TEST_P(GoldenTinyQuantTest, CpuBackendMatchesReference) {
  const QuantCase& p = GetParam();
  TinyLlamaOptions opts;
  opts.matrix_type = p.matrices;
  opts.ffn_down_type = p.down;
  opts.num_layers = 2;
  opts.model_dim = p.model_dim;
  opts.ffn_dim = p.ffn_dim;
  opts.num_heads = p.num_heads;
  opts.num_kv_heads = p.num_heads / 2;
  auto model = LoadTiny(opts);
  SNAPFILL_ASSERT_OK(model);
  const int64_t vocab = (*model)->config().vocab_size;

  auto cpu = CreateBackend(Device::kCpu, {});
  SNAPFILL_ASSERT_OK(cpu);
  auto ref = testing::CreateRefBackend(/*quantized_activations=*/true, /*bf16_products=*/true);
  const int n = 37, decode_steps = 3;
  std::vector<int32_t> ids(n + decode_steps);
  for (int i = 0; i < n + decode_steps; ++i) ids[i] = (i * 31 + 5) % vocab;
  auto got = PrefillThenDecode(**model, cpu->get(), ids, n, 32);  // 37 tokens: 32 (tiles) and 5 (small m)
  SNAPFILL_ASSERT_OK(got);
  auto want = PrefillThenDecode(**model, ref.get(), ids, n, 32);
  SNAPFILL_ASSERT_OK(want);
  ExpectClose(*got, *want, 1e-3, 0.03);
}

INSTANTIATE_TEST_SUITE_P(
    Types, GoldenTinyQuantTest,
    ::testing::Values(QuantCase{GgmlType::kQ5_0, GgmlType::kF32, 64, 128, 4},
                      QuantCase{GgmlType::kQ5_1, GgmlType::kF32, 64, 128, 4},
                      QuantCase{GgmlType::kQ4_1, GgmlType::kF32, 64, 128, 4},
                      // Q4_K_M of a model whose width is no multiple of 256
                      // (SmolLM2's): Q5_0, with Q6_K where the rows allow.
                      QuantCase{GgmlType::kQ5_0, GgmlType::kQ6_K, 64, 256, 4},
                      // Q4_K_M and Q5_K_M of a 256-multiple width.
                      QuantCase{GgmlType::kQ4_K, GgmlType::kQ6_K, 256, 512, 8},
                      QuantCase{GgmlType::kQ5_K, GgmlType::kQ6_K, 256, 512, 8},
                      QuantCase{GgmlType::kBF16, GgmlType::kQ8_0, 64, 128, 4}),
    [](const auto& info) {
      const QuantCase& c = info.param;
      return std::string(GetTypeTraits(c.matrices).name) + "_down_" +
             (c.down == GgmlType::kF32 ? "same" : GetTypeTraits(c.down).name);
    });

}  // namespace
}  // namespace snapfill
