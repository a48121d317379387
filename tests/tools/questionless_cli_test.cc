// The question-less pruners through the snapfill command on the tiny model:
// train-gate writes gates that --pruner=gate runs with, another model's gates
// and bad gate files are refused with a clear message; --pruner=reconstruct
// checks its flags (its resume: cli_reliability_test).
#include <string>

#include "gtest/gtest.h"
#include "tools/testmodel/tiny_llama.h"
#include "tests/testing/cli_fixture.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

using testing::Result;

class QuestionlessCliTest : public testing::CliTest {
 protected:
  std::string Prefill(const std::string& extra) {
    return "prefill --model " + tiny_ + " --input " + text_ +
           " --schedule fm --memory 64 --chunk 64 --window 8 --progress=false --timing=false " + extra;
  }
};

TEST_F(QuestionlessCliTest, TrainedGatesRunAndOthersAreRefused) {
  const std::string gates = dir_ + "/tiny.gates";
  Result r = Run("train-gate --model " + tiny_ + " --input " + text_ + "," + text_ + " --out " + gates +
                 " --seq_len 128 --max_sequences 12 --hidden 8 --epochs 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("held-out MAE"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("all layers:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gates:"), std::string::npos) << r.out;
  // It is not replaced without --force.
  EXPECT_FAILS_WITH(Run("train-gate --model " + tiny_ + " --input " + text_ + " --out " + gates), 1, "--force");

  r = Run(Prefill("--pruner gate --gates " + gates + " --out " + dir_ + "/g.kv"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FAILS_WITH(Run(Prefill("--pruner gate --out " + dir_ + "/g2.kv")), 2, "--gates");

  // Gates of another model: the tiny model with its weights changed.
  const std::string other = Patched("other.gguf", "tiny", "tinx");
  EXPECT_FAILS_WITH(Run("prefill --model " + other + " --input " + text_ +
                        " --schedule fm --memory 64 --chunk 64 --window 8 --pruner gate --gates " + gates +
                        " --out " + dir_ + "/g3.kv"),
                    1, "was trained for model");
  // A damaged and a truncated file.
  std::string bytes = testing::ReadAll(gates);
  std::string damaged = bytes;
  damaged[damaged.size() / 2] ^= 1;
  testing::WriteRaw(dir_ + "/damaged.gates", damaged);
  EXPECT_FAILS_WITH(Run(Prefill("--pruner gate --gates " + dir_ + "/damaged.gates --out " + dir_ + "/g4.kv")), 1,
                    "checksum mismatch");
  testing::WriteRaw(dir_ + "/short.gates", bytes.substr(0, bytes.size() / 3));
  EXPECT_FAILS_WITH(Run(Prefill("--pruner gate --gates " + dir_ + "/short.gates --out " + dir_ + "/g5.kv")), 1,
                    "truncated");
}

TEST_F(QuestionlessCliTest, ReconstructRunsAndChecksItsFlags) {
  Result r = Run(Prefill("--pruner reconstruct --repeat_stride 2 --out " + dir_ + "/r.kv --verbosity 1"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FAILS_WITH(Run(Prefill("--pruner reconstruct --repeat_stride 0 --out " + dir_ + "/bad.kv")), 2,
                    "--repeat_stride");
  EXPECT_FAILS_WITH(Run(Prefill("--pruner reconstruct --repeat_prompt= --out " + dir_ + "/bad.kv")), 2,
                    "--repeat_prompt");
}

}  // namespace
}  // namespace snapfill
