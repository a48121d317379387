// The seed corpus (MakeSeeds in fuzz_targets.h): small valid inputs of each
// target, written by the project's own writers, plus a few hand-made edge
// cases. Every seed stays far below 64 KB.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "snapfill/schedule.h"
#include "snapfill/status.h"
#include "src/gguf/gguf_reader.h"
#include "tools/testmodel/gguf_writer.h"
#include "src/kv/cache_file.h"
#include "src/kv/checkpoint_file.h"
#include "src/kv/kv_cache.h"
#include "tools/testmodel/tiny_llama.h"
#include "tests/fuzz/fuzz_targets.h"

namespace snapfill::fuzz {
namespace {

std::string TempPath(const char* stem) {
  return "/tmp/snapfill_seed_" + std::to_string(getpid()) + "_" + stem;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---------------------------------------------------------------------------
// GGUF.

std::string TinyGguf(int layers, bool f16, bool tie, int merges) {
  TinyLlamaOptions o;
  o.num_layers = layers;
  o.model_dim = 8;
  o.num_heads = 2;
  o.num_kv_heads = 1;
  o.ffn_dim = 16;
  o.context_length = 64;
  o.f16_matrices = f16;
  o.tie_embeddings = tie;
  o.num_merges = merges;
  auto bytes = MakeTinyLlamaGguf(o);
  SNAPFILL_CHECK(bytes.ok()) << bytes.status();
  return *bytes;
}

// A vocabulary-only GGUF with a SentencePiece ("llama") tokenizer.
std::string SpmVocabGguf() {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddString("tokenizer.ggml.model", "llama");
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    tokens.push_back(buf);
    scores.push_back(0);
    types.push_back(6);
  }
  for (const char* t : {"\xE2\x96\x81", "h", "e", "l", "o", "he", "ll", "hello",
                        "\xE2\x96\x81hello", "<|user|>"}) {
    tokens.push_back(t);
    scores.push_back(-static_cast<float>(tokens.size()));
    types.push_back(std::string(t) == "<|user|>" ? 4 : 1);
  }
  w.AddStringArray("tokenizer.ggml.tokens", tokens);
  w.AddFloat32Array("tokenizer.ggml.scores", scores);
  w.AddInt32Array("tokenizer.ggml.token_type", types);
  w.AddUint32("tokenizer.ggml.bos_token_id", 1);
  w.AddUint32("tokenizer.ggml.eos_token_id", 2);
  w.AddUint32("tokenizer.ggml.unknown_token_id", 0);
  w.AddBool("tokenizer.ggml.add_bos_token", true);
  return w.Serialize();
}

// Every metadata value type, arrays included, a custom alignment and a few
// tensors of block-quantized types (version 2).
std::string AllTypesGguf() {
  GgufWriter w;
  w.set_version(2);
  SNAPFILL_CHECK(w.SetAlignment(64).ok());
  w.AddString("general.architecture", "mistral");
  w.AddUint32("u32", 7);
  w.AddInt32("i32", -7);
  w.AddUint64("u64", uint64_t{1} << 40);
  w.AddFloat32("f32", 0.5f);
  w.AddBool("flag", true);
  w.AddStringArray("strings", {"a", "", "\xC3\xA9"});
  w.AddFloat32Array("floats", {1.0f, -2.0f});
  w.AddInt32Array("ints", {1, -1, 1 << 30});
  const std::pair<GgufValueType, GgufValue> more[] = {
      {GgufValueType::kUint8, GgufValue{GgufValueType::kUint8, GgufValueType::kUint8, uint64_t{200}}},
      {GgufValueType::kInt8, GgufValue{GgufValueType::kInt8, GgufValueType::kUint8, int64_t{-100}}},
      {GgufValueType::kUint16, GgufValue{GgufValueType::kUint16, GgufValueType::kUint8, uint64_t{60000}}},
      {GgufValueType::kInt16, GgufValue{GgufValueType::kInt16, GgufValueType::kUint8, int64_t{-30000}}},
      {GgufValueType::kInt64, GgufValue{GgufValueType::kInt64, GgufValueType::kUint8, int64_t{-1} << 40}},
      {GgufValueType::kFloat64, GgufValue{GgufValueType::kFloat64, GgufValueType::kUint8, 1e300}},
  };
  int k = 0;
  for (const auto& [type, value] : more) {
    SNAPFILL_CHECK(w.AddValue("scalar." + std::to_string(k++), value).ok());
  }
  SNAPFILL_CHECK(w.AddValue("bools", GgufValue{GgufValueType::kArray, GgufValueType::kBool,
                                               std::vector<bool>{true, false}})
                     .ok());
  SNAPFILL_CHECK(w.AddValue("u16s", GgufValue{GgufValueType::kArray, GgufValueType::kUint16,
                                              std::vector<uint64_t>{1, 65535}})
                     .ok());
  SNAPFILL_CHECK(w.AddValue("f64s", GgufValue{GgufValueType::kArray, GgufValueType::kFloat64,
                                              std::vector<double>{0.25, -1e-300}})
                     .ok());
  SNAPFILL_CHECK(w.AddTensorF32("vec", {4}, {1, 2, 3, 4}).ok());
  SNAPFILL_CHECK(w.AddTensor("q4_0", GgmlType::kQ4_0, {32, 2}, std::string(2 * 18, '\x11')).ok());
  SNAPFILL_CHECK(w.AddTensor("q6_k", GgmlType::kQ6_K, {256, 1, 1}, std::string(210, '\x22')).ok());
  return w.Serialize();
}

// ---------------------------------------------------------------------------
// KV files.

std::unique_ptr<KvCache> SmallKv(std::vector<int64_t> sizes, int64_t heads, int64_t dim) {
  KvCacheShape shape;
  shape.num_layers = static_cast<int64_t>(sizes.size());
  shape.num_kv_heads = heads;
  shape.head_dim = dim;
  int64_t cap = 1;
  for (int64_t s : sizes) cap = std::max(cap, s);
  shape.capacity = cap;
  auto kv = KvCache::Create(shape);
  SNAPFILL_CHECK(kv.ok()) << kv.status();
  float x = 0.5f;
  for (size_t l = 0; l < sizes.size(); ++l) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < sizes[l] * dim; ++i) {
        (*kv)->k(l, h)[i] = x;
        (*kv)->v(l, h)[i] = -x;
        x = x * 1.25f + 0.125f;
        if (x > 100) x = -3.0f;
      }
      for (int64_t i = 0; i < sizes[l]; ++i) (*kv)->pos(l, h)[i] = static_cast<int32_t>(3 * i + h);
    }
    (*kv)->set_size(static_cast<int64_t>(l), sizes[l]);
  }
  return std::move(*kv);
}

std::string CacheBytes(std::vector<int64_t> sizes, int64_t heads, int64_t dim,
                       std::string fingerprint, std::string config) {
  PromptCache c;
  c.model_fingerprint = std::move(fingerprint);
  c.config = std::move(config);
  c.next_position = 40;
  c.input_tokens = 37;
  c.kv = SmallKv(std::move(sizes), heads, dim);
  const std::string path = TempPath("cache");
  const absl::Status s = SaveCacheFile(path, c, /*overwrite=*/true);
  SNAPFILL_CHECK(s.ok()) << s;
  std::string bytes = Slurp(path);
  std::remove(path.c_str());
  return bytes;
}

std::string CheckpointBytes(std::vector<int64_t> sizes, int64_t heads, int64_t dim,
                            std::vector<double> retention, std::string config) {
  CheckpointState s;
  s.model_fingerprint = "xxh3:0123456789abcdef";
  s.config = std::move(config);
  s.input_digest = 0xfedcba9876543210ULL;
  s.input_tokens = 5000;
  s.plan_digest = 0x0011223344556677ULL;
  s.threads = 2;
  s.steps_done = 3;
  s.total_steps = 5;
  s.next_token = 3072;
  s.retention = std::move(retention);
  auto kv = SmallKv(std::move(sizes), heads, dim);
  const std::string path = TempPath("checkpoint");
  const absl::Status st = SaveCheckpointFile(path, s, *kv);
  SNAPFILL_CHECK(st.ok()) << st;
  std::string bytes = Slurp(path);
  std::remove(path.c_str());
  return bytes;
}

// ---------------------------------------------------------------------------
// Schedule configurations, encoded as DecodeScheduleConfig reads them.

class ByteSink {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) U8(static_cast<uint8_t>(v >> (8 * i)));
  }
  // Inverse of ByteSource::Range for a value inside [lo, hi].
  void Range(int64_t v, int64_t lo) { U32(static_cast<uint32_t>(v - lo)); }
  std::string bytes() const { return out_; }

 private:
  std::string out_;
};

struct PlanSeed {
  const char* name;
  ScheduleKind kind;
  Growth growth;
  int64_t total, chunk, memory, first_memory, window, layers, sinks, max_position;
  int shift;  // total <<= 2*shift (chunk and memory as given: flags 0x40/0x80 unset)
};

std::string EncodePlan(const PlanSeed& p, const std::vector<uint8_t>& tail) {
  ByteSink out;
  out.U8(static_cast<uint8_t>(static_cast<int>(p.kind) + 3 * static_cast<int>(p.growth)));
  const uint8_t scale = (p.first_memory > 0 ? 1 : 0) | (p.sinks > 0 ? 2 : 0) |
                        (p.max_position > 0 ? 4 : 0) | (p.shift << 3);
  out.U8(scale);
  out.Range(p.window, -1);
  out.Range(p.chunk, -1);
  out.Range(p.memory, -1);
  if (scale & 1) out.Range(p.first_memory, -1);
  out.Range(p.total, -1);
  out.Range(p.layers, 0);
  if (scale & 2) out.Range(p.sinks, -1);
  if (scale & 4) out.Range(p.max_position, -1);
  std::string bytes = out.bytes();
  for (uint8_t b : tail) bytes.push_back(static_cast<char>(b));
  return bytes;
}

std::vector<FuzzSeed> PlanSeeds() {
  using K = ScheduleKind;
  using G = Growth;
  const PlanSeed seeds[] = {
      {"fm_32k", K::kFixed, G::kLinear, 32768, 1024, 1024, 0, 32, 4, 0, 0, 0},
      {"im_linear_10000", K::kIncremental, G::kLinear, 10000, 1024, 1024, 0, 32, 3, 0, 0, 0},
      {"im_sqrt_tail_merge", K::kIncremental, G::kSqrt, 10260, 1024, 1024, 0, 32, 2, 0, 0, 0},
      {"im_square_first_memory", K::kIncremental, G::kSquare, 4096, 1024, 1024, 64, 32, 2, 0, 0, 0},
      {"imdc_linear_32k", K::kIncrementalDecremental, G::kLinear, 32768, 1024, 1024, 0, 32, 4, 0, 0, 0},
      {"imdc_square_sqrt_odd", K::kIncrementalDecremental, G::kSquareSqrt, 65536, 4096, 2048, 0, 64, 7, 0, 0, 0},
      {"imdc_remainder", K::kIncrementalDecremental, G::kLinear, 10240 + 13, 1024, 1024, 0, 32, 1, 0, 0, 0},
      {"imdc_refused_memory", K::kIncrementalDecremental, G::kLinear, 32768, 1024, 4096, 0, 32, 2, 0, 0, 0},
      {"imdc_tiny_chunks", K::kIncrementalDecremental, G::kLinear, 25000, 40, 64, 0, 8, 1, 0, 0, 1},
      {"imdc_sinks", K::kIncrementalDecremental, G::kSqrt, 32768, 1024, 1024, 0, 32, 4, 4, 0, 0},
      {"im_adaptive", K::kIncremental, G::kAdaptive, 16384, 1024, 1024, 0, 32, 6, 0, 0, 0},
      {"imdc_adaptive_long", K::kIncrementalDecremental, G::kAdaptive, 15625, 4096, 4096, 0, 32, 4, 0, 0, 3},
      {"fm_max_position", K::kFixed, G::kLinear, 16384, 2048, 1024, 0, 32, 2, 0, 2048, 0},
      {"fm_million", K::kFixed, G::kLinear, 15625, 1024, 1024, 0, 32, 2, 0, 0, 3},
      {"refused_window", K::kFixed, G::kLinear, 100, 32, 1024, 0, 32, 1, 0, 0, 0},
      {"one_chunk", K::kIncremental, G::kLinear, 500, 1024, 256, 0, 32, 3, 0, 0, 0},
  };
  // Retention ratios for AdaptiveBudgets: step index, then per layer a
  // kind byte (< 32: zero) and a u32 fraction, then the cap flag.
  std::vector<uint8_t> tail;
  for (int round = 0; round < 3; ++round) {
    for (int b = 0; b < 4; ++b) tail.push_back(static_cast<uint8_t>(round * 5 + b));
    for (int l = 0; l < 6; ++l) {
      tail.push_back(l == 2 ? 0 : 200);
      for (int b = 0; b < 4; ++b) tail.push_back(static_cast<uint8_t>(37 * l + 11 * b + round));
    }
    tail.push_back(static_cast<uint8_t>(round));
  }
  std::vector<FuzzSeed> out;
  for (const PlanSeed& p : seeds) out.push_back({p.name, EncodePlan(p, tail)});
  return out;
}

std::vector<FuzzSeed> TokenizerSeeds() {
  const std::pair<const char*, std::string> texts[] = {
      {"english", "Hello world, it's a test. We'll see 42 apples & 7 pears!\n"},
      {"unicode", "\xC3\xA9t\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xD0\x9F\xD1\x80\xD0\xB8 \xF0\x9F\x98\x80 "
                  "\xE2\x80\x94 na\xC3\xAFve"},
      {"invalid_utf8", std::string("ok \xFF\xFE \xC3 \xE2\x82 \xF0\x9F\x98 \xC0\xAF end\x80")},
      {"special", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|endoftext|>"},
      {"whitespace", "  \t\n\n   x  \r\n\t\t  y   "},
      {"digits_contractions", "12345678901234 I'm you're they'll we've don't 'S"},
      {"spm_text", "hello world  hello\xE2\x96\x81world h\xC3\xA9llo"},
      {"nul_bytes", std::string("a\0b\0\0c", 6)},
  };
  std::vector<FuzzSeed> out;
  for (const auto& [name, text] : texts) {
    for (uint8_t flags : {0, 3, 4, 7}) {
      out.push_back({std::string(name) + "_f" + std::to_string(flags),
                     std::string(1, static_cast<char>(flags)) + text});
    }
  }
  return out;
}

}  // namespace

std::vector<FuzzSeed> MakeSeeds(std::string_view target) {
  std::vector<FuzzSeed> out;
  if (target == "gguf_reader") {
    out.push_back({"tiny_f32_1layer.gguf", TinyGguf(1, false, true, 16)});
    out.push_back({"tiny_f16_2layers_untied.gguf", TinyGguf(2, true, false, 8)});
    out.push_back({"spm_vocab.gguf", SpmVocabGguf()});
    out.push_back({"all_types_v2.gguf", AllTypesGguf()});
    GgufWriter empty;
    out.push_back({"empty.gguf", empty.Serialize()});
  } else if (target == "tokenizer") {
    out = TokenizerSeeds();
  } else if (target == "cache_file") {
    const std::string one = CacheBytes({3}, 1, 4, "xxh3:0123456789abcdef", "{\"chunk\":1024}");
    const std::string two = CacheBytes({5, 2}, 2, 2, "fp", "{}");
    const std::string empty_layers = CacheBytes({0, 0, 0}, 2, 8, "", "");
    for (const auto& [name, bytes] : {std::pair<std::string, std::string>{"one_layer", one},
                                      {"two_layers", two},
                                      {"empty_layers", empty_layers}}) {
      out.push_back({name + ".kv", std::string(1, '\0') + bytes});
      // Trailer recomputed, extra capacity 3.
      out.push_back({name + "_fix_extra3.kv", std::string(1, '\x07') + bytes});
    }
  } else if (target == "checkpoint_file") {
    const std::string one = CheckpointBytes({3}, 1, 4, {0.5}, "schedule=imdc chunk=1024");
    const std::string two = CheckpointBytes({4, 1}, 2, 2, {0.0, 1.0}, "");
    for (const auto& [name, bytes] : {std::pair<std::string, std::string>{"one_layer", one},
                                      {"two_layers", two}}) {
      out.push_back({name + ".ck", std::string(1, '\0') + bytes});
      out.push_back({name + "_fix.ck", std::string(1, '\x01') + bytes});
    }
  } else if (target == "schedule_planner") {
    out = PlanSeeds();
  }
  return out;
}

}  // namespace snapfill::fuzz
