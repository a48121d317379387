// The checkpoint file: what is saved loads back exactly; a damaged,
// truncated or foreign file is refused with a message naming the problem;
// a checkpoint of another model, input, configuration or plan is refused.
#include "src/kv/checkpoint_file.h"

#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "snapfill/status.h"
#include "src/kv/cache_file.h"
#include "src/kv/kv_file_format.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<KvCache> Memory(int layers) {
  auto kv = KvCache::Create({layers, 2, 8, 16});
  SNAPFILL_CHECK(kv.ok());
  for (int l = 0; l < layers; ++l) {
    const int n = 3 + 4 * l;
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < n * 8; ++i) {
        (*kv)->k(l, h)[i] = 0.1f * i - l + h;
        (*kv)->v(l, h)[i] = -0.3f * i + l;
      }
      for (int i = 0; i < n; ++i) (*kv)->pos(l, h)[i] = 5 * i + h;
    }
    (*kv)->set_size(l, n);
  }
  return std::move(*kv);
}

CheckpointState State(int layers) {
  CheckpointState s;
  s.model_fingerprint = "model-abc";
  s.config = "{\"schedule\":\"imdc\",\"memory\":1024}";
  s.input_digest = 0xfedcba9876543210ull;
  s.input_tokens = 5000;
  s.plan_digest = 0x0123456789abcdefull;
  s.threads = 2;
  s.steps_done = 3;
  s.total_steps = 7;
  s.next_token = 2100;
  for (int l = 0; l < layers; ++l) s.retention.push_back(1.0 / (3 + l));  // not exact in decimal
  return s;
}

std::string Path(const std::string& name) { return ::testing::TempDir() + "/ckpt_" + name; }

TEST(CheckpointFileTest, RoundTripIsExact) {
  const auto memory = Memory(3);
  const CheckpointState s = State(3);
  const std::string path = Path("round_trip");
  SNAPFILL_ASSERT_OK(SaveCheckpointFile(path, s, *memory));
  auto loaded = LoadCheckpointFile(path);
  SNAPFILL_ASSERT_OK(loaded);
  const CheckpointState& t = loaded->state;
  EXPECT_EQ(t.model_fingerprint, s.model_fingerprint);
  EXPECT_EQ(t.config, s.config);
  EXPECT_EQ(t.input_digest, s.input_digest);
  EXPECT_EQ(t.input_tokens, s.input_tokens);
  EXPECT_EQ(t.plan_digest, s.plan_digest);
  EXPECT_EQ(t.threads, s.threads);
  EXPECT_EQ(t.steps_done, s.steps_done);
  EXPECT_EQ(t.total_steps, s.total_steps);
  EXPECT_EQ(t.next_token, s.next_token);
  EXPECT_EQ(t.retention, s.retention);  // bit-exact doubles
  EXPECT_TRUE(t.recall_slots.empty());
  for (int l = 0; l < 3; ++l) {
    ASSERT_EQ(loaded->memory->size(l), memory->size(l));
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(std::memcmp(loaded->memory->k(l, h), memory->k(l, h),
                            memory->size(l) * 8 * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(loaded->memory->v(l, h), memory->v(l, h),
                            memory->size(l) * 8 * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(loaded->memory->pos(l, h), memory->pos(l, h),
                            memory->size(l) * sizeof(int32_t)), 0);
    }
  }
  // A newer checkpoint replaces the older one.
  CheckpointState later = s;
  later.steps_done = 5;
  SNAPFILL_ASSERT_OK(SaveCheckpointFile(path, later, *memory));
  auto reloaded = LoadCheckpointFile(path);
  SNAPFILL_ASSERT_OK(reloaded);
  EXPECT_EQ(reloaded->state.steps_done, 5);
  // A run with a recall store records its slots per layer.
  later.recall_slots = {12, 0, 40000000000};
  SNAPFILL_ASSERT_OK(SaveCheckpointFile(path, later, *memory));
  auto with_recall = LoadCheckpointFile(path);
  SNAPFILL_ASSERT_OK(with_recall);
  EXPECT_EQ(with_recall->state.recall_slots, later.recall_slots);
}

TEST(CheckpointFileTest, EveryTruncationAndFlippedByteIsRefused) {
  const auto memory = Memory(2);
  const std::string path = Path("damage");
  SNAPFILL_ASSERT_OK(SaveCheckpointFile(path, State(2), *memory));
  const std::string bytes = testing::ReadAll(path);
  for (size_t n = 0; n < bytes.size(); n += 7) {
    auto r = ParseCheckpointFile(bytes.substr(0, n), "cut");
    ASSERT_FALSE(r.ok()) << "truncated at " << n;
    EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
  }
  for (size_t i = 0; i < bytes.size(); i += 5) {
    std::string b = bytes;
    b[i] ^= 0x10;
    auto r = ParseCheckpointFile(b, "flipped");
    EXPECT_FALSE(r.ok()) << "byte " << i;
  }
}

TEST(CheckpointFileTest, ACacheFileIsNotACheckpointNorTheOtherWay) {
  const auto memory = Memory(2);
  PromptCache cache;
  cache.kv = memory->Clone();
  cache.model_fingerprint = "m";
  const std::string cache_path = Path("cache.kv");
  SNAPFILL_ASSERT_OK(SaveCacheFile(cache_path, cache, true));
  auto r = LoadCheckpointFile(cache_path);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("not a snapfill checkpoint"));
  const std::string ck_path = Path("ck");
  SNAPFILL_ASSERT_OK(SaveCheckpointFile(ck_path, State(2), *memory));
  auto c = LoadCacheFile(ck_path, "", 0);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("not a snapfill cache file"));
  EXPECT_TRUE(absl::IsNotFound(LoadCheckpointFile(Path("missing")).status()));
}

// A state block that passes the checksum but says something impossible:
// written through the container directly.
TEST(CheckpointFileTest, BadStateBlocksAreRefused) {
  const auto memory = Memory(2);
  const internal::KvFileFormat format{
      std::string_view(kCheckpointFileMagic, sizeof(kCheckpointFileMagic)),
      kCheckpointFileVersion, "checkpoint", "start over"};
  const std::string good =
      "snapfill-checkpoint 1\nconfig={}\ninput_digest=00000000000000ff\n"
      "plan_digest=0000000000000001\nthreads=2\nsteps_done=1\ntotal_steps=4\n"
      "retention=0x1p-1,0x1.8p-1\n";
  struct Bad {
    std::string from, to, message;
  };
  const Bad cases[] = {
      {"snapfill-checkpoint 1", "snapfill-checkpoint 9", "does not start with"},
      {"threads=2", "threads=0", "bad threads"},
      {"steps_done=1", "steps_done=4", "is not between"},
      {"steps_done=1", "steps_done=-1", "bad steps_done"},
      {"retention=0x1p-1,0x1.8p-1", "retention=0x1p-1", "retention values for 2 layers"},
      {"retention=0x1p-1,0x1.8p-1", "retention=0x1p-1,1.5", "not in [0, 1]"},
      {"retention=0x1p-1,0x1.8p-1", "retention=0x1p-1,nan", "not in [0, 1]"},
      {"plan_digest=0000000000000001", "plan_digest=xyz", "bad plan_digest"},
      {"threads=2\n", "threads=2\nthreads=2\n", "appears twice"},
      {"config={}\n", "", "\"config\" is missing"},
      {"threads=2\n", "threads=2\nextra=1\n", "unknown keys"},
      {"threads=2\n", "threads=2\nno equals sign\n", "has no '='"},
      {"threads=2\n", "threads=2\nrecall_slots=5\n", "1 recall_slots values for 2 layers"},
      {"threads=2\n", "threads=2\nrecall_slots=5,-1\n", "bad recall_slots"},
  };
  const std::string path = Path("state");
  internal::KvFileHeader header;
  header.model_fingerprint = "m";
  header.config = good;
  header.next_position = 100;
  header.input_tokens = 1000;
  SNAPFILL_ASSERT_OK(internal::SaveKvFile(format, path, header, *memory, true));
  SNAPFILL_ASSERT_OK(LoadCheckpointFile(path));  // the baseline is valid
  for (const Bad& bad : cases) {
    std::string text = good;
    text.replace(text.find(bad.from), bad.from.size(), bad.to);
    header.config = text;
    SNAPFILL_ASSERT_OK(internal::SaveKvFile(format, path, header, *memory, true));
    auto r = LoadCheckpointFile(path);
    ASSERT_FALSE(r.ok()) << bad.to;
    EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(bad.message)) << bad.to;
  }
  header.config = good;
  header.next_position = 1001;  // past the input
  SNAPFILL_ASSERT_OK(internal::SaveKvFile(format, path, header, *memory, true));
  EXPECT_THAT(std::string(LoadCheckpointFile(path).status().message()),
              HasSubstr("past the input"));
}

TEST(CheckpointFileTest, SaveRefusesAnInconsistentState) {
  const auto memory = Memory(2);
  CheckpointState s = State(2);
  s.retention.pop_back();
  EXPECT_TRUE(absl::IsInvalidArgument(SaveCheckpointFile(Path("bad"), s, *memory)));
  s = State(2);
  s.steps_done = s.total_steps;  // a finished run has nothing to resume
  EXPECT_TRUE(absl::IsInvalidArgument(SaveCheckpointFile(Path("bad"), s, *memory)));
  s = State(2);
  s.config = "two\nlines";
  EXPECT_TRUE(absl::IsInvalidArgument(SaveCheckpointFile(Path("bad"), s, *memory)));
}

TEST(CheckpointMismatchTest, NamesWhatDiffers) {
  const CheckpointState saved = State(2);
  std::string warning;
  SNAPFILL_EXPECT_OK(CheckpointMismatch(saved, saved, "f", &warning));
  EXPECT_EQ(warning, "");
  CheckpointState run = saved;
  run.model_fingerprint = "model-xyz";
  auto s = CheckpointMismatch(saved, run, "f", &warning);
  EXPECT_TRUE(absl::IsFailedPrecondition(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("model-abc"));
  run = saved;
  run.input_digest ^= 1;
  EXPECT_THAT(std::string(CheckpointMismatch(saved, run, "f", &warning).message()),
              HasSubstr("another input"));
  run = saved;
  run.input_tokens += 1;
  EXPECT_THAT(std::string(CheckpointMismatch(saved, run, "f", &warning).message()),
              HasSubstr("another input"));
  run = saved;
  run.config = "{\"schedule\":\"fm\",\"memory\":1024}";
  s = CheckpointMismatch(saved, run, "f", &warning);
  EXPECT_THAT(std::string(s.message()), HasSubstr("another configuration"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("\"fm\""));
  run = saved;
  run.plan_digest ^= 1;
  EXPECT_THAT(std::string(CheckpointMismatch(saved, run, "f", &warning).message()),
              HasSubstr("another plan"));
  run = saved;
  run.threads = 1;
  SNAPFILL_EXPECT_OK(CheckpointMismatch(saved, run, "f", &warning));
  EXPECT_THAT(warning, HasSubstr("2 threads"));
}

}  // namespace
}  // namespace snapfill
