// Tests for the tiny random Llama GGUF: llama.cpp's keys, names and shapes,
// the GPT-2 byte vocabulary, determinism, weight statistics, and the
// float -> half conversion against hand-derived and exhaustive cases.
#include "tools/testmodel/tiny_llama.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/ref/quant_ref.h"
#include "src/gguf/gguf_reader.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

using ::testing::HasSubstr;
using tiny_llama::FloatToHalf;
using tiny_llama::HalfToFloat;

std::unique_ptr<GgufFile> Build(const TinyLlamaOptions& opts) {
  auto bytes = MakeTinyLlamaGguf(opts);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return nullptr;
  auto f = GgufFile::FromBytes(*std::move(bytes));
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? *std::move(f) : nullptr;
}

std::vector<float> TensorAsFloats(const GgufTensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.num_elements()));
  if (t.type == GgmlType::kF32) {
    std::memcpy(out.data(), t.data, out.size() * 4);
  } else {
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      out[i] = HalfToFloat(h);
    }
  }
  return out;
}

TEST(TinyLlamaTest, MetadataMatchesLlamaCppKeys) {
  TinyLlamaOptions opts;
  auto f = Build(opts);
  ASSERT_NE(f, nullptr);
  const GgufFile& g = *f;
  const int vocab = 256 + TinyLlamaMaxMerges() + 3;
  EXPECT_EQ(g.GetString("general.architecture").value(), "llama");
  EXPECT_EQ(g.GetUint("llama.block_count").value(), 2u);
  EXPECT_EQ(g.GetUint("llama.context_length").value(), 512u);
  EXPECT_EQ(g.GetUint("llama.embedding_length").value(), 64u);
  EXPECT_EQ(g.GetUint("llama.feed_forward_length").value(), 128u);
  EXPECT_EQ(g.GetUint("llama.attention.head_count").value(), 4u);
  EXPECT_EQ(g.GetUint("llama.attention.head_count_kv").value(), 2u);
  EXPECT_EQ(g.GetUint("llama.rope.dimension_count").value(), 16u);
  EXPECT_EQ(g.GetUint("llama.vocab_size").value(), static_cast<uint64_t>(vocab));
  EXPECT_EQ(g.GetFloat("llama.rope.freq_base").value(), 10000.0);
  EXPECT_EQ(g.GetFloat("llama.attention.layer_norm_rms_epsilon").value(), double{1e-5f});
  EXPECT_EQ(g.GetUint("general.file_type").value(), 0u);
  // head_dim = model_dim / num_heads, so llama.cpp needs no key_length.
  EXPECT_FALSE(g.Has("llama.attention.key_length"));
  EXPECT_EQ(g.GetString("tokenizer.ggml.model").value(), "gpt2");
  EXPECT_EQ(g.GetString("tokenizer.ggml.pre").value(), "default");
  EXPECT_EQ(g.GetBool("tokenizer.ggml.add_bos_token").value(), false);
  EXPECT_THAT(g.GetString("tokenizer.chat_template").value(), HasSubstr("<|im_start|>"));
  // The stored type of counts is uint32, as llama.cpp writes them.
  EXPECT_EQ(g.Find("llama.block_count")->type, GgufValueType::kUint32);
  EXPECT_EQ(g.Find("tokenizer.ggml.token_type")->array_type, GgufValueType::kInt32);
}

TEST(TinyLlamaTest, TensorsHaveLlamaCppNamesShapesAndTypes) {
  TinyLlamaOptions opts;
  opts.num_layers = 3;
  auto f = Build(opts);
  ASSERT_NE(f, nullptr);
  const int64_t d = 64, q = 4 * 16, kv = 2 * 16, ffn = 128;
  const int64_t vocab = 256 + TinyLlamaMaxMerges() + 3;
  std::map<std::string, std::vector<int64_t>> want = {{"token_embd.weight", {d, vocab}},
                                                      {"output_norm.weight", {d}}};
  for (int l = 0; l < 3; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    want[p + "attn_norm.weight"] = {d};
    want[p + "attn_q.weight"] = {d, q};
    want[p + "attn_k.weight"] = {d, kv};
    want[p + "attn_v.weight"] = {d, kv};
    want[p + "attn_output.weight"] = {q, d};
    want[p + "ffn_norm.weight"] = {d};
    want[p + "ffn_gate.weight"] = {d, ffn};
    want[p + "ffn_up.weight"] = {d, ffn};
    want[p + "ffn_down.weight"] = {ffn, d};
  }
  ASSERT_EQ(f->tensors().size(), want.size());  // tied: no output.weight
  for (const GgufTensorInfo& t : f->tensors()) {
    ASSERT_EQ(want.count(t.name), 1u) << t.name;
    EXPECT_EQ(t.shape, want[t.name]) << t.name;
    EXPECT_EQ(t.type, GgmlType::kF32) << t.name;
  }
  EXPECT_EQ(f->tensors().front().name, "token_embd.weight");
}

TEST(TinyLlamaTest, UntiedF16ModelHasOutputAndHalfMatrices) {
  TinyLlamaOptions opts;
  opts.tie_embeddings = false;
  opts.f16_matrices = true;
  auto f = Build(opts);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->GetUint("general.file_type").value(), 1u);
  const GgufTensorInfo* out = f->FindTensor("output.weight");
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(out->shape, (std::vector<int64_t>{64, 256 + TinyLlamaMaxMerges() + 3}));
  for (const GgufTensorInfo& t : f->tensors()) {
    EXPECT_EQ(t.type, t.shape.size() == 2 ? GgmlType::kF16 : GgmlType::kF32) << t.name;
  }
}

TEST(TinyLlamaTest, F16WeightsAreTheRoundedF32Weights) {
  TinyLlamaOptions opts;
  auto f32 = Build(opts);
  opts.f16_matrices = true;
  auto f16 = Build(opts);
  ASSERT_NE(f32, nullptr);
  ASSERT_NE(f16, nullptr);
  ASSERT_EQ(f32->tensors().size(), f16->tensors().size());
  for (size_t i = 0; i < f32->tensors().size(); ++i) {
    const GgufTensorInfo& a = f32->tensors()[i];
    const GgufTensorInfo& b = f16->tensors()[i];
    ASSERT_EQ(a.name, b.name);
    std::vector<float> x = TensorAsFloats(a);
    std::vector<float> y = TensorAsFloats(b);
    const bool matrix = a.shape.size() == 2;  // norms stay F32
    for (size_t j = 0; j < x.size(); ++j) {
      ASSERT_EQ(y[j], matrix ? HalfToFloat(FloatToHalf(x[j])) : x[j]) << a.name << "[" << j << "]";
    }
  }
}

TEST(TinyLlamaTest, HeadDimOverrideWritesKeyLength) {
  TinyLlamaOptions opts;
  opts.head_dim = 8;
  auto f = Build(opts);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->GetUint("llama.attention.key_length").value(), 8u);
  EXPECT_EQ(f->GetUint("llama.attention.value_length").value(), 8u);
  EXPECT_EQ(f->GetUint("llama.rope.dimension_count").value(), 8u);
  EXPECT_EQ(f->FindTensor("blk.0.attn_q.weight")->shape, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(f->FindTensor("blk.0.attn_k.weight")->shape, (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(f->FindTensor("blk.0.attn_output.weight")->shape, (std::vector<int64_t>{32, 64}));
}

TEST(TinyLlamaTest, VocabularyUsesGpt2ByteAlphabet) {
  auto f = Build(TinyLlamaOptions{});
  ASSERT_NE(f, nullptr);
  const std::vector<std::string> tokens = f->GetStringArray("tokenizer.ggml.tokens").value();
  const std::vector<int64_t> types = f->GetIntArray("tokenizer.ggml.token_type").value();
  ASSERT_EQ(tokens.size(), static_cast<size_t>(256 + TinyLlamaMaxMerges() + 3));
  ASSERT_EQ(types.size(), tokens.size());
  // bytes_to_unicode: printable bytes stand for themselves; the 68 others map
  // to U+0100 + their rank among non-printables (0x00 -> U+0100 "Ā",
  // ' ' 0x20 -> U+0120 "Ġ", '\n' 0x0A -> U+010A "Ċ", 0x7F -> U+0121 "ġ",
  // 0xAD -> U+0143 "Ń").
  EXPECT_EQ(tokens['a'], "a");
  EXPECT_EQ(tokens['!'], "!");
  EXPECT_EQ(tokens[0xE9], "\xC3\xA9");  // é (U+00E9)
  EXPECT_EQ(tokens[0x00], "\xC4\x80");
  EXPECT_EQ(tokens[0x20], "\xC4\xA0");
  EXPECT_EQ(tokens[0x0A], "\xC4\x8A");
  EXPECT_EQ(tokens[0x7F], "\xC4\xA1");
  EXPECT_EQ(tokens[0xAD], "\xC5\x83");
  std::set<std::string> unique(tokens.begin(), tokens.end());
  EXPECT_EQ(unique.size(), tokens.size());
  for (size_t i = 0; i < tokens.size() - 3; ++i) EXPECT_EQ(types[i], 1) << i;

  const int64_t bos = static_cast<int64_t>(f->GetUint("tokenizer.ggml.bos_token_id").value());
  const int64_t eos = static_cast<int64_t>(f->GetUint("tokenizer.ggml.eos_token_id").value());
  EXPECT_EQ(bos, eos);
  EXPECT_EQ(tokens[bos], "<|endoftext|>");
  const size_t n = tokens.size();
  EXPECT_EQ(tokens[n - 3], "<|endoftext|>");
  EXPECT_EQ(tokens[n - 2], "<|im_start|>");
  EXPECT_EQ(tokens[n - 1], "<|im_end|>");
  for (size_t i = n - 3; i < n; ++i) EXPECT_EQ(types[i], 3) << tokens[i];
}

TEST(TinyLlamaTest, MergesAreConsistentWithTokens) {
  auto f = Build(TinyLlamaOptions{});
  ASSERT_NE(f, nullptr);
  const std::vector<std::string> tokens = f->GetStringArray("tokenizer.ggml.tokens").value();
  const std::vector<std::string> merges = f->GetStringArray("tokenizer.ggml.merges").value();
  ASSERT_EQ(static_cast<int>(merges.size()), TinyLlamaMaxMerges());
  ASSERT_GE(merges.size(), 24u);       // "a few dozen"
  EXPECT_EQ(merges[0], "\xC4\xA0 t");  // "Ġ t"
  std::map<std::string, size_t> id;
  for (size_t i = 0; i < tokens.size(); ++i) id[tokens[i]] = i;
  for (size_t r = 0; r < merges.size(); ++r) {
    const size_t space = merges[r].find(' ');
    ASSERT_NE(space, std::string::npos) << merges[r];
    ASSERT_EQ(merges[r].find(' ', space + 1), std::string::npos) << merges[r];
    const std::string left = merges[r].substr(0, space);
    const std::string right = merges[r].substr(space + 1);
    // Both parts exist before the merged token, which sits at 256 + rank.
    ASSERT_TRUE(id.count(left) && id.count(right)) << merges[r];
    EXPECT_LT(id[left], 256 + r) << merges[r];
    EXPECT_LT(id[right], 256 + r) << merges[r];
    EXPECT_EQ(tokens[256 + r], left + right);
  }
  // " the" is reachable: Ġ t -> Ġt, h e -> he, Ġt he -> Ġthe.
  EXPECT_EQ(id.count("\xC4\xA0the"), 1u);
}

TEST(TinyLlamaTest, NumMergesControlsVocabSize) {
  TinyLlamaOptions opts;
  opts.num_merges = 0;
  auto f = Build(opts);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->GetUint("llama.vocab_size").value(), 259u);
  EXPECT_EQ(f->GetStringArray("tokenizer.ggml.merges").value().size(), 0u);
  EXPECT_EQ(f->FindTensor("token_embd.weight")->shape, (std::vector<int64_t>{64, 259}));
  EXPECT_EQ(f->GetUint("tokenizer.ggml.bos_token_id").value(), 256u);
  auto v = MakeTinyLlamaVocab(10);
  SNAPFILL_ASSERT_OK(v);
  EXPECT_EQ(v->tokens.size(), 269u);
  EXPECT_EQ(v->im_start_id, 267);
  EXPECT_EQ(v->im_end_id, 268);
}

TEST(TinyLlamaTest, SameSeedSameBytesDifferentSeedDifferentWeights) {
  TinyLlamaOptions opts;
  opts.seed = 7;
  const std::string a = MakeTinyLlamaGguf(opts).value();
  const std::string b = MakeTinyLlamaGguf(opts).value();
  EXPECT_EQ(a, b);
  opts.seed = 8;
  const std::string c = MakeTinyLlamaGguf(opts).value();
  ASSERT_EQ(a.size(), c.size());
  EXPECT_NE(a, c);
  // Only the weights change: the header, metadata and directory are equal.
  auto fa = GgufFile::FromBytes(a);
  SNAPFILL_ASSERT_OK(fa);
  // The writer packs tensors in order, so the data section is the last
  // last.offset + (last.size_bytes rounded up to 32) bytes of the file.
  const GgufTensorInfo& last = (*fa)->tensors().back();
  const size_t section =
      a.size() - static_cast<size_t>(last.offset + (last.size_bytes + 31) / 32 * 32);
  ASSERT_EQ(section % 32, 0u);
  ASSERT_EQ(std::memcmp(a.data() + section, (*fa)->tensors()[0].data, 64), 0);
  EXPECT_EQ(a.substr(0, section), c.substr(0, section));
  // Each tensor has its own stream, so adding a layer keeps earlier tensors.
  opts.seed = 7;
  opts.num_layers = 3;
  auto f3 = Build(opts);
  ASSERT_NE(f3, nullptr);
  const GgufTensorInfo* q2 = (*fa)->FindTensor("blk.1.attn_q.weight");
  const GgufTensorInfo* q3 = f3->FindTensor("blk.1.attn_q.weight");
  ASSERT_EQ(q2->size_bytes, q3->size_bytes);
  EXPECT_EQ(std::memcmp(q2->data, q3->data, q2->size_bytes), 0);
}

TEST(TinyLlamaTest, WeightStatisticsKeepActivationsSane) {
  auto f = Build(TinyLlamaOptions{});
  ASSERT_NE(f, nullptr);
  for (const GgufTensorInfo& t : f->tensors()) {
    const std::vector<float> w = TensorAsFloats(t);
    double sum = 0, sq = 0;
    float lo = w[0], hi = w[0];
    for (float x : w) {
      sum += x;
      sq += double{x} * x;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    const double n = static_cast<double>(w.size());
    const double mean = sum / n;
    const double stddev = std::sqrt(sq / n - mean * mean);
    if (t.shape.size() == 1) {
      // Norm gains: uniform in [0.9, 1.1).
      EXPECT_GE(lo, 0.9f) << t.name;
      EXPECT_LT(hi, 1.1f) << t.name;
      EXPECT_NEAR(mean, 1.0, 0.02) << t.name;
      continue;
    }
    const double want =
        t.name == "token_embd.weight" ? 0.1 : 0.5 / std::sqrt(static_cast<double>(t.shape[0]));
    // The sample stddev of n >= 2048 normal draws is within ~3% (1.5 sigma is
    // sqrt(1 / (2n)) relative); allow 10%. Irwin-Hall is bounded by 6 sigma.
    EXPECT_NEAR(stddev, want, 0.1 * want) << t.name;
    EXPECT_NEAR(mean, 0.0, 4 * want / std::sqrt(n)) << t.name;
    EXPECT_LE(std::max(-lo, hi), 6 * want) << t.name;
  }
}

TEST(TinyLlamaTest, WriteTinyLlamaGgufWritesAnOpenableFile) {
  const std::string path =
      ::testing::TempDir() + "/tiny_llama_test_" + std::to_string(::getpid()) + ".gguf";
  TinyLlamaOptions opts;
  opts.seed = 3;
  SNAPFILL_ASSERT_OK(WriteTinyLlamaGguf(path, opts));
  auto f = GgufFile::Open(path);
  SNAPFILL_ASSERT_OK(f);
  EXPECT_EQ((*f)->file_size(), MakeTinyLlamaGguf(opts).value().size());
  EXPECT_EQ((*f)->tensors().size(), 20u);
  std::remove(path.c_str());
}

TEST(TinyLlamaTest, InvalidOptionsNameTheField) {
  auto expect_invalid = [](TinyLlamaOptions o, const std::string& field) {
    const absl::Status s = ValidateTinyLlamaOptions(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(std::string(s.message()), HasSubstr(field));
    EXPECT_EQ(MakeTinyLlamaGguf(o).status().code(), absl::StatusCode::kInvalidArgument);
  };
  TinyLlamaOptions o;
  o.num_layers = 0;
  expect_invalid(o, "num_layers");
  o = {};
  o.num_kv_heads = 3;
  expect_invalid(o, "num_kv_heads = 3");
  o = {};
  o.model_dim = 66;
  expect_invalid(o, "model_dim = 66");
  o = {};
  o.head_dim = 7;
  expect_invalid(o, "head_dim = 7");
  o = {};
  o.num_merges = TinyLlamaMaxMerges() + 1;
  expect_invalid(o, "num_merges");
  o = {};
  o.model_dim = 1 << 21;
  expect_invalid(o, "model_dim");
  o = {};
  o.model_dim = 8192;
  o.ffn_dim = 1 << 20;
  o.num_heads = 64;
  o.num_kv_heads = 64;
  expect_invalid(o, "weights");
  o = {};
  o.matrix_type = GgmlType::kQ4_K;  // rows of 64: no whole 256-element block
  expect_invalid(o, "matrix_type = Q4_K");
  o = {};
  o.ffn_down_type = GgmlType::kIQ4_NL;  // a type snapfill does not compute with
  expect_invalid(o, "ffn_down_type = IQ4_NL");
  SNAPFILL_EXPECT_OK(ValidateTinyLlamaOptions(TinyLlamaOptions{}));
}

// Quantized matrices: each 2-D tensor of the asked type (ffn_down of its
// own), holding ref::QuantizeRow of the F32 model's weights.
TEST(TinyLlamaTest, QuantizedMatricesAreTheQuantizedF32Weights) {
  TinyLlamaOptions opts;
  opts.ffn_dim = 256;
  auto f32 = Build(opts);
  opts.matrix_type = GgmlType::kQ5_0;
  opts.ffn_down_type = GgmlType::kQ6_K;
  auto q = Build(opts);
  ASSERT_NE(f32, nullptr);
  ASSERT_NE(q, nullptr);
  ASSERT_EQ(f32->tensors().size(), q->tensors().size());
  for (size_t i = 0; i < q->tensors().size(); ++i) {
    const GgufTensorInfo& a = f32->tensors()[i];
    const GgufTensorInfo& b = q->tensors()[i];
    ASSERT_EQ(a.name, b.name);
    ASSERT_EQ(a.shape, b.shape);
    if (a.shape.size() != 2) {
      EXPECT_EQ(b.type, GgmlType::kF32) << b.name;
      continue;
    }
    const GgmlType want = b.name.find("ffn_down") != std::string::npos ? GgmlType::kQ6_K : GgmlType::kQ5_0;
    ASSERT_EQ(b.type, want) << b.name;
    const std::vector<float> x = TensorAsFloats(a);
    const int64_t row_bytes = RowBytes(want, a.shape[0]);
    std::vector<uint8_t> row(row_bytes);
    ref::QuantizeRow(want, x.data(), row.data(), a.shape[0]);  // the first row
    ASSERT_EQ(std::memcmp(row.data(), b.data, row_bytes), 0) << b.name;
  }
}

// ---------------------------------------------------------------------------
// float -> half.

float Bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(HalfConversionTest, HandDerivedCases) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);  // largest finite half
  // 1/3 = 1.0101...b * 2^-2: the 11th significand bit onward is 0101..., so
  // it rounds down to exponent 13, mantissa 0b0101010101.
  EXPECT_EQ(FloatToHalf(1.0f / 3.0f), 0x3555);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (down) ...
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3C00);
  // ... and 1 + 3 * 2^-11 is halfway between 0x3C01 and 0x3C02: up to even.
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3C02);
  EXPECT_EQ(FloatToHalf(std::nextafter(1.0f + 0x1p-11f, 2.0f)), 0x3C01);
  // Rounding carries into the exponent: just under 2 rounds to 2.
  EXPECT_EQ(FloatToHalf(std::nextafter(2.0f, 0.0f)), 0x4000);
  // 65520 is halfway between 65504 and 65536 (= infinity): ties to even -> inf.
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);
  EXPECT_EQ(FloatToHalf(std::nextafter(65520.0f, 0.0f)), 0x7BFF);
  EXPECT_EQ(FloatToHalf(1e10f), 0x7C00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xFC00);
  // Subnormals: 2^-24 is the smallest, 2^-14 the smallest normal.
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);
  EXPECT_EQ(FloatToHalf(0x1p-14f), 0x0400);
  EXPECT_EQ(FloatToHalf(3 * 0x1p-24f), 0x0003);
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);                        // tie -> even 0
  EXPECT_EQ(FloatToHalf(std::nextafter(0x1p-25f, 1.0f)), 0x0001);  // just above
  EXPECT_EQ(FloatToHalf(1.5f * 0x1p-24f), 0x0002);                 // tie -> even 2
  EXPECT_EQ(FloatToHalf(2.5f * 0x1p-24f), 0x0002);                 // tie -> even 2
  EXPECT_EQ(FloatToHalf(-0x1p-30f), 0x8000);
  EXPECT_EQ(FloatToHalf(0x1p-14f - 0x1p-25f), 0x0400);  // halfway 0x3FF/0x400 -> even
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  // Infinities and NaN.
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xFC00);
  const uint16_t nan = FloatToHalf(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7C00, 0x7C00);
  EXPECT_NE(nan & 0x03FF, 0);
  // A signalling NaN whose payload sits only in the low bits stays a NaN.
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(Bits(0x7F800001)))));
  EXPECT_EQ(FloatToHalf(Bits(0xFFC00000)) & 0x8000, 0x8000);

  EXPECT_EQ(HalfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x03FF), 1023 * 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x8000), 0.0f);
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
  EXPECT_EQ(HalfToFloat(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7E00)));
}

// HalfToFloat is exact, so every half must survive a round trip, and the
// midpoint between two neighbours must round to the one with an even
// mantissa, while the floats just beside it round to the nearer neighbour.
TEST(HalfConversionTest, ExhaustiveRoundTripAndTiesToEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << std::hex << h;
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
  }
  for (uint32_t sign : {0u, 0x8000u}) {
    for (uint32_t h = 0; h < 0x7BFF; ++h) {  // pairs (h, h + 1) of finite halves
      const uint16_t a = static_cast<uint16_t>(sign | h);
      const uint16_t b = static_cast<uint16_t>(sign | (h + 1));
      const double fa = HalfToFloat(a), fb = HalfToFloat(b);
      const float mid = static_cast<float>((fa + fb) / 2);  // exact: 12 significant bits
      ASSERT_EQ(static_cast<double>(mid), (fa + fb) / 2);
      const uint16_t even = (h & 1) ? b : a;
      ASSERT_EQ(FloatToHalf(mid), even) << std::hex << a;
      const float toward_a = std::nextafter(mid, static_cast<float>(fa));
      const float toward_b = std::nextafter(mid, static_cast<float>(fb));
      ASSERT_EQ(FloatToHalf(toward_a), a) << std::hex << a;
      ASSERT_EQ(FloatToHalf(toward_b), b) << std::hex << a;
    }
  }
}

}  // namespace
}  // namespace snapfill
