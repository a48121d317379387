// The configuration a checkpoint or a saved cache records (ConfigJson): a
// resumed run must match it, so a setting that changes what the memory keeps
// must show in it, and one at its default must not change old records.
#include <string>

#include "gtest/gtest.h"
#include "tools/cli/common.h"

namespace snapfill::cli {
namespace {

TEST(ConfigJson, TheVoteRuleShowsWhereItIsNotTheDefault) {
  PrefillConfig c;
  const std::string unguided = ConfigJson(c, "m.gguf", 1000);
  EXPECT_EQ(unguided.find("query"), std::string::npos) << unguided;
  c.query_tokens = {1, 2, 3};
  const std::string summed = ConfigJson(c, "m.gguf", 1000);
  EXPECT_NE(summed.find("\"query_heads\":\"each\""), std::string::npos) << summed;
  // Checkpoints written before --query_votes existed record the same.
  EXPECT_EQ(summed.find("query_votes"), std::string::npos) << summed;
  c.pruner.query_votes = QueryVotes::kMax;
  const std::string largest = ConfigJson(c, "m.gguf", 1000);
  EXPECT_NE(largest.find("\"query_votes\":\"max\""), std::string::npos) << largest;
  EXPECT_NE(largest, summed);  // a checkpoint of one is refused by the other
}

}  // namespace
}  // namespace snapfill::cli
