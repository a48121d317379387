// The retrieval tasks of `snapfill needle`, after RULER's (Hsieh et al.,
// 2024): what a trial plants in the haystack, what it asks, how its answer
// is scored, and the prompt that holds it (the haystack slice with the
// needles at their depths, inside the model's chat template with the
// question after it). Everything here is a pure function of its arguments
// and the tokenizer, so a trial is the same on every machine.
#ifndef SNAPFILL_TOOLS_CLI_NEEDLE_TASKS_H_
#define SNAPFILL_TOOLS_CLI_NEEDLE_TASKS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/engine/prompt.h"
#include "src/tokenizer/chat_template.h"
#include "src/tokenizer/tokenizer.h"

namespace snapfill::cli {

enum class NeedleTask {
  kPasskey,     // one "special magic number" (the SnapKV paper's needle)
  kMultikey,    // RULER niah_multikey: 4 names' numbers, one asked
  kMultivalue,  // RULER niah_multivalue: 4 numbers of one name, all asked
  kVartrack,    // RULER vt: which variables a chain of assignments gives a value
  kFact,        // a fact in an ordinary prose sentence
};

// What a task plants, asks and counts as found, for the output and the JSON.
struct NeedleTaskInfo {
  NeedleTask task;
  const char* name;         // as --tasks spells it
  const char* needle;       // the needle sentence(s), placeholders in <>
  const char* question;     // the question, placeholders in <>
  const char* found_when;   // the rule that scores a trial 1
  int64_t answer_tokens;    // greedy tokens decoded per answer
};

const NeedleTaskInfo& InfoOf(NeedleTask task);

// "passkey, multikey, multivalue, vartrack, fact".
std::string NeedleTaskNames();

// A comma list of task names, in its order, repeats dropped. InvalidArgument
// naming --tasks for an empty list or an unknown name.
absl::StatusOr<std::vector<NeedleTask>> ParseNeedleTasks(std::string_view flag);

struct Needle {
  std::string text;   // the sentence planted
  double depth = 0;   // where it goes: the share of the haystack before it, in [0, 1]
  bool asked = true;  // false: a distractor the question is not about
};

// What one trial plants and asks, and what its answer must hold.
struct NeedleTrial {
  NeedleTask task = NeedleTask::kPasskey;
  // In planting order; needles[0] is at the cell's depth. Needles of equal
  // depth go into the text in this order.
  std::vector<Needle> needles;
  std::string question;
  std::vector<std::string> expected;     // all must be in the answer
  std::vector<std::string> distractors;  // the distractor needles' values
};

// The trial of a cell (length, depth index, depth) and seed for `task`:
// values drawn from std::seed_seq + mt19937_64, both fully specified, so
// the same everywhere. The passkey's key is the 7-digit number drawn from
// seed_seq{length, depth index, seed, 0x6e65}.
NeedleTrial MakeNeedleTrial(NeedleTask task, int64_t length, size_t depth_index, double depth,
                            int seed);

// Whether `answer` holds `number`, ignoring thousands separators (',' and
// '\'').
bool ContainsNumber(std::string_view answer, std::string_view number);
// Whether `answer` holds `word` as a whole word (not inside a longer run of
// letters and digits), ignoring case.
bool ContainsWord(std::string_view answer, std::string_view word);

struct NeedleScore {
  int matched = 0;          // expected values the answer holds
  bool found = false;       // all of them
  bool distractor = false;  // the answer holds a distractor's value
};

// Numbers (passkey, multikey, multivalue) match by ContainsNumber, names and
// words (vartrack, fact) by ContainsWord.
NeedleScore ScoreNeedleAnswer(const NeedleTrial& trial, std::string_view answer);

// The prompt tokens [begin, end) whose bytes hold a needle's text (the
// first and last may hold a space or a join beside it); {-1, -1} where the
// text is not found in the document's tokens.
struct TokenSpan {
  int64_t begin = -1, end = -1;
  bool found() const { return end > begin; }
};
struct NeedleSpans {
  std::vector<TokenSpan> needles;  // [trial.needles.size()]
  std::vector<TokenSpan> values;   // [trial.expected.size()]
};

// A needle where it went.
struct PlacedNeedle {
  int64_t offset = 0;  // haystack tokens before it
  double depth = 0;    // offset / the prompt's haystack tokens
};

struct NeedlePrompt {
  DocumentPrompt prompt;
  std::vector<PlacedNeedle> placed;  // [trial.needles.size()], in planting order
  int64_t haystack_tokens = 0;       // haystack tokens in the prompt
  // Where the needles and the values to answer are in prompt.tokens
  // (NeedleTokenSpans).
  NeedleSpans spans;
};

// Each of trial.needles' spans in prompt (in planting order), by the
// pieces of the document's tokens (Tokenizer::TokenToPiece) and where each
// needle's text begins in them; and each of trial.expected's, inside the
// first asked needle whose text holds it as written (the fact's key word,
// the asked number), else not found.
NeedleSpans NeedleTokenSpans(const Tokenizer& tokenizer, const DocumentPrompt& prompt, const NeedleTrial& trial);

// Builds trial prompts from one tokenized haystack.
class NeedlePromptBuilder {
 public:
  NeedlePromptBuilder(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                      std::vector<int32_t> haystack, std::string system);

  // The fewest haystack tokens a prompt may hold per needle.
  static constexpr int64_t kMinHaystackPerNeedle = 16;

  int64_t haystack_tokens() const { return static_cast<int64_t>(haystack_.size()); }

  // Where seed `seed` of `seeds` starts reading the haystack: an even share
  // of the text per seed, moved to just after the next sentence end.
  int64_t Offset(int seed, int seeds) const;

  // InvalidArgument naming --lengths and the task where `length` leaves
  // fewer than kMinHaystackPerNeedle haystack tokens per needle beside the
  // template, the needles and the question.
  absl::Status CheckLength(int64_t length, const NeedleTrial& trial) const;

  // The prompt of `trial`: `length` tokens (or within a token or two where
  // the joins tokenize differently and no correction hits exactly), the
  // haystack read from `offset` (wrapping), each needle inserted between
  // haystack tokens at its depth, snapped back to a sentence end within 64
  // tokens, never before the needle ahead of it in the text.
  absl::StatusOr<NeedlePrompt> Build(int64_t length, int64_t offset,
                                     const NeedleTrial& trial) const;

 private:
  // Tokens of the template and question around the document, and of the
  // needles with a space either side.
  absl::StatusOr<int64_t> FixedTokens(const NeedleTrial& trial) const;

  const Tokenizer& tokenizer_;
  const ChatTemplate& chat_template_;
  std::vector<int32_t> haystack_;
  std::vector<bool> sentence_end_;  // [haystack_.size()]: the token ends a sentence
  std::string system_;
};

}  // namespace snapfill::cli

#endif  // SNAPFILL_TOOLS_CLI_NEEDLE_TASKS_H_
