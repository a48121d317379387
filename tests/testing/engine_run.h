// One IMDC prefill with eviction and the decoding after it, on a tiny model,
// for tests that compare two ways of running the same engine (where the
// backend keeps its buffers): every bit that comes out, to compare whole.
#ifndef SNAPFILL_TESTS_TESTING_ENGINE_RUN_H_
#define SNAPFILL_TESTS_TESTING_ENGINE_RUN_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "snapfill/backend.h"
#include "src/model/llama_model.h"

namespace snapfill::testing {

struct EngineOutcome {
  std::vector<float> last_logits;
  std::vector<float> k, v;  // the decoder cache's entries, layer by layer
  std::vector<int32_t> generated;
  int64_t recalled = 0;  // entries the recall tier brought back (per layer and KV head, the most)
};

// How the chunk loop scores: the question's votes; the same with the recall
// tier (a store in a temporary directory); SmartKV's gate (zero gates: the
// chunk's entries tie, and the keys still go through the gate's arithmetic
// on the host); the window's votes alone, with 4 sinks (no question: the
// selection is one backend op, Backend::SelectHeads); the question's
// largest weights with half the share, the window's votes picking after
// them (the op's second row, the log-denominators in its buffer).
enum class EngineScores { kGuided, kGuidedRecall, kGate, kWindow, kGuidedShareMax, kReconstruct };

// 300 test tokens through IMDC (chunk 48, memory 40, window 8) with SnapKV
// or the gate (with recall: a later question recalls into the decoder's
// cache as well), then 8 greedy tokens decoded from the cache, on
// `backend`.
EngineOutcome PrefillAndDecode(const LlamaModel& model, Backend* backend, EngineScores scores);

// The tiny model these runs use: 3 layers of `architecture` (llama, qwen2,
// gemma3: with sliding-window layers of 64 entries, every third global).
std::unique_ptr<LlamaModel> EngineRunModel(const std::string& architecture);

// Expects the two outcomes equal, bit for bit (gtest expectations).
void ExpectSameOutcome(const EngineOutcome& want, const EngineOutcome& got);

}  // namespace snapfill::testing

#endif  // SNAPFILL_TESTS_TESTING_ENGINE_RUN_H_
