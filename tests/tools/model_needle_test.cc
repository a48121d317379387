// snapfill needle on the default model at one length it handles (1024
// tokens, the needle in the middle of KJV Genesis): full attention, both
// through the chunk loop (--pruner full, one chunk) and as the one-pass
// baseline, finds the key. Checked by hand first: SmolLM2-135M-Instruct
// answers "The special magic number mentioned in the text is NNNNNNN." at
// depths 0 to 1 and at both seeds tried.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "src/model/llama_model.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"
#include "tools/cli/environment.h"

namespace snapfill {
namespace {

TEST(ModelNeedleTest, FullAttentionFindsTheKeyAt1024Tokens) {
  const std::string model = cli::ResolveModelPath("");
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "default model not found at " << model;
  const std::string dir = ::testing::TempDir() + "/snapfill_model_needle_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string json = dir + "/needle.json";
  const std::string cmd = std::string(SNAPFILL_BINARY_DIR) + "/bin/snapfill needle --model " +
                          model + " --input " +
                          testing::SourcePath("tests/data/tokenizer_corpus.txt") +
                          " --lengths 1024 --depths 0.5 --seeds 1 --pruner full --chunk 1024 "
                          "--progress=false --json " + json + " >" + dir + "/out 2>" + dir +
                          "/err";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << testing::ReadAll(dir + "/err");
  const nlohmann::json j =
      nlohmann::json::parse(testing::ReadAll(json), nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object());
  ASSERT_EQ(j["cells"].size(), 1u);
  const nlohmann::json& t = j["cells"][0]["runs"][0];
  EXPECT_EQ(t["tokens"], 1024);
  EXPECT_NEAR(t["needle_depth"].get<double>(), 0.5, 0.05);
  EXPECT_TRUE(t["found"].get<bool>()) << "key " << t["key"] << ", answer: " << t["answer"];
  ASSERT_TRUE(t.contains("baseline_found"));
  EXPECT_TRUE(t["baseline_found"].get<bool>())
      << "key " << t["key"] << ", answer: " << t["baseline_answer"];
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace snapfill
