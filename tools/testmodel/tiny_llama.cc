#include "tools/testmodel/tiny_llama.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <set>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/ref/quant_ref.h"
#include "snapfill/dtype.h"
#include "snapfill/status.h"
#include "src/base/half.h"
#include "tools/testmodel/gguf_writer.h"

namespace snapfill {
namespace {

// Common English BPE merges in rank order, written in GPT-2's byte-to-unicode
// alphabet ("Ġ" is a space, "Ċ" a newline). Each part is a byte token or the
// result of an earlier merge, and no two merges produce the same token.
constexpr std::pair<const char*, const char*> kMerges[] = {
    {"Ġ", "t"},  {"h", "e"},   {"i", "n"},  {"e", "r"},   {"a", "n"},   {"Ġ", "a"},  {"o", "n"},
    {"r", "e"},  {"Ġt", "he"}, {"e", "n"},  {"a", "t"},   {"o", "r"},   {"e", "s"},  {"Ġ", "s"},
    {"Ġ", "w"},  {"Ġ", "o"},   {"i", "s"},  {"i", "t"},   {"n", "d"},   {"Ġ", "c"},  {"Ġ", "b"},
    {"Ġ", "f"},  {"o", "u"},   {"in", "g"}, {"Ġ", "m"},   {"Ġ", "p"},   {"e", "d"},  {"Ġ", "h"},
    {"Ġ", "i"},  {"a", "r"},   {"l", "l"},  {"Ġa", "nd"}, {"Ġo", "f"},  {"Ġt", "o"}, {"Ġ", "in"},
    {"Ġi", "s"}, {"a", "l"},   {"l", "e"},  {"Ġ", "d"},   {"Ġ", "l"},   {"Ġ", "n"},  {"s", "t"},
    {"o", "m"},  {"Ġ", "re"},  {"i", "on"}, {"Ġ", "T"},   {"Ġc", "on"}, {"Ġ", "Ġ"},  {"Ċ", "Ċ"},
    {"Ġw", "h"},
};
constexpr int kNumMerges = static_cast<int>(sizeof(kMerges) / sizeof(kMerges[0]));

constexpr char kChatTemplate[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

constexpr int32_t kTokenTypeNormal = 1;
constexpr int32_t kTokenTypeControl = 3;
// The largest single dimension (which keeps the weight count from
// overflowing); the largest model is kTinyLlamaMaxWeights.
constexpr int64_t kMaxDim = int64_t{1} << 20;

struct Preset {
  const char* name;
  int num_layers, model_dim, num_heads, num_kv_heads, ffn_dim, context_length;
  bool tie_embeddings;
};
constexpr Preset kPresets[] = {
    {"smollm2-135m", 30, 576, 9, 3, 1536, 8192, true},
    {"llama2-7b", 32, 4096, 32, 32, 11008, 4096, false},
};

std::string Utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// GPT-2's bytes_to_unicode (openai/gpt-2 encoder.py): printable Latin-1
// bytes map to themselves, the other 68 bytes to U+0100.. in byte order.
uint32_t ByteToCodepoint(uint8_t b) {
  auto printable = [](int c) {
    return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
  };
  if (printable(b)) return b;
  uint32_t n = 0;
  for (int c = 0; c < b; ++c) n += printable(c) ? 0 : 1;
  return 256 + n;
}

// Uniform and approximately normal variates from a std::mt19937, whose
// output sequence the C++ standard fixes.
class WeightRng {
 public:
  WeightRng(uint64_t seed, uint32_t stream) {
    std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), stream};
    gen_.seed(seq);
  }
  // Uniform in [0, 1) on a 2^-24 grid.
  double Uniform() { return static_cast<double>(gen_() >> 8) * 0x1p-24; }
  // Irwin-Hall: the sum of 12 uniforms minus 6 has mean 0 and variance 1;
  // every step is exact in double, so the result is bit-reproducible.
  double Normal() {
    double sum = 0.0;
    for (int i = 0; i < 12; ++i) sum += Uniform();
    return sum - 6.0;
  }

 private:
  std::mt19937 gen_;
};

// The fast generator: splitmix64's finalizer of a counter. Tensor `stream`
// of seed `seed` has the key TensorKey(seed, stream); its element i is
// derived from Mix64(key + (i + 1) * kGolden), the (i+1)-th output of a
// splitmix64 started at the key.
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t TensorKey(uint64_t seed, uint32_t stream) {
  return Mix64(Mix64(seed ^ 0x6A09E667F3BCC908ull) + (uint64_t{stream} + 1) * 0xD1B54A32D192ED03ull);
}

// Approximately N(0, stddev^2), n elements from element `first` on: the sum
// of the hash's four 16-bit parts (Irwin-Hall, mean 131070, variance about
// 65536^2 / 3) minus its mean is an exact integer, and `factor` is
// stddev * sqrt(3) / 65536 as a float. One exact conversion and one multiply:
// no rounding step a compiler could fuse or reorder.
void FastNormalRow(uint64_t key, uint64_t first, int64_t n, float factor, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t h = Mix64(key + (first + static_cast<uint64_t>(j) + 1) * kGolden);
    const int32_t s = static_cast<int32_t>((h & 0xFFFF) + ((h >> 16) & 0xFFFF) + ((h >> 32) & 0xFFFF) + (h >> 48));
    out[j] = static_cast<float>(s - 131070) * factor;
  }
}

// Uniform in [0.9, 1.1) on a 2^-24 grid: 15099494 / 2^24 is 0.9 (rounded
// down) and (h >> 40) * 3355443 / 2^48 spans 0.2; all in integers, exact.
void FastUniformNormRow(uint64_t key, int64_t n, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t h = Mix64(key + (static_cast<uint64_t>(j) + 1) * kGolden);
    const uint32_t q = static_cast<uint32_t>(15099494 + (((h >> 40) * 3355443) >> 24));
    out[j] = static_cast<float>(q) * 0x1p-24f;
  }
}

// Q8_0 and Q4_0 rows for the fast generator, byte for byte what
// ref::QuantizeRow writes (ggml's reference quantizers), without its libm
// roundf call per weight. Block layout: the fp16 scale d, then the quants.
// ggml's reference code is compiled without FP contraction (Q4_0's
// "x * id + 8.5f" is two roundings), so these are too; the rest of this file
// (the original generator) keeps the flags it was always compiled with.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

constexpr int kQBlock = 32;  // elements per Q8_0 / Q4_0 block

void QuantizeRowQ8_0Fast(const float* x, char* y, int64_t k) {
  for (int64_t b = 0; b < k / kQBlock; ++b, y += 2 + kQBlock) {
    const float* xb = x + b * kQBlock;
    // max |x| as ref's std::max(amax, fabs(x)) finds it: for non-negative
    // floats (no NaN here) the order of the bit patterns is the order of the
    // values, and an integer max vectorizes.
    uint32_t abits = 0;
    for (int j = 0; j < kQBlock; ++j) {
      uint32_t u;
      std::memcpy(&u, &xb[j], 4);
      abits = std::max(abits, u & 0x7FFFFFFFu);
    }
    float amax;
    std::memcpy(&amax, &abits, 4);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = Fp32ToFp16(d);
    std::memcpy(y, &dh, 2);
    int8_t q[kQBlock];
    for (int j = 0; j < kQBlock; ++j) {
      // roundf (half away from zero): |v| + 0.5 is exact in double, and the
      // conversion truncates toward zero.
      const float v = xb[j] * id;
      q[j] = static_cast<int8_t>(static_cast<int>(static_cast<double>(v) + (v < 0.0f ? -0.5 : 0.5)));
    }
    std::memcpy(y + 2, q, kQBlock);
  }
}

void QuantizeRowQ4_0Fast(const float* x, char* y, int64_t k) {
  for (int64_t b = 0; b < k / kQBlock; ++b, y += 2 + kQBlock / 2) {
    const float* xb = x + b * kQBlock;
    // ref keeps the first element of the largest |x| (0.0f if all are
    // zeros): the largest |x| by an integer max (which vectorizes), then
    // the first element that has it.
    uint32_t bits[kQBlock];
    std::memcpy(bits, xb, sizeof(bits));
    uint32_t abits = 0;
    for (int j = 0; j < kQBlock; ++j) abits = std::max(abits, bits[j] & 0x7FFFFFFFu);
    float max = 0.0f;
    if (abits != 0) {
      int j = 0;
      while ((bits[j] & 0x7FFFFFFFu) != abits) ++j;
      max = xb[j];
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = Fp32ToFp16(d);
    std::memcpy(y, &dh, 2);
    uint8_t q[kQBlock / 2];
    for (int j = 0; j < kQBlock / 2; ++j) {
      // x * id + 8.5 lies in [0.5, 16.5]: truncation as ref's int8_t cast.
      const int q0 = std::min(15, static_cast<int>(xb[j] * id + 8.5f));
      const int q1 = std::min(15, static_cast<int>(xb[j + kQBlock / 2] * id + 8.5f));
      q[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
    std::memcpy(y + 2, q, kQBlock / 2);
  }
}

#pragma GCC pop_options

// One row of `type` from floats: the fast Q8_0/Q4_0 above, F16 by
// tiny_llama::FloatToHalfRow, else ref::QuantizeRow (F32, BF16 and the rest;
// the Builder checked that it writes the type).
void QuantizeRowFast(GgmlType type, const float* x, char* y, int64_t k) {
  switch (type) {
    case GgmlType::kQ8_0: QuantizeRowQ8_0Fast(x, y, k); return;
    case GgmlType::kQ4_0: QuantizeRowQ4_0Fast(x, y, k); return;
    case GgmlType::kF16: {
      uint16_t h[256];
      for (int64_t i = 0; i < k; i += 256) {
        const int64_t n = std::min<int64_t>(256, k - i);
        tiny_llama::FloatToHalfRow(x + i, h, n);
        std::memcpy(y + 2 * i, h, static_cast<size_t>(n) * 2);
      }
      return;
    }
    default: ref::QuantizeRow(type, x, y, k); return;
  }
}

int FastThreads(int num_threads) {
  if (num_threads > 0) return num_threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

// Fills a [ne0, ne1] matrix of `type` (F32, F16, BF16 or a type
// ref::QuantizeRow writes) at `dst`: row r holds the values of elements
// r*ne0 .. r*ne0+ne0-1, quantized. Rows are handed out in fixed blocks to
// `num_threads` threads; every row is generated into a 64-byte-aligned
// scratch row and quantized into its fixed place, so the bytes are the same
// for any thread count.
void FillFastMatrix(char* dst, uint64_t key, int64_t ne0, int64_t ne1, float factor, GgmlType type,
                    int num_threads) {
  const size_t row_bytes = RowBytes(type, ne0);
  const int64_t rows_per_block = std::max<int64_t>(1, (int64_t{1} << 16) / ne0);
  const int64_t num_blocks = (ne1 + rows_per_block - 1) / rows_per_block;
  std::atomic<int64_t> next{0};
  auto work = [&] {
    struct AlignedFree {
      void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
    };
    std::unique_ptr<float[], AlignedFree> row(
        static_cast<float*>(::operator new[](static_cast<size_t>(ne0) * sizeof(float), std::align_val_t{64})));
    for (int64_t b = next.fetch_add(1); b < num_blocks; b = next.fetch_add(1)) {
      const int64_t end = std::min(ne1, (b + 1) * rows_per_block);
      for (int64_t r = b * rows_per_block; r < end; ++r) {
        FastNormalRow(key, static_cast<uint64_t>(r * ne0), ne0, factor, row.get());
        QuantizeRowFast(type, row.get(), dst + static_cast<size_t>(r) * row_bytes, ne0);
      }
    }
  };
  const int threads = static_cast<int>(std::min<int64_t>(FastThreads(num_threads), num_blocks));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

// Builds the model tensor by tensor; `stream` numbers tensors in file order.
class Builder {
 public:
  Builder(const TinyLlamaOptions& opts, GgufWriter& writer) : opts_(opts), writer_(writer) {}

  absl::Status Matrix(const std::string& name, int64_t ne0, int64_t ne1, double stddev,
                      GgmlType type = GgmlType::kF32) {
    if (fast_) return FastMatrix(name, ne0, ne1, stddev, type);
    WeightRng rng(opts_.seed, stream_++);
    std::vector<float> w(static_cast<size_t>(ne0 * ne1));
    for (float& x : w) x = static_cast<float>(stddev * rng.Normal());
    if (!opts_.f16_matrices && type != GgmlType::kF32) {
      const int64_t row_bytes = RowBytes(type, ne0);
      std::string bytes(static_cast<size_t>(row_bytes * ne1), '\0');
      for (int64_t r = 0; r < ne1; ++r) {
        if (!ref::QuantizeRow(type, w.data() + r * ne0, bytes.data() + r * row_bytes, ne0)) {
          return absl::InvalidArgumentError(absl::StrCat(name, ": no quantizer for ", GetTypeTraits(type).name));
        }
      }
      return writer_.AddTensor(name, type, {ne0, ne1}, bytes);
    }
    if (!opts_.f16_matrices) return writer_.AddTensorF32(name, {ne0, ne1}, w);
    std::string bytes(w.size() * 2, '\0');
    for (size_t i = 0; i < w.size(); ++i) {
      const uint16_t h = tiny_llama::FloatToHalf(w[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
    }
    return writer_.AddTensor(name, GgmlType::kF16, {ne0, ne1}, bytes);
  }

  // A bias vector, N(0, 0.3^2) (always the original generator: it is short).
  absl::Status Bias(const std::string& name, int64_t n) {
    WeightRng rng(opts_.seed, stream_++);
    std::vector<float> w(static_cast<size_t>(n));
    for (float& x : w) x = static_cast<float>(0.3 * rng.Normal());
    return writer_.AddTensorF32(name, {n}, w);
  }

  // RMSNorm gains, uniform in [0.9, 1.1).
  absl::Status Norm(const std::string& name, int64_t n) {
    if (fast_) {
      const uint64_t key = TensorKey(opts_.seed, stream_++);
      return writer_.AddTensorGenerated(name, GgmlType::kF32, {n}, [key, n](char* dst, uint64_t) {
        std::vector<float> w(static_cast<size_t>(n));
        FastUniformNormRow(key, n, w.data());
        std::memcpy(dst, w.data(), w.size() * sizeof(float));
      });
    }
    WeightRng rng(opts_.seed, stream_++);
    std::vector<float> w(static_cast<size_t>(n));
    for (float& x : w) x = static_cast<float>(0.9 + 0.2 * rng.Uniform());
    return writer_.AddTensorF32(name, {n}, w);
  }

 private:
  // A matrix of the fast generator, generated when the writer needs it.
  absl::Status FastMatrix(const std::string& name, int64_t ne0, int64_t ne1, double stddev, GgmlType type) {
    if (opts_.f16_matrices) type = GgmlType::kF16;
    // Refuse a type without a quantizer now: the fill cannot fail.
    std::vector<float> zeros(static_cast<size_t>(ne0), 0.0f);
    std::string probe(RowBytes(type, ne0), '\0');
    if (!ref::QuantizeRow(type, zeros.data(), probe.data(), ne0)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": no quantizer for ", GetTypeTraits(type).name));
    }
    const uint64_t key = TensorKey(opts_.seed, stream_++);
    const float factor = static_cast<float>(stddev * std::sqrt(3.0) / 65536.0);
    const int threads = opts_.num_threads;
    return writer_.AddTensorGenerated(name, type, {ne0, ne1}, [=](char* dst, uint64_t) {
      FillFastMatrix(dst, key, ne0, ne1, factor, type, threads);
    });
  }

  const TinyLlamaOptions& opts_;
  GgufWriter& writer_;
  const bool fast_ = TinyLlamaUsesFastWeights(opts_);
  uint32_t stream_ = 0;
};

int HeadDim(const TinyLlamaOptions& o) {
  return o.head_dim != 0 ? o.head_dim : (o.num_heads > 0 ? o.model_dim / o.num_heads : 0);
}

}  // namespace

int TinyLlamaMaxMerges() { return kNumMerges; }

std::vector<std::string> TinyLlamaPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.push_back(p.name);
  return names;
}

absl::Status ApplyTinyLlamaPreset(const std::string& name, TinyLlamaOptions* opts) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    opts->num_layers = p.num_layers;
    opts->model_dim = p.model_dim;
    opts->num_heads = p.num_heads;
    opts->num_kv_heads = p.num_kv_heads;
    opts->head_dim = 0;
    opts->ffn_dim = p.ffn_dim;
    opts->context_length = p.context_length;
    opts->tie_embeddings = p.tie_embeddings;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown preset '", name, "'; known presets: ", absl::StrJoin(TinyLlamaPresetNames(), ", ")));
}

namespace {

// Weights a layer of `o.architecture` holds beyond llama's.
int64_t ExtraLayerWeights(const TinyLlamaOptions& o, int64_t d, int64_t q, int64_t kv, int64_t head_dim) {
  if (o.architecture == "qwen2") return q + 2 * kv;
  if (o.architecture == "qwen3") return 2 * head_dim;
  if (o.architecture == "gemma3") return 2 * head_dim + 2 * d;
  return 0;
}

}  // namespace

int64_t TinyLlamaWeightCount(const TinyLlamaOptions& o) {
  if (!ValidateTinyLlamaOptions(o).ok()) return -1;
  const int64_t head_dim = o.head_dim != 0 ? o.head_dim : o.model_dim / o.num_heads;
  const int64_t d = o.model_dim;
  const int64_t q = int64_t{o.num_heads} * head_dim;
  const int64_t kv = int64_t{o.num_kv_heads} * head_dim;
  const int64_t ffn = o.ffn_dim;
  const int64_t vocab = 256 + (o.num_merges < 0 ? kNumMerges : o.num_merges) + 3;
  const int64_t extras = ExtraLayerWeights(o, d, q, kv, head_dim);
  const int64_t per_layer = 2 * d + 2 * d * q + 2 * d * kv + 3 * d * ffn + extras;
  return per_layer * o.num_layers + (o.tie_embeddings ? 1 : 2) * d * vocab + d;
}

bool TinyLlamaUsesFastWeights(const TinyLlamaOptions& o) {
  return o.fast_weights || TinyLlamaWeightCount(o) > kTinyLlamaMaxOriginalWeights;
}

absl::StatusOr<TinyLlamaVocab> MakeTinyLlamaVocab(int num_merges) {
  if (num_merges < -1 || num_merges > kNumMerges) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_merges = ", num_merges, "; expected -1 (all) or 0..", kNumMerges));
  }
  if (num_merges == -1) num_merges = kNumMerges;
  TinyLlamaVocab v;
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(Utf8(ByteToCodepoint(static_cast<uint8_t>(b))));
    v.token_types.push_back(kTokenTypeNormal);
  }
  std::set<std::string> known(v.tokens.begin(), v.tokens.end());
  for (int i = 0; i < num_merges; ++i) {
    const auto& [left, right] = kMerges[i];
    // The table is static, so an inconsistency is a programmer error.
    SNAPFILL_CHECK(known.count(left) && known.count(right))
        << "merge " << i << " uses an unknown part";
    const std::string merged = absl::StrCat(left, right);
    SNAPFILL_CHECK(known.insert(merged).second) << "merge " << i << " repeats token " << merged;
    v.merges.push_back(absl::StrCat(left, " ", right));
    v.tokens.push_back(merged);
    v.token_types.push_back(kTokenTypeNormal);
  }
  auto add_special = [&](const char* text) {
    v.tokens.push_back(text);
    v.token_types.push_back(kTokenTypeControl);
    return static_cast<int32_t>(v.tokens.size() - 1);
  };
  v.bos_id = v.eos_id = add_special("<|endoftext|>");
  v.im_start_id = add_special("<|im_start|>");
  v.im_end_id = add_special("<|im_end|>");
  return v;
}

absl::Status ValidateTinyLlamaOptions(const TinyLlamaOptions& o) {
  auto positive = [](const char* field, int v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(field, " = ", v, "; expected > 0"));
  };
  if (o.architecture != "llama" && o.architecture != "qwen2" && o.architecture != "qwen3" &&
      o.architecture != "gemma3") {
    return absl::InvalidArgumentError(
        absl::StrCat("architecture = \"", o.architecture, "\"; expected llama, qwen2, qwen3 or gemma3"));
  }
  if (o.sliding_window < 0 || o.swa_pattern < 0 || ((o.sliding_window > 0 || o.swa_pattern > 0) &&
                                                    o.architecture != "gemma3")) {
    return absl::InvalidArgumentError(absl::StrCat("sliding_window = ", o.sliding_window, ", swa_pattern = ",
                                                   o.swa_pattern, "; expected >= 0, and set for gemma3 only"));
  }
  SNAPFILL_RETURN_IF_ERROR(positive("num_layers", o.num_layers));
  SNAPFILL_RETURN_IF_ERROR(positive("model_dim", o.model_dim));
  SNAPFILL_RETURN_IF_ERROR(positive("num_heads", o.num_heads));
  SNAPFILL_RETURN_IF_ERROR(positive("num_kv_heads", o.num_kv_heads));
  SNAPFILL_RETURN_IF_ERROR(positive("ffn_dim", o.ffn_dim));
  SNAPFILL_RETURN_IF_ERROR(positive("context_length", o.context_length));
  if (o.num_heads % o.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_heads = ", o.num_heads, " is not a multiple of num_kv_heads = ", o.num_kv_heads));
  }
  if (o.head_dim < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim = ", o.head_dim, "; expected > 0, or 0 for model_dim/num_heads"));
  }
  if (o.head_dim == 0 && o.model_dim % o.num_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model_dim = ", o.model_dim, " is not a multiple of num_heads = ", o.num_heads,
                     " (and head_dim is 0)"));
  }
  const int head_dim = HeadDim(o);
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim = ", head_dim, " is odd; RoPE rotates pairs of dimensions"));
  }
  if (o.num_merges < -1 || o.num_merges > kNumMerges) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_merges = ", o.num_merges, "; expected -1 (all) or 0..", kNumMerges));
  }
  if (!(o.rope_freq_base > 0.0f) || !(o.rms_norm_eps > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("rope_freq_base = ", o.rope_freq_base,
                                                   ", rms_norm_eps = ", o.rms_norm_eps,
                                                   "; both must be > 0"));
  }
  const int64_t d = o.model_dim;
  const int64_t q = int64_t{o.num_heads} * head_dim;
  const int64_t kv = int64_t{o.num_kv_heads} * head_dim;
  const int64_t ffn = o.ffn_dim;
  for (const auto& [field, type, row] : {std::tuple<const char*, GgmlType, int64_t>{"matrix_type", o.matrix_type, d},
                                         {"matrix_type", o.matrix_type, q},
                                         {"ffn_down_type", o.ffn_down_type, ffn}}) {
    const GgmlTypeTraits t = GetTypeTraits(type);
    if (type != GgmlType::kF32 && (t.name == nullptr || !IsSupportedWeightType(type) || row % t.block_size != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(field, " = ", t.name ? t.name : "?", ": not a weight type ",
                                                     "the builder writes, or rows of ", row, " elements are no ",
                                                     "whole number of its blocks"));
    }
  }
  if (o.matrix_type != GgmlType::kF32 && ffn % GetTypeTraits(o.matrix_type).block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("ffn_dim = ", ffn, " is no multiple of ",
                                                   GetTypeTraits(o.matrix_type).name, "'s block"));
  }
  if (d > kMaxDim || q > kMaxDim || ffn > kMaxDim || o.num_layers > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model_dim = ", d, ", num_heads * head_dim = ", q, ", ffn_dim = ", ffn,
        ", num_layers = ", o.num_layers, "; the tiny-model builder allows dimensions up to ",
        kMaxDim, " and up to 4096 layers"));
  }
  // With every dimension <= 2^20 and <= 4096 layers, these cannot overflow.
  const int64_t vocab = 256 + (o.num_merges < 0 ? kNumMerges : o.num_merges) + 3;
  const int64_t extras = ExtraLayerWeights(o, d, q, kv, head_dim);
  const int64_t per_layer = 2 * d + 2 * d * q + 2 * d * kv + 3 * d * ffn + extras;
  const int64_t total = per_layer * o.num_layers + (o.tie_embeddings ? 1 : 2) * d * vocab + d;
  if (total > kTinyLlamaMaxWeights) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model would have ", total,
                     " weights; the tiny-model builder allows at most ", kTinyLlamaMaxWeights));
  }
  if (o.num_threads < 0 || o.num_threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_threads = ", o.num_threads, "; expected 0 (all cores) .. 1024"));
  }
  return absl::OkStatus();
}

namespace {

// llama.cpp's llama_ftype for the file's matrices (general.file_type, which
// only names the file: llama-bench prints it; snapfill does not read it).
uint32_t FileType(const TinyLlamaOptions& opts) {
  if (opts.f16_matrices) return 1;
  const bool q6_down = opts.ffn_down_type == GgmlType::kQ6_K;
  switch (opts.matrix_type) {
    case GgmlType::kF16: return 1;
    case GgmlType::kQ4_0: return 2;
    case GgmlType::kQ4_1: return 3;
    case GgmlType::kQ8_0: return 7;
    case GgmlType::kQ5_0: return 8;
    case GgmlType::kQ5_1: return 9;
    case GgmlType::kQ4_K: return q6_down ? 15 : 14;  // Q4_K_M : Q4_K_S
    case GgmlType::kQ5_K: return q6_down ? 17 : 16;  // Q5_K_M : Q5_K_S
    case GgmlType::kQ6_K: return 18;
    case GgmlType::kBF16: return 32;
    default: return 0;  // F32
  }
}

// Fills `w` with the whole model.
absl::Status BuildTinyLlama(const TinyLlamaOptions& opts, GgufWriter& w) {
  SNAPFILL_RETURN_IF_ERROR(ValidateTinyLlamaOptions(opts));
  SNAPFILL_ASSIGN_OR_RETURN(const TinyLlamaVocab vocab, MakeTinyLlamaVocab(opts.num_merges));
  const int64_t d = opts.model_dim;
  const int64_t head_dim = HeadDim(opts);
  const int64_t q_dim = opts.num_heads * head_dim;
  const int64_t kv_dim = opts.num_kv_heads * head_dim;
  const int64_t ffn = opts.ffn_dim;
  const int64_t n_vocab = static_cast<int64_t>(vocab.tokens.size());

  Builder b(opts, w);
  // Keys in the order llama.cpp's convert_hf_to_gguf.py writes them.
  const std::string& a = opts.architecture;
  w.AddString("general.architecture", a);
  w.AddString("general.name", "snapfill-tiny-" + a);
  w.AddUint32("general.file_type", FileType(opts));
  w.AddUint32(a + ".vocab_size", static_cast<uint32_t>(n_vocab));
  w.AddUint32(a + ".context_length", static_cast<uint32_t>(opts.context_length));
  w.AddUint32(a + ".embedding_length", static_cast<uint32_t>(d));
  w.AddUint32(a + ".block_count", static_cast<uint32_t>(opts.num_layers));
  w.AddUint32(a + ".feed_forward_length", static_cast<uint32_t>(ffn));
  w.AddUint32(a + ".rope.dimension_count", static_cast<uint32_t>(head_dim));
  w.AddUint32(a + ".attention.head_count", static_cast<uint32_t>(opts.num_heads));
  w.AddUint32(a + ".attention.head_count_kv", static_cast<uint32_t>(opts.num_kv_heads));
  if (head_dim * opts.num_heads != d) {
    // llama.cpp assumes head_dim = embedding_length / head_count unless told.
    w.AddUint32(a + ".attention.key_length", static_cast<uint32_t>(head_dim));
    w.AddUint32(a + ".attention.value_length", static_cast<uint32_t>(head_dim));
  }
  w.AddFloat32(a + ".rope.freq_base", opts.rope_freq_base);
  if (opts.sliding_window > 0) w.AddUint32(a + ".attention.sliding_window", static_cast<uint32_t>(opts.sliding_window));
  if (opts.swa_pattern > 0) {
    w.AddUint32(a + ".attention.sliding_window_pattern", static_cast<uint32_t>(opts.swa_pattern));
  }
  w.AddFloat32(a + ".attention.layer_norm_rms_epsilon", opts.rms_norm_eps);
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddString("tokenizer.ggml.pre", "default");
  w.AddStringArray("tokenizer.ggml.tokens", vocab.tokens);
  w.AddInt32Array("tokenizer.ggml.token_type", vocab.token_types);
  w.AddStringArray("tokenizer.ggml.merges", vocab.merges);
  w.AddUint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(vocab.bos_id));
  w.AddUint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(vocab.eos_id));
  w.AddBool("tokenizer.ggml.add_bos_token", false);
  w.AddBool("tokenizer.ggml.add_space_prefix", false);
  w.AddString("tokenizer.chat_template", kChatTemplate);

  // Matrices get N(0, (0.5 / sqrt(fan_in))^2), so a projection of a unit-RMS
  // input has RMS about 0.5 and activations stay O(1) through the layers; the
  // embedding gets N(0, 0.1^2) (0.0625 for the default model_dim 64 matrices).
  auto scale = [](int64_t fan_in) { return 0.5 / std::sqrt(static_cast<double>(fan_in)); };
  const GgmlType mt = opts.matrix_type;
  const GgmlType dt = opts.ffn_down_type != GgmlType::kF32 ? opts.ffn_down_type : mt;
  SNAPFILL_RETURN_IF_ERROR(b.Matrix("token_embd.weight", d, n_vocab, 0.1, mt));
  for (int l = 0; l < opts.num_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    SNAPFILL_RETURN_IF_ERROR(b.Norm(p + "attn_norm.weight", d));
    SNAPFILL_RETURN_IF_ERROR(b.Matrix(p + "attn_q.weight", d, q_dim, scale(d), mt));
    SNAPFILL_RETURN_IF_ERROR(b.Matrix(p + "attn_k.weight", d, kv_dim, scale(d), mt));
    SNAPFILL_RETURN_IF_ERROR(b.Matrix(p + "attn_v.weight", d, kv_dim, scale(d), mt));
    if (opts.architecture == "qwen2") {
      SNAPFILL_RETURN_IF_ERROR(b.Bias(p + "attn_q.bias", q_dim));
      SNAPFILL_RETURN_IF_ERROR(b.Bias(p + "attn_k.bias", kv_dim));
      SNAPFILL_RETURN_IF_ERROR(b.Bias(p + "attn_v.bias", kv_dim));
    }
    const bool gemma3 = opts.architecture == "gemma3";
    if (opts.architecture == "qwen3" || gemma3) {
      SNAPFILL_RETURN_IF_ERROR(b.Norm(p + "attn_q_norm.weight", head_dim));
      SNAPFILL_RETURN_IF_ERROR(b.Norm(p + "attn_k_norm.weight", head_dim));
    }
    SNAPFILL_RETURN_IF_ERROR(b.Matrix(p + "attn_output.weight", q_dim, d, scale(q_dim), mt));
    if (gemma3) SNAPFILL_RETURN_IF_ERROR(b.Norm(p + "post_attention_norm.weight", d));
    SNAPFILL_RETURN_IF_ERROR(b.Norm(p + "ffn_norm.weight", d));
    SNAPFILL_RETURN_IF_ERROR(b.Matrix(p + "ffn_gate.weight", d, ffn, scale(d), mt));
    SNAPFILL_RETURN_IF_ERROR(b.Matrix(p + "ffn_up.weight", d, ffn, scale(d), mt));
    SNAPFILL_RETURN_IF_ERROR(b.Matrix(p + "ffn_down.weight", ffn, d, scale(ffn), dt));
    if (gemma3) SNAPFILL_RETURN_IF_ERROR(b.Norm(p + "post_ffw_norm.weight", d));
  }
  SNAPFILL_RETURN_IF_ERROR(b.Norm("output_norm.weight", d));
  if (!opts.tie_embeddings) {
    SNAPFILL_RETURN_IF_ERROR(b.Matrix("output.weight", d, n_vocab, scale(d), mt));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> MakeTinyLlamaGguf(const TinyLlamaOptions& opts) {
  GgufWriter w;
  SNAPFILL_RETURN_IF_ERROR(BuildTinyLlama(opts, w));
  return w.Serialize();
}

absl::Status WriteTinyLlamaGguf(const std::string& path, const TinyLlamaOptions& opts) {
  GgufWriter w;
  SNAPFILL_RETURN_IF_ERROR(BuildTinyLlama(opts, w));
  return w.WriteFile(path);
}

namespace tiny_llama {

uint16_t FloatToHalf(float x) {
  uint32_t f;
  std::memcpy(&f, &x, 4);
  const uint16_t sign = static_cast<uint16_t>((f >> 16) & 0x8000);
  const uint32_t a = f & 0x7FFFFFFF;
  if (a > 0x7F800000) {  // NaN: keep it quiet and keep the top payload bits
    return static_cast<uint16_t>(sign | 0x7E00 | ((a >> 13) & 0x3FF));
  }
  // 65520 = 65504 + half an ulp: it and everything above round to infinity
  // (the tie goes to the even neighbour, which is 2^16 = infinity).
  if (a >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);
  const uint32_t exp = a >> 23;  // biased by 127
  if (exp >= 113) {              // normal half: unbiased exponent >= -14
    // Rebias the exponent (127 -> 15) and drop 13 mantissa bits, rounding
    // to nearest even; a carry out of the mantissa bumps the exponent, which
    // is the right answer.
    const uint32_t h = ((exp - 112) << 10) | ((a >> 13) & 0x3FF);
    const uint32_t rest = a & 0x1FFF;
    const uint32_t round_up = rest > 0x1000 || (rest == 0x1000 && (h & 1));
    return static_cast<uint16_t>(sign | (h + round_up));
  }
  // Subnormal half (or zero): value / 2^-24 = mant * 2^(exp - 126) with the
  // implicit bit restored. At or below 2^-25 (half the smallest subnormal,
  // the tie rounding to the even 0) the result is zero.
  if (a <= 0x33000000) return sign;
  const uint32_t mant = (a & 0x7FFFFF) | 0x800000;
  const uint32_t shift = 126 - exp;  // 14..24 here
  const uint32_t h = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  const uint32_t round_up = rest > halfway || (rest == halfway && (h & 1));
  return static_cast<uint16_t>(sign | (h + round_up));  // may carry into the min normal
}

// F. Giesen's float_to_half_fast3_rtne, branch-free so that it vectorizes:
// both results are computed and one is selected. Normal halves: rebias and
// round the 13 dropped bits to even by adding 0xFFF plus the lowest kept bit
// (a carry into the exponent is right, up to infinity at 65520). Subnormal
// halves and zero (|x| < 2^-14): |x| + 0.5 in float rounds |x| to the nearest
// multiple of 2^-24 (ties to even) in its low mantissa bits. NaN is not
// handled (it gives infinity); the generator never makes one.
void FloatToHalfRow(const float* x, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t a = u & 0x7FFFFFFFu;
    const uint32_t normal = (a - 0x38000000u + 0xFFFu + ((a >> 13) & 1u)) >> 13;
    float fa;
    std::memcpy(&fa, &a, 4);
    const float t = fa + 0.5f;
    uint32_t tb;
    std::memcpy(&tb, &t, 4);
    const uint32_t sub = tb - 0x3F000000u;
    uint32_t h = a < 0x38800000u ? sub : normal;
    h = a >= 0x47800000u ? 0x7C00u : h;
    out[i] = static_cast<uint16_t>(sign | h);
  }
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  uint32_t f;
  if (exp == 0x1F) {
    f = sign | 0x7F800000 | (mant << 13);
  } else if (exp != 0) {
    f = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    f = sign;
  } else {
    // Subnormal: mant * 2^-24 is exact in float.
    const float v = static_cast<float>(mant) * 0x1p-24f;
    std::memcpy(&f, &v, 4);
    f |= sign;
  }
  float out;
  std::memcpy(&out, &f, 4);
  return out;
}

}  // namespace tiny_llama
}  // namespace snapfill
