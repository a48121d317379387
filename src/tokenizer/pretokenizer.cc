#include "src/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "snapfill/status.h"
#include "src/tokenizer/unicode.h"

namespace snapfill {
namespace {

constexpr uint32_t kOutOfRange = 0xFFFFFFFF;

constexpr char kQwen2Pattern[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// View of one piece of the text for the hand-written matchers: positions
// outside [begin, end) read as "out of range", which is what makes a match
// stop at piece boundaries.
struct PieceView {
  const std::vector<uint32_t>& cpts;
  size_t begin;
  size_t end;

  uint32_t Cpt(size_t pos) const { return pos >= begin && pos < end ? cpts[pos] : kOutOfRange; }
  // in_range is llama.cpp's `flags.as_uint() != 0`: every codepoint has at
  // least one flag set, only positions outside the piece have none.
  struct Flags {
    bool in_range = false;
    bool letter = false;
    bool number = false;
    bool whitespace = false;
  };
  Flags At(size_t pos) const {
    if (pos < begin || pos >= end) return {};
    const CodepointInfo info = GetCodepointInfo(cpts[pos]);
    return {true, info.IsLetter(), info.IsNumber(), info.whitespace};
  }
};

uint32_t AsciiLower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

// Emits piece lengths (in codepoints) as llama.cpp's _add_token does.
class Emitter {
 public:
  Emitter(size_t begin, std::vector<size_t>* out) : prev_end_(begin), out_(out) {}
  size_t Add(size_t end) {
    const size_t len = end - prev_end_;
    if (len > 0) out_->push_back(len);
    prev_end_ = end;
    return len;
  }

 private:
  size_t prev_end_;
  std::vector<size_t>* out_;
};

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void SplitGpt2(const PieceView& v, std::vector<size_t>* out) {
  Emitter emit(v.begin, out);
  for (size_t pos = v.begin; pos < v.end;) {
    const uint32_t cpt = v.Cpt(pos);
    const auto flags = v.At(pos);
    if (cpt == '\'' && pos + 1 < v.end) {
      const uint32_t next = v.Cpt(pos + 1);
      if (next == 's' || next == 't' || next == 'm' || next == 'd') {
        pos += emit.Add(pos + 2);
        continue;
      }
      if (pos + 2 < v.end) {
        const uint32_t next2 = v.Cpt(pos + 2);
        if ((next == 'r' && next2 == 'e') || (next == 'v' && next2 == 'e') ||
            (next == 'l' && next2 == 'l')) {
          pos += emit.Add(pos + 3);
          continue;
        }
      }
    }
    const auto flags2 = cpt == ' ' ? v.At(pos + 1) : flags;
    if (flags2.letter) {
      pos += cpt == ' ';
      while (v.At(pos).letter) ++pos;
      emit.Add(pos);
      continue;
    }
    if (flags2.number) {
      pos += cpt == ' ';
      while (v.At(pos).number) ++pos;
      emit.Add(pos);
      continue;
    }
    auto is_other = [](const PieceView::Flags& f) {
      return f.in_range && !(f.whitespace || f.letter || f.number);
    };
    if (is_other(flags2)) {
      pos += cpt == ' ';
      while (is_other(v.At(pos))) ++pos;
      emit.Add(pos);
      continue;
    }
    size_t num_ws = 0;
    while (v.At(pos + num_ws).whitespace) ++num_ws;
    if (num_ws > 1 && v.Cpt(pos + num_ws) != kOutOfRange) {  // \s+(?!\S)
      pos += num_ws - 1;
      emit.Add(pos);
      continue;
    }
    if (num_ws > 0) {  // \s+
      pos += num_ws;
      emit.Add(pos);
      continue;
    }
    emit.Add(++pos);  // no match: a piece of its own
  }
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
void SplitLlama3(const PieceView& v, std::vector<size_t>* out) {
  Emitter emit(v.begin, out);
  for (size_t pos = v.begin; pos < v.end;) {
    const uint32_t cpt = v.Cpt(pos);
    const auto flags = v.At(pos);
    if (cpt == '\'' && pos + 1 < v.end) {
      const uint32_t next = AsciiLower(v.Cpt(pos + 1));
      if (next == 's' || next == 't' || next == 'm' || next == 'd') {
        pos += emit.Add(pos + 2);
        continue;
      }
      if (pos + 2 < v.end) {
        const uint32_t next2 = AsciiLower(v.Cpt(pos + 2));
        if ((next == 'r' && next2 == 'e') || (next == 'v' && next2 == 'e') ||
            (next == 'l' && next2 == 'l')) {
          pos += emit.Add(pos + 3);
          continue;
        }
      }
    }
    if (!(cpt == '\r' || cpt == '\n' || flags.number)) {
      if (flags.letter || v.At(pos + 1).letter) {
        ++pos;
        while (v.At(pos).letter) ++pos;
        emit.Add(pos);
        continue;
      }
    }
    if (flags.number) {
      size_t ini = pos;
      while (v.At(pos).number) {
        if (++pos - ini >= 3) {
          emit.Add(pos);
          ini = pos;
        }
      }
      emit.Add(pos);
      continue;
    }
    auto flags2 = cpt == ' ' ? v.At(pos + 1) : flags;
    auto is_other = [](const PieceView::Flags& f) {
      return !(f.whitespace || f.letter || f.number);
    };
    // llama.cpp tests the first codepoint's own range flag here, not flags2's.
    if (is_other(flags2) && flags.in_range) {
      pos += cpt == ' ';
      while (is_other(flags2) && flags2.in_range) flags2 = v.At(++pos);
      uint32_t cpt2 = v.Cpt(pos);
      while (cpt2 == '\r' || cpt2 == '\n') cpt2 = v.Cpt(++pos);
      emit.Add(pos);
      continue;
    }
    size_t num_ws = 0;
    size_t last_end_r_or_n = 0;
    while (v.At(pos + num_ws).whitespace) {
      const uint32_t cpt2 = v.Cpt(pos + num_ws);
      if (cpt2 == '\r' || cpt2 == '\n') last_end_r_or_n = pos + num_ws + 1;
      ++num_ws;
    }
    if (last_end_r_or_n > 0) {  // \s*[\r\n]+
      pos = last_end_r_or_n;
      emit.Add(pos);
      continue;
    }
    if (num_ws > 1 && v.Cpt(pos + num_ws) != kOutOfRange) {  // \s+(?!\S)
      pos += num_ws - 1;
      emit.Add(pos);
      continue;
    }
    if (num_ws > 0) {
      pos += num_ws;
      emit.Add(pos);
      continue;
    }
    emit.Add(++pos);
  }
}

// \p{N}: every number codepoint becomes a piece of its own.
void SplitEachNumber(const PieceView& v, std::vector<size_t>* out) {
  size_t gap_begin = v.begin;
  for (size_t pos = v.begin; pos < v.end; ++pos) {
    if (GetCodepointInfo(v.cpts[pos]).IsNumber()) {
      if (pos > gap_begin) out->push_back(pos - gap_begin);
      out->push_back(1);
      gap_begin = pos + 1;
    }
  }
  if (v.end > gap_begin) out->push_back(v.end - gap_begin);
}

// llama.cpp's single-byte stand-ins for non-ASCII codepoint classes.
constexpr char kCollapsedNumber = '\xD1';
constexpr char kCollapsedLetter = '\xD2';
constexpr char kCollapsedPunct = '\xD3';
constexpr char kCollapsedMark = '\xD4';
constexpr char kCollapsedSymbol = '\xD5';
constexpr char kCollapsedOther = '\xD0';
constexpr char kCollapsedSpace = '\x0B';

char CollapseCodepoint(uint32_t cpt) {
  if (cpt < 128) return static_cast<char>(cpt);
  const CodepointInfo info = GetCodepointInfo(cpt);
  if (info.whitespace) return kCollapsedSpace;
  switch (info.cls) {
    case UnicodeClass::kNumber: return kCollapsedNumber;
    case UnicodeClass::kLetter: return kCollapsedLetter;
    case UnicodeClass::kPunctuation: return kCollapsedPunct;
    case UnicodeClass::kMark: return kCollapsedMark;
    case UnicodeClass::kSymbol: return kCollapsedSymbol;
    case UnicodeClass::kOther: break;
  }
  return kCollapsedOther;
}

// Rewrites \p{X} as a byte class over the collapsed text, as llama.cpp does.
absl::StatusOr<std::string> CollapsePattern(std::string_view regex) {
  struct Category {
    std::string_view name;
    char collapsed;
    std::string_view ascii;
  };
  static constexpr Category kCategories[] = {
      {"\\p{N}", kCollapsedNumber, "\\x30-\\x39"},
      {"\\p{L}", kCollapsedLetter, "\\x41-\\x5A\\x61-\\x7A"},
      {"\\p{P}", kCollapsedPunct, "\\x21-\\x23\\x25-\\x2A\\x2C-\\x2F\\x3A-\\x3B\\x3F-\\x40\\x5B-\\x5D\\x5F\\x7B\\x7D"},
      {"\\p{M}", kCollapsedMark, ""},
      {"\\p{S}", kCollapsedSymbol, "\\x24\\x2B\\x3C-\\x3E\\x5E\\x60\\x7C"},
  };
  std::string out;
  bool inside = false;
  for (size_t i = 0; i < regex.size(); ++i) {
    if (static_cast<uint8_t>(regex[i]) >= 128) {
      return absl::InvalidArgumentError("pre-tokenizer regex mixes \\p{} classes and non-ASCII text");
    }
    if (regex[i] == '[' && (i == 0 || regex[i - 1] != '\\')) {
      out += '[';
      inside = true;
      continue;
    }
    if (inside && regex[i] == ']' && regex[i - 1] != '\\') {
      out += ']';
      inside = false;
      continue;
    }
    bool replaced = false;
    for (const Category& c : kCategories) {
      if (regex.substr(i, c.name.size()) == c.name) {
        if (!inside) out += '[';
        out += c.collapsed;
        out += c.ascii;
        if (!inside) out += ']';
        i += c.name.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += regex[i];
  }
  return out;
}

}  // namespace

struct PreTokenizer::Step {
  enum Kind { kGpt2, kLlama3, kEachNumber, kRegex } kind;
  pcre2_code* code = nullptr;  // kRegex: compiled collapsed pattern

  explicit Step(Kind k) : kind(k) {}
  ~Step() {
    if (code != nullptr) pcre2_code_free(code);
  }

  static absl::StatusOr<std::unique_ptr<Step>> Regex(std::string_view pattern) {
    auto collapsed = CollapsePattern(pattern);
    if (!collapsed.ok()) return collapsed.status();
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(collapsed->data()),
                                     collapsed->size(), 0, &error, &error_offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return absl::InternalError(absl::StrCat("pre-tokenizer regex '", std::string(pattern),
                                              "' does not compile at offset ", error_offset, ": ",
                                              reinterpret_cast<const char*>(message)));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if absent
    auto step = std::make_unique<Step>(kRegex);
    step->code = code;
    return step;
  }

  // Re-splits every piece in `pieces` (lengths in codepoints).
  std::vector<size_t> Apply(const std::vector<uint32_t>& cpts, const std::string& collapsed,
                            pcre2_match_data* match_data, const std::vector<size_t>& pieces) const {
    std::vector<size_t> out;
    out.reserve(pieces.size() + cpts.size() / 3);
    size_t start = 0;
    for (const size_t len : pieces) {
      const PieceView view{cpts, start, start + len};
      switch (kind) {
        case kGpt2: SplitGpt2(view, &out); break;
        case kLlama3: SplitLlama3(view, &out); break;
        case kEachNumber: SplitEachNumber(view, &out); break;
        case kRegex: SplitRegex(collapsed, start, len, match_data, &out); break;
      }
      start += len;
    }
    return out;
  }

  void SplitRegex(const std::string& collapsed, size_t start, size_t len,
                  pcre2_match_data* match_data, std::vector<size_t>* out) const {
    // The subject is the piece alone, so lookaheads see its end as the end of
    // input, like std::regex_iterator over a sub-range.
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(collapsed.data() + start);
    size_t prev = 0;
    size_t search = 0;
    while (search <= len) {
      const int rc = pcre2_match(code, subject, len, search, 0, match_data, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match_data);
      const size_t mb = ov[0];
      const size_t me = ov[1];
      if (mb > prev) out->push_back(mb - prev);
      if (me > mb) out->push_back(me - mb);
      prev = me;
      search = me > mb ? me : me + 1;
    }
    if (len > prev) out->push_back(len - prev);
  }
};

PreTokenizer::~PreTokenizer() = default;

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(std::string_view name) {
  std::unique_ptr<PreTokenizer> pre(new PreTokenizer());
  pre->name_ = std::string(name);
  auto add = [&](Step::Kind kind) { pre->steps_.push_back(std::make_unique<Step>(kind)); };
  auto add_regex = [&](std::string_view pattern) -> absl::Status {
    auto step = Step::Regex(pattern);
    if (!step.ok()) return step.status();
    pre->steps_.push_back(*std::move(step));
    return absl::OkStatus();
  };
  auto is_any = [&](std::initializer_list<std::string_view> names) {
    for (std::string_view n : names) {
      if (name == n) return true;
    }
    return false;
  };
  PreTokenizerTraits& t = pre->traits_;
  // Names and settings follow llama.cpp's llama_vocab::impl::load and
  // llm_tokenizer_bpe; only the pattern families listed here are supported.
  if (name.empty() || name == "default") {
    SNAPFILL_RETURN_IF_ERROR(add_regex("[\\p{P}\\$\\+<=>\\^~\\|]+"));
    add(Step::kGpt2);
    SNAPFILL_RETURN_IF_ERROR(add_regex("\\p{N}+"));
    SNAPFILL_RETURN_IF_ERROR(add_regex("[0-9][0-9][0-9]"));
  } else if (is_any({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                     "midm-2.0", "lfm2", "jina-v5-nano"})) {
    add(Step::kLlama3);
    t.ignore_merges = true;
    t.add_bos = true;
  } else if (is_any({"dbrx", "smaug-bpe"})) {
    add(Step::kLlama3);
  } else if (is_any({"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
                     "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "mpt", "olmo", "jais",
                     "exaone4"})) {
    add(Step::kGpt2);
  } else if (is_any({"trillion", "granite-docling"})) {
    add(Step::kGpt2);
    t.clean_spaces = false;
  } else if (is_any({"starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"})) {
    add(Step::kEachNumber);
    add(Step::kGpt2);
  } else if (is_any({"smollm", "command-r"})) {
    add(Step::kEachNumber);
    add(Step::kGpt2);
    t.clean_spaces = false;
  } else if (is_any({"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"})) {
    SNAPFILL_RETURN_IF_ERROR(add_regex(kQwen2Pattern));
    t.clean_spaces = false;
  } else if (is_any({"stablelm2", "megrez"})) {
    SNAPFILL_RETURN_IF_ERROR(add_regex(kQwen2Pattern));
  } else if (name == "falcon") {
    SNAPFILL_RETURN_IF_ERROR(add_regex("[\\p{P}\\$\\+<=>\\^~\\|`]+"));
    add(Step::kGpt2);
    SNAPFILL_RETURN_IF_ERROR(add_regex("[0-9][0-9][0-9]"));
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "pre-tokenizer '", std::string(name),
        "' (tokenizer.ggml.pre) is not supported; supported families: default, gpt-2, smollm, "
        "starcoder, llama3/llama-bpe, dbrx, qwen2, stablelm2, falcon"));
  }
  return pre;
}

std::vector<std::pair<uint32_t, uint32_t>> PreTokenizer::Split(std::string_view text) const {
  std::vector<std::pair<uint32_t, uint32_t>> words;
  if (text.empty()) return words;
  const DecodedText decoded = DecodeUtf8(text);
  const std::vector<uint32_t>& cpts = decoded.cpts;

  std::string collapsed;
  pcre2_match_data* match_data = nullptr;
  for (const auto& step : steps_) {
    if (step->kind == Step::kRegex && match_data == nullptr) {
      collapsed.resize(cpts.size());
      for (size_t i = 0; i < cpts.size(); ++i) collapsed[i] = CollapseCodepoint(cpts[i]);
      match_data = pcre2_match_data_create(1, nullptr);
    }
  }
  std::vector<size_t> pieces = {cpts.size()};
  for (const auto& step : steps_) pieces = step->Apply(cpts, collapsed, match_data, pieces);
  if (match_data != nullptr) pcre2_match_data_free(match_data);

  words.reserve(pieces.size());
  size_t start = 0;
  for (const size_t len : pieces) {
    words.emplace_back(decoded.offsets[start], decoded.offsets[start + len]);
    start += len;
  }
  return words;
}

}  // namespace snapfill
