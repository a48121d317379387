// Unicode helpers for the tokenizer: UTF-8 decoding that never loses bytes,
// codepoint classes (letter / number / punctuation / mark / symbol / other,
// plus white space) matching llama.cpp's unicode_cpt_flags, and the GPT-2
// byte <-> unicode alphabet used by byte-level BPE.
#ifndef SNAPFILL_SRC_TOKENIZER_UNICODE_H_
#define SNAPFILL_SRC_TOKENIZER_UNICODE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace snapfill {

// General Category, collapsed the way llama.cpp collapses it.
enum class UnicodeClass : uint8_t {
  kOther = 0,   // separators, controls, unassigned, private use, surrogates
  kLetter = 1,  // \p{L}
  kNumber = 2,  // \p{N}
  kPunctuation = 3,  // \p{P}
  kMark = 4,    // \p{M}
  kSymbol = 5,  // \p{S}
};

namespace unicode_internal {
struct ClassRange {
  uint32_t first;
  uint8_t cls;
};
}  // namespace unicode_internal

struct CodepointInfo {
  UnicodeClass cls = UnicodeClass::kOther;
  bool whitespace = false;  // Unicode White_Space (25 codepoints)
  bool IsLetter() const { return cls == UnicodeClass::kLetter; }
  bool IsNumber() const { return cls == UnicodeClass::kNumber; }
};

// Class of a codepoint; codepoints past U+10FFFF are kOther.
CodepointInfo GetCodepointInfo(uint32_t cpt);

// One decoded codepoint of a UTF-8 string. Invalid bytes (a bad lead byte,
// a truncated sequence, a value past U+10FFFF) become one "codepoint" each
// with cpt = U+FFFD, as in llama.cpp's unicode_cpts_from_utf8, but the
// original bytes stay addressable through the offsets.
struct DecodedText {
  std::vector<uint32_t> cpts;     // [n]
  std::vector<uint32_t> offsets;  // [n + 1] byte offset of each codepoint
};
DecodedText DecodeUtf8(std::string_view text);

// Byte positions that DecodeUtf8 would turn into U+FFFD (empty if none).
std::vector<size_t> InvalidUtf8Positions(std::string_view text);

// Length of a UTF-8 sequence from its lead byte (1 for continuation and
// invalid bytes' high nibble < 0xC), as llama.cpp's unicode_len_utf8.
inline size_t Utf8LenFromLead(char c) {
  static constexpr uint8_t kLookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLookup[static_cast<uint8_t>(c) >> 4];
}

void AppendUtf8(uint32_t cpt, std::string* out);

// GPT-2 byte-level alphabet: each byte maps to a printable codepoint.
const std::string& ByteToGpt2Char(uint8_t byte);
// Inverse; returns -1 for a codepoint outside the alphabet.
int Gpt2CodepointToByte(uint32_t cpt);

}  // namespace snapfill

#endif  // SNAPFILL_SRC_TOKENIZER_UNICODE_H_
