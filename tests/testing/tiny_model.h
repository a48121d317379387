// The tiny random Llama of tools/testmodel/tiny_llama.h loaded in memory, and a
// fixed token sequence over its vocabulary, for engine tests.
#ifndef SNAPFILL_TESTS_TESTING_TINY_MODEL_H_
#define SNAPFILL_TESTS_TESTING_TINY_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "src/model/llama_model.h"
#include "tools/testmodel/tiny_llama.h"

namespace snapfill::testing {

// Dies (SNAPFILL_CHECK) if the builder or the loader fails: a test fixture.
std::unique_ptr<LlamaModel> LoadTinyModel(const TinyLlamaOptions& options);

// n ids spread over [0, vocab) without short cycles.
std::vector<int32_t> TestTokens(int n, int vocab);

}  // namespace snapfill::testing

#endif  // SNAPFILL_TESTS_TESTING_TINY_MODEL_H_
