// Chat templates: turn a list of messages into the prompt text a model was
// trained on. Like llama.cpp's llm_chat_apply_template this recognises the
// common template families by marker strings rather than running Jinja; the
// output of each family matches llama.cpp's (and, for ChatML models that
// insert a default system prompt, such as SmolLM2, the model's own Jinja).
#ifndef SNAPFILL_SRC_TOKENIZER_CHAT_TEMPLATE_H_
#define SNAPFILL_SRC_TOKENIZER_CHAT_TEMPLATE_H_

#include <string>
#include <string_view>
#include <vector>

namespace snapfill {

enum class ChatTemplateKind {
  kNone,       // plain concatenation of the contents
  kChatML,     // <|im_start|>role\ncontent<|im_end|>\n
  kLlama2,     // [INST] ... [/INST], system text inlined
  kLlama2Sys,  // [INST] <<SYS>>\n...\n<</SYS>>\n\n ... [/INST]
  kLlama3,     // <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
  kZephyr,     // <|role|>\ncontent<|endoftext|>\n
};

const char* ChatTemplateKindName(ChatTemplateKind kind);

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

struct ChatTemplate {
  ChatTemplateKind kind = ChatTemplateKind::kNone;
  // ChatML: system prompt the template inserts when the conversation does
  // not start with a system message ("" = none).
  std::string default_system;
};

// Recognises a tokenizer.chat_template text (or a family name: "chatml",
// "llama2", "llama2-sys", "llama3", "zephyr"). Unknown or empty -> kNone.
ChatTemplate DetectChatTemplate(std::string_view template_text);

// Renders `messages`; add_generation_prompt appends the assistant header.
std::string ApplyChatTemplate(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                              bool add_generation_prompt);
std::string ApplyChatTemplate(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                              bool add_generation_prompt);

}  // namespace snapfill

#endif  // SNAPFILL_SRC_TOKENIZER_CHAT_TEMPLATE_H_
