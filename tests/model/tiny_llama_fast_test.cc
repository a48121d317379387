// Tests for the tiny Llama builder's real-model presets and its fast weight
// generator (the one for models above 2^28 weights, or any with
// fast_weights): the file loads with the right shapes for each matrix type,
// the weights have the original generator's scale, and the bytes are a pure
// function of the options, whatever the thread count, in memory or streamed.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/ref/quant_ref.h"
#include "src/gguf/gguf_reader.h"
#include "src/model/llama_model.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"
#include "tools/testmodel/gguf_writer.h"
#include "tools/testmodel/tiny_llama.h"

namespace snapfill {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/tiny_llama_fast_test_" + std::to_string(::getpid()) + "_" + name + ".gguf";
}

// A moderate model forced onto the fast generator: rows of whole Q4_0/Q8_0
// blocks, GQA, untied, a few MB.
TinyLlamaOptions FastOptions() {
  TinyLlamaOptions o;
  o.num_layers = 3;
  o.model_dim = 256;
  o.num_heads = 8;
  o.num_kv_heads = 2;
  o.ffn_dim = 640;
  o.context_length = 1024;
  o.tie_embeddings = false;
  o.matrix_type = GgmlType::kQ8_0;
  o.fast_weights = true;
  o.seed = 11;
  return o;
}

TEST(TinyLlamaPresetTest, PresetsSetTheRealShapes) {
  TinyLlamaOptions o;
  o.matrix_type = GgmlType::kQ8_0;
  o.seed = 5;
  SNAPFILL_ASSERT_OK(ApplyTinyLlamaPreset("smollm2-135m", &o));
  EXPECT_EQ(o.num_layers, 30);
  EXPECT_EQ(o.model_dim, 576);
  EXPECT_EQ(o.num_heads, 9);
  EXPECT_EQ(o.num_kv_heads, 3);
  EXPECT_EQ(o.ffn_dim, 1536);
  EXPECT_EQ(o.context_length, 8192);
  EXPECT_TRUE(o.tie_embeddings);
  // Fields the preset does not name stay.
  EXPECT_EQ(o.matrix_type, GgmlType::kQ8_0);
  EXPECT_EQ(o.seed, 5u);
  SNAPFILL_EXPECT_OK(ValidateTinyLlamaOptions(o));
  // About 106M weights: under 2^28, so the original generator unless asked.
  EXPECT_LE(TinyLlamaWeightCount(o), kTinyLlamaMaxOriginalWeights);
  EXPECT_FALSE(TinyLlamaUsesFastWeights(o));
  o.fast_weights = true;
  EXPECT_TRUE(TinyLlamaUsesFastWeights(o));

  SNAPFILL_ASSERT_OK(ApplyTinyLlamaPreset("llama2-7b", &o));
  EXPECT_EQ(o.num_layers, 32);
  EXPECT_EQ(o.model_dim, 4096);
  EXPECT_EQ(o.num_heads, 32);
  EXPECT_EQ(o.num_kv_heads, 32);
  EXPECT_EQ(o.ffn_dim, 11008);
  EXPECT_EQ(o.context_length, 4096);
  EXPECT_FALSE(o.tie_embeddings);
  o.fast_weights = false;
  SNAPFILL_EXPECT_OK(ValidateTinyLlamaOptions(o));
  // 32 * (2*4096 + 4 * 4096^2 + 3 * 4096 * 11008) + 2 * 4096 * vocab + 4096.
  const int64_t vocab = 256 + TinyLlamaMaxMerges() + 3;
  EXPECT_EQ(TinyLlamaWeightCount(o),
            int64_t{32} * (2 * 4096 + 4 * int64_t{4096} * 4096 + 3 * int64_t{4096} * 11008) + 2 * 4096 * vocab + 4096);
  EXPECT_GT(TinyLlamaWeightCount(o), kTinyLlamaMaxOriginalWeights);
  EXPECT_TRUE(TinyLlamaUsesFastWeights(o));  // above the old cap: always fast
}

TEST(TinyLlamaPresetTest, UnknownPresetListsTheKnownOnes) {
  TinyLlamaOptions o;
  const absl::Status s = ApplyTinyLlamaPreset("llama3-70b", &o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("llama3-70b"));
  for (const std::string& name : TinyLlamaPresetNames()) EXPECT_THAT(std::string(s.message()), HasSubstr(name));
  EXPECT_THAT(TinyLlamaPresetNames(), ::testing::ElementsAre("smollm2-135m", "llama2-7b"));
  // Untouched.
  EXPECT_EQ(o.num_layers, TinyLlamaOptions{}.num_layers);
}

TEST(TinyLlamaPresetTest, SizeLimits) {
  TinyLlamaOptions o;
  // 2^34 weights is the limit; a 70B-like shape is above it.
  o.num_layers = 80;
  o.model_dim = 8192;
  o.num_heads = 64;
  o.num_kv_heads = 8;
  o.ffn_dim = 28672;
  const absl::Status s = ValidateTinyLlamaOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("weights"));
  EXPECT_EQ(TinyLlamaWeightCount(o), -1);
  o = {};
  o.num_threads = -1;
  EXPECT_THAT(std::string(ValidateTinyLlamaOptions(o).message()), HasSubstr("num_threads"));
  o.num_threads = 1025;
  EXPECT_THAT(std::string(ValidateTinyLlamaOptions(o).message()), HasSubstr("num_threads"));
}

// Each matrix type of the big path: the loader binds every weight with the
// preset-like shapes, and the dequantized weights have the original
// generator's scale (0.5 / sqrt(fan_in); norms in [0.9, 1.1)).
TEST(TinyLlamaFastTest, FileLoadsWithTheRightShapesForEachType) {
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kF16, GgmlType::kBF16, GgmlType::kF32}) {
    SCOPED_TRACE(GetTypeTraits(type).name);
    TinyLlamaOptions opts = FastOptions();
    opts.matrix_type = type;
    const std::string path = TempPath(GetTypeTraits(type).name);
    SNAPFILL_ASSERT_OK(WriteTinyLlamaGguf(path, opts));
    auto model = LlamaModel::Open(path);
    SNAPFILL_ASSERT_OK(model);
    const LlamaConfig& c = (*model)->config();
    const int64_t vocab = 256 + TinyLlamaMaxMerges() + 3;
    EXPECT_EQ(c.num_layers, 3);
    EXPECT_EQ(c.model_dim, 256);
    EXPECT_EQ(c.num_heads, 8);
    EXPECT_EQ(c.num_kv_heads, 2);
    EXPECT_EQ(c.head_dim, 32);
    EXPECT_EQ(c.ffn_dim, 640);
    EXPECT_EQ(c.context_length, 1024);
    EXPECT_EQ(c.vocab_size, vocab);
    EXPECT_FALSE(c.tied_embeddings);
    auto expect_view = [&](const WeightView& w, int64_t rows, int64_t cols, const char* what) {
      EXPECT_EQ(w.rows, rows) << what;
      EXPECT_EQ(w.cols, cols) << what;
      EXPECT_EQ(w.type, type) << what;
    };
    expect_view((*model)->token_embd(), vocab, 256, "token_embd");
    expect_view((*model)->output(), vocab, 256, "output");
    for (int l = 0; l < 3; ++l) {
      const LlamaLayerWeights& w = (*model)->layer(l);
      expect_view(w.wq, 256, 256, "wq");
      expect_view(w.wk, 64, 256, "wk");
      expect_view(w.wv, 64, 256, "wv");
      expect_view(w.wo, 256, 256, "wo");
      expect_view(w.w_gate, 640, 256, "w_gate");
      expect_view(w.w_up, 640, 256, "w_up");
      expect_view(w.w_down, 256, 640, "w_down");
      for (int i = 0; i < 256; ++i) {
        ASSERT_GE(w.attn_norm[i], 0.9f);
        ASSERT_LT(w.attn_norm[i], 1.1f);
      }
    }
    // The scale: the RMS of ffn_down (fan-in 640) and attn_q (fan-in 256).
    for (const auto& [view, fan_in] : {std::pair<const WeightView*, int>{&(*model)->layer(1).w_down, 640},
                                       {&(*model)->layer(2).wq, 256}}) {
      double sum = 0, sum2 = 0;
      std::vector<float> row(static_cast<size_t>(view->cols));
      for (int64_t r = 0; r < view->rows; ++r) {
        ASSERT_TRUE(ref::DequantizeRow(type, static_cast<const char*>(view->data) + r * view->row_bytes, row.data(),
                                       view->cols));
        for (float x : row) {
          sum += x;
          sum2 += double{x} * x;
        }
      }
      const double n = static_cast<double>(view->rows * view->cols);
      const double want = 0.5 / std::sqrt(static_cast<double>(fan_in));
      EXPECT_NEAR(sum / n, 0.0, 0.02 * want);
      // Q4_0's rounding adds noise of about a tenth of the scale.
      EXPECT_NEAR(std::sqrt(sum2 / n), want, (type == GgmlType::kQ4_0 ? 0.12 : 0.02) * want);
    }
    model->reset();
    std::remove(path.c_str());
  }
}

TEST(TinyLlamaFastTest, BytesArePureFunctionOfTheOptions) {
  TinyLlamaOptions opts = FastOptions();
  opts.num_threads = 1;
  auto one = MakeTinyLlamaGguf(opts);
  SNAPFILL_ASSERT_OK(one);
  auto again = MakeTinyLlamaGguf(opts);
  SNAPFILL_ASSERT_OK(again);
  EXPECT_TRUE(*one == *again) << "two builds differ";
  for (int threads : {2, 3, 8, 0}) {
    opts.num_threads = threads;
    auto other = MakeTinyLlamaGguf(opts);
    SNAPFILL_ASSERT_OK(other);
    EXPECT_TRUE(*one == *other) << threads << " threads give other bytes";
  }
  // Streamed to disk: the same bytes.
  const std::string path = TempPath("stream");
  opts.num_threads = 4;
  SNAPFILL_ASSERT_OK(WriteTinyLlamaGguf(path, opts));
  EXPECT_TRUE(testing::ReadAll(path) == *one) << "the written file differs from MakeTinyLlamaGguf";
  SNAPFILL_ASSERT_OK(WriteTinyLlamaGguf(path, opts));  // overwrite, atomically
  EXPECT_TRUE(testing::ReadAll(path) == *one);
  std::remove(path.c_str());
  // Another seed, other weights; the original generator, other weights too.
  opts.seed = 12;
  auto seeded = MakeTinyLlamaGguf(opts);
  SNAPFILL_ASSERT_OK(seeded);
  EXPECT_EQ(seeded->size(), one->size());
  EXPECT_FALSE(*seeded == *one);
  opts.seed = 11;
  opts.fast_weights = false;
  auto original = MakeTinyLlamaGguf(opts);
  SNAPFILL_ASSERT_OK(original);
  EXPECT_EQ(original->size(), one->size());
  EXPECT_FALSE(*original == *one);
}

// The fast generator's quantized matrices are ref::QuantizeRow of its F32
// weights, every row (its own Q8_0/Q4_0 quantizers must match ggml's
// reference bit for bit); norms are the same F32 in every file.
TEST(TinyLlamaFastTest, QuantizedMatricesAreTheReferenceQuantizationOfTheF32Weights) {
  TinyLlamaOptions opts = FastOptions();
  opts.num_layers = 1;
  opts.matrix_type = GgmlType::kF32;
  auto f32_bytes = MakeTinyLlamaGguf(opts);
  SNAPFILL_ASSERT_OK(f32_bytes);
  auto f32 = GgufFile::FromBytes(*std::move(f32_bytes));
  SNAPFILL_ASSERT_OK(f32);
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kF16, GgmlType::kBF16}) {
    SCOPED_TRACE(GetTypeTraits(type).name);
    opts.matrix_type = type;
    auto bytes = MakeTinyLlamaGguf(opts);
    SNAPFILL_ASSERT_OK(bytes);
    auto q = GgufFile::FromBytes(*std::move(bytes));
    SNAPFILL_ASSERT_OK(q);
    ASSERT_EQ((*q)->tensors().size(), (*f32)->tensors().size());
    for (size_t i = 0; i < (*q)->tensors().size(); ++i) {
      const GgufTensorInfo& a = (*f32)->tensors()[i];
      const GgufTensorInfo& b = (*q)->tensors()[i];
      ASSERT_EQ(a.name, b.name);
      ASSERT_EQ(a.shape, b.shape);
      if (a.shape.size() != 2) {
        ASSERT_EQ(b.type, GgmlType::kF32);
        ASSERT_EQ(std::memcmp(a.data, b.data, a.num_elements() * 4), 0) << a.name;
        continue;
      }
      ASSERT_EQ(b.type, type) << b.name;
      const int64_t row_bytes = RowBytes(type, a.shape[0]);
      std::vector<char> row(static_cast<size_t>(row_bytes));
      for (int64_t r = 0; r < a.shape[1]; ++r) {
        ASSERT_TRUE(ref::QuantizeRow(type, reinterpret_cast<const float*>(a.data) + r * a.shape[0], row.data(),
                                     a.shape[0]));
        ASSERT_EQ(std::memcmp(row.data(), b.data + r * row_bytes, row_bytes), 0) << b.name << " row " << r;
      }
    }
  }
  // --f16 on the fast path is the F16 type.
  opts.matrix_type = GgmlType::kF32;
  opts.f16_matrices = true;
  auto f16_flag = MakeTinyLlamaGguf(opts);
  opts.f16_matrices = false;
  opts.matrix_type = GgmlType::kF16;
  auto f16_type = MakeTinyLlamaGguf(opts);
  SNAPFILL_ASSERT_OK(f16_flag);
  SNAPFILL_ASSERT_OK(f16_type);
  EXPECT_TRUE(*f16_flag == *f16_type);
}

// The fast generator's F16 conversion is FloatToHalf (nearest even) for
// every non-NaN float; a sweep of bit patterns with an odd stride, and every
// float whose half is subnormal or at the rounding edges near 1 and 65504.
// (All 2^32 agree; that check takes too long for a unit test.)
TEST(TinyLlamaFastTest, FloatToHalfRowIsFloatToHalf) {
  std::vector<float> x;
  auto add_bits = [&](uint32_t u) {
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return;  // NaN
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  };
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4093) add_bits(static_cast<uint32_t>(u));
  for (uint32_t u = 0x33000000u - 16; u < 0x38800000u + 16; u += 61) {  // around the subnormal halves
    add_bits(u);
    add_bits(u | 0x80000000u);
  }
  for (uint32_t u = 0x3F7FE000u; u < 0x3F802000u; ++u) add_bits(u);  // around 1.0
  for (uint32_t u = 0x477FE000u; u < 0x47802000u; ++u) add_bits(u);  // around 65504..65536
  std::vector<uint16_t> h(x.size());
  tiny_llama::FloatToHalfRow(x.data(), h.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(h[i], tiny_llama::FloatToHalf(x[i])) << std::hexfloat << x[i];
  }
}

// The writer's generated tensors: checked when added, filled in place when
// serialized, and streamed to disk with the same bytes.
TEST(GgufWriterGeneratedTest, GeneratedTensorsSerializeAndStreamAlike) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  auto fill = [](char* dst, uint64_t bytes) {
    for (uint64_t i = 0; i < bytes; ++i) dst[i] = static_cast<char>(i * 7 + 1);
  };
  SNAPFILL_ASSERT_OK(w.AddTensorGenerated("a", GgmlType::kF32, {3}, fill));  // 12 bytes: padding follows
  SNAPFILL_ASSERT_OK(w.AddTensor("b", GgmlType::kF32, {2}, std::string(8, '\x11')));
  SNAPFILL_ASSERT_OK(w.AddTensorGenerated("c", GgmlType::kQ8_0, {64, 5}, fill));
  EXPECT_EQ(w.AddTensorGenerated("c", GgmlType::kF32, {4}, fill).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddTensorGenerated("d", GgmlType::kQ8_0, {33}, fill).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddTensorGenerated("e", GgmlType::kF32, {4}, nullptr).code(), absl::StatusCode::kInvalidArgument);
  const std::string bytes = w.Serialize();
  auto f = GgufFile::FromBytes(bytes);
  SNAPFILL_ASSERT_OK(f);
  ASSERT_EQ((*f)->tensors().size(), 3u);
  const GgufTensorInfo* c = (*f)->FindTensor("c");
  ASSERT_NE(c, nullptr);
  for (int i = 0; i < 5 * 68; ++i) ASSERT_EQ(static_cast<char>(c->data[i]), static_cast<char>(i * 7 + 1)) << i;
  EXPECT_EQ(static_cast<char>((*f)->FindTensor("b")->data[0]), '\x11');
  const std::string path = TempPath("writer");
  SNAPFILL_ASSERT_OK(w.WriteFile(path));
  EXPECT_TRUE(testing::ReadAll(path) == bytes);
  std::remove(path.c_str());
}

// The original generator is untouched by the fast one's options: the thread
// count does not enter it, and streaming writes its Serialize() bytes.
TEST(TinyLlamaFastTest, OriginalGeneratorIgnoresThreads) {
  TinyLlamaOptions opts;
  opts.matrix_type = GgmlType::kQ8_0;
  auto a = MakeTinyLlamaGguf(opts);
  opts.num_threads = 3;
  auto b = MakeTinyLlamaGguf(opts);
  SNAPFILL_ASSERT_OK(a);
  SNAPFILL_ASSERT_OK(b);
  EXPECT_TRUE(*a == *b);
  const std::string path = TempPath("original");
  SNAPFILL_ASSERT_OK(WriteTinyLlamaGguf(path, opts));
  EXPECT_TRUE(testing::ReadAll(path) == *a);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace snapfill
