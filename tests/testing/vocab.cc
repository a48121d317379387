#include "tests/testing/vocab.h"

#include <cstdio>

namespace snapfill::testing {

void AddSpmToken(Vocab& vocab, const std::string& text, float score, int type) {
  vocab.tokens.push_back(text);
  vocab.scores.push_back(score);
  vocab.token_types.push_back(type);
}

Vocab SpmVocabBase() {
  Vocab v;
  v.model = TokenizerModel::kSpm;
  AddSpmToken(v, "<unk>", 0, 2);
  AddSpmToken(v, "<s>", 0, 3);
  AddSpmToken(v, "</s>", 0, 3);
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    AddSpmToken(v, buf, 0, 6);
  }
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  return v;
}

}  // namespace snapfill::testing
