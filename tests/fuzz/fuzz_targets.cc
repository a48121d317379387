#include "tests/fuzz/fuzz_targets.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "snapfill/dtype.h"
#include "snapfill/schedule.h"
#include "snapfill/status.h"
#include "src/gguf/gguf_reader.h"
#include "src/kv/cache_file.h"
#include "src/kv/checkpoint_file.h"
#include "src/kv/kv_cache.h"
#include "src/model/llama_model.h"
#include "tools/testmodel/tiny_llama.h"
#include "src/tokenizer/tokenizer.h"

namespace snapfill::fuzz {
namespace {

// Every refusal must carry a message: the project's rule is that bad input
// returns a Status naming what was found and what was expected.
void CheckRefusal(const absl::Status& s) {
  SNAPFILL_CHECK(!s.ok());
  SNAPFILL_CHECK(!s.message().empty()) << "refusal without a message: code " << s.code();
}

bool Inside(const void* p, uint64_t n, std::string_view bytes) {
  const auto* b = reinterpret_cast<const uint8_t*>(bytes.data());
  const auto* q = static_cast<const uint8_t*>(p);
  return q >= b && q <= b + bytes.size() && n <= static_cast<uint64_t>(b + bytes.size() - q);
}

// ---------------------------------------------------------------------------
// Scratch files for the writers (SaveCacheFile / SaveCheckpointFile take a
// path). tmpfs when available: the writers fsync, which is free there.

std::string ScratchPath(std::string_view stem) {
  static const std::string dir = [] {
    const char* base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    return std::string(base);
  }();
  return dir + "/snapfill_fuzz_" + std::to_string(getpid()) + "_" + std::string(stem);
}

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Overwrites the u64 trailer with the XXH3-64 of the bytes before it.
void FixTrailer(std::string& bytes) {
  if (bytes.size() < 8) return;
  const uint64_t h = XXH3_64bits(bytes.data(), bytes.size() - 8);
  std::memcpy(bytes.data() + bytes.size() - 8, &h, 8);
}

// Same valid entries (K, V, positions bit for bit), same shape.
void CheckSameKv(const KvCache& a, const KvCache& b) {
  SNAPFILL_CHECK(a.shape().num_layers == b.shape().num_layers);
  SNAPFILL_CHECK(a.shape().num_kv_heads == b.shape().num_kv_heads);
  SNAPFILL_CHECK(a.shape().head_dim == b.shape().head_dim);
  const int64_t d = a.shape().head_dim;
  for (int64_t l = 0; l < a.shape().num_layers; ++l) {
    SNAPFILL_CHECK(a.size(l) == b.size(l)) << "layer " << l;
    const size_t n = static_cast<size_t>(a.size(l));
    for (int64_t h = 0; h < a.shape().num_kv_heads; ++h) {
      SNAPFILL_CHECK(std::memcmp(a.k(l, h), b.k(l, h), n * d * sizeof(float)) == 0);
      SNAPFILL_CHECK(std::memcmp(a.v(l, h), b.v(l, h), n * d * sizeof(float)) == 0);
      SNAPFILL_CHECK(std::memcmp(a.pos(l, h), b.pos(l, h), n * sizeof(int32_t)) == 0);
    }
  }
}

// What every successfully loaded KV file guarantees (cache_file.h).
void CheckKvContents(const KvCache& kv, int64_t extra_capacity) {
  const KvCacheShape& s = kv.shape();
  SNAPFILL_CHECK(s.num_layers >= 1 && static_cast<uint64_t>(s.num_layers) <= kMaxCacheLayers);
  SNAPFILL_CHECK(s.num_kv_heads >= 1 && static_cast<uint64_t>(s.num_kv_heads) <= kMaxCacheKvHeads);
  SNAPFILL_CHECK(s.head_dim >= 1 && static_cast<uint64_t>(s.head_dim) <= kMaxCacheHeadDim);
  SNAPFILL_CHECK(kv.capacity() >= 1);
  SNAPFILL_CHECK(kv.capacity() == std::max<int64_t>(1, kv.max_size() + extra_capacity))
      << "capacity " << kv.capacity() << " max size " << kv.max_size() << " extra "
      << extra_capacity;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    SNAPFILL_CHECK(kv.size(l) >= 0 && kv.size(l) <= kv.capacity());
    for (int64_t h = 0; h < s.num_kv_heads; ++h) {
      const int32_t* pos = kv.pos(l, h);
      for (int64_t i = 0; i < kv.size(l); ++i) SNAPFILL_CHECK(pos[i] >= 0);
    }
  }
}

// ---------------------------------------------------------------------------
// GGUF reader.

void CheckGgufFile(const GgufFile& f, std::string_view input) {
  SNAPFILL_CHECK(f.file_size() == input.size());
  SNAPFILL_CHECK(f.bytes() == input);
  SNAPFILL_CHECK(f.version() == 2 || f.version() == 3);
  const uint64_t align = f.alignment();
  SNAPFILL_CHECK(align != 0 && (align & (align - 1)) == 0 && align <= (uint64_t{1} << 30));

  for (const GgufKv& kv : f.metadata()) {
    SNAPFILL_CHECK(f.Find(kv.key) == &kv.value) << "key '" << kv.key << "' not found again";
    const GgufValue& v = kv.value;
    // Every typed getter either converts or refuses with a message; none
    // may accept a type the header says it refuses.
    auto s = f.GetString(kv.key);
    SNAPFILL_CHECK(s.ok() == (v.type == GgufValueType::kString));
    auto b = f.GetBool(kv.key);
    SNAPFILL_CHECK(b.ok() == (v.type == GgufValueType::kBool));
    auto u = f.GetUint(kv.key);
    if (u.ok()) SNAPFILL_CHECK(IsGgufUnsigned(v.type) || IsGgufSigned(v.type));
    auto i = f.GetInt(kv.key);
    if (i.ok()) SNAPFILL_CHECK(IsGgufUnsigned(v.type) || IsGgufSigned(v.type));
    if (u.ok() && i.ok()) SNAPFILL_CHECK(*u == static_cast<uint64_t>(*i));
    auto d = f.GetFloat(kv.key);
    SNAPFILL_CHECK(d.ok() == (IsGgufFloat(v.type) || IsGgufUnsigned(v.type) || IsGgufSigned(v.type)));
    if (v.type == GgufValueType::kArray) {
      auto sa = f.GetStringArray(kv.key);
      if (sa.ok()) SNAPFILL_CHECK(sa->size() == v.size());
      auto fa = f.GetFloatArray(kv.key);
      if (fa.ok()) SNAPFILL_CHECK(fa->size() == v.size());
      auto ia = f.GetIntArray(kv.key);
      if (ia.ok()) SNAPFILL_CHECK(ia->size() == v.size());
      // Each array element took at least one byte of the file.
      SNAPFILL_CHECK(v.size() <= input.size());
    } else {
      SNAPFILL_CHECK(v.size() == 1);
    }
  }

  // Tensors: views into the file, inside it, aligned, disjoint.
  std::vector<std::pair<const uint8_t*, uint64_t>> ranges;
  const uint64_t mem_align = std::min<uint64_t>(align, 64);
  for (const GgufTensorInfo& t : f.tensors()) {
    SNAPFILL_CHECK(f.FindTensor(t.name) == &t) << "tensor '" << t.name << "' not found again";
    const GgmlTypeTraits traits = GetTypeTraits(t.type);
    SNAPFILL_CHECK(traits.name != nullptr);
    SNAPFILL_CHECK(!t.shape.empty() && t.shape.size() <= 4);
    unsigned __int128 bytes = 1;
    for (size_t dim = 0; dim < t.shape.size(); ++dim) {
      SNAPFILL_CHECK(t.shape[dim] > 0);
      if (dim == 0) {
        SNAPFILL_CHECK(t.shape[0] % traits.block_size == 0);
        bytes = static_cast<unsigned __int128>(t.shape[0] / traits.block_size) * traits.type_size;
      } else {
        bytes *= static_cast<uint64_t>(t.shape[dim]);
      }
    }
    SNAPFILL_CHECK(bytes == t.size_bytes) << "tensor " << t.name;
    SNAPFILL_CHECK(t.offset % align == 0);
    SNAPFILL_CHECK(Inside(t.data, t.size_bytes, f.bytes())) << "tensor " << t.name;
    SNAPFILL_CHECK(reinterpret_cast<uintptr_t>(t.data) % mem_align == 0) << "tensor " << t.name;
    ranges.emplace_back(t.data, t.size_bytes);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t k = 1; k < ranges.size(); ++k) {
    SNAPFILL_CHECK(ranges[k - 1].first + ranges[k - 1].second <= ranges[k].first)
        << "overlapping tensors";
  }
}

void CheckTokenizerBasics(const Tokenizer& tok) {
  const int32_t n = tok.vocab_size();
  SNAPFILL_CHECK(n > 0);
  for (int32_t id : {tok.bos_id(), tok.eos_id(), tok.eot_id(), tok.unk_id(), tok.pad_id()}) {
    SNAPFILL_CHECK(id == kNoToken || (id >= 0 && id < n)) << "special id " << id << " of " << n;
  }
  if (tok.add_bos()) SNAPFILL_CHECK(tok.bos_id() != kNoToken);
  // Texts with every kind of piece the pre-tokenizers split: words,
  // numbers, punctuation, spaces, newlines, multi-byte and invalid UTF-8.
  static const char* const kTexts[] = {
      "Hello world, it's 2024!\n\n  x", "\xC3\xA9t\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80",
      "\xFF\xFE\xC3 <|im_start|>user\n", "    \t\r\n 123456789 'll 've"};
  for (const char* text : kTexts) {
    for (int flags = 0; flags < 4; ++flags) {
      const std::vector<int32_t> ids = tok.Encode(text, flags & 1, flags & 2);
      for (int32_t id : ids) SNAPFILL_CHECK(id >= 0 && id < n) << "id " << id << " of " << n;
      (void)tok.Decode(ids, flags & 1);
    }
  }
  // Every token renders (tokens of a fuzzed vocabulary are arbitrary bytes).
  const int32_t limit = std::min<int32_t>(n, 4096);
  for (int32_t id = 0; id < limit; ++id) {
    (void)tok.TokenToPiece(id, true);
    (void)tok.IsEndOfGeneration(id);
    SNAPFILL_CHECK(tok.TextToToken(tok.TokenText(id)) != kNoToken);
  }
  SNAPFILL_CHECK(tok.TokenToPiece(-1).empty() && tok.TokenToPiece(n).empty());
}

void CheckModel(const LlamaModel& m) {
  const LlamaConfig& c = m.config();
  SNAPFILL_CHECK(c.num_layers > 0 && c.model_dim > 0 && c.ffn_dim > 0 && c.num_heads > 0);
  SNAPFILL_CHECK(c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0);
  SNAPFILL_CHECK(c.head_dim > 0 && c.rope_dim > 0 && c.rope_dim <= c.head_dim && c.rope_dim % 2 == 0);
  SNAPFILL_CHECK(c.vocab_size > 0 && c.context_length > 0);
  SNAPFILL_CHECK(std::isfinite(c.rope_freq_base) && c.rope_freq_base > 1.0f);
  SNAPFILL_CHECK(c.rms_eps > 0.0f && c.rms_eps <= 1.0f);
  const std::string_view file = m.gguf().bytes();
  auto check_matrix = [&](const WeightView& w, int64_t rows, int64_t cols) {
    SNAPFILL_CHECK(w.rows == rows && w.cols == cols);
    SNAPFILL_CHECK(static_cast<int64_t>(w.row_bytes) == RowBytes(w.type, cols));
    SNAPFILL_CHECK(IsSupportedWeightType(w.type));
    SNAPFILL_CHECK(Inside(w.data, static_cast<uint64_t>(rows) * w.row_bytes, file));
  };
  // The norms' weights are copies the model owns: all n of them readable
  // (a short copy is an overflow under the sanitizers).
  auto check_vector = [&](const float* p, int64_t n) {
    SNAPFILL_CHECK(p != nullptr && !Inside(p, 1, file));
    volatile float sum = 0;
    for (int64_t i = 0; i < n; ++i) sum = sum + p[i];
  };
  check_matrix(m.token_embd(), c.vocab_size, c.model_dim);
  check_matrix(m.output(), c.vocab_size, c.model_dim);
  check_vector(m.output_norm(), c.model_dim);
  const int64_t q = c.num_heads * c.head_dim;
  const int64_t kvd = c.num_kv_heads * c.head_dim;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const LlamaLayerWeights& l = m.layer(i);
    check_vector(l.attn_norm, c.model_dim);
    check_vector(l.ffn_norm, c.model_dim);
    check_matrix(l.wq, q, c.model_dim);
    check_matrix(l.wk, kvd, c.model_dim);
    check_matrix(l.wv, kvd, c.model_dim);
    check_matrix(l.wo, c.model_dim, q);
    check_matrix(l.w_gate, c.ffn_dim, c.model_dim);
    check_matrix(l.w_up, c.ffn_dim, c.model_dim);
    check_matrix(l.w_down, c.model_dim, c.ffn_dim);
  }
  SNAPFILL_CHECK(m.weight_bytes() <= file.size());
}

// ---------------------------------------------------------------------------
// Tokenizer vocabularies, built once.

const Tokenizer& TinyBpeTokenizer() {
  static const Tokenizer* tok = [] {
    TinyLlamaOptions o;
    o.num_layers = 1;
    o.model_dim = 8;
    o.num_heads = 2;
    o.num_kv_heads = 1;
    o.ffn_dim = 16;
    auto bytes = MakeTinyLlamaGguf(o);
    SNAPFILL_CHECK(bytes.ok()) << bytes.status();
    auto file = GgufFile::FromBytes(std::move(*bytes));
    SNAPFILL_CHECK(file.ok()) << file.status();
    auto t = Tokenizer::FromGguf(**file);
    SNAPFILL_CHECK(t.ok()) << t.status();
    return t->release();
  }();
  return *tok;
}

// A SentencePiece vocabulary shaped like Llama 2's: <unk>, <s>, </s>, the
// 256 byte tokens, single characters, and merges of "hello world".
Vocab SmallSpmVocab() {
  Vocab v;
  v.model = TokenizerModel::kSpm;
  auto add = [&](const std::string& t, float score, int type) {
    v.tokens.push_back(t);
    v.scores.push_back(score);
    v.token_types.push_back(type);
  };
  add("<unk>", 0, 2);
  add("<s>", 0, 3);
  add("</s>", 0, 3);
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    add(buf, 0, 6);
  }
  const std::string sp = "\xE2\x96\x81";
  for (const char* c : {"h", "e", "l", "o", "w", "r", "d", "a", "\xC3\xA9"}) add(c, -10, 1);
  add(sp, -10, 1);
  add("he", -1, 1);
  add("ll", -2, 1);
  add(sp + "w", -3, 1);
  add("or", -4, 1);
  add("ld", -5, 1);
  add("hell", -0.5f, 1);
  add("hello", -0.4f, 1);
  add(sp + "hello", -0.1f, 1);
  add(sp + "wor", -0.6f, 1);
  add(sp + "world", -0.2f, 1);
  add("aa", -1, 1);
  add(sp + sp, -2, 1);
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  return v;
}

const Tokenizer& SmallSpmTokenizer() {
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::FromVocab(SmallSpmVocab());
    SNAPFILL_CHECK(t.ok()) << t.status();
    return t->release();
  }();
  return *tok;
}

// ---------------------------------------------------------------------------
// Schedule planner input.

class ByteSource {
 public:
  ByteSource(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint32_t U32() {
    uint32_t x = 0;
    for (int i = 0; i < 4; ++i) x |= static_cast<uint32_t>(U8()) << (8 * i);
    return x;
  }
  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  // A value in [lo, hi] (inclusive).
  int64_t Range(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    return lo + static_cast<int64_t>(U32() % span);
  }
  bool empty() const { return pos_ >= size_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Decodes a configuration that is usually valid but reaches every refusal:
// each field's range includes values just outside what PlanSchedule accepts.
ScheduleConfig DecodeScheduleConfig(ByteSource& in) {
  ScheduleConfig c;
  const uint8_t kind = in.U8();
  c.kind = static_cast<ScheduleKind>(kind % 3);
  c.growth = static_cast<Growth>((kind / 3) % 5);
  const uint8_t scale = in.U8();
  c.window = in.Range(-1, 96);
  c.chunk = in.Range(-1, 4096);
  c.memory = in.Range(-1, 8192);
  c.first_memory = (scale & 1) ? in.Range(-1, c.memory + 1) : 0;
  c.total_tokens = in.Range(-1, 1 << 16);
  c.num_layers = in.Range(0, 40);
  c.sink_tokens = (scale & 2) ? in.Range(-1, 64) : 0;
  c.max_position = (scale & 4) ? in.Range(-1, 1 << 16) : 0;
  // Scale up to long inputs and large sizes (the 1M-token runs) without
  // making every plan long.
  const int shift = (scale >> 3) & 7;  // 0..7
  if (shift > 0) {
    c.total_tokens <<= 2 * shift;  // up to 2^30
    if (scale & 0x40) c.chunk <<= shift;
    if (scale & 0x80) c.memory <<= shift;
    if (scale & 0x80 && c.first_memory > 0) c.first_memory <<= shift;
  }
  return c;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Plans of more than this many budgets (steps × layers) are legal (the
// planner allows 2^26) but take seconds under ASan; the fuzzer skips them,
// for the configuration it decodes and for the retries of suggestions.
constexpr int64_t kMaxFuzzPlanBudgets = int64_t{1} << 17;

bool TooLargeToFuzz(const ScheduleConfig& c) {
  if (c.total_tokens <= 0 || c.chunk <= 0 || c.num_layers <= 0) return false;
  const int64_t entries = CeilDiv(c.total_tokens, c.chunk) * c.num_layers;
  return entries > kMaxFuzzPlanBudgets && entries <= (int64_t{1} << 26);
}

// Finds "<flag> <op> <number>" in a refusal and returns the number (-1 if absent).
int64_t SuggestedValue(std::string_view msg, std::string_view prefix) {
  const size_t at = msg.find(prefix);
  if (at == std::string_view::npos) return -1;
  int64_t v = 0;
  size_t i = at + prefix.size();
  if (i >= msg.size() || msg[i] < '0' || msg[i] > '9') return -1;
  for (; i < msg.size() && msg[i] >= '0' && msg[i] <= '9'; ++i) v = v * 10 + (msg[i] - '0');
  return v;
}

void CheckPlan(const ScheduleConfig& given, const SchedulePlan& plan) {
  const ScheduleConfig& c = plan.config;
  const int64_t n = static_cast<int64_t>(plan.steps.size());
  const int64_t big_n = given.num_layers;
  const int64_t w = given.window;
  const int64_t s = given.sink_tokens;
  SNAPFILL_CHECK(n >= 1);
  if (given.total_tokens <= w) {
    // An input no longer than the window is read in one chunk and kept
    // whole (PlanSchedule), with a warning.
    SNAPFILL_CHECK(n == 1 && plan.steps[0].start_token == 0 &&
                   plan.steps[0].chunk_tokens == given.total_tokens);
    SNAPFILL_CHECK(static_cast<int64_t>(plan.steps[0].budget.size()) == big_n);
    for (int64_t b : plan.steps[0].budget) SNAPFILL_CHECK(b == given.total_tokens);
    SNAPFILL_CHECK(plan.steps[0].attention_length == given.total_tokens);
    SNAPFILL_CHECK(plan.peak_attention_length == given.total_tokens &&
                   plan.max_chunk_tokens == given.total_tokens);
    SNAPFILL_CHECK(!plan.warnings.empty());
    SNAPFILL_CHECK(FormatPlan(plan).find("summary: ") != std::string::npos);
    return;
  }
  SNAPFILL_CHECK(c.total_tokens == given.total_tokens && c.chunk == given.chunk &&
                 c.memory == given.memory && c.window == w && c.num_layers == big_n &&
                 c.kind == given.kind && c.sink_tokens == s);
  SNAPFILL_CHECK(plan.adaptive == (given.kind != ScheduleKind::kFixed &&
                                   given.growth == Growth::kAdaptive));
  // m0 as resolved: the given one, or max(w, ⌊m_max / n⌋); m_max for FM or one step.
  if (given.kind == ScheduleKind::kFixed || n == 1) {
    SNAPFILL_CHECK(c.first_memory == given.memory);
  } else if (given.first_memory > 0) {
    SNAPFILL_CHECK(c.first_memory == given.first_memory);
  }
  SNAPFILL_CHECK(c.first_memory >= w && c.first_memory <= given.memory)
      << "first memory " << c.first_memory;

  // Every token exactly once, in order; chunks longer than the window; the
  // first holds the sinks and the window.
  int64_t next = 0;
  int64_t max_chunk = 0;
  int64_t peak_attention = 0;
  double memory_sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const ScheduleStep& step = plan.steps[i];
    SNAPFILL_CHECK(step.start_token == next) << "step " << i;
    SNAPFILL_CHECK(step.chunk_tokens > w) << "step " << i << " chunk " << step.chunk_tokens;
    if (i == 0) SNAPFILL_CHECK(step.chunk_tokens >= s + w);
    next += step.chunk_tokens;
    max_chunk = std::max(max_chunk, step.chunk_tokens);
    SNAPFILL_CHECK(static_cast<int64_t>(step.budget.size()) == big_n) << "step " << i;
    for (int64_t l = 0; l < big_n; ++l) {
      const int64_t b = step.budget[l];
      SNAPFILL_CHECK(b >= w && b <= given.memory) << "step " << i << " layer " << l << " " << b;
      if (given.kind == ScheduleKind::kFixed) SNAPFILL_CHECK(b == given.memory);
      if (i > 0) {
        SNAPFILL_CHECK(b >= plan.steps[i - 1].budget[l]) << "memory shrinks at step " << i;
      } else if (n > 1) {
        SNAPFILL_CHECK(b == c.first_memory) << "layer " << l;
      }
      if (i + 1 < n || n == 1) memory_sum += static_cast<double>(b);
    }
    // Keys read: the chunk, plus (after step 0) sinks and the previous
    // memories, which never exceed their budgets.
    int64_t prev_max = 0;
    if (i > 0) {
      prev_max = *std::max_element(plan.steps[i - 1].budget.begin(), plan.steps[i - 1].budget.end());
    }
    const int64_t bound = i == 0 ? step.chunk_tokens : s + prev_max + step.chunk_tokens;
    SNAPFILL_CHECK(step.attention_length >= step.chunk_tokens && step.attention_length <= bound)
        << "step " << i << " attention " << step.attention_length << " bound " << bound;
    peak_attention = std::max(peak_attention, step.attention_length);
  }
  SNAPFILL_CHECK(next == given.total_tokens) << "chunks cover " << next;
  for (int64_t l = 0; l < big_n; ++l) SNAPFILL_CHECK(plan.steps.back().budget[l] == given.memory);
  SNAPFILL_CHECK(plan.max_chunk_tokens == max_chunk);
  SNAPFILL_CHECK(plan.peak_attention_length == peak_attention);
  const double m_hat = memory_sum / static_cast<double>(std::max<int64_t>(n - 1, 1) * big_n);
  SNAPFILL_CHECK(std::fabs(plan.mean_memory - m_hat) <= 1e-9 * std::max(1.0, m_hat));
  // Live KV slots: at least one chunk, at most every memory at its budget
  // plus one chunk and every layer's sinks.
  SNAPFILL_CHECK(plan.peak_kv_slots >= max_chunk);
  SNAPFILL_CHECK(plan.peak_kv_slots <= big_n * (given.memory + s) + max_chunk)
      << "peak kv " << plan.peak_kv_slots;

  // Chunk counts (schedule.h "Rounding"): IMDC has ⌈L/c⌉; FM/IM the same,
  // minus one when a tail at or below the window joins the chunk before it.
  const int64_t ref_n = CeilDiv(given.total_tokens, given.chunk);
  if (given.kind == ScheduleKind::kIncrementalDecremental) {
    SNAPFILL_CHECK(n == ref_n) << n << " steps, expected " << ref_n;
    // Peak attention: A or A + 1 (plus sinks), A = ⌊c̄ + m̂⌋ — never more
    // than FM's s + m_max + c with the same flags.
    SNAPFILL_CHECK(plan.peak_attention_length <= s + given.memory + given.chunk)
        << "IMDC peak " << plan.peak_attention_length;
  } else {
    const int64_t tail = given.total_tokens - (ref_n - 1) * given.chunk;
    const bool merged = ref_n > 1 && tail <= w;
    SNAPFILL_CHECK(n == (merged ? ref_n - 1 : ref_n));
    for (int64_t i = 0; i + 1 < n; ++i) SNAPFILL_CHECK(plan.steps[i].chunk_tokens == given.chunk);
  }

  const std::string table = FormatPlan(plan, static_cast<int>(n % 7) * 5);
  SNAPFILL_CHECK(table.find("summary: ") != std::string::npos);
  for (const std::string& warning : plan.warnings) {
    SNAPFILL_CHECK(table.find(warning) != std::string::npos);
  }
}

}  // namespace

// ---------------------------------------------------------------------------

int FuzzGgufReader(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  auto file_or = GgufFile::FromBytes(std::string(input));
  if (!file_or.ok()) {
    CheckRefusal(file_or.status());
    return 0;
  }
  std::unique_ptr<GgufFile> file = std::move(*file_or);
  CheckGgufFile(*file, input);

  auto tok = Tokenizer::FromGguf(*file);
  if (tok.ok()) {
    CheckTokenizerBasics(**tok);
  } else {
    CheckRefusal(tok.status());
  }
  auto model = LlamaModel::Load(std::move(file));
  if (model.ok()) {
    CheckModel(**model);
  } else {
    CheckRefusal(model.status());
  }
  return 0;
}

int FuzzTokenizer(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const bool add_special = flags & 1;
  const bool parse_special = flags & 2;
  const bool spm = flags & 4;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const Tokenizer& tok = spm ? SmallSpmTokenizer() : TinyBpeTokenizer();
  const std::vector<int32_t> ids = tok.Encode(text, add_special, parse_special);
  const int32_t n = tok.vocab_size();
  for (int32_t id : ids) SNAPFILL_CHECK(id >= 0 && id < n) << "id " << id << " of " << n;

  // BOS / EOS exactly where the vocabulary asks for them.
  size_t begin = 0;
  size_t end = ids.size();
  if (add_special && tok.add_bos()) {
    SNAPFILL_CHECK(!ids.empty() && ids.front() == tok.bos_id());
    ++begin;
  }
  if (add_special && tok.add_eos()) {
    SNAPFILL_CHECK(end > begin && ids.back() == tok.eos_id());
    --end;
  }
  const std::vector<int32_t> body(ids.begin() + begin, ids.begin() + end);
  if (text.empty()) SNAPFILL_CHECK(body.empty());

  // Round trip (tokenizer.h): both vocabularies have a token for every
  // byte, so every input comes back byte for byte.
  //  - Byte-level BPE: the pieces concatenate to the input; with
  //    parse_special, control tokens render as their text.
  //  - SentencePiece without parse_special: Decode drops the space prefix
  //    Encode added. Not for inputs holding U+2581 itself, which SPM's space
  //    escape maps to a space (irreversible by design, as in SentencePiece),
  //    and not with parse_special, which re-adds a prefix after each special
  //    token as llama.cpp does.
  if (!spm) {
    std::string joined;
    for (int32_t id : body) joined += tok.TokenToPiece(id, parse_special);
    SNAPFILL_CHECK(joined == text) << "BPE round trip lost bytes";
  } else if (!parse_special && text.find("\xE2\x96\x81") == std::string_view::npos) {
    SNAPFILL_CHECK(tok.Decode(body) == text) << "SPM round trip lost bytes";
  }
  // Encoding is a function of the text: the same call gives the same ids.
  SNAPFILL_CHECK(tok.Encode(text, add_special, parse_special) == ids);
  return 0;
}

int FuzzCacheFile(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool fix_trailer = data[0] & 1;
  // Small on purpose: the loader allocates (largest layer + extra) entries
  // of every layer and head, so a large request multiplied by a file's
  // (legal) wide shape is the caller's allocation, not the parser's.
  const int64_t extra_capacity = (data[0] >> 1) & 3;
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if (fix_trailer) FixTrailer(bytes);
  auto cache = ParseCacheFile(bytes, "fuzz", "", extra_capacity);
  if (!cache.ok()) {
    CheckRefusal(cache.status());
    return 0;
  }
  SNAPFILL_CHECK(cache->kv != nullptr);
  SNAPFILL_CHECK(cache->next_position >= 0 && cache->input_tokens >= 0);
  CheckKvContents(*cache->kv, extra_capacity);
  // A fingerprint other than the stored one is refused.
  auto other = ParseCacheFile(bytes, "fuzz", cache->model_fingerprint + "x", extra_capacity);
  SNAPFILL_CHECK(!other.ok() && other.status().code() == absl::StatusCode::kFailedPrecondition);

  // What loads saves back to the same bytes (the format has one encoding).
  const std::string path = ScratchPath("cache");
  const absl::Status saved = SaveCacheFile(path, *cache, /*overwrite=*/true);
  SNAPFILL_CHECK(saved.ok()) << "a loaded cache does not save: " << saved;
  const std::string again = ReadFileBytes(path);
  std::remove(path.c_str());
  SNAPFILL_CHECK(again == bytes) << "re-saved cache differs from the file it was loaded from";
  return 0;
}

int FuzzCheckpointFile(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool fix_trailer = data[0] & 1;
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if (fix_trailer) FixTrailer(bytes);
  auto ck = ParseCheckpointFile(bytes, "fuzz");
  if (!ck.ok()) {
    CheckRefusal(ck.status());
    return 0;
  }
  const CheckpointState& s = ck->state;
  SNAPFILL_CHECK(ck->memory != nullptr);
  CheckKvContents(*ck->memory, 0);
  SNAPFILL_CHECK(s.steps_done >= 1 && s.steps_done < s.total_steps);
  SNAPFILL_CHECK(s.threads >= 1);
  SNAPFILL_CHECK(s.next_token >= 0 && s.next_token <= s.input_tokens);
  SNAPFILL_CHECK(static_cast<int64_t>(s.retention.size()) == ck->memory->shape().num_layers);
  for (double r : s.retention) SNAPFILL_CHECK(r >= 0.0 && r <= 1.0);
  SNAPFILL_CHECK(s.config.find('\n') == std::string::npos);
  // A checkpoint always fits the run it describes.
  std::string warning = "unset";
  SNAPFILL_CHECK(CheckpointMismatch(s, s, "fuzz", &warning).ok());
  SNAPFILL_CHECK(warning.empty());

  // Save, parse again: the same state and memory, and saving that gives the
  // same bytes (numbers may be spelled differently in the input, e.g. hex
  // digits in upper case, so only the re-saved file is canonical).
  const std::string path = ScratchPath("checkpoint");
  absl::Status saved = SaveCheckpointFile(path, s, *ck->memory);
  SNAPFILL_CHECK(saved.ok()) << "a loaded checkpoint does not save: " << saved;
  const std::string first = ReadFileBytes(path);
  auto again = ParseCheckpointFile(first, "fuzz-resaved");
  SNAPFILL_CHECK(again.ok()) << again.status();
  const CheckpointState& t = again->state;
  SNAPFILL_CHECK(t.model_fingerprint == s.model_fingerprint && t.config == s.config &&
                 t.input_digest == s.input_digest && t.input_tokens == s.input_tokens &&
                 t.plan_digest == s.plan_digest && t.threads == s.threads &&
                 t.steps_done == s.steps_done && t.total_steps == s.total_steps &&
                 t.next_token == s.next_token);
  SNAPFILL_CHECK(t.retention.size() == s.retention.size());
  for (size_t i = 0; i < s.retention.size(); ++i) {
    SNAPFILL_CHECK(std::memcmp(&t.retention[i], &s.retention[i], sizeof(double)) == 0)
        << "retention " << i << " does not round-trip: " << s.retention[i] << " vs "
        << t.retention[i];
  }
  CheckSameKv(*ck->memory, *again->memory);
  saved = SaveCheckpointFile(path, t, *again->memory);
  SNAPFILL_CHECK(saved.ok()) << saved;
  const std::string second = ReadFileBytes(path);
  std::remove(path.c_str());
  SNAPFILL_CHECK(first == second) << "checkpoint encoding is not canonical";
  return 0;
}

int FuzzSchedulePlanner(const uint8_t* data, size_t size) {
  ByteSource in(data, size);
  const ScheduleConfig config = DecodeScheduleConfig(in);
  if (std::getenv("SNAPFILL_FUZZ_VERBOSE") != nullptr) {
    std::fprintf(stderr,
                 "config: kind=%s growth=%s L=%lld c=%lld m=%lld m0=%lld w=%lld N=%lld s=%lld "
                 "max_position=%lld\n",
                 std::string(ScheduleKindName(config.kind)).c_str(),
                 std::string(GrowthName(config.growth)).c_str(), (long long)config.total_tokens,
                 (long long)config.chunk, (long long)config.memory, (long long)config.first_memory,
                 (long long)config.window, (long long)config.num_layers,
                 (long long)config.sink_tokens, (long long)config.max_position);
  }
  // The planner's own limit (2^26 budgets, refused quickly) is still reached.
  if (TooLargeToFuzz(config)) return 0;
  auto plan = PlanSchedule(config);
  if (!plan.ok()) {
    CheckRefusal(plan.status());
    SNAPFILL_CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument) << plan.status();
    // IMDC refusals name a --chunk / --memory that works (schedule.h): try
    // it. (Validation's "--chunk must be > --window" suggests only the
    // bound that validation checks; IMDC's shrinking chunks may need more,
    // which the next refusal names. So only the IMDC refusals are held to
    // a value that works.)
    const std::string msg(plan.status().message());
    if (config.kind == ScheduleKind::kIncrementalDecremental && msg.rfind("IMDC with", 0) == 0) {
      const int64_t chunk = SuggestedValue(msg, "use --chunk >= ");
      if (chunk > 0) {
        ScheduleConfig fixed = config;
        fixed.chunk = chunk;
        if (!TooLargeToFuzz(fixed)) {
          auto retry = PlanSchedule(fixed);
          SNAPFILL_CHECK(retry.ok()) << "suggested --chunk=" << chunk << " fails: " << retry.status();
        }
      }
      const int64_t memory = SuggestedValue(msg, "--memory <= ");
      if (memory > 0) {
        ScheduleConfig fixed = config;
        fixed.memory = memory;
        auto retry = PlanSchedule(fixed);
        SNAPFILL_CHECK(retry.ok()) << "suggested --memory=" << memory << " fails: "
                                   << retry.status();
      }
    } else if (msg.find("must be > --window=") != std::string::npos) {
      // The suggested chunk at least passes the check that refused this one.
      const int64_t chunk = SuggestedValue(msg, "--chunk >= ");
      if (chunk > 0) {
        ScheduleConfig fixed = config;
        fixed.chunk = chunk;
        if (TooLargeToFuzz(fixed)) return 0;
        auto retry = PlanSchedule(fixed);
        const std::string again = "--chunk=" + std::to_string(chunk) + " must be > --window";
        SNAPFILL_CHECK(retry.ok() || std::string(retry.status().message()).find(again) ==
                                         std::string::npos)
            << "suggested --chunk=" << chunk << " is refused the same way: " << retry.status();
      }
    }
    return 0;
  }
  CheckPlan(config, *plan);

  // Adaptive budgets with fuzzed retention ratios at a few steps.
  if (plan->adaptive) {
    const int64_t big_n = config.num_layers;
    for (int rounds = 0; rounds < 3 && !in.empty(); ++rounds) {
      const int64_t i = in.Range(0, static_cast<int64_t>(plan->steps.size()) - 1);
      const int64_t b = plan->steps[i].budget[0];
      std::vector<double> ratios(big_n);
      for (double& r : ratios) {
        const uint8_t kind = in.U8();
        r = kind < 32 ? 0.0 : static_cast<double>(in.U32()) / 4294967295.0;
        if (kind == 255) r = -1.0;  // refused
      }
      const int64_t cap = (in.U8() & 1) ? 0 : config.memory;
      auto budgets = AdaptiveBudgets(b, ratios, config.window, cap);
      const bool bad_ratio = std::any_of(ratios.begin(), ratios.end(), [](double r) { return r < 0; });
      if (bad_ratio) {
        SNAPFILL_CHECK(!budgets.ok());
        continue;
      }
      SNAPFILL_CHECK(budgets.ok()) << budgets.status();
      SNAPFILL_CHECK(static_cast<int64_t>(budgets->size()) == big_n);
      SNAPFILL_CHECK(std::accumulate(budgets->begin(), budgets->end(), int64_t{0}) == big_n * b)
          << "adaptive budgets do not sum to N * " << b;
      for (int64_t m : *budgets) {
        SNAPFILL_CHECK(m >= config.window) << m;
        if (cap > 0) SNAPFILL_CHECK(m <= cap) << m << " > " << cap;
      }
      // All-zero ratios give every layer the linear budget.
      if (std::all_of(ratios.begin(), ratios.end(), [](double r) { return r == 0; })) {
        for (int64_t m : *budgets) SNAPFILL_CHECK(m == b);
      }
    }
  }
  return 0;
}

absl::Status ParseStatus(std::string_view target, const uint8_t* data, size_t size) {
  if (target == "gguf_reader") {
    auto file = GgufFile::FromBytes(std::string(reinterpret_cast<const char*>(data), size));
    if (!file.ok()) return file.status();
    // A file that presents itself as a model must also load as one.
    if ((*file)->FindTensor("token_embd.weight") == nullptr) return absl::OkStatus();
    return LlamaModel::Load(std::move(*file)).status();
  }
  if (target == "tokenizer") return absl::OkStatus();
  if (target == "cache_file" || target == "checkpoint_file") {
    if (size == 0) return absl::InvalidArgumentError("empty fuzz input");
    std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
    if (data[0] & 1) FixTrailer(bytes);
    if (target == "checkpoint_file") return ParseCheckpointFile(bytes, "fuzz").status();
    return ParseCacheFile(bytes, "fuzz", "", (data[0] >> 1) & 3).status();
  }
  if (target == "schedule_planner") {
    ByteSource in(data, size);
    return PlanSchedule(DecodeScheduleConfig(in)).status();
  }
  return absl::NotFoundError("unknown fuzz target");
}

std::span<const FuzzTarget> FuzzTargets() {
  static constexpr FuzzTarget kTargets[] = {
      {"gguf_reader", &FuzzGgufReader},
      {"tokenizer", &FuzzTokenizer},
      {"cache_file", &FuzzCacheFile},
      {"checkpoint_file", &FuzzCheckpointFile},
      {"schedule_planner", &FuzzSchedulePlanner},
  };
  return kTargets;
}

}  // namespace snapfill::fuzz
