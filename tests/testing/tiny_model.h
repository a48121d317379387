// The tiny random Llama of tools/testmodel/tiny_llama.h loaded in memory, a
// fixed token sequence over its vocabulary, and one-shot prefill's logits
// (what the chunk loop is compared with), for engine tests.
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

// A tiny hybrid model (Gemma 3's blocks): 4 layers, of which 0 and 2
// attend within a sliding window of `window` positions and 1 and 3 are
// global; context 4096.
TinyLlamaOptions TinyHybridOptions(int window = 24);

// n ids spread over [0, vocab) without short cycles.
std::vector<int32_t> TestTokens(int n, int vocab);

// The last position's logits of `ids` prefilled at positions 0.. into a
// fresh cache, in batches of up to `batch` tokens. Dies if a step fails.
std::vector<float> OneShotLogits(const LlamaModel& model, Backend* backend, const std::vector<int32_t>& ids,
                                 int64_t batch = 512);

// Asserts (gtest) that logits a equal b to within rel times b's largest
// magnitude, naming the first logit that does not.
void ExpectLogitsClose(const std::vector<float>& a, const std::vector<float>& b, double rel);

}  // namespace snapfill::testing

#endif  // SNAPFILL_TESTS_TESTING_TINY_MODEL_H_
