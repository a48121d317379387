// Tokenizer: text <-> token ids for GGUF vocabularies, matching llama.cpp.
//
// Two model kinds are supported, named by tokenizer.ggml.model:
//   "gpt2"  byte-level BPE: pre-tokenize (see pretokenizer.h), map bytes to
//           the GPT-2 alphabet, merge adjacent pairs by rank.
//   "llama" SentencePiece BPE: escape spaces as U+2581, merge adjacent
//           symbols by score, fall back to <0xXX> byte tokens.
// Special-token texts ("<|im_start|>") are split out first when asked to, as
// llama.cpp's tokenizer_st_partition does.
//
// The one deliberate difference from llama.cpp: invalid UTF-8 bytes are
// kept as they are (byte-level BPE encodes them as their byte tokens,
// SentencePiece as <0xXX> tokens, one symbol per malformed byte), where
// llama.cpp replaces each with U+FFFD (BPE) or lets a bad lead byte swallow
// the bytes after it (SPM). So Decode(Encode(x)) == x for every byte string
// x whose bytes the vocabulary can represent; an invalid byte that has no
// byte token (SmolLM2 has none for 0xC0, 0xC1, 0xF1, 0xF2, 0xF5-0xFF) is
// encoded as U+FFFD like llama.cpp does. Valid UTF-8 tokenizes exactly as in
// llama.cpp, including its dropping of characters without any token (in
// SmolLM2: the control bytes 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D).
#ifndef SNAPFILL_SRC_TOKENIZER_TOKENIZER_H_
#define SNAPFILL_SRC_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"

namespace snapfill {

class GgufFile;
class PreTokenizer;

enum class TokenizerModel { kBpe, kSpm };

// tokenizer.ggml.token_type values (llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

inline constexpr int32_t kNoToken = -1;

// A vocabulary as stored in GGUF; tests build these by hand.
struct Vocab {
  TokenizerModel model = TokenizerModel::kBpe;
  std::string pre;                  // tokenizer.ggml.pre; "" = absent ("default")
  std::vector<std::string> tokens;  // [vocab_size]
  std::vector<float> scores;        // [vocab_size] or empty (all 0)
  std::vector<int32_t> token_types; // [vocab_size] or empty (all normal)
  std::vector<std::string> merges;  // BPE only: "left right", by rank
  int32_t bos_id = kNoToken;
  int32_t eos_id = kNoToken;
  int32_t unk_id = kNoToken;
  int32_t pad_id = kNoToken;
  int32_t eot_id = kNoToken;  // kNoToken: found by text (<|im_end|>, ...)
  int32_t eom_id = kNoToken;
  // Unset: llama.cpp's default for the model kind and pre-tokenizer.
  std::optional<bool> add_bos;
  std::optional<bool> add_eos;
  std::optional<bool> add_space_prefix;
  std::string chat_template;  // tokenizer.chat_template, may be empty
};

class Tokenizer {
 public:
  // Errors: InvalidArgument for an inconsistent vocabulary (sizes differ,
  // duplicate tokens, add_bos without a BOS id, out-of-range ids),
  // Unimplemented for an unsupported pre-tokenizer.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromVocab(Vocab vocab);
  // Reads tokenizer.ggml.* from a GGUF file. NotFound "model has no
  // tokenizer" without tokenizer.ggml.model; Unimplemented for a model other
  // than "gpt2" or "llama" (naming it); InvalidArgument for keys of the
  // wrong type or size.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // add_special: add BOS / EOS as the vocabulary says. parse_special: emit
  // control-token texts found in `text` as their ids (user-defined tokens
  // are always split out, as in llama.cpp).
  std::vector<int32_t> Encode(std::string_view text, bool add_special, bool parse_special) const;

  // The last position c in [from, text.size() - kSplitLookahead] where the
  // text may be cut for StreamingEncoder: Encode(text) is then the encoding
  // of text[0, c) followed by that of the rest, whatever follows text.
  // 0 if there is none. Two kinds of place qualify (both leave the words of
  // every supported pre-tokenizer whole, and the merges of both vocabulary
  // kinds on their side):
  //   - after a line break that follows a non-space character, before a
  //     letter or digit ("...end.\nNext"): a lone "\n" is a word of its own;
  //   - after a letter, before a space and a letter ("word| next"): a word
  //     never ends in a space, and " next" starts one.
  // The bytes on the two sides must never be adjacent in a special token
  // (which is split out before pre-tokenization) or, for SentencePiece, in
  // any token (its merges run over the whole text).
  size_t LastSplitPoint(std::string_view text, size_t from = 0) const;
  // Bytes past a split point that LastSplitPoint needs to see.
  static constexpr size_t kSplitLookahead = 8;

  // Bytes of one token. Control and unknown tokens render as "" unless
  // render_special. Out-of-range ids give "".
  std::string TokenToPiece(int32_t id, bool render_special = false) const;
  // Concatenated pieces, with llama.cpp's detokenizer rules: the leading
  // space of an SPM first token is dropped, and vocabularies with
  // clean_spaces tidy " ." / " 's" etc.
  std::string Decode(const std::vector<int32_t>& ids, bool render_special = false) const;

  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t eot_id() const { return eot_id_; }
  int32_t unk_id() const { return unk_id_; }
  int32_t pad_id() const { return pad_id_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  // End of generation: EOS, EOT, EOM and tokens llama.cpp recognises by
  // text (<|im_end|>, <|endoftext|>, <|eot_id|>, FIM pad/repo/sep, ...).
  bool IsEndOfGeneration(int32_t id) const;
  bool IsControl(int32_t id) const;
  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  TokenizerModel model() const { return model_; }
  // tokenizer.ggml.pre as stored ("" if absent).
  const std::string& pre() const { return pre_name_; }
  const std::string& chat_template() const { return chat_template_; }
  // Token text as stored in the vocabulary (GPT-2 alphabet / U+2581 form).
  const std::string& TokenText(int32_t id) const { return tokens_[id]; }
  // Id of an exact token text, or kNoToken.
  int32_t TextToToken(std::string_view text) const;

 private:
  Tokenizer();
  absl::Status Init(Vocab vocab);
  friend class StreamingEncoder;
  // Encode() of one part of a text given in parts: BOS before the first,
  // EOS after the last (add_special); *prev_special carries SentencePiece's
  // "the last fragment was a special token" (the space prefix) across parts.
  void EncodePart(std::string_view text, bool first, bool last, bool add_special, bool parse_special,
                  bool* prev_special, std::vector<int32_t>* out) const;
  bool CanSplitAt(std::string_view text, size_t c) const;
  void EncodeBpeText(std::string_view text, std::vector<int32_t>* out) const;
  void EncodeBpeWord(std::string_view word, std::vector<int32_t>* out) const;
  void EncodeSpmText(std::string_view text, std::vector<int32_t>* out) const;
  void EmitBpePiece(int32_t piece, std::vector<int32_t>* out) const;
  int32_t SpmByteToken(uint8_t byte) const;

  // Attribute bits (llama_token_attr).
  enum Attr : uint32_t {
    kAttrUndefined = 0,
    kAttrUnknown = 1 << 0,
    kAttrUnused = 1 << 1,
    kAttrNormal = 1 << 2,
    kAttrControl = 1 << 3,
    kAttrUserDefined = 1 << 4,
    kAttrByte = 1 << 5,
  };

  TokenizerModel model_ = TokenizerModel::kBpe;
  std::string pre_name_;
  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  std::vector<uint32_t> attrs_;
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> token_to_id_;
  std::vector<int32_t> special_tokens_;  // control / user-defined / unknown, longest first
  std::vector<int32_t> eog_ids_;         // sorted
  // joined_[a * 256 + b]: bytes a, b are adjacent in a special token's text
  // or (SentencePiece, spaces as U+2581) in any token's: no split between.
  std::vector<bool> joined_;
  std::unique_ptr<PreTokenizer> pre_;
  bool ignore_merges_ = false;
  bool clean_spaces_ = false;

  // BPE merge table over "pieces": ids < vocab_size are tokens; larger ids
  // name merge results that are not tokens (kept so that merging proceeds
  // exactly as llama.cpp's string-based merge does).
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  // Open addressing keyed by (left << 32 | right); merges are looked up once
  // per adjacent pair, so this is the hot path of Encode.
  struct MergeSlot {
    uint64_t key = ~uint64_t{0};
    Merge merge;
  };
  std::vector<MergeSlot> merge_slots_;  // power-of-two size
  const Merge* FindMerge(int32_t left, int32_t right) const;
  void InsertMerge(int32_t left, int32_t right, Merge merge);
  std::vector<std::string> extra_pieces_;  // texts of ids >= vocab_size
  int32_t byte_piece_[256] = {};           // piece id of each byte's GPT-2 char

  int32_t bos_id_ = kNoToken;
  int32_t eos_id_ = kNoToken;
  int32_t eot_id_ = kNoToken;
  int32_t eom_id_ = kNoToken;
  int32_t unk_id_ = kNoToken;
  int32_t pad_id_ = kNoToken;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;
  std::string chat_template_;
};

// Tokenizes a text handed over in parts (a file read block by block) with
// the result of Tokenizer::Encode over the whole text, holding only about
// one block: text is kept back until a split point (LastSplitPoint) past a
// block's worth, and encoded up to it. Text without split points (no line
// breaks or spaces between words) is held until one comes or it ends.
class StreamingEncoder {
 public:
  // Large enough that a block's fixed costs vanish, small enough that its
  // working set (WorkingSetBytes: about 11 MiB) stays beside the model's.
  static constexpr size_t kDefaultBlockBytes = size_t{1} << 18;
  StreamingEncoder(const Tokenizer& tokenizer, bool add_special, bool parse_special,
                   size_t block_bytes = kDefaultBlockBytes);
  // Appends the ids of the text settled so far to *out.
  void Add(std::string_view bytes, std::vector<int32_t>* out);
  // The rest (and EOS where add_special asks for it). Add after Finish
  // starts a new text.
  void Finish(std::vector<int32_t>* out);
  // The most text held at once: a block (and the lookahead) on text with
  // split points.
  size_t peak_held_bytes() const { return peak_held_; }
  // Text seen and not yet encoded.
  size_t held_bytes() const { return held_.size(); }
  // What an encoder with this block size holds at most on text with split
  // points: the block and Encode's own working set for it (code points,
  // words, ids).
  static uint64_t WorkingSetBytes(size_t block_bytes = kDefaultBlockBytes);

 private:
  void EncodeHeld(size_t end, bool last, std::vector<int32_t>* out);

  const Tokenizer& tokenizer_;
  const bool add_special_;
  const bool parse_special_;
  const size_t block_bytes_;
  std::string held_;
  size_t scanned_ = 0;  // no split point in held_[0, scanned_) (past the lookahead)
  bool first_ = true;
  bool prev_special_ = true;
  size_t peak_held_ = 0;
};

}  // namespace snapfill

#endif  // SNAPFILL_SRC_TOKENIZER_TOKENIZER_H_
