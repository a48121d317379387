#include "tools/cli/needle_tasks.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <numeric>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "snapfill/status.h"

namespace snapfill::cli {
namespace {

constexpr NeedleTaskInfo kTasks[] = {
    {NeedleTask::kPasskey, "passkey", "The special magic number is <key>.",
     "What is the special magic number mentioned in the text?", "the answer holds the key",
     // "The special magic number mentioned in the text is 1234567." with
     // digits as single tokens.
     24},
    {NeedleTask::kMultikey, "multikey",
     "The special magic number for <name> is <number>. (4 names, one asked)",
     "What is the special magic number for <name> mentioned in the text?",
     "the answer holds the asked name's number", 32},
    {NeedleTask::kMultivalue, "multivalue",
     "One of the special magic numbers for <name> is <number>. (4 numbers, one name)",
     "What are all the special magic numbers for <name> mentioned in the text?",
     "the answer holds all 4 numbers", 64},
    {NeedleTask::kVartrack, "vartrack",
     "VAR <X1> = <value>. VAR <X2> = VAR <X1>. ... VAR <X5> = VAR <X4>. (and a distractor "
     "chain with another value)",
     "Find all variables that are assigned the value <value> in the text above.",
     "the answer names all 5 variables of the chain", 64},
    {NeedleTask::kFact, "fact", "<a fact in a prose sentence, from a table of 10>",
     "<a question about it>", "the answer holds the fact's key word", 32},
};

// Keys of multikey and multivalue: short common words.
constexpr const char* kNames[] = {"apple",  "violin", "pepper",  "marble", "falcon", "harbor",
                                  "meadow", "copper", "lantern", "orchid", "saddle", "walnut",
                                  "rocket", "pillow", "tiger",   "cactus"};
constexpr int kMultiNeedles = 4;
// Assignments after the first (RULER's num_hops): 5 variables per chain.
constexpr int kVarHops = 4;

struct Fact {
  const char* sentence;
  const char* question;
  const char* word;  // the answer must hold it; rare in the haystacks used (the KJV)
};
constexpr Fact kFacts[] = {
    {"Tobias hid his grandmother's letters inside an old violin case.",
     "Where did Tobias hide his grandmother's letters?", "violin"},
    {"The lighthouse keeper Margarethe named her grey cat Pumpernickel.",
     "What did the lighthouse keeper Margarethe name her cat?", "Pumpernickel"},
    {"Ravi parked his green bicycle behind the old bakery every morning.",
     "Where did Ravi park his green bicycle?", "bakery"},
    {"The secret ingredient in Aunt Lucia's soup was smoked paprika.",
     "What was the secret ingredient in Aunt Lucia's soup?", "paprika"},
    {"Elena learned to play the cello in the city of Tallinn.",
     "In which city did Elena learn to play the cello?", "Tallinn"},
    {"The treasure map was hidden inside a hollow lamppost near the harbour.",
     "Where was the treasure map hidden?", "lamppost"},
    {"Marcus paid for the old sailing boat with seventeen seashells.",
     "What did Marcus pay for the old sailing boat with?", "seashells"},
    {"Ingrid's favourite flower was the yellow tulip from her father's greenhouse.",
     "What was Ingrid's favourite flower?", "tulip"},
    {"The chess club of the village meets every Thursday in the library basement.",
     "On which day does the chess club of the village meet?", "Thursday"},
    {"Hugo taught his parrot to whistle the tune of a famous waltz.",
     "What did Hugo teach his parrot to whistle?", "waltz"},
};

std::mt19937_64 TrialRng(NeedleTask task, int64_t length, size_t depth_index, int seed) {
  const auto u32 = [](auto v) { return static_cast<uint32_t>(v); };
  if (task == NeedleTask::kPasskey) {
    std::seed_seq seq{u32(length), u32(depth_index), u32(seed), 0x6e65u};
    return std::mt19937_64(seq);
  }
  std::seed_seq seq{u32(length), u32(depth_index), u32(seed), 0x6e65u, 1 + u32(task)};
  return std::mt19937_64(seq);
}

// A number of `digits` digits (no leading zero) not in `taken`, added to it.
std::string DistinctNumber(std::mt19937_64& rng, int digits, std::set<std::string>& taken) {
  uint64_t low = 1;
  for (int i = 1; i < digits; ++i) low *= 10;
  for (;;) {
    std::string s = absl::StrCat(low + rng() % (9 * low));
    if (taken.insert(s).second) return s;
  }
}

// `count` distinct entries of kNames (a partial Fisher-Yates shuffle).
std::vector<std::string> DistinctNames(std::mt19937_64& rng, int count) {
  std::vector<std::string> names(std::begin(kNames), std::end(kNames));
  for (int i = 0; i < count; ++i) {
    std::swap(names[i], names[i + rng() % (names.size() - i)]);
  }
  names.resize(count);
  return names;
}

// RULER's variable names: 5 random capital letters.
std::string VariableName(std::mt19937_64& rng, std::set<std::string>& taken) {
  for (;;) {
    std::string s(5, 'A');
    for (char& c : s) c = static_cast<char>('A' + rng() % 26);
    if (taken.insert(s).second) return s;
  }
}

bool MatchesWords(NeedleTask task) {
  return task == NeedleTask::kVartrack || task == NeedleTask::kFact;
}

}  // namespace

const NeedleTaskInfo& InfoOf(NeedleTask task) {
  for (const NeedleTaskInfo& info : kTasks) {
    if (info.task == task) return info;
  }
  SNAPFILL_CHECK(false) << "unknown needle task " << static_cast<int>(task);
  return kTasks[0];
}

std::string NeedleTaskNames() {
  std::vector<std::string> names;
  for (const NeedleTaskInfo& info : kTasks) names.push_back(info.name);
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<std::vector<NeedleTask>> ParseNeedleTasks(std::string_view flag) {
  std::vector<NeedleTask> out;
  for (absl::string_view part :
       absl::StrSplit(absl::string_view(flag.data(), flag.size()), ',', absl::SkipWhitespace())) {
    const std::string name(absl::StripAsciiWhitespace(part));
    const NeedleTaskInfo* found = nullptr;
    for (const NeedleTaskInfo& info : kTasks) {
      if (name == info.name) found = &info;
    }
    if (found == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("--tasks: \"", name, "\" is not one of ",
                                                     NeedleTaskNames()));
    }
    if (std::find(out.begin(), out.end(), found->task) == out.end()) out.push_back(found->task);
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--tasks is empty; give one or more of ",
                                                   NeedleTaskNames()));
  }
  return out;
}

NeedleTrial MakeNeedleTrial(NeedleTask task, int64_t length, size_t depth_index, double depth,
                            int seed) {
  std::mt19937_64 rng = TrialRng(task, length, depth_index, seed);
  NeedleTrial t;
  t.task = task;
  std::set<std::string> taken;
  // The other needles of multikey and multivalue: a quarter of the text
  // apart, wrapping round, so that the four spread over the whole text
  // whatever the cell's depth.
  auto spread = [depth](int j) {
    return j == 0 ? depth : std::fmod(depth + j / double(kMultiNeedles), 1.0);
  };
  switch (task) {
    case NeedleTask::kPasskey: {
      const std::string key = DistinctNumber(rng, 7, taken);
      t.needles.push_back({absl::StrCat("The special magic number is ", key, "."), depth, true});
      t.question = InfoOf(task).question;
      t.expected = {key};
      break;
    }
    case NeedleTask::kMultikey: {
      const std::vector<std::string> names = DistinctNames(rng, kMultiNeedles);
      for (int j = 0; j < kMultiNeedles; ++j) {
        const std::string number = DistinctNumber(rng, 7, taken);
        t.needles.push_back({absl::StrCat("The special magic number for ", names[j], " is ",
                                          number, "."),
                             spread(j), j == 0});
        (j == 0 ? t.expected : t.distractors).push_back(number);
      }
      t.question = absl::StrCat("What is the special magic number for ", names[0],
                                " mentioned in the text?");
      break;
    }
    case NeedleTask::kMultivalue: {
      const std::string name = DistinctNames(rng, 1)[0];
      for (int j = 0; j < kMultiNeedles; ++j) {
        const std::string number = DistinctNumber(rng, 7, taken);
        t.needles.push_back({absl::StrCat("One of the special magic numbers for ", name, " is ",
                                          number, "."),
                             spread(j), true});
        t.expected.push_back(number);
      }
      t.question = absl::StrCat("What are all the special magic numbers for ", name,
                                " mentioned in the text?");
      break;
    }
    case NeedleTask::kVartrack: {
      std::set<std::string> names;
      const std::string value = DistinctNumber(rng, 5, taken);
      const std::string other = DistinctNumber(rng, 5, taken);
      // The asked chain from the cell's depth to the end of the text, in
      // order; the distractor chain spread evenly over the whole text.
      for (int chain = 0; chain < 2; ++chain) {
        std::string prev;
        for (int j = 0; j <= kVarHops; ++j) {
          const std::string var = VariableName(rng, names);
          const double d = chain == 0 ? depth + (1.0 - depth) * j / (kVarHops + 1)
                                      : (j + 0.5) / (kVarHops + 1);
          const std::string rhs = j == 0 ? (chain == 0 ? value : other) : "VAR " + prev;
          t.needles.push_back({absl::StrCat("VAR ", var, " = ", rhs, "."), d, chain == 0});
          (chain == 0 ? t.expected : t.distractors).push_back(var);
          prev = var;
        }
      }
      t.question = absl::StrCat("Find all variables that are assigned the value ", value,
                                " in the text above.");
      break;
    }
    case NeedleTask::kFact: {
      const Fact& f = kFacts[rng() % std::size(kFacts)];
      t.needles.push_back({f.sentence, depth, true});
      t.question = f.question;
      t.expected = {f.word};
      break;
    }
  }
  return t;
}

bool ContainsNumber(std::string_view answer, std::string_view number) {
  std::string a;
  for (char c : answer) {
    if (c != ',' && c != '\'') a += c;
  }
  return a.find(number) != std::string::npos;
}

bool ContainsWord(std::string_view answer, std::string_view word) {
  if (word.empty()) return false;
  const std::string a = absl::AsciiStrToLower(std::string(answer));
  const std::string w = absl::AsciiStrToLower(std::string(word));
  const auto is_word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  for (size_t at = a.find(w); at != std::string::npos; at = a.find(w, at + 1)) {
    const bool starts = at == 0 || !is_word_char(a[at - 1]);
    const bool ends = at + w.size() == a.size() || !is_word_char(a[at + w.size()]);
    if (starts && ends) return true;
  }
  return false;
}

NeedleScore ScoreNeedleAnswer(const NeedleTrial& trial, std::string_view answer) {
  const bool words = MatchesWords(trial.task);
  const auto holds = [&](const std::string& v) {
    return words ? ContainsWord(answer, v) : ContainsNumber(answer, v);
  };
  NeedleScore s;
  s.matched = static_cast<int>(std::count_if(trial.expected.begin(), trial.expected.end(), holds));
  s.found = !trial.expected.empty() && s.matched == static_cast<int>(trial.expected.size());
  s.distractor = std::any_of(trial.distractors.begin(), trial.distractors.end(), holds);
  return s;
}

NeedlePromptBuilder::NeedlePromptBuilder(const Tokenizer& tokenizer,
                                         const ChatTemplate& chat_template,
                                         std::vector<int32_t> haystack, std::string system)
    : tokenizer_(tokenizer),
      chat_template_(chat_template),
      haystack_(std::move(haystack)),
      system_(std::move(system)) {
  sentence_end_.resize(haystack_.size());
  for (size_t i = 0; i < haystack_.size(); ++i) {
    const std::string piece = tokenizer_.TokenToPiece(haystack_[i]);
    const char last = piece.empty() ? 0 : piece.back();
    sentence_end_[i] = last == '.' || last == '!' || last == '?' || last == '\n';
  }
}

int64_t NeedlePromptBuilder::Offset(int seed, int seeds) const {
  const int64_t n = haystack_.size();
  const int64_t raw = static_cast<int64_t>(static_cast<double>(seed) * n / seeds);
  if (raw == 0) return 0;
  for (int64_t i = raw; i < std::min(n, raw + 256); ++i) {
    if (sentence_end_[i]) return (i + 1) % n;
  }
  return raw;
}

absl::StatusOr<int64_t> NeedlePromptBuilder::FixedTokens(const NeedleTrial& trial) const {
  SNAPFILL_ASSIGN_OR_RETURN(
      DocumentPrompt p,
      BuildDocumentPrompt(tokenizer_, chat_template_, "x", trial.question, system_));
  int64_t fixed = static_cast<int64_t>(p.tokens.size()) - p.document_tokens;
  for (const Needle& n : trial.needles) {
    fixed += tokenizer_.Encode(" " + n.text + " ", false, false).size();
  }
  return fixed;
}

namespace {

absl::Status TooShort(int64_t length, const NeedleTrial& trial, int64_t fixed, int64_t need) {
  const size_t n = trial.needles.size();
  return absl::InvalidArgumentError(absl::StrCat(
      "--lengths ", length, " is too short for task ", InfoOf(trial.task).name,
      ": the template, ", n == 1 ? std::string("needle") : absl::StrCat(n, " needles"),
      " and question take ", fixed, " tokens, leaving fewer than ", need,
      " for the haystack"));
}

}  // namespace

absl::Status NeedlePromptBuilder::CheckLength(int64_t length, const NeedleTrial& trial) const {
  SNAPFILL_ASSIGN_OR_RETURN(const int64_t fixed, FixedTokens(trial));
  const int64_t need = kMinHaystackPerNeedle * static_cast<int64_t>(trial.needles.size());
  if (length - fixed < need) return TooShort(length, trial, fixed, need);
  return absl::OkStatus();
}

absl::StatusOr<NeedlePrompt> NeedlePromptBuilder::Build(int64_t length, int64_t offset,
                                                        const NeedleTrial& trial) const {
  SNAPFILL_ASSIGN_OR_RETURN(const int64_t fixed, FixedTokens(trial));
  const int64_t need = kMinHaystackPerNeedle * static_cast<int64_t>(trial.needles.size());
  // The needles in text order: by depth, ties in planting order.
  std::vector<size_t> order(trial.needles.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return trial.needles[a].depth < trial.needles[b].depth;
  });
  int64_t hay = length - fixed;
  NeedlePrompt best;
  for (int attempt = 0; attempt < 4; ++attempt) {
    if (hay < need) return TooShort(length, trial, fixed, need);
    std::vector<int32_t> slice(hay);
    std::vector<bool> ends(hay);
    const int64_t n = haystack_.size();
    for (int64_t i = 0; i < hay; ++i) {
      slice[i] = haystack_[(offset + i) % n];
      ends[i] = sentence_end_[(offset + i) % n];
    }
    // Each needle goes after haystack token k-1, snapped back to a sentence
    // end within 64 tokens but not before the needle ahead of it; with no
    // sentence end there, right after that needle when it is that close.
    NeedlePrompt p;
    p.placed.resize(trial.needles.size());
    int64_t prev = 0;
    bool has_prev = false;
    for (size_t i : order) {
      int64_t k = std::llround(trial.needles[i].depth * hay);
      if (k > 0 && k < hay) {
        const int64_t lo = std::max(prev, k - 64);
        int64_t j = k;
        while (j > lo && !ends[j - 1]) --j;
        if (j > lo) {
          k = j;
        } else if (has_prev && lo == prev) {
          k = prev;
        }
      }
      p.placed[i] = {k, static_cast<double>(k) / hay};
      prev = k;
      has_prev = true;
    }
    // Haystack pieces and needles alternate; a needle gets a space either
    // side where the text lacks one.
    std::string doc;
    int64_t at = 0;
    auto append_piece = [&](int64_t end) {
      const std::string piece =
          tokenizer_.Decode(std::vector<int32_t>(slice.begin() + at, slice.begin() + end));
      if (!doc.empty() && !piece.empty() && !std::isspace(static_cast<unsigned char>(piece[0]))) {
        doc += ' ';
      }
      doc += piece;
      at = end;
    };
    for (size_t i : order) {
      append_piece(p.placed[i].offset);
      if (!doc.empty() && !std::isspace(static_cast<unsigned char>(doc.back()))) doc += ' ';
      doc += trial.needles[i].text;
    }
    append_piece(hay);
    SNAPFILL_ASSIGN_OR_RETURN(
        p.prompt, BuildDocumentPrompt(tokenizer_, chat_template_, doc, trial.question, system_));
    p.haystack_tokens = hay;
    const int64_t got = p.prompt.tokens.size();
    const int64_t best_miss =
        best.prompt.tokens.empty()
            ? INT64_MAX
            : std::abs(static_cast<int64_t>(best.prompt.tokens.size()) - length);
    const bool exact = got == length;
    if (std::abs(got - length) < best_miss) best = std::move(p);
    if (exact) break;
    hay += length - got;
  }
  best.spans = NeedleTokenSpans(tokenizer_, best.prompt, trial);
  return best;
}

NeedleSpans NeedleTokenSpans(const Tokenizer& tokenizer, const DocumentPrompt& prompt, const NeedleTrial& trial) {
  const int64_t doc_begin = std::max<int64_t>(0, prompt.document_end - prompt.document_tokens);
  const int64_t doc_end = std::min<int64_t>(prompt.document_end, prompt.tokens.size());
  // The document's bytes as its tokens render them, and where each token's
  // bytes end.
  std::string text;
  std::vector<size_t> ends;
  for (int64_t t = doc_begin; t < doc_end; ++t) {
    text += tokenizer.TokenToPiece(prompt.tokens[t]);
    ends.push_back(text.size());
  }
  // The tokens of bytes [at, at + size): the first whose bytes end after
  // `at`, through the one that holds the last byte.
  auto span_of = [&](size_t at, size_t size) -> TokenSpan {
    const auto first = std::upper_bound(ends.begin(), ends.end(), at);
    const auto last = std::lower_bound(ends.begin(), ends.end(), at + size);
    return {doc_begin + (first - ends.begin()), doc_begin + (last - ends.begin()) + 1};
  };
  NeedleSpans out;
  out.needles.resize(trial.needles.size());
  out.values.resize(trial.expected.size());
  std::vector<size_t> found_at(trial.needles.size(), std::string::npos);
  for (size_t i = 0; i < trial.needles.size(); ++i) {
    const std::string& needle = trial.needles[i].text;
    found_at[i] = needle.empty() ? std::string::npos : text.find(needle);
    if (found_at[i] != std::string::npos) out.needles[i] = span_of(found_at[i], needle.size());
  }
  for (size_t v = 0; v < trial.expected.size(); ++v) {
    const std::string& value = trial.expected[v];
    for (size_t i = 0; i < trial.needles.size() && !value.empty(); ++i) {
      const size_t in = trial.needles[i].text.find(value);
      if (!trial.needles[i].asked || found_at[i] == std::string::npos || in == std::string::npos) continue;
      out.values[v] = span_of(found_at[i] + in, value.size());
      break;
    }
  }
  return out;
}

}  // namespace snapfill::cli
