// The recall tier after a compression the question did not guide, on the
// default model: `run --query_aware=false --recall_dir` reads the input
// without the question, which then brings back what it attends to most
// from the store and is read as the prompt; that is what `prefill
// --recall_dir` and `generate --cache --recall_dir` do in two commands, and
// the answer is theirs. (The real model, because the tiny random one answers
// every cache alike. Checked by hand: with the store the answer begins
// "This text is about Noah's Ark, specifically about the Ark of Noah,
// which", without it "This text is about the Ark of Noah, specifically
// about the Ark of Noah's", so a run that skipped the recall would not
// match.)
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"
#include "tests/testing/cli_fixture.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"
#include "tools/cli/environment.h"

namespace snapfill {
namespace {

using testing::Result;

class ModelRecallAfterTest : public testing::CliTest {
 protected:
  void SetUp() override {
    testing::CliTest::SetUp();
    model_ = cli::ResolveModelPath("");
    if (access(model_.c_str(), R_OK) != 0) GTEST_SKIP() << "the default model is not here; run tools/fetch_model.sh";
    // About 5,000 tokens: FM 256 / 512 evicts most of it.
    testing::WriteRaw(dir_ + "/doc.txt",
                      testing::ReadAll(testing::SourcePath("tests/data/tokenizer_corpus.txt")).substr(0, 20000));
  }
  std::string model_;
};

// At the input's positions (--original_positions) neither flow moves the
// question, so both compute the same cache and the same tokens.
TEST_F(ModelRecallAfterTest, RunAnswersAsPrefillThenGenerate) {
  const std::string settings = " --model " + model_ + " --input " + dir_ +
                               "/doc.txt --schedule fm --memory 256 --chunk 512 --original_positions"
                               " --pruner snapkv --progress=false --timing=false";
  const std::string question = " 'What is this text about?'";
  Result run = Run("run" + settings + " --question" + question + " --query_aware=false -n 16 --recall 64" +
                   " --recall_dir " + dir_ + "/store");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.err.find("recall: 64 entries per layer and KV head brought back"), std::string::npos) << run.err;
  ASSERT_GT(run.out.size(), 16u) << run.out;

  Result r = Run("prefill" + settings + " --recall_dir " + dir_ + "/kept --out " + dir_ + "/doc.kv");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Run("generate --model " + model_ + " --cache " + dir_ + "/doc.kv --recall_dir " + dir_ +
          "/kept --recall 64 -n 16 --timing=false --prompt" + question);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("recall: 64 entries per layer and KV head brought back"), std::string::npos) << r.err;
  EXPECT_EQ(run.out, r.out);
}

}  // namespace
}  // namespace snapfill
