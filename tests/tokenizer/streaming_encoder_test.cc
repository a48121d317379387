// StreamingEncoder gives exactly Encode() of the whole text, whatever the
// block size and however the text is handed over, for every supported
// pre-tokenizer and for SentencePiece vocabularies (hand-made ones here;
// the real SmolLM2 vocabulary in model_tokenizer_test).
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/tokenizer/tokenizer.h"
#include "src/tokenizer/unicode.h"
#include "tests/testing/vocab.h"

namespace snapfill {
namespace {

// The pieces random texts are made of: letters, digits, runs of white
// space, punctuation, contractions, accented and non-Latin letters, an
// emoji, and invalid bytes.
const std::vector<std::string>& Pieces() {
  static const std::vector<std::string> kPieces = {
      "a",  "b",   "Z",  "x",  "1",  "2",  "3",  " ",        "  ", "\n", "\n\n", "\t", "\r\n", ".",
      ",",  "'s",  "'t", "é",  "É",  "ß",  "€",  "\xCE\xB1" /* α */, "\xE4\xB8\xAD" /* 中 */,
      "\xF0\x9F\x98\x80" /* 😀 */, "\xFF", "\xC3" /* cut sequence */, "\xE2\x80\x83" /* em space */,
      "\xC2\xA0" /* no-break space */, "<tool>", "he", "ll", "o", "q"};
  return kPieces;
}

std::string RandomText(std::mt19937& rng, int pieces) {
  const std::vector<std::string>& p = Pieces();
  std::uniform_int_distribution<size_t> pick(0, p.size() - 1);
  std::string s;
  for (int i = 0; i < pieces; ++i) s += p[pick(rng)];
  return s;
}

// A byte-level BPE vocabulary whose merges join most pairs of the test
// alphabet, so that a word split anywhere else shows in the ids.
Vocab MakeBpe(const std::string& pre) {
  Vocab v;
  v.model = TokenizerModel::kBpe;
  v.pre = pre;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(ByteToGpt2Char(static_cast<uint8_t>(b)));
  const std::vector<std::string> chars = {"a", "b", "Z", "x", "1", "2", "\xC4\xA0" /* Ġ */, "\xC4\x8A" /* Ċ */,
                                          "\xC4\x89" /* ĉ */, ".", "'", "s", "\xC4\x8D" /* č = \r */};
  for (const std::string& l : chars) {
    for (const std::string& r : chars) {
      v.tokens.push_back(l + r);
      v.merges.push_back(l + " " + r);
    }
  }
  for (const std::string& l : chars) {  // and some of three
    v.tokens.push_back(l + l + "a");
    v.merges.push_back(l + l + " a");
  }
  v.token_types.assign(v.tokens.size(), 1);
  v.tokens.push_back("<|endoftext|>");
  v.token_types.push_back(3);
  v.tokens.push_back("<tool>");
  v.token_types.push_back(4);  // user-defined: split out even without parse_special
  v.tokens.push_back("x\nq");  // user-defined across a line break: no split inside it
  v.token_types.push_back(4);
  v.bos_id = static_cast<int32_t>(v.tokens.size() - 3);
  v.eos_id = v.bos_id;
  v.add_bos = true;
  return v;
}

// A SentencePiece vocabulary: single characters, byte fallback, and
// scored merges of pairs and triples, some across "▁" and "\n".
Vocab MakeSpm(uint32_t seed) {
  Vocab v = testing::SpmVocabBase();
  auto add = [&](const std::string& t, float score, int type) { testing::AddSpmToken(v, t, score, type); };
  const std::string sp = "\xE2\x96\x81";
  const std::vector<std::string> chars = {"a", "b", "Z", "x", "1", "2", sp, "\n", ".", "'", "s", "é", "\t", "\r"};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> score(-10, 0);
  for (const std::string& c : chars) add(c, -20, 1);
  for (const std::string& l : chars) {
    for (const std::string& r : chars) {
      if (l + r == "x\n" || l + r == "a" + sp) continue;  // places the split rules may then use
      add(l + r, score(rng), 1);
    }
  }
  for (const std::string& l : {std::string("a"), std::string("b"), sp, std::string("\n")}) {
    for (const std::string& r : {std::string("ab"), std::string("ba"), sp + "a", std::string("\nb")}) {
      add(l + r, score(rng), 1);
    }
  }
  add("<tool>", 0, 4);
  v.add_eos = true;
  return v;
}

std::vector<int32_t> Streamed(const Tokenizer& tok, const std::string& text, size_t block, std::mt19937& rng,
                              bool add_special, size_t* splits = nullptr) {
  StreamingEncoder enc(tok, add_special, /*parse_special=*/false, block);
  std::vector<int32_t> out;
  std::uniform_int_distribution<size_t> step(1, 24);
  size_t held_before = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t n = std::min(step(rng), text.size() - at);
    enc.Add(std::string_view(text).substr(at, n), &out);
    if (splits != nullptr && enc.held_bytes() < held_before + n) ++*splits;
    held_before = enc.held_bytes();
    at += n;
  }
  enc.Finish(&out);
  return out;
}

void ExpectStreamingMatches(const Tokenizer& tok, uint32_t seed, size_t min_splits) {
  std::mt19937 rng(seed);
  size_t splits = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const std::string text = RandomText(rng, 300);
    for (const bool add_special : {true, false}) {
      const std::vector<int32_t> whole = tok.Encode(text, add_special, false);
      for (const size_t block : {1, 2, 7, 32, 200, 1 << 20}) {
        ASSERT_EQ(Streamed(tok, text, block, rng, add_special, &splits), whole)
            << "block " << block << " text (" << text.size() << " bytes): " << text;
      }
    }
  }
  EXPECT_GT(splits, min_splits) << "the texts should be split often";
}

class StreamingBpeTest : public ::testing::TestWithParam<const char*> {};

TEST_P(StreamingBpeTest, MatchesWholeText) {
  auto tok = Tokenizer::FromVocab(MakeBpe(GetParam()));
  ASSERT_TRUE(tok.ok()) << tok.status();
  ExpectStreamingMatches(**tok, 7, 1000);
}

// One name of each pattern family PreTokenizer::Create supports.
INSTANTIATE_TEST_SUITE_P(EveryPreTokenizer, StreamingBpeTest,
                         ::testing::Values("default", "llama3", "dbrx", "gpt-2", "trillion", "starcoder", "smollm",
                                           "qwen2", "stablelm2", "falcon"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) {
                             if (c == '-') c = '_';
                           }
                           return n;
                         });

TEST(StreamingSpmTest, MatchesWholeText) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    auto tok = Tokenizer::FromVocab(MakeSpm(seed));
    ASSERT_TRUE(tok.ok()) << tok.status();
    // Fewer places qualify: the vocabulary joins "\n" and "▁" to letters.
    ExpectStreamingMatches(**tok, seed, 500);
  }
}

// Every way of handing over two parts, around the places where a cut would
// go wrong: inside a UTF-8 sequence, inside runs of spaces and line breaks,
// between a letter and a digit, before a special token.
TEST(StreamingEncoderTest, EveryCutOfTrickyTexts) {
  const std::vector<std::string> texts = {
      "word  \n\nNext line\nA  b",     "caf\xC3\xA9\n\xC3\x89" "cole \xC3\xA9t\xC3\xA9 x",
      "abc123 def\n456 ghi7 j",        "x\n1 2\n\n3 a\tb\r\nc",
      "a\xF0\x9F\x98\x80 b\nc\xF0\x9F\x98\x80", "\xC3 \n b\xFF\nc d",
      "the x\nqend <tool>\nnext word",  "a\xE2\x80\x83\nb \xC2\xA0" "c\nd",
      "it's a dog's\nlife's end"};
  for (const char* pre : {"smollm", "llama3", "qwen2", "default"}) {
    auto bpe = Tokenizer::FromVocab(MakeBpe(pre));
    ASSERT_TRUE(bpe.ok());
    auto spm = Tokenizer::FromVocab(MakeSpm(5));
    ASSERT_TRUE(spm.ok());
    for (const Tokenizer* tok : {bpe->get(), spm->get()}) {
      for (const std::string& text : texts) {
        const std::vector<int32_t> whole = tok->Encode(text, true, false);
        for (size_t cut = 0; cut <= text.size(); ++cut) {
          StreamingEncoder enc(*tok, true, false, /*block_bytes=*/1);
          std::vector<int32_t> out;
          enc.Add(std::string_view(text).substr(0, cut), &out);
          enc.Add(std::string_view(text).substr(cut), &out);
          enc.Finish(&out);
          ASSERT_EQ(out, whole) << pre << " cut at " << cut << " of: " << text;
        }
      }
    }
  }
}

TEST(StreamingEncoderTest, SplitPointsAreWhereTheRulesSay) {
  auto tok = Tokenizer::FromVocab(MakeBpe("smollm"));
  ASSERT_TRUE(tok.ok());
  const std::string pad(Tokenizer::kSplitLookahead, '.');
  // After a lone line break, before a letter or digit.
  EXPECT_EQ((*tok)->LastSplitPoint("end.\nNext" + pad), 5u);
  EXPECT_EQ((*tok)->LastSplitPoint("end.\n1" + pad), 5u);
  EXPECT_EQ((*tok)->LastSplitPoint("end.\n\nNext" + pad), 0u) << "a run of line breaks joins";
  EXPECT_EQ((*tok)->LastSplitPoint("end \nNext" + pad), 0u) << "space before the line break joins it";
  EXPECT_EQ((*tok)->LastSplitPoint("end.\n Next" + pad), 0u);
  // Between a letter and " letter".
  EXPECT_EQ((*tok)->LastSplitPoint("one two" + pad), 3u);
  EXPECT_EQ((*tok)->LastSplitPoint("on\xC3\xA9 \xC3\xA9t" + pad), 4u) << "non-ASCII letters";
  EXPECT_EQ((*tok)->LastSplitPoint("one  two" + pad), 0u);
  EXPECT_EQ((*tok)->LastSplitPoint("one 2wo" + pad), 0u);
  EXPECT_EQ((*tok)->LastSplitPoint("on1 two" + pad), 0u);
  // Not inside a special token: "x\nq" is one here.
  EXPECT_EQ((*tok)->LastSplitPoint("ax\nqrs" + pad), 0u);
  EXPECT_EQ((*tok)->LastSplitPoint("ax\nrst" + pad), 3u);
  // The last one, at or after `from`.
  EXPECT_EQ((*tok)->LastSplitPoint("a b c d" + pad), 5u);
  EXPECT_EQ((*tok)->LastSplitPoint("a b c d" + pad, 5), 0u);
}

TEST(StreamingEncoderTest, HoldsAboutABlock) {
  auto tok = Tokenizer::FromVocab(MakeBpe("smollm"));
  ASSERT_TRUE(tok.ok());
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "some words on a line\n";
  StreamingEncoder enc(**tok, true, false, /*block_bytes=*/4096);
  std::vector<int32_t> out, all;
  for (size_t at = 0; at < text.size(); at += 1000) {
    enc.Add(std::string_view(text).substr(at, 1000), &out);
    all.insert(all.end(), out.begin(), out.end());
    out.clear();
  }
  enc.Finish(&all);
  EXPECT_EQ(all, (*tok)->Encode(text, true, false));
  EXPECT_LE(enc.peak_held_bytes(), 4096u + Tokenizer::kSplitLookahead);
  // Without split points the text is held until it ends, and still right.
  const std::string one_word(50000, 'a');
  StreamingEncoder whole(**tok, true, false, 4096);
  std::vector<int32_t> ids;
  for (size_t at = 0; at < one_word.size(); at += 1000) whole.Add(std::string_view(one_word).substr(at, 1000), &ids);
  EXPECT_TRUE(ids.empty());
  whole.Finish(&ids);
  EXPECT_EQ(ids, (*tok)->Encode(one_word, true, false));
}

}  // namespace
}  // namespace snapfill
