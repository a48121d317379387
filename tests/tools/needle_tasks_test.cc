// The needle tasks (tools/cli/needle_tasks.h): the answer rules (numbers
// with separators, whole words in any case, multivalue's all-values rule,
// vartrack's share of the chain), what each trial plants (distinct values,
// the asked needle at the cell's depth, the others spread), and the prompts
// built on the tiny model's tokenizer: the asked length, every needle
// sentence once, in the order of the depths recorded for it.
#include "tools/cli/needle_tasks.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "src/gguf/gguf_reader.h"
#include "tools/testmodel/tiny_llama.h"
#include "tests/testing/status_matchers.h"

namespace snapfill::cli {
namespace {

constexpr NeedleTask kAllTasks[] = {NeedleTask::kPasskey, NeedleTask::kMultikey,
                                    NeedleTask::kMultivalue, NeedleTask::kVartrack,
                                    NeedleTask::kFact};

TEST(NeedleTasksTest, ParsesTheTaskList) {
  auto tasks = ParseNeedleTasks("fact, passkey,fact,multikey");
  SNAPFILL_ASSERT_OK(tasks.status());
  EXPECT_EQ(*tasks, (std::vector<NeedleTask>{NeedleTask::kFact, NeedleTask::kPasskey,
                                             NeedleTask::kMultikey}));
  for (NeedleTask t : kAllTasks) {
    auto one = ParseNeedleTasks(InfoOf(t).name);
    SNAPFILL_ASSERT_OK(one.status());
    EXPECT_EQ(*one, std::vector<NeedleTask>{t});
    EXPECT_NE(NeedleTaskNames().find(InfoOf(t).name), std::string::npos);
  }
  auto bad = ParseNeedleTasks("passkey,haystack");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--tasks: \"haystack\""), std::string::npos)
      << bad.status();
  EXPECT_NE(bad.status().message().find("vartrack"), std::string::npos) << bad.status();
  EXPECT_EQ(ParseNeedleTasks(" , ").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NeedleTasksTest, NumbersMatchWhateverTheSeparators) {
  EXPECT_TRUE(ContainsNumber("The number is 1234567.", "1234567"));
  EXPECT_TRUE(ContainsNumber("It is 1,234,567", "1234567"));
  EXPECT_TRUE(ContainsNumber("It is 1'234'567", "1234567"));
  EXPECT_FALSE(ContainsNumber("It is 123456", "1234567"));
  EXPECT_FALSE(ContainsNumber("It is 1 234 567", "1234567"));
}

TEST(NeedleTasksTest, WordsMatchWholeInAnyCase) {
  EXPECT_TRUE(ContainsWord("In a blue TIN box.", "tin"));
  EXPECT_TRUE(ContainsWord("tin", "tin"));
  EXPECT_TRUE(ContainsWord("VAR ABCDE, VAR FGHIJ", "fghij"));
  EXPECT_FALSE(ContainsWord("He was getting it", "tin"));
  EXPECT_FALSE(ContainsWord("tinder", "tin"));
  EXPECT_FALSE(ContainsWord("VAR XABCDE", "ABCDE"));
  EXPECT_FALSE(ContainsWord("anything", ""));
}

TEST(NeedleTasksTest, MultivalueNeedsEveryValue) {
  const NeedleTrial t = MakeNeedleTrial(NeedleTask::kMultivalue, 1024, 1, 0.5, 0);
  ASSERT_EQ(t.expected.size(), 4u);
  std::string answer = "They are ";
  for (size_t i = 0; i < t.expected.size(); ++i) {
    const NeedleScore s = ScoreNeedleAnswer(t, answer);
    EXPECT_EQ(s.matched, static_cast<int>(i));
    EXPECT_FALSE(s.found) << answer;
    answer += t.expected[i] + ", ";
  }
  const NeedleScore all = ScoreNeedleAnswer(t, answer);
  EXPECT_EQ(all.matched, 4);
  EXPECT_TRUE(all.found);
}

TEST(NeedleTasksTest, VartrackCountsTheChainsVariables) {
  const NeedleTrial t = MakeNeedleTrial(NeedleTask::kVartrack, 2048, 0, 0.25, 1);
  ASSERT_EQ(t.expected.size(), 5u);
  ASSERT_EQ(t.distractors.size(), 5u);
  // Lower case, in a list: three of the five, and one of the other chain.
  const std::string answer = absl::StrCat("var ", absl::AsciiStrToLower(t.expected[0]), ", VAR ",
                                          t.expected[2], " and ", t.expected[4], "; VAR ",
                                          t.distractors[1]);
  const NeedleScore s = ScoreNeedleAnswer(t, answer);
  EXPECT_EQ(s.matched, 3);
  EXPECT_FALSE(s.found);
  EXPECT_TRUE(s.distractor);
}

TEST(NeedleTasksTest, MultikeyFlagsADistractorsNumber) {
  const NeedleTrial t = MakeNeedleTrial(NeedleTask::kMultikey, 1024, 0, 0.0, 0);
  ASSERT_EQ(t.expected.size(), 1u);
  ASSERT_EQ(t.distractors.size(), 3u);
  NeedleScore s = ScoreNeedleAnswer(t, "The number is " + t.distractors[2] + ".");
  EXPECT_FALSE(s.found);
  EXPECT_TRUE(s.distractor);
  s = ScoreNeedleAnswer(t, "The number is " + t.expected[0] + ".");
  EXPECT_TRUE(s.found);
  EXPECT_FALSE(s.distractor);
}

TEST(NeedleTasksTest, FactMatchesItsWordInAnyCase) {
  // Every fact of the table: its word is in its sentence, not in its
  // question (the question must not give the answer away).
  std::set<std::string> sentences;
  for (int seed = 0; seed < 200; ++seed) {
    const NeedleTrial t = MakeNeedleTrial(NeedleTask::kFact, 1024, 0, 0.5, seed);
    ASSERT_EQ(t.needles.size(), 1u);
    ASSERT_EQ(t.expected.size(), 1u);
    sentences.insert(t.needles[0].text);
    EXPECT_TRUE(ContainsWord(t.needles[0].text, t.expected[0])) << t.needles[0].text;
    EXPECT_FALSE(ContainsWord(t.question, t.expected[0])) << t.question;
    EXPECT_TRUE(ScoreNeedleAnswer(t, absl::AsciiStrToUpper(t.needles[0].text)).found);
    EXPECT_FALSE(ScoreNeedleAnswer(t, t.question).found);
  }
  EXPECT_GE(sentences.size(), 8u);
}

// The passkey's key is the draw it has always been: the 7-digit number from
// seed_seq{length, depth index, seed, 0x6e65}.
TEST(NeedleTasksTest, PasskeyKeyIsTheSeededDraw) {
  for (int seed = 0; seed < 3; ++seed) {
    std::seed_seq seq{4096u, 2u, static_cast<uint32_t>(seed), 0x6e65u};
    std::mt19937_64 rng(seq);
    const NeedleTrial t = MakeNeedleTrial(NeedleTask::kPasskey, 4096, 2, 0.5, seed);
    ASSERT_EQ(t.expected.size(), 1u);
    EXPECT_EQ(t.expected[0], absl::StrCat(1000000 + rng() % 9000000));
    ASSERT_EQ(t.needles.size(), 1u);
    EXPECT_EQ(t.needles[0].text, "The special magic number is " + t.expected[0] + ".");
    EXPECT_EQ(t.question, "What is the special magic number mentioned in the text?");
  }
}

TEST(NeedleTasksTest, TrialsAreDeterministicAndDistinct) {
  std::set<std::string> questions_and_values;
  for (NeedleTask task : kAllTasks) {
    for (int seed = 0; seed < 20; ++seed) {
      for (size_t di = 0; di < 3; ++di) {
        const double depth = di / 2.0;
        const NeedleTrial t = MakeNeedleTrial(task, 1024, di, depth, seed);
        const NeedleTrial again = MakeNeedleTrial(task, 1024, di, depth, seed);
        ASSERT_EQ(t.needles.size(), again.needles.size());
        for (size_t i = 0; i < t.needles.size(); ++i) {
          EXPECT_EQ(t.needles[i].text, again.needles[i].text);
          EXPECT_EQ(t.needles[i].depth, again.needles[i].depth);
        }
        EXPECT_EQ(t.question, again.question);
        // The needle at the cell's depth is asked about.
        ASSERT_FALSE(t.needles.empty());
        EXPECT_EQ(t.needles[0].depth, depth);
        EXPECT_TRUE(t.needles[0].asked);
        // Planted values and names are distinct within a trial.
        std::set<std::string> texts, values(t.expected.begin(), t.expected.end());
        values.insert(t.distractors.begin(), t.distractors.end());
        for (const Needle& n : t.needles) {
          texts.insert(n.text);
          EXPECT_GE(n.depth, 0.0);
          EXPECT_LE(n.depth, 1.0);
        }
        EXPECT_EQ(texts.size(), t.needles.size());
        EXPECT_EQ(values.size(), t.expected.size() + t.distractors.size());
        // Every expected value is in an asked needle, every distractor in
        // another.
        for (const std::string& v : t.expected) {
          EXPECT_TRUE(std::any_of(t.needles.begin(), t.needles.end(), [&](const Needle& n) {
            return n.asked && n.text.find(v) != std::string::npos;
          })) << v;
        }
        for (const std::string& v : t.distractors) {
          EXPECT_TRUE(std::any_of(t.needles.begin(), t.needles.end(), [&](const Needle& n) {
            return !n.asked && n.text.find(v) != std::string::npos;
          })) << v;
        }
        questions_and_values.insert(absl::StrCat(t.question, "|", t.expected[0]));
      }
    }
  }
  // Numbers and names vary over cells and seeds (facts repeat: 10 of them).
  EXPECT_GT(questions_and_values.size(), 4u * 60 * 9 / 10);
}

TEST(NeedleTasksTest, MultiNeedlesSpreadOverTheText) {
  for (NeedleTask task : {NeedleTask::kMultikey, NeedleTask::kMultivalue}) {
    for (double depth : {0.0, 0.3, 0.5, 0.75, 1.0}) {
      const NeedleTrial t = MakeNeedleTrial(task, 1024, 0, depth, 0);
      ASSERT_EQ(t.needles.size(), 4u);
      std::vector<double> d;
      for (const Needle& n : t.needles) d.push_back(n.depth);
      std::sort(d.begin(), d.end());
      for (size_t i = 1; i < d.size(); ++i) EXPECT_NEAR(d[i] - d[i - 1], 0.25, 1e-9) << depth;
    }
  }
  // Vartrack's chain runs in text order from the cell's depth; each
  // assignment names the variable before it.
  const NeedleTrial t = MakeNeedleTrial(NeedleTask::kVartrack, 1024, 0, 0.4, 0);
  for (size_t i = 1; i < t.expected.size(); ++i) {
    EXPECT_GT(t.needles[i].depth, t.needles[i - 1].depth);
    EXPECT_EQ(t.needles[i].text,
              absl::StrCat("VAR ", t.expected[i], " = VAR ", t.expected[i - 1], "."));
  }
  EXPECT_NE(t.question.find(t.needles[0].text.substr(t.needles[0].text.find("= ") + 2, 5)),
            std::string::npos);
}

class NeedlePromptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "/needle_tasks_tiny_" + std::to_string(getpid()) + ".gguf";
    SNAPFILL_ASSERT_OK(WriteTinyLlamaGguf(path_, TinyLlamaOptions()));
    auto file = GgufFile::Open(path_);
    SNAPFILL_ASSERT_OK(file.status());
    file_ = std::move(*file);
    auto tok = Tokenizer::FromGguf(*file_);
    SNAPFILL_ASSERT_OK(tok.status());
    tokenizer_ = std::move(*tok);
    chatml_ = DetectChatTemplate("chatml");
    std::string text;
    for (int i = 0; i < 80; ++i) {
      text += "Line " + std::to_string(i) + " of the haystack says little. ";
      text += "The quick brown fox jumps over the lazy dog.\n";
    }
    haystack_ = tokenizer_->Encode(text, false, false);
  }
  void TearDown() override { std::remove(path_.c_str()); }

  std::string path_;
  std::unique_ptr<GgufFile> file_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ChatTemplate chatml_;
  std::vector<int32_t> haystack_;
};

TEST_F(NeedlePromptTest, EveryNeedleOnceInDepthOrderAtTheAskedLength) {
  const NeedlePromptBuilder builder(*tokenizer_, chatml_, haystack_, "");
  for (NeedleTask task : kAllTasks) {
    for (int64_t length : {700, 1100}) {
      for (double depth : {0.0, 0.5, 1.0}) {
        SCOPED_TRACE(absl::StrCat(InfoOf(task).name, " length ", length, " depth ", depth));
        const NeedleTrial t = MakeNeedleTrial(task, length, 0, depth, 1);
        SNAPFILL_ASSERT_OK(builder.CheckLength(length, t));
        auto built = builder.Build(length, builder.Offset(1, 2), t);
        SNAPFILL_ASSERT_OK(built.status());
        const NeedlePrompt& p = *built;
        EXPECT_NEAR(static_cast<double>(p.prompt.tokens.size()), length, 2);
        ASSERT_EQ(p.placed.size(), t.needles.size());
        const std::string text = tokenizer_->Decode(p.prompt.tokens, /*render_special=*/true);
        const size_t question_at = text.rfind(t.question);
        ASSERT_NE(question_at, std::string::npos);
        // Each needle once, before the question; sorted by recorded offset
        // (ties by planned depth, then planting order), they are in text
        // order.
        std::vector<size_t> at(t.needles.size());
        for (size_t i = 0; i < t.needles.size(); ++i) {
          at[i] = text.find(t.needles[i].text);
          ASSERT_NE(at[i], std::string::npos) << t.needles[i].text;
          EXPECT_EQ(text.find(t.needles[i].text, at[i] + 1), std::string::npos);
          EXPECT_LT(at[i], question_at);
          EXPECT_EQ(p.placed[i].depth,
                    static_cast<double>(p.placed[i].offset) / p.haystack_tokens);
        }
        // Each needle's token span holds its text, and neither end token
        // can go: the span is the tokens the text is made of.
        ASSERT_EQ(p.spans.needles.size(), t.needles.size());
        auto pieces = [&](int64_t b, int64_t e) {
          std::string out;
          for (int64_t k = b; k < e; ++k) out += tokenizer_->TokenToPiece(p.prompt.tokens[k]);
          return out;
        };
        for (size_t i = 0; i < t.needles.size(); ++i) {
          const TokenSpan s = p.spans.needles[i];
          ASSERT_TRUE(s.found()) << t.needles[i].text;
          EXPECT_GE(s.begin, p.prompt.document_end - p.prompt.document_tokens);
          EXPECT_LE(s.end, p.prompt.document_end);
          EXPECT_NE(pieces(s.begin, s.end).find(t.needles[i].text), std::string::npos);
          EXPECT_EQ(pieces(s.begin + 1, s.end).find(t.needles[i].text), std::string::npos);
          EXPECT_EQ(pieces(s.begin, s.end - 1).find(t.needles[i].text), std::string::npos);
        }
        // Each value to answer, inside the first asked needle that holds
        // it as written: its own tokens, within that needle's.
        ASSERT_EQ(p.spans.values.size(), t.expected.size());
        for (size_t v = 0; v < t.expected.size(); ++v) {
          SCOPED_TRACE(t.expected[v]);
          size_t holder = t.needles.size();
          for (size_t i = 0; i < t.needles.size() && holder == t.needles.size(); ++i) {
            if (t.needles[i].asked && t.needles[i].text.find(t.expected[v]) != std::string::npos) holder = i;
          }
          const TokenSpan s = p.spans.values[v];
          ASSERT_EQ(s.found(), holder < t.needles.size());
          if (!s.found()) continue;
          EXPECT_GE(s.begin, p.spans.needles[holder].begin);
          EXPECT_LE(s.end, p.spans.needles[holder].end);
          EXPECT_NE(pieces(s.begin, s.end).find(t.expected[v]), std::string::npos);
          EXPECT_EQ(pieces(s.begin + 1, s.end).find(t.expected[v]), std::string::npos);
          EXPECT_EQ(pieces(s.begin, s.end - 1).find(t.expected[v]), std::string::npos);
        }
        NeedleTrial elsewhere = t;
        elsewhere.needles[0].text = "A sentence this prompt does not hold.";
        EXPECT_FALSE(NeedleTokenSpans(*tokenizer_, p.prompt, elsewhere).needles[0].found());
        std::vector<size_t> order(t.needles.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
          if (p.placed[a].offset != p.placed[b].offset) {
            return p.placed[a].offset < p.placed[b].offset;
          }
          return t.needles[a].depth < t.needles[b].depth;
        });
        for (size_t i = 1; i < order.size(); ++i) {
          EXPECT_LT(at[order[i - 1]], at[order[i]]);
        }
        // The needle at the cell's depth sits there (to the nearest token),
        // snapped back to a sentence end within 64 tokens.
        EXPECT_LE(p.placed[0].depth, depth + 0.5 / p.haystack_tokens);
        EXPECT_GE(p.placed[0].depth, depth - 64.0 / p.haystack_tokens);
        if (depth == 0.0) {
          // First in the user's turn.
          EXPECT_EQ(text.substr(0, at[0]), text.substr(0, text.find("user\n") + 5));
        }
        if (depth == 1.0) {
          // Nothing of the haystack between the needle(s) at depth 1 and
          // the question.
          size_t last_end = 0;
          for (size_t i = 0; i < t.needles.size(); ++i) {
            last_end = std::max(last_end, at[i] + t.needles[i].text.size());
          }
          EXPECT_EQ(text.find("haystack", last_end), std::string::npos);
        }
      }
    }
  }
}

TEST_F(NeedlePromptTest, TooShortNamesLengthsAndTask) {
  const NeedlePromptBuilder builder(*tokenizer_, chatml_, haystack_, "");
  const NeedleTrial passkey = MakeNeedleTrial(NeedleTask::kPasskey, 160, 0, 0.5, 0);
  const NeedleTrial multivalue = MakeNeedleTrial(NeedleTask::kMultivalue, 160, 0, 0.5, 0);
  SNAPFILL_EXPECT_OK(builder.CheckLength(160, passkey));
  const absl::Status s = builder.CheckLength(160, multivalue);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--lengths 160 is too short for task multivalue"), std::string::npos)
      << s;
  EXPECT_EQ(builder.Build(160, 0, multivalue).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace snapfill::cli
