#include "src/tokenizer/chat_template.h"

#include <cctype>

namespace snapfill {
namespace {

bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

// llama.cpp's trim(): ASCII white space at both ends.
std::string Trim(std::string_view s) {
  size_t begin = 0;
  size_t end = s.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(s[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(s[end - 1]))) --end;
  return std::string(s.substr(begin, end - begin));
}

// Finds the literal default system prompt in a ChatML Jinja template, e.g.
// SmolLM2's {{ '<|im_start|>system\nYou are ...<|im_end|>\n' }} emitted when
// messages[0] is not a system message. The prompt may be written with a
// real newline or a "\n" escape after "system".
std::string FindDefaultSystem(std::string_view tmpl) {
  static constexpr std::string_view kOpen = "<|im_start|>system";
  for (size_t pos = tmpl.find(kOpen); pos != std::string_view::npos;
       pos = tmpl.find(kOpen, pos + 1)) {
    size_t start = pos + kOpen.size();
    if (tmpl.substr(start, 1) == "\n") {
      start += 1;
    } else if (tmpl.substr(start, 2) == "\\n") {
      start += 2;
    } else {
      continue;
    }
    const size_t end = tmpl.find("<|im_end|>", start);
    if (end == std::string_view::npos) continue;
    const std::string_view text = tmpl.substr(start, end - start);
    // A literal prompt, not an expression such as "' + message['content'] + '".
    if (text.empty() || Contains(text, "'") || Contains(text, "\"") || Contains(text, "{") ||
        Contains(text, "}")) {
      continue;
    }
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') {
        out += '\n';
        ++i;
      } else {
        out += text[i];
      }
    }
    return out;
  }
  return "";
}

}  // namespace

const char* ChatTemplateKindName(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kNone: return "none";
    case ChatTemplateKind::kChatML: return "chatml";
    case ChatTemplateKind::kLlama2: return "llama2";
    case ChatTemplateKind::kLlama2Sys: return "llama2-sys";
    case ChatTemplateKind::kLlama3: return "llama3";
    case ChatTemplateKind::kZephyr: return "zephyr";
  }
  return "unknown";
}

ChatTemplate DetectChatTemplate(std::string_view t) {
  ChatTemplate out;
  if (t == "chatml") {
    out.kind = ChatTemplateKind::kChatML;
  } else if (t == "llama2") {
    out.kind = ChatTemplateKind::kLlama2;
  } else if (t == "llama2-sys") {
    out.kind = ChatTemplateKind::kLlama2Sys;
  } else if (t == "llama3") {
    out.kind = ChatTemplateKind::kLlama3;
  } else if (t == "zephyr") {
    out.kind = ChatTemplateKind::kZephyr;
  } else if (Contains(t, "<|im_start|>")) {
    // Same order of checks as llama.cpp's llm_chat_detect_template.
    if (!Contains(t, "<|im_sep|>") && !Contains(t, "<end_of_utterance>")) {
      out.kind = ChatTemplateKind::kChatML;
      out.default_system = FindDefaultSystem(t);
    }
  } else if (Contains(t, "[INST]")) {
    out.kind = Contains(t, "<<SYS>>") ? ChatTemplateKind::kLlama2Sys : ChatTemplateKind::kLlama2;
  } else if (Contains(t, "<|user|>") && Contains(t, "<|endoftext|>") && !Contains(t, "<|assistant|>")) {
    out.kind = ChatTemplateKind::kZephyr;
  } else if (Contains(t, "<|start_header_id|>") && Contains(t, "<|end_header_id|>")) {
    out.kind = ChatTemplateKind::kLlama3;
  }
  return out;
}

std::string ApplyChatTemplate(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                              bool add_generation_prompt) {
  std::string s;
  switch (tmpl.kind) {
    case ChatTemplateKind::kNone:
      for (const ChatMessage& m : messages) s += m.content;
      break;
    case ChatTemplateKind::kChatML:
      if (!tmpl.default_system.empty() && !messages.empty() && messages[0].role != "system") {
        s += "<|im_start|>system\n" + tmpl.default_system + "<|im_end|>\n";
      }
      for (const ChatMessage& m : messages) {
        s += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      }
      if (add_generation_prompt) s += "<|im_start|>assistant\n";
      break;
    case ChatTemplateKind::kLlama2:
    case ChatTemplateKind::kLlama2Sys: {
      // llama.cpp leaves the leading <s> to the tokenizer (add_bos).
      const bool system_block = tmpl.kind == ChatTemplateKind::kLlama2Sys;
      bool inside_turn = true;
      s += "[INST] ";
      for (const ChatMessage& m : messages) {
        if (!inside_turn) {
          inside_turn = true;
          s += "[INST] ";
        }
        if (m.role == "system") {
          s += system_block ? "<<SYS>>\n" + m.content + "\n<</SYS>>\n\n" : m.content + "\n";
        } else if (m.role == "user") {
          s += m.content + " [/INST]";
        } else {
          s += m.content + "</s>";
          inside_turn = false;
        }
      }
      break;
    }
    case ChatTemplateKind::kLlama3:
      for (const ChatMessage& m : messages) {
        s += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + Trim(m.content) + "<|eot_id|>";
      }
      if (add_generation_prompt) s += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case ChatTemplateKind::kZephyr:
      for (const ChatMessage& m : messages) {
        s += "<|" + m.role + "|>\n" + m.content + "<|endoftext|>\n";
      }
      if (add_generation_prompt) s += "<|assistant|>\n";
      break;
  }
  return s;
}

std::string ApplyChatTemplate(ChatTemplateKind kind, const std::vector<ChatMessage>& messages,
                              bool add_generation_prompt) {
  return ApplyChatTemplate(ChatTemplate{kind, ""}, messages, add_generation_prompt);
}

}  // namespace snapfill
