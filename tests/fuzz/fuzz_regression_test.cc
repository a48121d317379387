// Replays the fuzz corpus and every kept crash reproducer through the fuzz
// entry functions (tests/fuzz/fuzz_targets.h), in the normal build and under
// ASan/UBSan (tools/run_sanitizers.sh). An entry function aborts on a broken
// invariant, so a reproducer whose bug came back fails this test.
//
// SNAPFILL_WRITE_FUZZ_CORPUS=1 rewrites tests/fuzz/corpus/<target>/ from
// MakeSeeds() (the seeds the tree holds were written that way).
#include <sys/stat.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "snapfill/schedule.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"

namespace snapfill::fuzz {
namespace {

using ::snapfill::testing::ListDir;
using ::snapfill::testing::ReadAll;
using ::snapfill::testing::SourcePath;

struct Input {
  std::string name;
  std::string bytes;
};

std::vector<Input> ReadInputs(const std::string& dir) {
  std::vector<Input> out;
  for (const std::string& name : ListDir(dir)) {
    if (name == "README.md" || name[0] == '.') continue;
    out.push_back({name, ReadAll(dir + "/" + name)});
  }
  return out;
}

int RunTarget(const FuzzTarget& t, const std::string& bytes) {
  return t.function(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

// Seed names that are meant to be refused (they start the fuzzer at a
// refusal path).
bool MeantToBeRefused(const std::string& name) {
  return name.find("refused") != std::string::npos;
}

TEST(FuzzCorpusTest, EveryTargetHasSeedsAndReplaysThem) {
  ASSERT_EQ(FuzzTargets().size(), 5u);
  for (const FuzzTarget& t : FuzzTargets()) {
    SCOPED_TRACE(t.name);
    const std::vector<Input> inputs = ReadInputs(SourcePath("tests/fuzz/corpus/") + t.name);
    // At least the generated seeds (more once fuzzing adds to the corpus).
    EXPECT_GE(inputs.size(), MakeSeeds(t.name).size()) << "seed corpus missing or incomplete";
    EXPECT_GT(inputs.size(), 0u);
    for (const Input& in : inputs) {
      EXPECT_EQ(RunTarget(t, in.bytes), 0) << in.name;
    }
  }
}

TEST(FuzzCorpusTest, SeedsAreSmall) {
  uint64_t total = 0;
  for (const FuzzTarget& t : FuzzTargets()) {
    for (const Input& in : ReadInputs(SourcePath("tests/fuzz/corpus/") + t.name)) {
      EXPECT_LT(in.bytes.size(), 64u << 10) << t.name << "/" << in.name;
      total += in.bytes.size();
    }
  }
  EXPECT_LT(total, 2u << 20) << "the corpus in the tree should stay under 2 MB";
}

// The generated seeds reach past the first parser (so fuzzing starts from
// deep inside the formats), except those named as refusals.
TEST(FuzzCorpusTest, GeneratedSeedsAreAcceptedByTheParsers) {
  for (const FuzzTarget& t : FuzzTargets()) {
    const std::vector<FuzzSeed> seeds = MakeSeeds(t.name);
    EXPECT_FALSE(seeds.empty()) << t.name;
    for (const FuzzSeed& s : seeds) {
      SCOPED_TRACE(std::string(t.name) + "/" + s.name);
      const auto* data = reinterpret_cast<const uint8_t*>(s.bytes.data());
      const absl::Status status = ParseStatus(t.name, data, s.bytes.size());
      if (MeantToBeRefused(s.name)) {
        EXPECT_FALSE(status.ok());
      } else {
        SNAPFILL_EXPECT_OK(status);
      }
      EXPECT_EQ(RunTarget(t, s.bytes), 0);
    }
  }
}

// Crash reproducers found by tools/fuzz.sh: each made the code abort, leak,
// read out of bounds or allocate gigabytes before its fix. They must now be
// refused cleanly (a file named *accepted* broke an invariant of an accepted
// input instead, and must now pass the entry function's checks).
TEST(FuzzRegressionTest, CrashReproducersAreRefusedCleanly) {
  int total = 0;
  for (const FuzzTarget& t : FuzzTargets()) {
    const std::string dir = SourcePath("tests/fuzz/regressions/") + t.name;
    for (const Input& in : ReadInputs(dir)) {
      SCOPED_TRACE(std::string(t.name) + "/" + in.name);
      ++total;
      const auto* data = reinterpret_cast<const uint8_t*>(in.bytes.data());
      const absl::Status status = ParseStatus(t.name, data, in.bytes.size());
      if (in.name.find("accepted") == std::string::npos && std::string(t.name) != "tokenizer") {
        EXPECT_FALSE(status.ok()) << "a crash reproducer is accepted";
        EXPECT_FALSE(status.message().empty());
      }
      EXPECT_EQ(RunTarget(t, in.bytes), 0);
    }
  }
  RecordProperty("reproducers", total);
}

// tests/fuzz/regressions/schedule_planner/timeout-imdc-refusal-memory-bisection
// decodes to --chunk=-1, whose refusal suggests --chunk >= 4, and the fuzzer
// then planned that: IMDC over 13,698,304 tokens in chunks of 4 on 18 layers
// (61.6M budgets, within the planner's 2^26). The refusal bisected --memory
// with a dozen plans of the same size: 13 s in a release build, a timeout
// under the fuzzer. schedules/incremental_decremental.cc now skips that
// bisection above 2^22 budgets (about 1 s). The fuzz entry function skips
// plans this large, so the case is replayed here directly.
TEST(FuzzRegressionTest, ImdcRefusalOfAHugePlanNamesAWorkingChunk) {
  ScheduleConfig c;
  c.kind = ScheduleKind::kIncrementalDecremental;
  c.growth = Growth::kSqrt;
  c.total_tokens = 13698304;
  c.chunk = 4;
  c.memory = 3817;
  c.first_memory = 2613;
  c.window = 3;
  c.num_layers = 18;
  const auto plan = PlanSchedule(c);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(plan.status().message());
  const size_t at = msg.find("use --chunk >= ");
  ASSERT_NE(at, std::string::npos) << msg;
  c.chunk = std::atoll(msg.c_str() + at + std::strlen("use --chunk >= "));
  EXPECT_GT(c.chunk, 4) << msg;
  SNAPFILL_EXPECT_OK(PlanSchedule(c)) << "the suggested --chunk=" << c.chunk << " must work";
}

TEST(FuzzCorpusTest, WriteSeedCorpus) {
  if (std::getenv("SNAPFILL_WRITE_FUZZ_CORPUS") == nullptr) {
    GTEST_SKIP() << "set SNAPFILL_WRITE_FUZZ_CORPUS=1 to rewrite tests/fuzz/corpus/";
  }
  for (const FuzzTarget& t : FuzzTargets()) {
    const std::string dir = SourcePath("tests/fuzz/corpus/") + t.name;
    ::mkdir(SourcePath("tests/fuzz/corpus").c_str(), 0755);
    ::mkdir(dir.c_str(), 0755);
    for (const FuzzSeed& s : MakeSeeds(t.name)) {
      ::snapfill::testing::WriteRaw(dir + "/" + s.name, s.bytes);
      EXPECT_EQ(ReadAll(dir + "/" + s.name), s.bytes);
    }
  }
}

}  // namespace
}  // namespace snapfill::fuzz
