// The forward pass and the chunk loop keep their activations in the
// backend's buffers and touch them only through its ops: with
// BackendOptions::guard_buffers the CPU backend's buffers fault outside its
// ops, as a device's memory is out of the host's reach, and a prefill
// (question-guided, with eviction) and the decoding after it compute the
// same bits with the guard as without, for each architecture's extra ops
// (Qwen's biases, Gemma's embedding scale and sliding-window layers), and
// where the host reads the candidates (the recall tier's store) through
// copies, and where the selection is a backend op whose kept indices (and
// for SmartKV's gates and context reconstruction, kept scores) the host
// reads once per chunk.
// (testing::PrefillAndDecode is the run.)
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "snapfill/backend.h"
#include "snapfill/status.h"
#include "tests/testing/engine_run.h"

namespace snapfill {
namespace {

using Outcome = testing::EngineOutcome;
using Scores = testing::EngineScores;

Outcome PrefillAndDecode(const LlamaModel& model, bool guard, Scores scores) {
  BackendOptions o;
  o.guard_buffers = guard;
  o.half_decode_kv = true;  // the decode copy through ToHalf as well
  auto backend = CreateBackend(Device::kCpu, o);
  SNAPFILL_CHECK(backend.ok()) << backend.status();
  return testing::PrefillAndDecode(model, backend->get(), scores);
}

struct Case {
  std::string architecture;
  Scores scores;
};

class BackendMemoryTest : public ::testing::TestWithParam<Case> {};

TEST_P(BackendMemoryTest, TheEngineTouchesTheBackendsMemoryOnlyThroughIt) {
  const std::unique_ptr<LlamaModel> model = testing::EngineRunModel(GetParam().architecture);
  const Outcome plain = PrefillAndDecode(*model, /*guard=*/false, GetParam().scores);
  const Outcome guarded = PrefillAndDecode(*model, /*guard=*/true, GetParam().scores);
  testing::ExpectSameOutcome(plain, guarded);
  if (GetParam().scores == Scores::kGuidedRecall) {
    EXPECT_GT(plain.recalled, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, BackendMemoryTest,
                         ::testing::Values(Case{"llama", Scores::kGuided}, Case{"qwen2", Scores::kGuided},
                                           Case{"gemma3", Scores::kGuided}, Case{"llama", Scores::kGuidedRecall},
                                           Case{"llama", Scores::kGate}, Case{"llama", Scores::kWindow},
                                           Case{"gemma3", Scores::kWindow}, Case{"llama", Scores::kReconstruct}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return i.param.architecture + (i.param.scores == Scores::kGuidedRecall  ? "_recall"
                                                          : i.param.scores == Scores::kGate        ? "_gate"
                                                          : i.param.scores == Scores::kWindow      ? "_window"
                                                          : i.param.scores == Scores::kReconstruct ? "_reconstruct"
                                                                                                   : "_guided");
                         });

}  // namespace
}  // namespace snapfill
