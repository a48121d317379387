// Builds the token sequence of a long-document job: the document and an
// optional question inside the model's chat template, so that the last
// chunk ends with the question and SnapKV's observation window is the
// question itself (query-aware compression, DESIGN.md §6).
#ifndef SNAPFILL_ENGINE_PROMPT_H_
#define SNAPFILL_ENGINE_PROMPT_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "src/tokenizer/chat_template.h"
#include "src/tokenizer/tokenizer.h"

namespace snapfill {

struct DocumentPrompt {
  std::vector<int32_t> tokens;
  int64_t document_tokens = 0;  // tokens of the document text itself
  // tokens[0, document_end) is the template's opening and the document:
  // what `snapfill prefill` stores; the rest closes the user turn.
  int64_t document_end = 0;
};

// What surrounds the document in a long-document prompt, for a document
// tokenized apart (streamed from a file): prefix, then the document's own
// tokens, Encode(document, document_add_special, false), then suffix (the
// user turn's closing, with the question). BuildDocumentPrompt's tokens are
// exactly these three.
struct PromptFrame {
  std::vector<int32_t> prefix;
  // Without a chat template the document itself carries BOS (and EOS).
  bool document_add_special = false;
  std::vector<int32_t> suffix;
};
absl::StatusOr<PromptFrame> BuildPromptFrame(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                                             std::string_view question, std::string_view system);

// The template's markers are tokenized as special tokens; the document and
// the question as plain text (a document that contains "<|im_start|>" stays
// text). InvalidArgument if the document is empty.
absl::StatusOr<DocumentPrompt> BuildDocumentPrompt(const Tokenizer& tokenizer,
                                                   const ChatTemplate& chat_template,
                                                   std::string_view document,
                                                   std::string_view question,
                                                   std::string_view system);

// The tokens that follow a document prefilled by BuildDocumentPrompt (its
// tokens[0, document_end)): "\n\n" + question, then the template's closing
// of the user turn and opening of the assistant's.
absl::StatusOr<std::vector<int32_t>> BuildContinuation(const Tokenizer& tokenizer,
                                                       const ChatTemplate& chat_template,
                                                       std::string_view question);

}  // namespace snapfill

#endif  // SNAPFILL_ENGINE_PROMPT_H_
