// Invariants of the forward pass on a tiny random-weight Llama (no download):
// splitting a batch, or decoding one token after a prefill, must give the
// logits of one prefill of the whole sequence.
#include "src/model/llama_forward.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/matmul.h"
#include "kernels/quant_blocks.h"
#include "tools/testmodel/tiny_llama.h"
#include "snapfill/status.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

struct Tiny {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Backend> backend;
};

Tiny MakeTiny(const TinyLlamaOptions& opts) {
  Tiny t;
  auto bytes = MakeTinyLlamaGguf(opts);
  SNAPFILL_CHECK(bytes.ok()) << bytes.status();
  auto file = GgufFile::FromBytes(std::move(*bytes));
  SNAPFILL_CHECK(file.ok()) << file.status();
  auto model = LlamaModel::Load(std::move(*file));
  SNAPFILL_CHECK(model.ok()) << model.status();
  t.model = std::move(*model);
  auto backend = CreateBackend(Device::kCpu, {});
  SNAPFILL_CHECK(backend.ok());
  t.backend = std::move(*backend);
  return t;
}

std::vector<int32_t> Tokens(int n, int vocab) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (i * 37 + 11) % vocab;
  return ids;
}

std::vector<int32_t> Positions(int start, int n) {
  std::vector<int32_t> p(n);
  std::iota(p.begin(), p.end(), start);
  return p;
}

// Relative comparison scaled by the row's largest logit: f32 rounding with
// different accumulation orders (batched vs. single-token matmul tiles).
void ExpectLogitsNear(const float* a, const float* b, int64_t n, double rel) {
  double scale = 0;
  for (int64_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(double(a[i])));
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i) {
    if (std::fabs(a[i] - b[i]) > rel * scale + 1e-6) {
      ADD_FAILURE() << "logit " << i << ": " << a[i] << " vs " << b[i] << " (tol "
                    << rel * scale << ")";
      ++bad;
    }
  }
}

// The invariants are of the forward pass, so its products keep one
// arithmetic at every batch size: f32 for the float matrices. (kAuto would
// take AMX-BF16 for F16 batches of 16 tokens and more, where bf16 operands
// make them differ from the f32 products of smaller batches and of decode by
// design; golden_tiny_test checks that path against its bf16 reference.)
class ForwardInvariantTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAmxInt8); }
  void TearDown() override { cpu::SetMatMulImplForTesting(cpu::MatMulImpl::kAuto); }
};

TEST_P(ForwardInvariantTest, PrefillThenDecodeEqualsLongerPrefill) {
  TinyLlamaOptions opts;
  opts.f16_matrices = GetParam();
  opts.num_layers = 3;
  Tiny t = MakeTiny(opts);
  const int64_t vocab = t.model->config().vocab_size;
  const int n = 23;
  std::vector<int32_t> ids = Tokens(n + 1, vocab);
  auto fwd = LlamaForward::Create(*t.model, t.backend.get(), 64);
  SNAPFILL_ASSERT_OK(fwd);
  auto kv_full = (*fwd)->NewKvCache(64);
  auto kv_inc = (*fwd)->NewKvCache(64);
  SNAPFILL_ASSERT_OK(kv_full);
  SNAPFILL_ASSERT_OK(kv_inc);

  std::vector<float> want(vocab), got(vocab);
  std::vector<int32_t> pos = Positions(0, n + 1);
  SNAPFILL_ASSERT_OK((*fwd)->Forward(ids.data(), n + 1, pos.data(), **kv_full, 1, want.data()));
  SNAPFILL_ASSERT_OK((*fwd)->Forward(ids.data(), n, pos.data(), **kv_inc, 0, nullptr));
  SNAPFILL_ASSERT_OK((*fwd)->Forward(ids.data() + n, 1, pos.data() + n, **kv_inc, 1, got.data()));
  ExpectLogitsNear(want.data(), got.data(), vocab, 1e-4);
  EXPECT_EQ((*kv_inc)->size(0), n + 1);
  // The logits are not trivially equal (a different last token changes them).
  std::vector<int32_t> other = ids;
  other[n] = (ids[n] + 1) % vocab;
  std::vector<float> changed(vocab);
  auto kv3 = (*fwd)->NewKvCache(64);
  SNAPFILL_ASSERT_OK((*fwd)->Forward(other.data(), n + 1, pos.data(), **kv3, 1, changed.data()));
  double diff = 0;
  for (int64_t i = 0; i < vocab; ++i) diff = std::max(diff, std::fabs(double(changed[i] - want[i])));
  EXPECT_GT(diff, 1e-3);
}

// The tiny model with 3 layers, and a CPU backend whose decode reads the
// fp16 KV entries (BackendOptions::half_decode_kv); null if it fails.
Tiny ThreeLayerTiny(bool f16_matrices) {
  TinyLlamaOptions opts;
  opts.f16_matrices = f16_matrices;
  opts.num_layers = 3;
  return MakeTiny(opts);
}
std::unique_ptr<Backend> HalfKvBackend() {
  BackendOptions opts;
  opts.half_decode_kv = true;
  auto b = CreateBackend(Device::kCpu, opts);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

// Decoding over the fp16 copy of the cache (BackendOptions::half_decode_kv)
// against the f32 entries (the default): the copy holds every entry of
// every layer, the logits differ (the copy is read) but only by fp16
// rounding of K and V, and the f32 backend makes no copy.
TEST_P(ForwardInvariantTest, DecodeOverHalfCacheIsNearTheF32Decode) {
  Tiny t = ThreeLayerTiny(GetParam());
  std::unique_ptr<Backend> half_backend = HalfKvBackend();
  ASSERT_NE(half_backend, nullptr);
  Backend* f32_backend = t.backend.get();
  ASSERT_TRUE(half_backend->HalfDecodeKv());
  ASSERT_FALSE(f32_backend->HalfDecodeKv());
  const int64_t vocab = t.model->config().vocab_size;
  const int n = 40;
  std::vector<int32_t> ids = Tokens(n + 2, vocab);
  std::vector<int32_t> pos = Positions(0, n + 2);
  std::vector<float> logits[2];
  int64_t half_sizes[2] = {};
  for (int half = 0; half < 2; ++half) {
    Backend* b = half ? half_backend.get() : f32_backend;
    auto fwd = LlamaForward::Create(*t.model, b, 64);
    SNAPFILL_ASSERT_OK(fwd);
    auto kv = (*fwd)->NewKvCache(64);
    SNAPFILL_ASSERT_OK(kv);
    logits[half].resize(vocab);
    SNAPFILL_ASSERT_OK((*fwd)->Forward(ids.data(), n, pos.data(), **kv, 0, nullptr));
    SNAPFILL_ASSERT_OK((*fwd)->Forward(ids.data() + n, 1, pos.data() + n, **kv, 0, nullptr));
    SNAPFILL_ASSERT_OK((*fwd)->Forward(ids.data() + n + 1, 1, pos.data() + n + 1, **kv, 1, logits[half].data()));
    for (int64_t l = 0; l < t.model->config().num_layers; ++l) {
      EXPECT_EQ((*kv)->half_size(l), half ? n + 2 : 0) << "layer " << l;
    }
    half_sizes[half] = (*kv)->half_size(0);
  }
  EXPECT_EQ(half_sizes[1], n + 2);
  ExpectLogitsNear(logits[0].data(), logits[1].data(), vocab, 2e-3);
  double diff = 0;
  for (int64_t i = 0; i < vocab; ++i) diff = std::max(diff, std::fabs(double(logits[0][i] - logits[1][i])));
  EXPECT_GT(diff, 0.0) << "the fp16 copy was not read";
}

// The fp16 entries replace the f32 ones while decoding (every layer's f32
// pages released at the first decode step); a batch after that widens
// them back, and its logits stay near those of the same tokens over f32
// entries (they would not if the released entries read as zeros).
TEST_P(ForwardInvariantTest, BatchAfterHalfDecodeReadsTheEntriesWidenedBack) {
  Tiny t = ThreeLayerTiny(GetParam());
  std::unique_ptr<Backend> half_backend = HalfKvBackend();
  ASSERT_NE(half_backend, nullptr);
  const int64_t vocab = t.model->config().vocab_size;
  const int64_t layers = t.model->config().num_layers;
  const int n = 40;
  std::vector<int32_t> ids = Tokens(n + 5, vocab);
  std::vector<int32_t> pos = Positions(0, n + 5);
  std::vector<float> logits[2];
  std::vector<float> first_key[2];
  for (int half = 0; half < 2; ++half) {
    Backend* b = half ? half_backend.get() : t.backend.get();
    auto fwd = LlamaForward::Create(*t.model, b, 64);
    SNAPFILL_ASSERT_OK(fwd);
    auto kv = (*fwd)->NewKvCache(64);
    SNAPFILL_ASSERT_OK(kv);
    SNAPFILL_ASSERT_OK((*fwd)->Forward(ids.data(), n, pos.data(), **kv, 0, nullptr));
    SNAPFILL_ASSERT_OK((*fwd)->Forward(ids.data() + n, 1, pos.data() + n, **kv, 0, nullptr));
    SNAPFILL_ASSERT_OK((*fwd)->Forward(ids.data() + n + 1, 1, pos.data() + n + 1, **kv, 0, nullptr));
    for (int64_t l = 0; l < layers; ++l) {
      EXPECT_EQ((*kv)->f32_released(l), half ? n + 1 : 0) << "layer " << l;  // the last one pending
    }
    logits[half].resize(3 * vocab);
    SNAPFILL_ASSERT_OK((*fwd)->Forward(ids.data() + n + 2, 3, pos.data() + n + 2, **kv, 3, logits[half].data()));
    for (int64_t l = 0; l < layers; ++l) EXPECT_EQ((*kv)->f32_released(l), 0) << "layer " << l;
    const float* k0 = static_cast<const KvCache&>(**kv).k(1, 0);
    first_key[half].assign(k0, k0 + t.model->config().head_dim);
  }
  for (int r = 0; r < 3; ++r) ExpectLogitsNear(logits[0].data() + r * vocab, logits[1].data() + r * vocab, vocab, 2e-3);
  for (size_t i = 0; i < first_key[0].size(); ++i) {
    EXPECT_EQ(first_key[1][i], Fp16ToFp32(Fp32ToFp16(first_key[0][i]))) << "dim " << i;
  }
}

TEST_P(ForwardInvariantTest, SplitBatchesEqualOneBatch) {
  TinyLlamaOptions opts;
  opts.f16_matrices = GetParam();
  Tiny t = MakeTiny(opts);
  const int64_t vocab = t.model->config().vocab_size;
  const int n = 37;
  std::vector<int32_t> ids = Tokens(n, vocab);
  std::vector<int32_t> pos = Positions(0, n);
  auto big = LlamaForward::Create(*t.model, t.backend.get(), 64);
  auto small = LlamaForward::Create(*t.model, t.backend.get(), 5);
  SNAPFILL_ASSERT_OK(big);
  SNAPFILL_ASSERT_OK(small);
  auto kv1 = (*big)->NewKvCache(n);
  auto kv2 = (*small)->NewKvCache(n);
  // Logits of the last 7 positions, which straddle two 5-token pieces.
  std::vector<float> want(7 * vocab), got(7 * vocab);
  SNAPFILL_ASSERT_OK((*big)->Forward(ids.data(), n, pos.data(), **kv1, 7, want.data()));
  SNAPFILL_ASSERT_OK((*small)->Forward(ids.data(), n, pos.data(), **kv2, 7, got.data()));
  for (int r = 0; r < 7; ++r) {
    ExpectLogitsNear(want.data() + r * vocab, got.data() + r * vocab, vocab, 1e-4);
  }
}

// ForwardWithAttention with hidden_rows = r: the attention step is asked for
// every row's output in every layer but the last, there for the last r rows
// only; the logits of those rows are the ones hidden_rows = n gives, and
// BatchLogits serves them and refuses the rows before them. Forward keeps
// the rows of the logits it is asked for.
TEST_P(ForwardInvariantTest, LastLayerRunsOnlyTheRowsWhoseHiddenStatesAreKept) {
  Tiny t = ThreeLayerTiny(GetParam());
  const LlamaConfig& c = t.model->config();
  const int64_t vocab = c.vocab_size, d = c.head_dim;
  const int n = 37;
  std::vector<int32_t> ids = Tokens(n, vocab);
  std::vector<int32_t> pos = Positions(0, n);
  auto fwd = LlamaForward::Create(*t.model, t.backend.get(), 64);
  SNAPFILL_ASSERT_OK(fwd);
  Backend& b = *t.backend;
  std::vector<int64_t> asked;  // out_rows per layer call
  // Plain causal attention over the batch itself, for the last out_rows
  // rows; the rows before them get NaN, which must not reach the result.
  LlamaForward::AttendFn attend = [&](int64_t layer, float* q, int64_t q_stride, float* k, float* v,
                                      int64_t kv_stride, int64_t rows, int64_t out_rows,
                                      float* out) -> absl::Status {
    asked.push_back(out_rows);
    SNAPFILL_RETURN_IF_ERROR(b.Rope(q, rows, c.num_heads, d, q_stride, pos.data(), c.rope(layer)));
    SNAPFILL_RETURN_IF_ERROR(b.Rope(k, rows, c.num_kv_heads, d, kv_stride, pos.data(), c.rope(layer)));
    KvView view;
    view.k = k;
    view.v = v;
    view.head_stride = d;
    view.key_stride = kv_stride;
    view.num_keys = rows;
    const int64_t skip = rows - out_rows;
    std::fill(out, out + skip * q_stride, std::nanf(""));
    if (out_rows == 0) return absl::OkStatus();
    return b.Attention(LlamaQueries(c, q, q_stride, rows).From(skip), view, out + skip * q_stride, q_stride);
  };
  std::vector<float> want(n * vocab);
  SNAPFILL_ASSERT_OK((*fwd)->ForwardWithAttention(ids.data(), n, attend, n, want.data(), n));
  EXPECT_EQ(asked, std::vector<int64_t>(c.num_layers, n));
  for (int64_t r : {6, 1, 0}) {
    SCOPED_TRACE(r);
    asked.clear();
    const int64_t logits_rows = std::min<int64_t>(r, 2);
    std::vector<float> got(std::max<int64_t>(logits_rows, 1) * vocab, std::nanf(""));
    SNAPFILL_ASSERT_OK((*fwd)->ForwardWithAttention(ids.data(), n, attend, logits_rows, got.data(), r));
    std::vector<int64_t> expect(c.num_layers, n);
    expect.back() = r;
    EXPECT_EQ(asked, expect);
    for (int64_t i = 0; i < logits_rows; ++i) {
      ExpectLogitsNear(want.data() + (n - logits_rows + i) * vocab, got.data() + i * vocab, vocab, 1e-4);
    }
    std::vector<float> row(vocab);
    for (int64_t first = n - r; first < n; ++first) {
      SNAPFILL_ASSERT_OK((*fwd)->BatchLogits(first, 1, row.data()));
      ExpectLogitsNear(want.data() + first * vocab, row.data(), vocab, 1e-4);
    }
    EXPECT_TRUE(absl::IsInvalidArgument((*fwd)->BatchLogits(n - r - 1, 1, row.data())));
  }
  // Fewer kept rows than logits, or more than the batch, are refused.
  EXPECT_TRUE(absl::IsInvalidArgument((*fwd)->ForwardWithAttention(ids.data(), n, attend, 2, want.data(), 1)));
  EXPECT_TRUE(absl::IsInvalidArgument((*fwd)->ForwardWithAttention(ids.data(), n, attend, 0, nullptr, n + 1)));
  // Forward keeps the rows whose logits it made: the same logits as all
  // rows of the batch give, and BatchLogits refuses the rows before them.
  auto kv = (*fwd)->NewKvCache(n);
  SNAPFILL_ASSERT_OK(kv);
  std::vector<float> last3(3 * vocab), row(vocab);
  SNAPFILL_ASSERT_OK((*fwd)->Forward(ids.data(), n, pos.data(), **kv, 3, last3.data()));
  for (int64_t i = 0; i < 3; ++i) {
    ExpectLogitsNear(want.data() + (n - 3 + i) * vocab, last3.data() + i * vocab, vocab, 1e-4);
    SNAPFILL_ASSERT_OK((*fwd)->BatchLogits(n - 3 + i, 1, row.data()));
    ExpectLogitsNear(last3.data() + i * vocab, row.data(), vocab, 1e-6);
  }
  EXPECT_TRUE(absl::IsInvalidArgument((*fwd)->BatchLogits(n - 4, 1, row.data())));
}

INSTANTIATE_TEST_SUITE_P(Weights, ForwardInvariantTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "F16" : "F32"; });

TEST(ForwardTest, RefusesBadArguments) {
  Tiny t = MakeTiny({});
  auto fwd = LlamaForward::Create(*t.model, t.backend.get(), 8);
  SNAPFILL_ASSERT_OK(fwd);
  auto kv = (*fwd)->NewKvCache(4);
  std::vector<int32_t> ids = {1, 2, 3, 4, 5};
  std::vector<int32_t> pos = Positions(0, 5);
  std::vector<float> logits(t.model->config().vocab_size);
  EXPECT_TRUE(absl::IsInvalidArgument((*fwd)->Forward(ids.data(), 0, pos.data(), **kv, 0, nullptr)));
  EXPECT_TRUE(absl::IsOutOfRange((*fwd)->Forward(ids.data(), 5, pos.data(), **kv, 1, logits.data())));
  std::vector<int32_t> bad = {1, 100000};
  auto kv2 = (*fwd)->NewKvCache(4);
  EXPECT_TRUE(absl::IsOutOfRange((*fwd)->Forward(bad.data(), 2, pos.data(), **kv2, 1, logits.data())));
  EXPECT_TRUE(absl::IsInvalidArgument(LlamaForward::Create(*t.model, t.backend.get(), 0).status()));
}

}  // namespace
}  // namespace snapfill
