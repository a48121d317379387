// Pre-tokenizers for byte-level BPE: split text into words before merges,
// reproducing llama.cpp's unicode_regex_split for each `tokenizer.ggml.pre`.
//
// llama.cpp applies a list of split steps in turn; each step re-splits every
// piece produced by the previous steps, and both the matches and the text
// between them become pieces. The GPT-2 and Llama-3 patterns use llama.cpp's
// hand-written matchers (whose behaviour at piece boundaries differs from a
// regex over the whole text); other patterns run through PCRE2 over a
// "collapsed" text in which every non-ASCII codepoint is replaced by one byte
// naming its class, exactly as llama.cpp feeds std::regex.
#ifndef SNAPFILL_SRC_TOKENIZER_PRETOKENIZER_H_
#define SNAPFILL_SRC_TOKENIZER_PRETOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace snapfill {

// Per-name settings llama.cpp attaches to a pre-tokenizer.
struct PreTokenizerTraits {
  bool clean_spaces = true;    // detokenizer removes " ." etc.
  bool ignore_merges = false;  // a word that is a whole token skips merges
  bool add_bos = false;        // default for tokenizer.ggml.add_bos_token
};

class PreTokenizer {
 public:
  // `name` is tokenizer.ggml.pre ("" means absent, i.e. llama.cpp's
  // "default"). Unknown names return Unimplemented, as llama.cpp refuses
  // to load them.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(std::string_view name);
  ~PreTokenizer();

  // Splits `text` into words, as [begin, end) byte ranges covering all of
  // the text in order. Invalid UTF-8 bytes are classified like U+FFFD and
  // kept as they are.
  std::vector<std::pair<uint32_t, uint32_t>> Split(std::string_view text) const;

  const PreTokenizerTraits& traits() const { return traits_; }
  const std::string& name() const { return name_; }

  struct Step;  // defined in the .cc

 private:
  PreTokenizer() = default;
  std::string name_;
  PreTokenizerTraits traits_;
  std::vector<std::unique_ptr<Step>> steps_;
};

}  // namespace snapfill

#endif  // SNAPFILL_SRC_TOKENIZER_PRETOKENIZER_H_
