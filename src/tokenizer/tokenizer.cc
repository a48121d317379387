#include "src/tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "snapfill/status.h"
#include "src/gguf/gguf_reader.h"
#include "src/tokenizer/pretokenizer.h"
#include "src/tokenizer/unicode.h"

namespace snapfill {
namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 "▁"

void ReplaceAll(std::string* s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s->size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s->find(from, pos);
    if (hit == std::string::npos) break;
    out.append(*s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  out.append(*s, pos, std::string::npos);
  *s = std::move(out);
}

// Token texts llama.cpp treats as end of generation / end of turn.
bool IsEogText(std::string_view t) {
  static constexpr std::string_view kTexts[] = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
      "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
      "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
      "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", "[e~["};
  for (std::string_view k : kTexts) {
    if (t == k) return true;
  }
  return false;
}

bool IsEotText(std::string_view t) {
  static constexpr std::string_view kTexts[] = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
      "<EOT>", "_<EOT>", "[EOT]", "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
      "<end_of_utterance>"};
  for (std::string_view k : kTexts) {
    if (t == k) return true;
  }
  return false;
}

// FIM pad / repo / file-separator tokens, which llama.cpp also stops on.
bool IsFimStopText(std::string_view t) {
  static constexpr std::string_view kTexts[] = {
      "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
      "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>"};
  for (std::string_view k : kTexts) {
    if (t == k) return true;
  }
  return false;
}

// Parses "<0xXX>"; -1 if the text has another form.
int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = text[i];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return -1;
    v = v * 16 + d;
  }
  return v;
}

uint64_t MergeKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

size_t HashKey(uint64_t key) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdULL;
  key ^= key >> 33;
  key *= 0xc4ceb9fe1a85ec53ULL;
  key ^= key >> 33;
  return static_cast<size_t>(key);
}

// A piece of text still to tokenize, or a special token split out of it.
struct Fragment {
  int32_t token;  // kNoToken for raw text
  size_t offset;
  size_t length;
};

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

const Tokenizer::Merge* Tokenizer::FindMerge(int32_t left, int32_t right) const {
  if (merge_slots_.empty()) return nullptr;
  const uint64_t key = MergeKey(left, right);
  const size_t mask = merge_slots_.size() - 1;
  for (size_t i = HashKey(key) & mask;; i = (i + 1) & mask) {
    const MergeSlot& slot = merge_slots_[i];
    if (slot.key == key) return &slot.merge;
    if (slot.key == ~uint64_t{0}) return nullptr;
  }
}

void Tokenizer::InsertMerge(int32_t left, int32_t right, Merge merge) {
  const uint64_t key = MergeKey(left, right);
  const size_t mask = merge_slots_.size() - 1;
  for (size_t i = HashKey(key) & mask;; i = (i + 1) & mask) {
    MergeSlot& slot = merge_slots_[i];
    if (slot.key == key) return;  // first rank wins, as llama.cpp's emplace
    if (slot.key == ~uint64_t{0}) {
      slot.key = key;
      slot.merge = merge;
      return;
    }
  }
}

int32_t Tokenizer::TextToToken(std::string_view text) const {
  const auto it = token_to_id_.find(text);
  return it == token_to_id_.end() ? kNoToken : it->second;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromVocab(Vocab vocab) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  SNAPFILL_RETURN_IF_ERROR(tok->Init(std::move(vocab)));
  return tok;
}

absl::Status Tokenizer::Init(Vocab vocab) {
  const size_t n = vocab.tokens.size();
  if (n == 0) return absl::InvalidArgumentError("tokenizer vocabulary is empty");
  if (n >= (1u << 30)) return absl::InvalidArgumentError(absl::StrCat("vocabulary of ", n, " tokens is too large"));
  if (!vocab.scores.empty() && vocab.scores.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer has ", vocab.scores.size(),
                                                   " scores for ", n, " tokens"));
  }
  if (!vocab.token_types.empty() && vocab.token_types.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer has ", vocab.token_types.size(),
                                                   " token types for ", n, " tokens"));
  }
  model_ = vocab.model;
  pre_name_ = vocab.pre;
  chat_template_ = std::move(vocab.chat_template);
  tokens_ = std::move(vocab.tokens);
  scores_ = vocab.scores.empty() ? std::vector<float>(n, 0.0f) : std::move(vocab.scores);
  attrs_.assign(n, kAttrNormal);
  token_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (tokens_[i].empty()) tokens_[i] = absl::StrCat("[EMPTY_", i, "]");  // as llama.cpp
    const auto [it, inserted] = token_to_id_.emplace(tokens_[i], static_cast<int32_t>(i));
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate token in vocabulary: '", tokens_[i],
                                                     "' has ids ", it->second, " and ", i));
    }
    if (!vocab.token_types.empty()) {
      switch (static_cast<TokenType>(vocab.token_types[i])) {
        case TokenType::kNormal: attrs_[i] = kAttrNormal; break;
        case TokenType::kUnknown: attrs_[i] = kAttrUnknown; break;
        case TokenType::kControl: attrs_[i] = kAttrControl; break;
        case TokenType::kUserDefined: attrs_[i] = kAttrUserDefined; break;
        case TokenType::kUnused: attrs_[i] = kAttrUnused; break;
        case TokenType::kByte: attrs_[i] = kAttrByte; break;
        default: attrs_[i] = kAttrUndefined; break;
      }
    }
  }

  // Defaults per model kind (llama_vocab::impl::load).
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;
  if (model_ == TokenizerModel::kBpe) {
    SNAPFILL_ASSIGN_OR_RETURN(pre_, PreTokenizer::Create(pre_name_));
    clean_spaces_ = pre_->traits().clean_spaces;
    ignore_merges_ = pre_->traits().ignore_merges;
    add_bos = pre_->traits().add_bos;
  } else {
    add_space_prefix = true;
    add_bos = true;
    clean_spaces_ = false;
  }
  add_bos_ = vocab.add_bos.value_or(add_bos);
  add_eos_ = vocab.add_eos.value_or(add_eos);
  add_space_prefix_ = vocab.add_space_prefix.value_or(add_space_prefix);

  auto check_id = [&](int32_t id, const char* what) -> absl::Status {
    if (id != kNoToken && (id < 0 || static_cast<size_t>(id) >= n)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " token id ", id, " is outside the vocabulary [0, ", n, ")"));
    }
    return absl::OkStatus();
  };
  SNAPFILL_RETURN_IF_ERROR(check_id(vocab.bos_id, "BOS"));
  SNAPFILL_RETURN_IF_ERROR(check_id(vocab.eos_id, "EOS"));
  SNAPFILL_RETURN_IF_ERROR(check_id(vocab.unk_id, "unknown"));
  SNAPFILL_RETURN_IF_ERROR(check_id(vocab.pad_id, "padding"));
  SNAPFILL_RETURN_IF_ERROR(check_id(vocab.eot_id, "EOT"));
  SNAPFILL_RETURN_IF_ERROR(check_id(vocab.eom_id, "EOM"));
  bos_id_ = vocab.bos_id;
  eos_id_ = vocab.eos_id;
  unk_id_ = vocab.unk_id;
  pad_id_ = vocab.pad_id;
  eot_id_ = vocab.eot_id;
  eom_id_ = vocab.eom_id;
  if (add_bos_ && bos_id_ == kNoToken) {
    return absl::InvalidArgumentError("tokenizer adds a BOS token but has no BOS token id");
  }
  if (add_eos_ && eos_id_ == kNoToken) {
    return absl::InvalidArgumentError("tokenizer adds an EOS token but has no EOS token id");
  }

  // Special tokens recognised by text, as llama.cpp does; they are forced to
  // control type, which matters for splitting and rendering.
  std::vector<uint8_t> eog(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = tokens_[i];
    bool force_control = false;
    if (eot_id_ == kNoToken && IsEotText(t)) {
      eot_id_ = static_cast<int32_t>(i);
      force_control = true;
    }
    if (eom_id_ == kNoToken && t == "<|eom_id|>") {
      eom_id_ = static_cast<int32_t>(i);
      force_control = true;
    }
    if (IsFimStopText(t)) {
      eog[i] = 1;
      force_control = true;
    }
    if (IsEogText(t)) {
      eog[i] = 1;
      force_control = true;
    }
    if (force_control) attrs_[i] |= kAttrControl;
  }
  for (int32_t id : {eos_id_, eot_id_, eom_id_}) {
    if (id != kNoToken) eog[id] = 1;
  }
  for (size_t i = 0; i < n; ++i) {
    if (eog[i]) eog_ids_.push_back(static_cast<int32_t>(i));
  }

  for (size_t i = 0; i < n; ++i) {
    if (attrs_[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
      special_tokens_.push_back(static_cast<int32_t>(i));
    }
  }
  std::stable_sort(special_tokens_.begin(), special_tokens_.end(), [&](int32_t a, int32_t b) {
    return tokens_[a].size() > tokens_[b].size();
  });
  joined_.assign(256 * 256, false);
  auto mark_pairs = [&](std::string_view text) {
    for (size_t i = 1; i < text.size(); ++i) {
      joined_[static_cast<uint8_t>(text[i - 1]) * 256 + static_cast<uint8_t>(text[i])] = true;
    }
  };
  for (const int32_t special : special_tokens_) mark_pairs(tokens_[special]);
  if (model_ == TokenizerModel::kSpm) {
    for (const std::string& token : tokens_) mark_pairs(token);
  }

  if (model_ == TokenizerModel::kBpe) {
    std::unordered_map<std::string, int32_t> extra;
    auto piece_id = [&](const std::string& text) -> int32_t {
      const auto it = token_to_id_.find(text);
      if (it != token_to_id_.end()) return it->second;
      const auto [e, inserted] =
          extra.emplace(text, static_cast<int32_t>(n + extra_pieces_.size()));
      if (inserted) extra_pieces_.push_back(text);
      return e->second;
    };
    for (int b = 0; b < 256; ++b) byte_piece_[b] = piece_id(ByteToGpt2Char(static_cast<uint8_t>(b)));
    size_t slots = 16;
    while (slots < 2 * vocab.merges.size()) slots *= 2;
    merge_slots_.assign(slots, MergeSlot{});
    for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
      const std::string& m = vocab.merges[rank];
      const size_t space = m.find(' ', 1);
      if (space == std::string::npos) continue;  // llama.cpp keeps it as ("", ""), never matched
      const std::string left = m.substr(0, space);
      const std::string right = m.substr(space + 1);
      const int32_t l = piece_id(left);
      const int32_t r = piece_id(right);
      const int32_t result = piece_id(left + right);
      InsertMerge(l, r, Merge{static_cast<int32_t>(rank), result});
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& file) {
  Vocab vocab;
  auto model = file.GetString("tokenizer.ggml.model");
  if (!model.ok()) {
    if (absl::IsNotFound(model.status())) {
      return absl::NotFoundError("model has no tokenizer (tokenizer.ggml.model is missing)");
    }
    return model.status();
  }
  if (*model == "gpt2") {
    vocab.model = TokenizerModel::kBpe;
  } else if (*model == "llama") {
    vocab.model = TokenizerModel::kSpm;
  } else {
    return absl::UnimplementedError(absl::StrCat("tokenizer model '", *model,
                                                 "' is not supported (expected 'gpt2' or 'llama')"));
  }
  if (file.Has("tokenizer.ggml.pre")) {
    SNAPFILL_ASSIGN_OR_RETURN(vocab.pre, file.GetString("tokenizer.ggml.pre"));
  }
  auto tokens = file.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens.ok()) {
    if (absl::IsNotFound(tokens.status())) {
      return absl::NotFoundError("model has no tokenizer vocabulary (tokenizer.ggml.tokens)");
    }
    return tokens.status();
  }
  vocab.tokens = *std::move(tokens);
  const size_t n = vocab.tokens.size();
  if (file.Has("tokenizer.ggml.scores")) {
    auto scores = file.GetFloatArray("tokenizer.ggml.scores");
    if (!scores.ok()) return scores.status();
    if (scores->size() < n) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.scores has ", scores->size(),
                                                     " entries for ", n, " tokens"));
    }
    scores->resize(n);
    vocab.scores = *std::move(scores);
  }
  if (file.Has("tokenizer.ggml.token_type")) {
    SNAPFILL_ASSIGN_OR_RETURN(std::vector<int64_t> types, file.GetIntArray("tokenizer.ggml.token_type"));
    if (types.size() < n) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.token_type has ", types.size(),
                                                     " entries for ", n, " tokens"));
    }
    vocab.token_types.assign(types.begin(), types.begin() + n);
  }
  if (vocab.model == TokenizerModel::kBpe) {
    auto merges = file.GetStringArray("tokenizer.ggml.merges");
    if (!merges.ok()) {
      if (absl::IsNotFound(merges.status())) {
        return absl::InvalidArgumentError("gpt2 tokenizer has no tokenizer.ggml.merges");
      }
      return merges.status();
    }
    vocab.merges = *std::move(merges);
  }
  // llama.cpp's default ids per model kind; a default outside the
  // vocabulary is dropped, a stored id outside it is ignored.
  const bool spm = vocab.model == TokenizerModel::kSpm;
  struct IdKey {
    const char* key;
    int32_t* id;
    int32_t fallback;
  };
  const IdKey id_keys[] = {
      {"tokenizer.ggml.bos_token_id", &vocab.bos_id, spm ? 1 : 11},
      {"tokenizer.ggml.eos_token_id", &vocab.eos_id, spm ? 2 : 11},
      {"tokenizer.ggml.unknown_token_id", &vocab.unk_id, spm ? 0 : kNoToken},
      {"tokenizer.ggml.padding_token_id", &vocab.pad_id, kNoToken},
      {"tokenizer.ggml.eot_token_id", &vocab.eot_id, kNoToken},
      {"tokenizer.ggml.eom_token_id", &vocab.eom_id, kNoToken},
  };
  for (const IdKey& k : id_keys) {
    *k.id = k.fallback >= 0 && static_cast<size_t>(k.fallback) < n ? k.fallback : kNoToken;
    if (!file.Has(k.key)) continue;
    SNAPFILL_ASSIGN_OR_RETURN(const uint64_t id, file.GetUint(k.key));
    if (id < n) *k.id = static_cast<int32_t>(id);
  }
  struct BoolKey {
    const char* key;
    std::optional<bool>* value;
  };
  const BoolKey bool_keys[] = {
      {"tokenizer.ggml.add_bos_token", &vocab.add_bos},
      {"tokenizer.ggml.add_eos_token", &vocab.add_eos},
      {"tokenizer.ggml.add_space_prefix", &vocab.add_space_prefix},
  };
  for (const BoolKey& k : bool_keys) {
    if (!file.Has(k.key)) continue;
    SNAPFILL_ASSIGN_OR_RETURN(const bool v, file.GetBool(k.key));
    *k.value = v;
  }
  if (file.Has("tokenizer.chat_template")) {
    SNAPFILL_ASSIGN_OR_RETURN(vocab.chat_template, file.GetString("tokenizer.chat_template"));
  }
  return FromVocab(std::move(vocab));
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  std::vector<int32_t> out;
  bool prev_special = true;  // the first fragment gets the space prefix
  EncodePart(text, /*first=*/true, /*last=*/true, add_special, parse_special, &prev_special, &out);
  return out;
}

void Tokenizer::EncodePart(std::string_view text, bool first, bool last, bool add_special,
                           bool parse_special, bool* prev_special, std::vector<int32_t>* out_ptr) const {
  // Split out special-token texts, longest token first, each over all
  // remaining raw fragments (llama.cpp's tokenizer_st_partition).
  std::vector<Fragment> fragments;
  if (!text.empty()) fragments.push_back({kNoToken, 0, text.size()});
  std::vector<Fragment> next;
  for (const int32_t special : special_tokens_) {
    if (!parse_special && (attrs_[special] & (kAttrControl | kAttrUnknown))) continue;
    const std::string& needle = tokens_[special];
    bool any = false;
    for (const Fragment& f : fragments) {
      if (f.token == kNoToken && text.substr(f.offset, f.length).find(needle) != std::string_view::npos) {
        any = true;
        break;
      }
    }
    if (!any) continue;
    next.clear();
    for (const Fragment& f : fragments) {
      if (f.token != kNoToken) {
        next.push_back(f);
        continue;
      }
      const std::string_view raw = text.substr(f.offset, f.length);
      size_t pos = 0;
      while (true) {
        const size_t hit = raw.find(needle, pos);
        if (hit == std::string_view::npos) break;
        if (hit > pos) next.push_back({kNoToken, f.offset + pos, hit - pos});
        next.push_back({special, 0, 0});
        pos = hit + needle.size();
      }
      if (pos < raw.size()) next.push_back({kNoToken, f.offset + pos, raw.size() - pos});
    }
    fragments.swap(next);
  }

  std::vector<int32_t>& out = *out_ptr;
  if (out.empty()) out.reserve(text.size() / 3 + 2);
  if (model_ == TokenizerModel::kSpm) {
    bool is_prev_special = *prev_special;
    if (first && add_special && add_bos_) out.push_back(bos_id_);
    std::string buf;
    for (const Fragment& f : fragments) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
        is_prev_special = true;
        continue;
      }
      buf.clear();
      if (add_space_prefix_ && is_prev_special) buf.push_back(' ');
      buf.append(text.substr(f.offset, f.length));
      ReplaceAll(&buf, " ", kSpmSpace);
      EncodeSpmText(buf, &out);
      is_prev_special = false;
    }
    *prev_special = is_prev_special;
    if (last && add_special && add_eos_) out.push_back(eos_id_);
  } else {
    if (first && add_special && add_bos_) out.push_back(bos_id_);
    for (const Fragment& f : fragments) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
      } else {
        EncodeBpeText(text.substr(f.offset, f.length), &out);
      }
    }
    if (last && add_special && add_eos_) out.push_back(eos_id_);
  }
}

namespace {

// The code point that ends at byte `end` (exclusive), if its bytes are one
// valid UTF-8 sequence; -1 otherwise.
int64_t CodepointBefore(std::string_view t, size_t end) {
  size_t start = end;
  for (int back = 0; back < 4 && start > 0; ++back) {
    --start;
    if ((static_cast<uint8_t>(t[start]) & 0xC0) != 0x80) break;
  }
  if (start == end || Utf8LenFromLead(t[start]) != end - start) return -1;
  const DecodedText d = DecodeUtf8(t.substr(start, end - start));
  if (d.cpts.size() != 1 || (d.cpts[0] == 0xFFFD && t.substr(start, end - start) != "\xEF\xBF\xBD")) return -1;
  return d.cpts[0];
}

// The code point that starts at byte `at`, if valid; -1 otherwise.
int64_t CodepointAt(std::string_view t, size_t at) {
  if (at >= t.size()) return -1;
  const size_t len = Utf8LenFromLead(t[at]);
  if ((static_cast<uint8_t>(t[at]) & 0xC0) == 0x80 || at + len > t.size()) return -1;
  return CodepointBefore(t, at + len);
}

bool IsAsciiSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace

bool Tokenizer::CanSplitAt(std::string_view t, size_t c) const {
  if (c < 2 || c + 2 > t.size()) return false;
  const char before = t[c - 1];
  if (before == '\n') {
    // A lone line break: whitespace before it would join it.
    if (IsAsciiSpace(t[c - 2])) return false;
    const int64_t b = CodepointBefore(t, c - 1);
    if (b < 0 || GetCodepointInfo(static_cast<uint32_t>(b)).whitespace) return false;
    const int64_t next = CodepointAt(t, c);
    if (next < 0) return false;
    const CodepointInfo info = GetCodepointInfo(static_cast<uint32_t>(next));
    if (!(info.IsLetter() || info.IsNumber())) return false;
  } else {
    if (t[c] != ' ') return false;
    const int64_t b = CodepointBefore(t, c);
    const int64_t next = CodepointAt(t, c + 1);
    if (b < 0 || next < 0 || !GetCodepointInfo(static_cast<uint32_t>(b)).IsLetter() ||
        !GetCodepointInfo(static_cast<uint32_t>(next)).IsLetter()) {
      return false;
    }
  }
  // Special tokens are matched on the raw bytes; SentencePiece merges see a
  // space as U+2581, so its first byte counts too.
  const uint8_t left = static_cast<uint8_t>(before);
  const uint8_t right = static_cast<uint8_t>(t[c]);
  if (joined_[left * 256 + right]) return false;
  return model_ != TokenizerModel::kSpm || right != ' ' ||
         !joined_[left * 256 + static_cast<uint8_t>(kSpmSpace[0])];
}

size_t Tokenizer::LastSplitPoint(std::string_view text, size_t from) const {
  if (text.size() < kSplitLookahead + 2) return 0;
  for (size_t c = text.size() - kSplitLookahead; c > std::max<size_t>(from, 1); --c) {
    const char b = text[c - 1];
    if ((b == '\n' || text[c] == ' ') && CanSplitAt(text, c)) return c;
  }
  return 0;
}

StreamingEncoder::StreamingEncoder(const Tokenizer& tokenizer, bool add_special, bool parse_special,
                                   size_t block_bytes)
    : tokenizer_(tokenizer), add_special_(add_special), parse_special_(parse_special),
      block_bytes_(std::max<size_t>(block_bytes, 1)) {}

uint64_t StreamingEncoder::WorkingSetBytes(size_t block_bytes) {
  // The held block and, while it is encoded, per byte of it at most: a code
  // point and its offset (8 bytes), the pre-tokenizer's pieces before and
  // after a step (8 each, a piece per byte at worst), a word range (8), a
  // collapsed byte (1), an invalid byte's position (8) and an id (4); the
  // special-token fragments and a word's merge scratch are small beside
  // those. On English text tokenizing measured about half of it.
  return static_cast<uint64_t>(block_bytes) * (1 + 8 + 16 + 8 + 1 + 8 + 4);
}

void StreamingEncoder::EncodeHeld(size_t end, bool last, std::vector<int32_t>* out) {
  tokenizer_.EncodePart(std::string_view(held_).substr(0, end), first_, last, add_special_, parse_special_,
                        &prev_special_, out);
  first_ = false;
  held_.erase(0, end);
  scanned_ = 0;
}

void StreamingEncoder::Add(std::string_view bytes, std::vector<int32_t>* out) {
  const size_t full = block_bytes_ + Tokenizer::kSplitLookahead;
  while (!bytes.empty()) {
    // A block at a time, however much was handed over: what one Encode
    // call holds (code points, words, ids) scales with its text.
    const size_t take = std::min(bytes.size(), held_.size() < full ? full - held_.size() : block_bytes_);
    held_.append(bytes.substr(0, take));
    bytes.remove_prefix(take);
    peak_held_ = std::max(peak_held_, held_.size());
    if (held_.size() < full) continue;
    // The split point nearest the end, found once per block of text.
    const size_t cut = tokenizer_.LastSplitPoint(held_, scanned_);
    if (cut == 0) {
      scanned_ = held_.size() - Tokenizer::kSplitLookahead;
      continue;
    }
    EncodeHeld(cut, /*last=*/false, out);
  }
}

void StreamingEncoder::Finish(std::vector<int32_t>* out) {
  EncodeHeld(held_.size(), /*last=*/true, out);
  first_ = true;
  prev_special_ = true;
}

void Tokenizer::EncodeBpeText(std::string_view text, std::vector<int32_t>* out) const {
  // An invalid byte is encoded as itself when the vocabulary has its GPT-2
  // character; otherwise (SmolLM2 lacks e.g. 0xC0, 0xF5-0xFF) it becomes
  // U+FFFD, as llama.cpp encodes every invalid byte, rather than vanish.
  // U+FFFD and invalid bytes pre-tokenize alike, so the words do not move.
  std::string replaced;
  const std::vector<size_t> invalid = InvalidUtf8Positions(text);
  bool replace = false;
  for (const size_t pos : invalid) {
    if (byte_piece_[static_cast<uint8_t>(text[pos])] >= vocab_size()) replace = true;
  }
  if (replace) {
    size_t prev = 0;
    for (const size_t pos : invalid) {
      replaced.append(text.substr(prev, pos - prev));
      if (byte_piece_[static_cast<uint8_t>(text[pos])] >= vocab_size()) {
        replaced.append("\xEF\xBF\xBD");
      } else {
        replaced.push_back(text[pos]);
      }
      prev = pos + 1;
    }
    replaced.append(text.substr(prev));
    text = replaced;
  }
  for (const auto& [begin, end] : pre_->Split(text)) {
    EncodeBpeWord(text.substr(begin, end - begin), out);
  }
}

void Tokenizer::EmitBpePiece(int32_t piece, std::vector<int32_t>* out) const {
  if (piece < vocab_size()) {
    out->push_back(piece);
    return;
  }
  // A merge result that is not a token: llama.cpp looks up each byte of its
  // (GPT-2 alphabet) text as a token and drops those that are not.
  const std::string& text = extra_pieces_[piece - vocab_size()];
  for (const char c : text) {
    const int32_t id = TextToToken(std::string_view(&c, 1));
    if (id != kNoToken) out->push_back(id);
  }
}

void Tokenizer::EncodeBpeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    std::string encoded;
    for (const char c : word) encoded += ByteToGpt2Char(static_cast<uint8_t>(c));
    const int32_t id = TextToToken(encoded);
    if (id != kNoToken) {
      out->push_back(id);
      return;
    }
  }
  if (word.size() == 1) {
    EmitBpePiece(byte_piece_[static_cast<uint8_t>(word[0])], out);
    return;
  }
  // One symbol per byte (= one GPT-2 alphabet character), in a linked list;
  // a min-heap of (rank, left position) picks the next merge, as in
  // llama.cpp's llm_tokenizer_bpe_session. Entries whose symbols have
  // changed since they were pushed are skipped when popped.
  struct Symbol {
    int32_t piece;  // -1 once merged into its left neighbour
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t right;
    int32_t left_piece;
    int32_t right_piece;
  };
  const int32_t n = static_cast<int32_t>(word.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {byte_piece_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  std::vector<Candidate> heap;
  heap.reserve(n);
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Merge* m = FindMerge(symbols[left].piece, symbols[right].piece);
    if (m == nullptr) return;
    heap.push_back({m->rank, left, right, symbols[left].piece, symbols[right].piece});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int32_t i = 1; i < n; ++i) try_add(i - 1, i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = symbols[c.left];
    Symbol& right = symbols[c.right];
    if (left.piece != c.left_piece || right.piece != c.right_piece || left.next != c.right) continue;
    left.piece = FindMerge(c.left_piece, c.right_piece)->result;
    right.piece = -1;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    try_add(left.prev, c.left);
    try_add(c.left, left.next);
  }
  for (int32_t i = 0; i != -1; i = symbols[i].next) EmitBpePiece(symbols[i].piece, out);
}

int32_t Tokenizer::SpmByteToken(uint8_t byte) const {
  static constexpr char kHex[] = "0123456789ABCDEF";
  const char buf[6] = {'<', '0', 'x', kHex[byte >> 4], kHex[byte & 15], '>'};
  int32_t id = TextToToken(std::string_view(buf, 6));
  if (id == kNoToken) id = TextToToken(std::string_view(reinterpret_cast<const char*>(&byte), 1));
  // llama.cpp aborts here; an unknown token keeps the output usable.
  return id;
}

void Tokenizer::EncodeSpmText(std::string_view text, std::vector<int32_t>* out) const {
  // llama.cpp's llm_tokenizer_spm_session: start from UTF-8 characters and
  // repeatedly merge the adjacent pair whose concatenation is the token with
  // the highest score (ties: leftmost).
  struct Symbol {
    int32_t prev;
    int32_t next;
    size_t offset;
    size_t n;  // bytes; 0 once merged into its left neighbour
  };
  struct Bigram {
    float score;
    int32_t left;
    int32_t right;
    size_t size;
  };
  std::vector<Symbol> symbols;
  for (size_t offs = 0; offs < text.size();) {
    // llama.cpp takes min(lead-byte length, rest) even when the following
    // bytes are not continuation bytes, which would swallow a "▁" after an
    // invalid byte; a malformed sequence here is one byte per symbol
    // instead. Valid UTF-8 is split identically.
    size_t len = std::min(Utf8LenFromLead(text[offs]), text.size() - offs);
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<uint8_t>(text[offs + k]) & 0xC0) != 0x80) {
        len = 1;
        break;
      }
    }
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({index - 1, offs + len == text.size() ? -1 : index + 1, offs, len});
    offs += len;
  }
  if (symbols.empty()) return;
  auto worse = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::vector<Bigram> heap;
  auto try_add = [&](int32_t left, int32_t right) {
    if (left == -1 || right == -1) return;
    const std::string_view merged = text.substr(symbols[left].offset, symbols[left].n + symbols[right].n);
    const int32_t id = TextToToken(merged);
    if (id == kNoToken) return;
    heap.push_back({scores_[id], left, right, merged.size()});
    std::push_heap(heap.begin(), heap.end(), worse);
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const Bigram b = heap.back();
    heap.pop_back();
    Symbol& left = symbols[b.left];
    Symbol& right = symbols[b.right];
    if (left.n == 0 || right.n == 0 || left.n + right.n != b.size) continue;
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = b.left;
    try_add(left.prev, b.left);
    try_add(b.left, left.next);
  }
  // Every merged symbol is a token (only token texts are pushed), so
  // llama.cpp's re-segmentation reduces to "token, or its bytes".
  for (int32_t i = 0; i != -1; i = symbols[i].next) {
    const std::string_view piece = text.substr(symbols[i].offset, symbols[i].n);
    const int32_t id = TextToToken(piece);
    if (id != kNoToken) {
      out->push_back(id);
      continue;
    }
    for (const char c : piece) {
      const int32_t byte_id = SpmByteToken(static_cast<uint8_t>(c));
      if (byte_id != kNoToken) {
        out->push_back(byte_id);
      } else if (unk_id_ != kNoToken) {
        out->push_back(unk_id_);
      }
    }
  }
}

std::string Tokenizer::TokenToPiece(int32_t id, bool render_special) const {
  if (id < 0 || id >= vocab_size()) return "";
  const uint32_t attr = attrs_[id];
  if (!render_special && (attr & (kAttrUnknown | kAttrControl))) return "";
  const std::string& text = tokens_[id];
  if (attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) return text;
  if (attr & kAttrNormal) {
    if (model_ == TokenizerModel::kSpm) {
      std::string result = text;
      ReplaceAll(&result, kSpmSpace, " ");
      return result;
    }
    // GPT-2 alphabet back to bytes.
    std::string result;
    result.reserve(text.size());
    const DecodedText decoded = DecodeUtf8(text);
    for (size_t i = 0; i < decoded.cpts.size(); ++i) {
      const int b = Gpt2CodepointToByte(decoded.cpts[i]);
      if (b >= 0) {
        result.push_back(static_cast<char>(b));
        continue;
      }
      // Same marker llama.cpp's llama_decode_text writes.
      result += "[UNK_BYTE_0x";
      char hex[3];
      for (uint32_t j = decoded.offsets[i]; j < decoded.offsets[i + 1]; ++j) {
        std::snprintf(hex, sizeof(hex), "%02x", static_cast<uint8_t>(text[j]));
        result += hex;
      }
      result += text + "]";
    }
    return result;
  }
  if (attr & kAttrByte) {
    const int b = ParseByteToken(text);
    return b >= 0 ? std::string(1, static_cast<char>(b)) : text;
  }
  return "";
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool render_special) const {
  std::string text;
  bool remove_space = add_space_prefix_;
  for (const int32_t id : ids) {
    std::string piece = TokenToPiece(id, render_special);
    if (remove_space && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    remove_space = false;
    text += piece;
  }
  if (!clean_spaces_ || text.empty()) return text;

  // llama.cpp's three in-place clean-up passes, kept literally.
  int32_t total = static_cast<int32_t>(text.size());
  {  // " ?", " !", " .", " ,"
    const int32_t total1 = total;
    total = 1;
    for (int32_t i = 1; i < total1; ++i) {
      const char x = text[i];
      if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --total;
      text[total++] = x;
    }
  }
  {  // " ' " -> "'"
    const int32_t total2 = total;
    total = total ? 1 : 0;
    for (int32_t i = 1; i < total2; ++i) {
      const char x = text[i];
      if (x == '\'' && i + 1 < total2 && text[i - 1] == ' ' && text[i + 1] == ' ') {
        --total;
        text[++i] = '\0';
      }
      text[total++] = x;
    }
  }
  {  // " 's", " 'm", " 're", " 've"
    const int32_t total3 = total;
    total = total ? 1 : 0;
    for (int32_t i = 1; i < total3; ++i) {
      const char x = text[i];
      if (text[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
        const char x1 = text[i + 1];
        if (x1 == 's' || x1 == 'm') {
          --total;
        } else if (i + 2 < total3) {
          const char x2 = text[i + 2];
          if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
        }
      }
      text[total++] = x;
    }
  }
  text.resize(total);
  return text;
}

bool Tokenizer::IsEndOfGeneration(int32_t id) const {
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

bool Tokenizer::IsControl(int32_t id) const {
  return id >= 0 && id < vocab_size() && (attrs_[id] & kAttrControl);
}

}  // namespace snapfill
