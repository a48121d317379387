// The work the CPU backend's profile counts (BackendProfile::Ops): each
// product 2·m·n·k once, whichever path ran it (one weight, several sharing
// their input, the decode copy, the fused paths), each attention 4·head_dim·
// num_heads per visible (query, key) pair, the votes 2·head_dim·num_heads;
// and over a whole forward pass of a tiny model, exactly what its shapes
// say, the last layer's skipped rows and the logits included. These counts
// are what the profile's GOP/s and `snapfill bench`'s floor divide.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/quant_blocks.h"
#include "snapfill/backend.h"
#include "src/model/llama_forward.h"
#include "tools/testmodel/tiny_llama.h"
#include "tests/testing/matmul_data.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

std::unique_ptr<Backend> MakeBackend(bool profile, bool exact = false) {
  BackendOptions o;
  o.profile = profile;
  o.exact_matmul = exact;
  auto b = CreateBackend(Device::kCpu, o);
  EXPECT_TRUE(b.ok()) << b.status();
  return std::move(*b);
}

double OpsOf(Backend& b, const std::string& op) {
  for (const auto& [name, ops] : b.profile()->Ops()) {
    if (name == op) return ops;
  }
  ADD_FAILURE() << "no op " << op << " in the profile";
  return -1;
}

struct Matrix {
  std::vector<uint8_t> bytes;
  WeightView view;
};

Matrix MakeMatrix(GgmlType type, int64_t n, int64_t k, uint32_t seed) {
  Matrix m;
  m.bytes = testing::QuantizedWeights(type, n, k, RowBytes(type, k), seed, 0.05f);
  m.view.data = m.bytes.data();
  m.view.type = type;
  m.view.rows = n;
  m.view.cols = k;
  m.view.row_bytes = RowBytes(type, k);
  return m;
}

TEST(CpuBackendProfile, ProductsCountTwiceMNKOnEveryPath) {
  const int64_t k = 128;
  const Matrix a = MakeMatrix(GgmlType::kQ4_1, 96, k, 1), b = MakeMatrix(GgmlType::kQ4_1, 32, k, 2);
  const Matrix f = MakeMatrix(GgmlType::kF16, 48, k, 3);
  const std::vector<float> x = testing::HiddenStates(9, k, k, 4);
  std::vector<float> y(9 * 96);
  auto backend = MakeBackend(/*profile=*/true);
  double want = 0, want_int8 = 0;
  // One weight, 9 rows.
  SNAPFILL_ASSERT_OK(backend->MatMul(x.data(), 9, k, a.view, y.data(), 96));
  want += 2.0 * 9 * 96 * k;
  want_int8 += 2.0 * 9 * 96 * k;
  EXPECT_EQ(OpsOf(*backend, "matmul"), want);
  // Two weights sharing their input (one call), 5 rows.
  std::vector<float> ya(5 * 96), yb(5 * 32);
  const Backend::SharedOut outs[2] = {{&a.view, ya.data(), 96}, {&b.view, yb.data(), 32}};
  SNAPFILL_ASSERT_OK(backend->MatMulShared(x.data(), 5, k, outs, 2));
  want += 2.0 * 5 * (96 + 32) * k;
  want_int8 += 2.0 * 5 * (96 + 32) * k;
  EXPECT_EQ(OpsOf(*backend, "matmul"), want);
  // One token, twice (the second over the decode copy), and shared.
  for (int rep = 0; rep < 2; ++rep) {
    SNAPFILL_ASSERT_OK(backend->MatMul(x.data(), 1, k, a.view, y.data(), 96));
    want += 2.0 * 96 * k;
    want_int8 += 2.0 * 96 * k;
  }
  SNAPFILL_ASSERT_OK(backend->MatMulShared(x.data(), 1, k, outs, 2));
  want += 2.0 * (96 + 32) * k;
  want_int8 += 2.0 * (96 + 32) * k;
  // A float type: products, but not on int8 dots.
  SNAPFILL_ASSERT_OK(backend->MatMul(x.data(), 9, k, f.view, y.data(), 48));
  want += 2.0 * 9 * 48 * k;
  EXPECT_EQ(OpsOf(*backend, "matmul"), want);
  EXPECT_EQ(backend->profile()->Int8MatMulOps(), want_int8);
  // A call refused for its shapes did no work.
  EXPECT_FALSE(backend->MatMul(x.data(), 9, k - 1, a.view, y.data(), 96).ok());
  EXPECT_EQ(OpsOf(*backend, "matmul"), want);
  EXPECT_EQ(OpsOf(*backend, "rms_norm"), 0.0);
}

TEST(CpuBackendProfile, TheExactArithmeticHasNoInt8Products) {
  const int64_t k = 64;
  const Matrix a = MakeMatrix(GgmlType::kQ8_0, 16, k, 5);
  const std::vector<float> x = testing::HiddenStates(3, k, k, 6);
  std::vector<float> y(3 * 16);
  auto backend = MakeBackend(/*profile=*/true, /*exact=*/true);
  SNAPFILL_ASSERT_OK(backend->MatMul(x.data(), 3, k, a.view, y.data(), 16));
  EXPECT_EQ(OpsOf(*backend, "matmul"), 2.0 * 3 * 16 * k);
  EXPECT_EQ(backend->profile()->Int8MatMulOps(), 0.0);
}

TEST(CpuBackendProfile, AttentionCountsVisiblePairs) {
  const int64_t heads = 4, kv_heads = 2, d = 16, keys = 20, num_q = 7;
  std::vector<float> q(num_q * heads * d, 0.1f), k(kv_heads * keys * d, 0.2f), v(kv_heads * keys * d, 0.3f);
  std::vector<float> out(num_q * heads * d), votes(kv_heads * keys);
  KvView kv;
  kv.k = k.data();
  kv.v = v.data();
  kv.num_keys = keys;
  kv.head_stride = keys * d;
  kv.key_stride = d;
  auto backend = MakeBackend(/*profile=*/true);
  // 7 queries, the last 7 of 20 keys theirs: 13 keys before them each, and
  // 1 + 2 + ... + 7 of their own.
  const double pairs = 7.0 * 13 + 28;
  const Queries queries{q.data(), heads * d, num_q, heads, kv_heads, d, 0.25f};
  SNAPFILL_ASSERT_OK(backend->Attention(queries, kv, out.data(), heads * d));
  EXPECT_EQ(OpsOf(*backend, "attention"), 4.0 * d * heads * pairs);
  // One query (decode) sees every key.
  SNAPFILL_ASSERT_OK(backend->Attention(queries.From(num_q - 1), kv, out.data(), heads * d));
  EXPECT_EQ(OpsOf(*backend, "attention"), 4.0 * d * heads * (pairs + keys));
  SNAPFILL_ASSERT_OK(backend->WindowScores(queries, kv, votes.data(), keys));
  EXPECT_EQ(OpsOf(*backend, "window_scores"), 2.0 * d * heads * pairs);
}

TEST(CpuBackendProfile, NothingWithoutProfiling) {
  const Matrix a = MakeMatrix(GgmlType::kQ4_1, 16, 64, 7);
  const std::vector<float> x = testing::HiddenStates(2, 64, 64, 8);
  std::vector<float> y(2 * 16);
  auto backend = MakeBackend(/*profile=*/false);
  SNAPFILL_ASSERT_OK(backend->MatMul(x.data(), 2, 64, a.view, y.data(), 16));
  EXPECT_TRUE(backend->profile()->Ops().empty());
  EXPECT_EQ(backend->profile()->Int8MatMulOps(), 0.0);
  EXPECT_EQ(backend->profile()->Report(), "");
}

// A tiny model's prefill of n tokens then one decode step: the products and
// the attention its shapes imply, no more and no less.
class ForwardWorkTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(ForwardWorkTest, MatchesTheShapes) {
  TinyLlamaOptions opts;
  opts.num_layers = 3;
  opts.matrix_type = GetParam();
  auto bytes = MakeTinyLlamaGguf(opts);
  SNAPFILL_ASSERT_OK(bytes);
  auto file = GgufFile::FromBytes(std::move(*bytes));
  SNAPFILL_ASSERT_OK(file);
  auto model = LlamaModel::Load(std::move(*file));
  SNAPFILL_ASSERT_OK(model);
  const LlamaConfig& c = (*model)->config();
  auto backend = MakeBackend(/*profile=*/true);
  auto fwd = LlamaForward::Create(**model, backend.get(), 64);
  SNAPFILL_ASSERT_OK(fwd);
  auto kv = (*fwd)->NewKvCache(64);
  SNAPFILL_ASSERT_OK(kv);
  const int64_t n = 23;
  std::vector<int32_t> ids(n + 1), pos(n + 1);
  for (int64_t i = 0; i <= n; ++i) {
    ids[i] = static_cast<int32_t>((i * 37 + 11) % c.vocab_size);
    pos[i] = static_cast<int32_t>(i);
  }
  std::vector<float> logits(c.vocab_size);
  SNAPFILL_ASSERT_OK((*fwd)->Forward(ids.data(), n, pos.data(), **kv, 1, logits.data()));
  SNAPFILL_ASSERT_OK((*fwd)->Forward(ids.data() + n, 1, pos.data() + n, **kv, 1, logits.data()));

  const double dim = c.model_dim, qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  const double qkv = dim * (qd + 2 * kvd), rest = qd * dim + 3 * dim * c.ffn_dim;
  const double logit = dim * c.vocab_size;
  const double L = c.num_layers;
  // Prefill: every layer's Q, K, V of all n rows; Wo and the feed-forward
  // block of all rows but in the last layer, where only the row whose
  // logits are asked for goes on; the logits of that row. Then a step of
  // one row through everything.
  const double matmul = 2 * (L * n * qkv + (L - 1) * n * rest + 1 * rest + logit) + 2 * (L * (qkv + rest) + logit);
  EXPECT_EQ(OpsOf(*backend, "matmul"), matmul);
  EXPECT_EQ(backend->profile()->Int8MatMulOps(), GetParam() == GgmlType::kF32 ? 0.0 : matmul);
  // Attention: n causal queries in all but the last layer, whose one query
  // sees all n keys; then one query over n + 1 keys in every layer.
  const double per_pair = 4.0 * c.head_dim * c.num_heads;
  const double attention = per_pair * ((L - 1) * n * (n + 1) / 2 + n + L * (n + 1));
  EXPECT_EQ(OpsOf(*backend, "attention"), attention);
  EXPECT_EQ(OpsOf(*backend, "window_scores"), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Types, ForwardWorkTest, ::testing::Values(GgmlType::kQ8_0, GgmlType::kQ4_1, GgmlType::kF32),
                         [](const ::testing::TestParamInfo<GgmlType>& info) {
                           return std::string(GetTypeTraits(info.param).name);
                         });

}  // namespace
}  // namespace snapfill
