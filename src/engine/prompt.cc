#include "src/engine/prompt.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "snapfill/status.h"

namespace snapfill {
namespace {

// Placeholders that cannot come from a chat template; they mark where the
// plain-text parts go in the rendered template.
constexpr std::string_view kDocMarker = "\x01snapfill-document\x01";
constexpr std::string_view kQuestionMarker = "\x01snapfill-question\x01";

void Append(std::vector<int32_t>& out, const std::vector<int32_t>& ids) {
  out.insert(out.end(), ids.begin(), ids.end());
}

}  // namespace

absl::StatusOr<PromptFrame> BuildPromptFrame(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                                             std::string_view question, std::string_view system) {
  PromptFrame f;
  if (chat_template.kind == ChatTemplateKind::kNone) {
    f.document_add_special = true;
    if (!question.empty()) {
      Append(f.suffix, tokenizer.Encode(std::string("\n\n").append(question), false, false));
    }
    return f;
  }
  std::vector<ChatMessage> messages;
  if (!system.empty()) messages.push_back({"system", std::string(system)});
  std::string content(kDocMarker);
  if (!question.empty()) content.append("\n\n").append(kQuestionMarker);
  messages.push_back({"user", content});
  const std::string rendered =
      ApplyChatTemplate(chat_template, messages, /*add_generation_prompt=*/true);
  const size_t doc_at = rendered.find(kDocMarker);
  if (doc_at == std::string::npos) {
    return absl::InternalError("chat template dropped the user message");
  }
  const std::string_view r(rendered);
  // Template text before the document: special tokens parsed, BOS if any.
  Append(f.prefix, tokenizer.Encode(r.substr(0, doc_at), /*add_special=*/true, true));
  std::string_view rest = r.substr(doc_at + kDocMarker.size());
  if (!question.empty()) {
    const size_t q_at = rest.find(kQuestionMarker);
    if (q_at == std::string_view::npos) return absl::InternalError("question marker lost");
    Append(f.suffix, tokenizer.Encode(rest.substr(0, q_at), false, true));
    Append(f.suffix, tokenizer.Encode(question, false, false));
    rest = rest.substr(q_at + kQuestionMarker.size());
  }
  Append(f.suffix, tokenizer.Encode(rest, false, true));
  return f;
}

absl::StatusOr<DocumentPrompt> BuildDocumentPrompt(const Tokenizer& tokenizer,
                                                   const ChatTemplate& chat_template,
                                                   std::string_view document,
                                                   std::string_view question,
                                                   std::string_view system) {
  if (document.empty()) return absl::InvalidArgumentError("the input document is empty");
  SNAPFILL_ASSIGN_OR_RETURN(PromptFrame f, BuildPromptFrame(tokenizer, chat_template, question, system));
  DocumentPrompt p;
  p.tokens = std::move(f.prefix);
  const std::vector<int32_t> doc = tokenizer.Encode(document, f.document_add_special, false);
  p.document_tokens = static_cast<int64_t>(doc.size());
  Append(p.tokens, doc);
  p.document_end = static_cast<int64_t>(p.tokens.size());
  Append(p.tokens, f.suffix);
  return p;
}

absl::StatusOr<std::vector<int32_t>> BuildContinuation(const Tokenizer& tokenizer,
                                                       const ChatTemplate& chat_template,
                                                       std::string_view question) {
  if (question.empty()) return absl::InvalidArgumentError("the prompt is empty");
  // Render a one-character stand-in document and keep what follows it.
  SNAPFILL_ASSIGN_OR_RETURN(DocumentPrompt p,
                            BuildDocumentPrompt(tokenizer, chat_template, "x", question, ""));
  return std::vector<int32_t>(p.tokens.begin() + p.document_end, p.tokens.end());
}

}  // namespace snapfill
