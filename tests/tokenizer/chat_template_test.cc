#include "src/tokenizer/chat_template.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace snapfill {
namespace {

// tokenizer.chat_template of SmolLM2-135M-Instruct, as stored in its GGUF.
constexpr char kSmolLmTemplate[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

TEST(ChatTemplateTest, DetectsSmolLmChatMlWithDefaultSystem) {
  const ChatTemplate t = DetectChatTemplate(kSmolLmTemplate);
  EXPECT_EQ(t.kind, ChatTemplateKind::kChatML);
  EXPECT_EQ(t.default_system, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
}

TEST(ChatTemplateTest, SmolLmRendering) {
  const ChatTemplate t = DetectChatTemplate(kSmolLmTemplate);
  EXPECT_EQ(ApplyChatTemplate(t, {{"user", "Hi"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(ApplyChatTemplate(t, {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}},
                              false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello<|im_end|>\n");
  // No messages: the Jinja loop never runs, so no system prompt either.
  EXPECT_EQ(ApplyChatTemplate(t, {}, true), "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, PlainChatMlHasNoDefaultSystem) {
  const ChatTemplate t = DetectChatTemplate(
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}");
  EXPECT_EQ(t.kind, ChatTemplateKind::kChatML);
  EXPECT_EQ(t.default_system, "");
  EXPECT_EQ(ApplyChatTemplate(ChatTemplateKind::kChatML, {{"user", "Hi"}}, false),
            "<|im_start|>user\nHi<|im_end|>\n");
  // Escaped newline form of a default system prompt (Qwen-style template).
  EXPECT_EQ(DetectChatTemplate("{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}").default_system,
            "You are Qwen.");
}

TEST(ChatTemplateTest, Llama2) {
  EXPECT_EQ(DetectChatTemplate("{{ bos_token + '[INST] <<SYS>>\\n' }}").kind, ChatTemplateKind::kLlama2Sys);
  EXPECT_EQ(DetectChatTemplate("[INST] {{ message }}").kind, ChatTemplateKind::kLlama2);
  const std::vector<ChatMessage> chat = {
      {"system", "S"}, {"user", "U"}, {"assistant", "A"}, {"user", "U2"}};
  EXPECT_EQ(ApplyChatTemplate(ChatTemplateKind::kLlama2Sys, chat, true),
            "[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST]A</s>[INST] U2 [/INST]");
  EXPECT_EQ(ApplyChatTemplate(ChatTemplateKind::kLlama2, chat, true),
            "[INST] S\nU [/INST]A</s>[INST] U2 [/INST]");
}

TEST(ChatTemplateTest, Llama3AndZephyr) {
  EXPECT_EQ(DetectChatTemplate("<|start_header_id|>x<|end_header_id|>").kind, ChatTemplateKind::kLlama3);
  EXPECT_EQ(ApplyChatTemplate(ChatTemplateKind::kLlama3, {{"user", "  Hi \n"}}, true),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(ApplyChatTemplate(ChatTemplateKind::kZephyr, {{"user", "Hi"}}, true),
            "<|user|>\nHi<|endoftext|>\n<|assistant|>\n");
}

TEST(ChatTemplateTest, NoneAndUnknown) {
  EXPECT_EQ(DetectChatTemplate("").kind, ChatTemplateKind::kNone);
  EXPECT_EQ(DetectChatTemplate("{{ whatever }}").kind, ChatTemplateKind::kNone);
  EXPECT_EQ(ApplyChatTemplate(ChatTemplateKind::kNone, {{"user", "a"}, {"assistant", "b"}}, true), "ab");
  EXPECT_STREQ(ChatTemplateKindName(ChatTemplateKind::kLlama3), "llama3");
}

}  // namespace
}  // namespace snapfill
