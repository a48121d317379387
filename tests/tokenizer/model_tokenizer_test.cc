// Tokenizer tests against the real SmolLM2 vocabulary and llama.cpp
// reference tokenizations (tests/data/, produced by llama.cpp's tools).
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "src/gguf/gguf_reader.h"
#include "src/tokenizer/chat_template.h"
#include "src/tokenizer/tokenizer.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/vocab.h"
#include "tools/cli/environment.h"

namespace snapfill {
namespace {

using ::snapfill::testing::SourcePath;
using ::testing::ElementsAre;

// --model's resolution without the flag: $SNAPFILL_MODEL, else models/.
std::string ModelPath() { return cli::ResolveModelPath(""); }

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

std::vector<int32_t> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  std::istringstream in(text);
  int64_t v;
  while (in >> v) ids.push_back(static_cast<int32_t>(v));
  return ids;
}

class ModelTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto file = GgufFile::Open(ModelPath());
    if (!file.ok()) return;
    auto tok = Tokenizer::FromGguf(**file);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = tok->release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  void SetUp() override {
    if (tokenizer_ == nullptr) GTEST_SKIP() << "model not found at " << ModelPath() << " (set SNAPFILL_MODEL)";
  }

  // Compares whole sequences; on a mismatch, reports the first differing
  // position with the surrounding tokens decoded.
  static void ExpectSameIds(const std::vector<int32_t>& expected, const std::vector<int32_t>& actual,
                            const std::string& what) {
    if (expected == actual) return;
    size_t i = 0;
    while (i < expected.size() && i < actual.size() && expected[i] == actual[i]) ++i;
    auto window = [&](const std::vector<int32_t>& ids) {
      std::string s;
      const size_t begin = i >= 8 ? i - 8 : 0;
      for (size_t j = begin; j < std::min(ids.size(), i + 8); ++j) {
        s += (j == i ? "[[" : "") + std::to_string(ids[j]) + ":'" + tokenizer_->TokenToPiece(ids[j], true) +
             "'" + (j == i ? "]]" : "") + " ";
      }
      return s;
    };
    ADD_FAILURE() << what << ": first mismatch at token " << i << " (expected " << expected.size()
                  << " tokens, got " << actual.size() << ")\n  llama.cpp: " << window(expected)
                  << "\n  snapfill:  " << window(actual);
  }

  static Tokenizer* tokenizer_;
};

Tokenizer* ModelTokenizerTest::tokenizer_ = nullptr;

TEST_F(ModelTokenizerTest, Metadata) {
  const Tokenizer& t = *tokenizer_;
  EXPECT_EQ(t.vocab_size(), 49152);
  EXPECT_EQ(t.model(), TokenizerModel::kBpe);
  EXPECT_EQ(t.pre(), "smollm");
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_FALSE(t.add_bos());
  EXPECT_FALSE(t.add_space_prefix());
  EXPECT_TRUE(t.IsEndOfGeneration(2));   // <|im_end|> (EOS)
  EXPECT_TRUE(t.IsEndOfGeneration(0));   // <|endoftext|>
  EXPECT_FALSE(t.IsEndOfGeneration(1));  // <|im_start|>
  EXPECT_FALSE(t.IsEndOfGeneration(19556));
  EXPECT_TRUE(t.IsControl(1));
  EXPECT_EQ(DetectChatTemplate(t.chat_template()).kind, ChatTemplateKind::kChatML);
}

TEST_F(ModelTokenizerTest, KnownPieces) {
  const Tokenizer& t = *tokenizer_;
  // Token texts in the GGUF vocabulary (GPT-2 alphabet), checked directly.
  const int32_t hello = t.TextToToken("Hello");
  const int32_t world = t.TextToToken("\xC4\xA0world");
  ASSERT_NE(hello, kNoToken);
  ASSERT_NE(world, kNoToken);
  EXPECT_THAT(t.Encode("Hello world", false, false), ElementsAre(hello, world));
  EXPECT_EQ(t.TokenToPiece(world), " world");
  // Digits are always single tokens with the smollm pre-tokenizer.
  const std::vector<int32_t> digits = t.Encode("2024", false, false);
  ASSERT_EQ(digits.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(digits[i], t.TextToToken(std::string(1, "2024"[i])));
}

TEST_F(ModelTokenizerTest, ParseSpecial) {
  const Tokenizer& t = *tokenizer_;
  const std::vector<int32_t> with = t.Encode("<|im_start|>user", false, true);
  ASSERT_EQ(with.size(), 2u);
  EXPECT_EQ(with[0], 1);
  EXPECT_EQ(with[1], t.TextToToken("user"));
  const std::vector<int32_t> without = t.Encode("<|im_start|>user", false, false);
  EXPECT_GT(without.size(), 2u);
  for (int32_t id : without) EXPECT_FALSE(t.IsControl(id)) << id;
  EXPECT_EQ(t.Decode(without), "<|im_start|>user");
  EXPECT_EQ(t.Decode(with), "user");
  EXPECT_EQ(t.Decode(with, /*render_special=*/true), "<|im_start|>user");
}

TEST_F(ModelTokenizerTest, EdgeCasesRoundTrip) {
  const Tokenizer& t = *tokenizer_;
  EXPECT_TRUE(t.Encode("", false, false).empty());
  EXPECT_THAT(t.Encode("", true, false), ::testing::IsEmpty());  // add_bos is false
  // Invalid UTF-8 (a lone lead byte, stray continuation bytes, a truncated
  // sequence), long white-space runs, a 100 KB word, control bytes.
  for (const std::string& s :
       {std::string("\xC3 abc \x80\x81 \xE2\x82 x\xC3"), std::string(5000, ' '),
        std::string("a") + std::string(3000, '\n') + "b", std::string(100000, 'x'),
        std::string("\x00\x01\x7F", 3), std::string("\xED\xA0\x80 surrogate")}) {
    const std::vector<int32_t> ids = t.Encode(s, false, false);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(t.Decode(ids), s) << "length " << s.size();
  }
  // A lone invalid byte is its own byte token.
  const std::vector<int32_t> lone = t.Encode("\x80", false, false);
  ASSERT_EQ(lone.size(), 1u);
  EXPECT_EQ(t.TokenToPiece(lone[0]), "\x80");
  // SmolLM2 has no token for byte 0xFF: it becomes U+FFFD, not nothing.
  EXPECT_EQ(t.Decode(t.Encode("\xFF\xFE abc \xC3", false, false)),
            "\xEF\xBF\xBD\xEF\xBF\xBD abc \xC3");
}

TEST_F(ModelTokenizerTest, CorpusRoundTrip) {
  for (const char* name : {"tests/data/tokenizer_corpus_small.txt", "tests/data/tokenizer_corpus.txt"}) {
    std::string text;
    if (!ReadFile(SourcePath(name), &text)) continue;
    EXPECT_EQ(tokenizer_->Decode(tokenizer_->Encode(text, false, false)), text) << name;
  }
}

std::vector<int32_t> StreamIn(const Tokenizer& tok, const std::string& text, size_t block, size_t read) {
  StreamingEncoder enc(tok, /*add_special=*/true, /*parse_special=*/false, block);
  std::vector<int32_t> out;
  for (size_t at = 0; at < text.size(); at += read) enc.Add(std::string_view(text).substr(at, read), &out);
  enc.Finish(&out);
  return out;
}

// The King James Bible (the Debian package bible-kjv that
// tools/install_deps.sh installs): about 4 MB of public-domain text.
std::string KjvText() {
  FILE* p = popen("bible -f 'Gen1:1-Rev22:21' 2>/dev/null", "r");
  if (p == nullptr) return "";
  std::string text;
  char buf[1 << 16];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) text.append(buf, n);
  pclose(p);
  return text;
}

// Streaming tokenization (a file read block by block) gives the ids of the
// whole text, on the 121 KB corpus and on a few MB of public-domain text,
// with blocks from 64 bytes (a cut at nearly every place that allows one)
// to the default 1 MiB.
TEST_F(ModelTokenizerTest, StreamingMatchesWholeText) {
  std::string corpus;
  ASSERT_TRUE(ReadFile(SourcePath("tests/data/tokenizer_corpus.txt"), &corpus));
  const std::vector<int32_t> whole = tokenizer_->Encode(corpus, true, false);
  for (const auto& [block, read] : {std::pair<size_t, size_t>{64, 61}, {1000, 4096}, {1 << 20, 1 << 20}}) {
    EXPECT_EQ(StreamIn(*tokenizer_, corpus, block, read), whole) << "block " << block;
  }
  const std::string kjv = KjvText();
  if (kjv.size() < (1u << 20)) GTEST_SKIP() << "the bible command (Debian bible-kjv) is missing";
  const std::vector<int32_t> kjv_whole = tokenizer_->Encode(kjv, true, false);
  EXPECT_GT(kjv_whole.size(), 1000000u);
  for (const auto& [block, read] : {std::pair<size_t, size_t>{4096, 1000}, {1 << 20, 1 << 20}}) {
    EXPECT_EQ(StreamIn(*tokenizer_, kjv, block, read), kjv_whole) << "block " << block;
  }
}

// A SentencePiece vocabulary made from SmolLM2's: the same tokens as bytes
// with "▁" for the space, scored by rank, with byte fallback.
TEST_F(ModelTokenizerTest, StreamingMatchesWholeTextSentencePiece) {
  Vocab v = testing::SpmVocabBase();
  std::set<std::string> seen(v.tokens.begin(), v.tokens.end());
  for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
    if (tokenizer_->IsControl(id)) continue;
    std::string bytes = tokenizer_->TokenToPiece(id);
    std::string text;
    for (char c : bytes) text += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
    if (text.empty() || !seen.insert(text).second) continue;
    testing::AddSpmToken(v, text, -static_cast<float>(id));
  }
  auto spm = Tokenizer::FromVocab(std::move(v));
  ASSERT_TRUE(spm.ok()) << spm.status();
  std::string corpus;
  ASSERT_TRUE(ReadFile(SourcePath("tests/data/tokenizer_corpus.txt"), &corpus));
  const std::vector<int32_t> whole = (*spm)->Encode(corpus, true, false);
  EXPECT_GT(whole.size(), 10000u);
  for (const auto& [block, read] : {std::pair<size_t, size_t>{64, 61}, {1000, 4096}, {1 << 20, 1 << 20}}) {
    EXPECT_EQ(StreamIn(**spm, corpus, block, read), whole) << "block " << block;
  }
}

TEST_F(ModelTokenizerTest, CorpusMatchesLlamaCpp) {
  int checked = 0;
  for (const char* stem : {"tests/data/tokenizer_corpus_small", "tests/data/tokenizer_corpus"}) {
    std::string text;
    std::string ids_text;
    if (!ReadFile(SourcePath(std::string(stem) + ".txt"), &text) ||
        !ReadFile(SourcePath(std::string(stem) + ".ids"), &ids_text)) {
      continue;
    }
    // llama-tokenize --ids --no-bos, special-token parsing off.
    ExpectSameIds(ParseIds(ids_text), tokenizer_->Encode(text, false, false), stem);
    ++checked;
  }
  // The same small corpus tokenized with special-token parsing on.
  std::string text;
  std::string ids_text;
  if (ReadFile(SourcePath("tests/data/tokenizer_corpus_small.txt"), &text) &&
      ReadFile(SourcePath("tests/data/tokenizer_corpus_small.parse_special.ids"), &ids_text)) {
    ExpectSameIds(ParseIds(ids_text), tokenizer_->Encode(text, false, true),
                  "tokenizer_corpus_small (parse_special)");
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no llama.cpp reference ids in tests/data/";
}

// logits_top10.json / greedy.json carry llama.cpp's tokenization of each
// prompt; any object with a string "prompt" and an id array "prompt_ids"
// (or "token_ids" when there is no "prompt_ids") is checked.
void CollectPrompts(const nlohmann::json& j,
                    std::vector<std::pair<std::string, std::vector<int32_t>>>* out) {
  if (j.is_object()) {
    if (j.contains("prompt") && j["prompt"].is_string()) {
      const char* key = j.contains("prompt_ids") ? "prompt_ids" : "token_ids";
      if (j.contains(key) && j[key].is_array()) {
        std::vector<int32_t> ids;
        for (const auto& v : j[key]) ids.push_back(v.get<int32_t>());
        out->emplace_back(j["prompt"].get<std::string>(), std::move(ids));
      }
    }
    for (const auto& [k, v] : j.items()) CollectPrompts(v, out);
  } else if (j.is_array()) {
    for (const auto& v : j) CollectPrompts(v, out);
  }
}

TEST_F(ModelTokenizerTest, PromptsMatchLlamaCpp) {
  std::vector<std::pair<std::string, std::vector<int32_t>>> prompts;
  for (const char* name : {"tests/data/logits_top10.json", "tests/data/greedy.json"}) {
    std::string text;
    if (!ReadFile(SourcePath(name), &text)) continue;
    CollectPrompts(nlohmann::json::parse(text), &prompts);
  }
  if (prompts.empty()) GTEST_SKIP() << "no llama.cpp prompt tokenizations in tests/data/";
  for (const auto& [prompt, ids] : prompts) {
    // llama.cpp's tools tokenize prompts with add_special and parse_special.
    ExpectSameIds(ids, tokenizer_->Encode(prompt, true, true), "prompt \"" + prompt.substr(0, 40) + "\"");
  }
}

}  // namespace
}  // namespace snapfill
