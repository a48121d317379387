// The question-less pruners through the snapfill command on the tiny model:
// train-gate writes gates that --pruner=gate runs with, another model's gates
// and bad gate files are refused with a clear message; --pruner=reconstruct
// checks its flags (its resume: cli_reliability_test). --pruner=auto, the
// default, takes the gates beside the model where there are some and no
// question guides.
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
  const std::string gates = dir_ + "/trained.gates";
  Result r = Run("train-gate --model " + tiny_ + " --input " + text_ + "," + text_ + " --out " + gates +
                 " --seq_len 128 --max_sequences 12 --hidden 8 --epochs 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("held-out MAE"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("all layers:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gates:"), std::string::npos) << r.out;
  // It is not replaced without --force.
  EXPECT_FAILS_WITH(Run("train-gate --model " + tiny_ + " --input " + text_ + " --out " + gates), 1, "--force");

  // (Its selection is one backend op per layer, its scores made there:
  // telemetry counts the layers.)
  r = Run(Prefill("--pruner gate --gates " + gates + " --out " + dir_ + "/g.kv --telemetry " + dir_ + "/g.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(testing::ReadAll(dir_ + "/g.jsonl").find("\"backend_selections\":"), std::string::npos);
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

// The pruner a run reports (the timing line names it).
std::string PrunerOf(const Result& r) {
  const size_t at = r.err.find("pruner ");
  if (at == std::string::npos) return "";
  return r.err.substr(at + 7, r.err.find_first_of(",| ", at + 7) - at - 7);
}

TEST_F(QuestionlessCliTest, AutoTakesTheModelsGatesWithoutAQuestion) {
  const std::string job = "prefill --model " + tiny_ + " --input " + text_ +
                          " --schedule fm --memory 64 --chunk 64 --window 8 --progress=false ";
  // No gates: SnapKV, saying why.
  Result r = Run(job + "--out " + dir_ + "/a.kv");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(PrunerOf(r), "snapkv") << r.err;
  EXPECT_NE(r.err.find("no gates for this model (" + dir_ + "/tiny.gates"), std::string::npos) << r.err;
  EXPECT_FAILS_WITH(Run(job + "--pruner gate --out " + dir_ + "/b.kv"), 2, dir_ + "/tiny.gates");

  // Gates beside the model (tiny.gguf -> tiny.gates): taken by auto and by
  // --pruner=gate without --gates, the same cache as naming them.
  const std::string gates = dir_ + "/tiny.gates";
  r = Run("train-gate --model " + tiny_ + " --input " + text_ + " --out " + gates +
          " --seq_len 128 --max_sequences 4 --epochs 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Run(job + "--out " + dir_ + "/c.kv");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(PrunerOf(r), "gate") << r.err;
  EXPECT_EQ(r.err.find("no gates"), std::string::npos) << r.err;
  ASSERT_EQ(Run(job + "--pruner gate --out " + dir_ + "/d.kv").exit_code, 0);
  ASSERT_EQ(Run(job + "--pruner gate --gates " + gates + " --out " + dir_ + "/e.kv").exit_code, 0);
  EXPECT_TRUE(testing::ReadAll(dir_ + "/c.kv") == testing::ReadAll(dir_ + "/d.kv"));
  EXPECT_TRUE(testing::ReadAll(dir_ + "/c.kv") == testing::ReadAll(dir_ + "/e.kv"));
  EXPECT_FALSE(testing::ReadAll(dir_ + "/c.kv") == testing::ReadAll(dir_ + "/a.kv"));
  // A question that guides the compression keeps SnapKV (its votes); one
  // that does not (--query_aware=false) gets the gates.
  const std::string ask = "run --model " + tiny_ + " --input " + text_ +
                          " --schedule fm --memory 64 --chunk 64 --window 8 --progress=false -n 2 --question Who? ";
  r = Run(ask);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(PrunerOf(r), "snapkv") << r.err;
  r = Run(ask + "--query_aware=false");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(PrunerOf(r), "gate") << r.err;
  // An explicit pruner is kept.
  r = Run(job + "--pruner snapkv --out " + dir_ + "/f.kv");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(PrunerOf(r), "snapkv") << r.err;
  EXPECT_TRUE(testing::ReadAll(dir_ + "/f.kv") == testing::ReadAll(dir_ + "/a.kv"));
}

TEST_F(QuestionlessCliTest, ReconstructRunsAndChecksItsFlags) {
  Result r = Run(Prefill("--pruner reconstruct --repeat_stride 2 --out " + dir_ + "/r.kv --verbosity 1 --telemetry " +
                         dir_ + "/r.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(testing::ReadAll(dir_ + "/r.jsonl").find("\"backend_selections\":"), std::string::npos);
  EXPECT_FAILS_WITH(Run(Prefill("--pruner reconstruct --repeat_stride 0 --out " + dir_ + "/bad.kv")), 2,
                    "--repeat_stride");
  EXPECT_FAILS_WITH(Run(Prefill("--pruner reconstruct --repeat_prompt= --out " + dir_ + "/bad.kv")), 2,
                    "--repeat_prompt");
}

}  // namespace
}  // namespace snapfill
