#include "src/tokenizer/unicode.h"

#include <array>

namespace snapfill {
namespace unicode_internal {
extern const ClassRange kClassRanges[];
extern const int kNumClassRanges;
}  // namespace unicode_internal

namespace {

constexpr uint32_t kMaxCodepoints = 0x110000;

bool IsWhiteSpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// One byte per codepoint: class in the low 3 bits, white space in bit 3.
// 1.1 MB, built once; lookups are then a single load.
const std::vector<uint8_t>& ClassTable() {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> t(kMaxCodepoints, 0);
    using unicode_internal::kClassRanges;
    for (int i = 0; i < unicode_internal::kNumClassRanges; ++i) {
      const uint32_t end =
          i + 1 < unicode_internal::kNumClassRanges ? kClassRanges[i + 1].first : kMaxCodepoints;
      for (uint32_t c = kClassRanges[i].first; c < end; ++c) t[c] = kClassRanges[i].cls;
    }
    for (uint32_t c = 0; c < 0x3001; ++c) {
      if (IsWhiteSpace(c)) t[c] |= 8;
    }
    return t;
  }();
  return table;
}

struct Gpt2Tables {
  std::array<std::string, 256> byte_to_char;
  std::array<int16_t, 512> cpt_to_byte;  // all alphabet codepoints are < 512
};

const Gpt2Tables& Gpt2() {
  static const Gpt2Tables tables = [] {
    Gpt2Tables t;
    t.cpt_to_byte.fill(-1);
    std::array<bool, 256> direct{};
    for (int b = 0x21; b <= 0x7E; ++b) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cpt = direct[b] ? b : 256 + n++;
      AppendUtf8(cpt, &t.byte_to_char[b]);
      t.cpt_to_byte[cpt] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}

}  // namespace

CodepointInfo GetCodepointInfo(uint32_t cpt) {
  if (cpt >= kMaxCodepoints) return {};
  const uint8_t v = ClassTable()[cpt];
  return {static_cast<UnicodeClass>(v & 7), (v & 8) != 0};
}

// Decodes the codepoint at p[i]; returns its length, or 0 for an invalid
// byte. Same acceptance rules as llama.cpp's unicode_cpt_from_utf8 (which
// does not reject overlong forms or surrogates), plus a range check.
inline size_t DecodeOne(const uint8_t* p, size_t n, size_t i, uint32_t* cpt) {
  auto cont = [&](size_t j) { return j < n && (p[j] & 0xC0) == 0x80; };
  const uint8_t b = p[i];
  if (b < 0x80) {
    *cpt = b;
    return 1;
  }
  if ((b & 0xE0) == 0xC0 && cont(i + 1)) {
    *cpt = ((b & 0x1F) << 6) | (p[i + 1] & 0x3F);
    return 2;
  }
  if ((b & 0xF0) == 0xE0 && cont(i + 1) && cont(i + 2)) {
    *cpt = ((b & 0x0F) << 12) | ((p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F);
    return 3;
  }
  if ((b & 0xF8) == 0xF0 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
    const uint32_t v = ((b & 0x07) << 18) | ((p[i + 1] & 0x3F) << 12) |
                       ((p[i + 2] & 0x3F) << 6) | (p[i + 3] & 0x3F);
    if (v < kMaxCodepoints) {
      *cpt = v;
      return 4;
    }
  }
  *cpt = 0xFFFD;
  return 0;
}

DecodedText DecodeUtf8(std::string_view s) {
  DecodedText out;
  out.cpts.reserve(s.size());
  out.offsets.reserve(s.size() + 1);
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    out.offsets.push_back(static_cast<uint32_t>(i));
    uint32_t cpt;
    const size_t len = DecodeOne(p, n, i, &cpt);
    out.cpts.push_back(cpt);
    i += len == 0 ? 1 : len;
  }
  out.offsets.push_back(static_cast<uint32_t>(n));
  return out;
}

std::vector<size_t> InvalidUtf8Positions(std::string_view s) {
  std::vector<size_t> out;
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    uint32_t cpt;
    const size_t len = DecodeOne(p, n, i, &cpt);
    if (len == 0) out.push_back(i);
    i += len == 0 ? 1 : len;
  }
  return out;
}

void AppendUtf8(uint32_t cpt, std::string* out) {
  if (cpt <= 0x7F) {
    out->push_back(static_cast<char>(cpt));
  } else if (cpt <= 0x7FF) {
    out->push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt <= 0xFFFF) {
    out->push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | ((cpt >> 18) & 0x07)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

const std::string& ByteToGpt2Char(uint8_t byte) { return Gpt2().byte_to_char[byte]; }

int Gpt2CodepointToByte(uint32_t cpt) {
  return cpt < 512 ? Gpt2().cpt_to_byte[cpt] : -1;
}

}  // namespace snapfill
