// Unit tests for the tokenizer with hand-made vocabularies; every expected
// id sequence below is derived by hand from the merge / score rules.
#include "src/tokenizer/tokenizer.h"

#include <chrono>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/tokenizer/pretokenizer.h"
#include "src/tokenizer/unicode.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/vocab.h"

namespace snapfill {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

std::vector<std::string> SplitWords(std::string_view pre, std::string_view text) {
  auto p = PreTokenizer::Create(pre);
  EXPECT_TRUE(p.ok()) << p.status();
  std::vector<std::string> words;
  if (!p.ok()) return words;
  for (const auto& [b, e] : (*p)->Split(text)) words.emplace_back(text.substr(b, e - b));
  return words;
}

TEST(PreTokenizerTest, Gpt2Pattern) {
  // 'm is a contraction; two spaces before a word leave one behind
  // (\s+(?!\S)); trailing white space is one piece.
  EXPECT_THAT(SplitWords("gpt-2", "I'm  fine\n\n"), ElementsAre("I", "'m", " ", " fine", "\n\n"));
  EXPECT_THAT(SplitWords("gpt-2", "Hi!! 42x"), ElementsAre("Hi", "!!", " 42", "x"));
  // Non-ASCII letters are letters; U+00A0 is white space.
  EXPECT_THAT(SplitWords("gpt-2", "na\xC3\xAFve caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87"),
              ElementsAre("na\xC3\xAFve", " caf\xC3\xA9", " \xE4\xB8\xAD\xE6\x96\x87"));
  EXPECT_THAT(SplitWords("gpt-2", "a\xC2\xA0" "b"), ElementsAre("a", "\xC2\xA0", "b"));
  // Case-sensitive contractions: 'S is not one.
  EXPECT_THAT(SplitWords("gpt-2", "it'S"), ElementsAre("it", "'", "S"));
}

TEST(PreTokenizerTest, InvalidBytesAreKeptAndGrouped) {
  // Each invalid byte counts as U+FFFD (a symbol), so they form one run.
  EXPECT_THAT(SplitWords("gpt-2", "ab\xFF\xFE" "cd"), ElementsAre("ab", "\xFF\xFE", "cd"));
  EXPECT_THAT(SplitWords("gpt-2", "x \xC3"), ElementsAre("x", " \xC3"));
}

TEST(PreTokenizerTest, SmolLmSplitsDigitsFirst) {
  // "\p{N}" splits every digit out first; GPT-2 rules then run inside each
  // piece, so the space before the digits is a piece of its own.
  EXPECT_THAT(SplitWords("smollm", "abc 123"), ElementsAre("abc", " ", "1", "2", "3"));
  EXPECT_THAT(SplitWords("smollm", "x  \xD9\xA3" "y"), ElementsAre("x", "  ", "\xD9\xA3", "y"));
}

TEST(PreTokenizerTest, Llama3Pattern) {
  EXPECT_THAT(SplitWords("llama-bpe", "Hello 12345 world's\r\n"),
              ElementsAre("Hello", " ", "123", "45", " world", "'s", "\r\n"));
  EXPECT_THAT(SplitWords("llama3", "it'S ok"), ElementsAre("it", "'S", " ok"));
}

TEST(PreTokenizerTest, DefaultUsesRegexSteps) {
  // Punctuation run, GPT-2, \p{N}+, then [0-9]{3} (PCRE2 over collapsed text).
  EXPECT_THAT(SplitWords("", "x = 1234;"), ElementsAre("x", " ", "=", " ", "123", "4", ";"));
  EXPECT_THAT(SplitWords("default", "x = 1234;"), ElementsAre("x", " ", "=", " ", "123", "4", ";"));
}

TEST(PreTokenizerTest, Qwen2Regex) {
  EXPECT_THAT(SplitWords("qwen2", "ab 12"), ElementsAre("ab", " ", "1", "2"));
  EXPECT_THAT(SplitWords("qwen2", "don'T stop"), ElementsAre("don", "'T", " stop"));
}

TEST(PreTokenizerTest, UnknownNameIsUnimplemented) {
  auto p = PreTokenizer::Create("no-such-pre");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(p.status().message()), ::testing::HasSubstr("no-such-pre"));
}

// Byte-level BPE vocabulary: ids 0..255 are the GPT-2 characters of bytes
// 0..255, then merged tokens, then special tokens.
struct BpeFixture {
  Vocab vocab;
  int32_t Id(const std::string& t) const {
    for (size_t i = 0; i < vocab.tokens.size(); ++i) {
      if (vocab.tokens[i] == t) return static_cast<int32_t>(i);
    }
    ADD_FAILURE() << "no token " << t;
    return -1;
  }
};

BpeFixture MakeBpe() {
  BpeFixture f;
  Vocab& v = f.vocab;
  v.model = TokenizerModel::kBpe;
  v.pre = "gpt-2";
  for (int b = 0; b < 256; ++b) v.tokens.push_back(ByteToGpt2Char(static_cast<uint8_t>(b)));
  for (const char* t : {"he", "ll", "hell", "hello", "\xC4\xA0w", "bc", "aa", "aaaa", "ab"}) {
    v.tokens.push_back(t);
  }
  v.merges = {"h e", "l l", "he ll", "hell o", "\xC4\xA0 w", "b c", "a b", "a a", "aa aa", "x y"};
  v.token_types.assign(v.tokens.size(), 1);
  for (const char* t : {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im_start|>user"}) {
    v.tokens.push_back(t);
    v.token_types.push_back(3);
  }
  v.tokens.push_back("<tool>");
  v.token_types.push_back(4);  // user-defined: split out even without parse_special
  v.bos_id = f.Id("<|im_start|>");
  v.eos_id = f.Id("<|endoftext|>");
  return f;
}

std::unique_ptr<Tokenizer> Build(Vocab v) {
  auto t = Tokenizer::FromVocab(std::move(v));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

TEST(BpeTest, MergesByRank) {
  BpeFixture f = MakeBpe();
  auto tok = Build(f.vocab);
  ASSERT_NE(tok, nullptr);
  // h e l l o -> he, ll (ranks 0, 1) -> hell (2) -> hello (3).
  EXPECT_THAT(tok->Encode("hello", false, false), ElementsAre(f.Id("hello")));
  // " w" merges; "orld" has no merges, so its bytes stay.
  EXPECT_THAT(tok->Encode("hello world", false, false),
              ElementsAre(f.Id("hello"), f.Id("\xC4\xA0w"), 'o', 'r', 'l', 'd'));
  // "abc": b c (rank 5) beats a b (rank 6).
  EXPECT_THAT(tok->Encode("abc", false, false), ElementsAre('a', f.Id("bc")));
  // "aaaaa": equal ranks merge leftmost first: aa aa a -> aaaa a.
  EXPECT_THAT(tok->Encode("aaaaa", false, false), ElementsAre(f.Id("aaaa"), 'a'));
}

TEST(BpeTest, MergeResultThatIsNotATokenFallsBackToBytes) {
  BpeFixture f = MakeBpe();
  auto tok = Build(f.vocab);
  ASSERT_NE(tok, nullptr);
  // "x y" merges into "xy", which is no token: llama.cpp then emits the
  // single-byte tokens of its text.
  EXPECT_THAT(tok->Encode("xy", false, false), ElementsAre('x', 'y'));
}

TEST(BpeTest, SpecialTokens) {
  BpeFixture f = MakeBpe();
  auto tok = Build(f.vocab);
  ASSERT_NE(tok, nullptr);
  // The longest special text wins ("<|im_start|>user" over "<|im_start|>").
  EXPECT_THAT(tok->Encode("<|im_start|>user\nhe", false, true),
              ElementsAre(f.Id("<|im_start|>user"), '\n', f.Id("he")));
  EXPECT_THAT(tok->Encode("<|im_start|>he<|im_end|>", false, true),
              ElementsAre(f.Id("<|im_start|>"), f.Id("he"), f.Id("<|im_end|>")));
  // Without parse_special the text is plain text: "<|", "im", "_", "start",
  // "|>" pre-tokenized, bytes unmerged except "he".
  std::vector<int32_t> plain;
  for (char c : std::string("<|im_start|>")) plain.push_back(static_cast<uint8_t>(c));
  plain.push_back(f.Id("he"));
  EXPECT_THAT(tok->Encode("<|im_start|>he", false, false), ElementsAreArray(plain));
  // User-defined tokens are split out either way.
  EXPECT_THAT(tok->Encode("a<tool>b", false, false), ElementsAre('a', f.Id("<tool>"), 'b'));
}

TEST(BpeTest, AddSpecialAndEmpty) {
  BpeFixture f = MakeBpe();
  f.vocab.add_bos = true;
  f.vocab.add_eos = true;
  auto tok = Build(f.vocab);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("he", true, false), ElementsAre(f.Id("<|im_start|>"), f.Id("he"), f.Id("<|endoftext|>")));
  EXPECT_THAT(tok->Encode("", true, false), ElementsAre(f.Id("<|im_start|>"), f.Id("<|endoftext|>")));
  EXPECT_TRUE(tok->Encode("", false, false).empty());
  EXPECT_TRUE(tok->add_bos());
}

TEST(BpeTest, PiecesAndDecode) {
  BpeFixture f = MakeBpe();
  auto tok = Build(f.vocab);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->TokenToPiece(f.Id("\xC4\xA0w")), " w");
  EXPECT_EQ(tok->TokenToPiece(0xFF), "\xFF");
  EXPECT_EQ(tok->TokenToPiece(f.Id("<|im_end|>")), "");
  EXPECT_EQ(tok->TokenToPiece(f.Id("<|im_end|>"), /*render_special=*/true), "<|im_end|>");
  EXPECT_EQ(tok->TokenToPiece(f.Id("<tool>")), "<tool>");
  EXPECT_EQ(tok->TokenToPiece(-1), "");
  EXPECT_EQ(tok->TokenToPiece(1 << 20), "");
  // gpt-2 cleans " ." and " 's" when decoding, as llama.cpp does.
  EXPECT_EQ(tok->Decode(tok->Encode("he . he 's", false, false)), "he. he's");
}

TEST(BpeTest, EndOfGeneration) {
  BpeFixture f = MakeBpe();
  auto tok = Build(f.vocab);
  ASSERT_NE(tok, nullptr);
  EXPECT_TRUE(tok->IsEndOfGeneration(f.Id("<|endoftext|>")));
  EXPECT_TRUE(tok->IsEndOfGeneration(f.Id("<|im_end|>")));  // found by text
  EXPECT_FALSE(tok->IsEndOfGeneration(f.Id("<|im_start|>")));
  EXPECT_FALSE(tok->IsEndOfGeneration(f.Id("he")));
  EXPECT_FALSE(tok->IsEndOfGeneration(-1));
}

TEST(BpeTest, InvalidUtf8RoundTripsByteExactly) {
  BpeFixture f = MakeBpe();
  f.vocab.pre = "smollm";
  auto tok = Build(f.vocab);
  ASSERT_NE(tok, nullptr);
  const std::string text = "\xFF\xFE abc \xC3";
  const std::vector<int32_t> ids = tok->Encode(text, false, false);
  // Each invalid byte is its own byte token; "bc" merges.
  EXPECT_THAT(ids, ElementsAre(0xFF, 0xFE, ' ', 'a', f.Id("bc"), ' ', 0xC3));
  EXPECT_EQ(tok->Decode(ids), text);
  std::string all_bytes;
  for (int b = 255; b >= 0; --b) all_bytes.push_back(static_cast<char>(b));
  EXPECT_EQ(tok->Decode(tok->Encode(all_bytes, false, false)), all_bytes);
}

TEST(BpeTest, LongInputsStayFast) {
  BpeFixture f = MakeBpe();
  auto tok = Build(f.vocab);
  ASSERT_NE(tok, nullptr);
  const auto start = std::chrono::steady_clock::now();
  // A 100 KB word: 'a' x 100000 -> 25000 x "aaaa".
  const std::vector<int32_t> ids = tok->Encode(std::string(100000, 'a'), false, false);
  EXPECT_EQ(ids.size(), 25000u);
  EXPECT_EQ(ids.front(), f.Id("aaaa"));
  // A long white-space run: one piece for all but the last space.
  const std::string spaces = "x" + std::string(100000, ' ') + "y";
  EXPECT_EQ(tok->Decode(tok->Encode(spaces, false, false)), spaces);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 2.0);
}

TEST(BpeTest, BadVocabularies) {
  BpeFixture f = MakeBpe();
  Vocab dup = f.vocab;
  dup.tokens[260] = dup.tokens[5];
  auto s = Tokenizer::FromVocab(dup);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);

  Vocab bad_id = f.vocab;
  bad_id.bos_id = 100000;
  EXPECT_EQ(Tokenizer::FromVocab(bad_id).status().code(), absl::StatusCode::kInvalidArgument);

  Vocab no_bos = f.vocab;
  no_bos.bos_id = kNoToken;
  no_bos.add_bos = true;
  EXPECT_EQ(Tokenizer::FromVocab(no_bos).status().code(), absl::StatusCode::kInvalidArgument);

  Vocab types = f.vocab;
  types.token_types.pop_back();
  EXPECT_EQ(Tokenizer::FromVocab(types).status().code(), absl::StatusCode::kInvalidArgument);

  Vocab pre = f.vocab;
  pre.pre = "mystery";
  EXPECT_EQ(Tokenizer::FromVocab(pre).status().code(), absl::StatusCode::kUnimplemented);

  EXPECT_EQ(Tokenizer::FromVocab(Vocab{}).status().code(), absl::StatusCode::kInvalidArgument);
}

// SentencePiece vocabulary: <unk>, <s>, </s>, 256 byte tokens, then pieces
// with scores (higher merges first).
struct SpmFixture {
  Vocab vocab;
  int32_t Id(const std::string& t) const {
    for (size_t i = 0; i < vocab.tokens.size(); ++i) {
      if (vocab.tokens[i] == t) return static_cast<int32_t>(i);
    }
    ADD_FAILURE() << "no token " << t;
    return -1;
  }
};

SpmFixture MakeSpm() {
  SpmFixture f;
  Vocab& v = f.vocab;
  v = testing::SpmVocabBase();
  auto add = [&](const std::string& t, float score, int type) { testing::AddSpmToken(v, t, score, type); };
  const std::string sp = "\xE2\x96\x81";
  for (const char* c : {"h", "e", "l", "o", "w", "r", "d", "a"}) add(c, -10, 1);
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
  return f;
}

TEST(SpmTest, MergesByScore) {
  SpmFixture f = MakeSpm();
  auto tok = Build(f.vocab);
  ASSERT_NE(tok, nullptr);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_TRUE(tok->add_space_prefix());
  // "▁hello▁world": he, ll, hell, hello, ▁hello; ▁w, or, ▁wor, ld, ▁world.
  EXPECT_THAT(tok->Encode("hello world", true, false),
              ElementsAre(1, f.Id("\xE2\x96\x81hello"), f.Id("\xE2\x96\x81world")));
  EXPECT_THAT(tok->Encode("", true, false), ElementsAre(1));
  EXPECT_TRUE(tok->Encode("", false, false).empty());
  // "▁aaa": equal scores merge leftmost first -> ▁, aa, a.
  EXPECT_THAT(tok->Encode("aaa", false, false),
              ElementsAre(f.Id("\xE2\x96\x81"), f.Id("aa"), f.Id("a")));
  EXPECT_EQ(tok->Decode(tok->Encode("hello world", true, false)), " hello world")
      << "llama.cpp keeps the space when the first token is BOS";
  EXPECT_EQ(tok->Decode(tok->Encode("hello world", false, false)), "hello world");
}

TEST(SpmTest, ByteFallbackAndInvalidUtf8) {
  SpmFixture f = MakeSpm();
  auto tok = Build(f.vocab);
  ASSERT_NE(tok, nullptr);
  // é is no piece: its two bytes become <0xC3> <0xA9>.
  const std::vector<int32_t> ids = tok->Encode("h\xC3\xA9", false, false);
  EXPECT_THAT(ids, ElementsAre(f.Id("\xE2\x96\x81"), f.Id("h"), f.Id("<0xC3>"), f.Id("<0xA9>")));
  EXPECT_EQ(tok->Decode(ids), "h\xC3\xA9");
  const std::string bad = "\xFF\xFE abc \xC3";
  EXPECT_EQ(tok->Decode(tok->Encode(bad, false, false)), bad);
}

TEST(SpmTest, SpecialTokensGetSpacePrefixAfter) {
  SpmFixture f = MakeSpm();
  auto tok = Build(f.vocab);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("hello<s>world", false, true),
              ElementsAre(f.Id("\xE2\x96\x81hello"), 1, f.Id("\xE2\x96\x81world")));
  EXPECT_TRUE(tok->IsEndOfGeneration(2));
  EXPECT_EQ(tok->TokenToPiece(f.Id("\xE2\x96\x81world")), " world");
  EXPECT_EQ(tok->TokenToPiece(f.Id("<0x41>")), "A");
  EXPECT_EQ(tok->TokenToPiece(1), "");
}

}  // namespace
}  // namespace snapfill
