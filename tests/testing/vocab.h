// Hand-made vocabularies for tokenizer tests.
#ifndef SNAPFILL_TESTS_TESTING_VOCAB_H_
#define SNAPFILL_TESTS_TESTING_VOCAB_H_

#include <string>

#include "src/tokenizer/tokenizer.h"

namespace snapfill::testing {

// The start of a SentencePiece vocabulary shaped like Llama 2's: <unk> (0),
// <s> (1, BOS), </s> (2, EOS) and the 256 byte-fallback tokens <0x00>..<0xFF>
// (3..258); a test appends its pieces with AddSpmToken.
Vocab SpmVocabBase();
// type: a TokenType value (1 normal, 3 control, 4 user-defined, ...).
void AddSpmToken(Vocab& vocab, const std::string& text, float score, int type = 1);

}  // namespace snapfill::testing

#endif  // SNAPFILL_TESTS_TESTING_VOCAB_H_
