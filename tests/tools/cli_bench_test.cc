// snapfill bench on the tiny model: every configuration runs, in its own
// process, the requested number of times; the JSON holds what the table
// shows, each schedule is compared with the FM run of its own chunk (added
// where missing; none without fm in the list), eq. 4 gives FM exactly 1, and
// bad flags are refused.
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/cli_fixture.h"
#include "tests/testing/files.h"

namespace snapfill {
namespace {

using testing::Result;

class BenchCliTest : public testing::CliTest {
 protected:
  // snapfill bench on the tiny model and text with `flags` (window 8, one
  // thread); its JSON, parsed, in *j.
  Result Bench(const std::string& flags, nlohmann::json* j, int threads = 1) {
    const std::string json = dir_ + "/bench.json";
    Result r = Run("bench --model " + tiny_ + " --input " + text_ + " --window 8 --threads " +
                   std::to_string(threads) + " " + flags + " --json " + json);
    if (r.exit_code == 0) *j = nlohmann::json::parse(testing::ReadAll(json));
    return r;
  }
};

TEST_F(BenchCliTest, BenchRunsEveryScheduleAndWritesJson) {
  nlohmann::json j;
  Result r = Bench("--schedules fm,im:sqrt,imdc --memory 128 --chunk 64 --imdc_chunk 128"
                   " --repetitions 2 --full_tokens 512 -n 8", &j);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("eq. 4 uses r ="), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("peak device memory"), std::string::npos) << r.out;
  // IMDC runs at chunk 128, which no FM entry has: an FM run at 128 is added
  // before it as its baseline.
  ASSERT_EQ(j["schedules"].size(), 4u);
  const char* labels[] = {"fm", "im:sqrt", "fm@128", "imdc"};
  const int64_t chunks[] = {64, 64, 128, 128};
  for (int i = 0; i < 4; ++i) {
    const auto& s = j["schedules"][i];
    EXPECT_EQ(s["schedule"], labels[i]);
    EXPECT_EQ(s["chunk"], chunks[i]) << labels[i];
    EXPECT_EQ(s["ttft_seconds"].size(), 2u) << "two repetitions";
    EXPECT_GT(s["ttft_median"].get<double>(), 0);
    EXPECT_GT(s["peak_rss_bytes"].get<double>(), 1 << 20);
    EXPECT_EQ(s["device_peak_bytes"], 0) << "no device memory on the CPU";
    EXPECT_GT(s["decode_tokens_per_second"].get<double>(), 0);
    // Each run's decode is followed by its own bandwidth probe, and its
    // prediction and share come from those.
    ASSERT_EQ(s["read_bandwidth_bytes_per_second"].size(), 2u) << labels[i];
    ASSERT_EQ(s["decode_tokens_per_second_runs"].size(), 2u) << labels[i];
    for (const auto& bw : s["read_bandwidth_bytes_per_second"]) EXPECT_GT(bw.get<double>(), 1e8);
    // Beside it, memory's own read rate, and the share against that.
    ASSERT_EQ(s["dram_read_bandwidth_bytes_per_second"].size(), 2u) << labels[i];
    for (const auto& bw : s["dram_read_bandwidth_bytes_per_second"]) EXPECT_GT(bw.get<double>(), 1e8);
    EXPECT_GT(s["decode_share_of_dram_prediction"].get<double>(), 0);
    // A step reads the weights once and every cache entry once: the same
    // weights in every run, each entry at the JSON's bytes per entry.
    const double weights = s["decode_step_bytes"].get<double>() -
                           s["cache_entries"].get<double>() * j["decode_bytes_per_kv_entry"].get<double>();
    EXPECT_GT(weights, 100000) << labels[i];
    if (i > 0) {
      const auto& s0 = j["schedules"][0];
      EXPECT_DOUBLE_EQ(weights, s0["decode_step_bytes"].get<double>() -
                                    s0["cache_entries"].get<double>() * j["decode_bytes_per_kv_entry"].get<double>());
    }
    // The prediction: the median probed rate (of two runs, their mean) over
    // the step's bytes.
    const double bw_median = 0.5 * (s["read_bandwidth_bytes_per_second"][0].get<double>() +
                                    s["read_bandwidth_bytes_per_second"][1].get<double>());
    EXPECT_NEAR(s["decode_predicted_tokens_per_second"].get<double>(),
                bw_median / s["decode_step_bytes"].get<double>(),
                1e-9 * s["decode_predicted_tokens_per_second"].get<double>());
    // And by the round trip of a line between two threads: none with the
    // run's one thread (the probes use the run's thread count).
    ASSERT_EQ(s["cpu_round_trip_ns"].size(), 2u) << labels[i];
    for (const auto& rt : s["cpu_round_trip_ns"]) EXPECT_EQ(rt.get<double>(), 0.0) << labels[i];
    EXPECT_GT(s["decode_predicted_tokens_per_second"].get<double>(), 0);
    EXPECT_GT(s["decode_share_of_prediction"].get<double>(), 0);
    const double share = s["attention_share"].get<double>();
    EXPECT_GT(share, 0);
    EXPECT_LT(share, 1);
  }
  EXPECT_EQ(j["schedules"][1]["baseline"], "fm");
  EXPECT_EQ(j["schedules"][3]["baseline"], "fm@128");
  // FM against itself: measured 1 and eq. 4 exactly 1, at both chunks.
  for (int i : {0, 2}) {
    EXPECT_DOUBLE_EQ(j["schedules"][i]["speedup_vs_fm"].get<double>(), 1.0);
    EXPECT_DOUBLE_EQ(j["schedules"][i]["eq4_prediction"].get<double>(), 1.0);
    EXPECT_DOUBLE_EQ(j["schedules"][i]["peak_rss_vs_fm"].get<double>(), 1.0);
  }
  // IMDC against FM at 128: the measured ratio is its TTFT over that run's.
  const auto& imdc = j["schedules"][3];
  EXPECT_DOUBLE_EQ(imdc["speedup_vs_fm"].get<double>(),
                   j["schedules"][2]["ttft_median"].get<double>() / imdc["ttft_median"].get<double>());
  EXPECT_GT(imdc["eq4_prediction"].get<double>(), 1.0);
  // IM's mean memory is below FM's, so eq. 4 predicts a gain.
  EXPECT_LT(j["schedules"][1]["mean_memory"].get<double>(), 128);
  EXPECT_GT(j["schedules"][1]["eq4_prediction"].get<double>(), 1.0);
  // The full cache holds the first 512 tokens (plus the question and the
  // generated tokens), far more than the compressed one.
  EXPECT_GE(j["full_cache"]["cache_entries"].get<int64_t>(), 512);
  EXPECT_EQ(j["full_cache"]["read_bandwidth_bytes_per_second"].size(), 2u);
  EXPECT_EQ(j["full_cache"]["dram_read_bandwidth_bytes_per_second"].size(), 2u);
  // More entries, more bytes per step.
  EXPECT_GT(j["full_cache"]["decode_step_bytes"].get<double>(), j["schedules"][0]["decode_step_bytes"].get<double>());
  EXPECT_GT(j["dram_read_bandwidth_bytes_per_second"].get<double>(), 1e8);
  EXPECT_EQ(j["full_cache"]["cpu_round_trip_ns"].size(), 2u);
  EXPECT_GT(j["full_cache"]["decode_share_of_prediction"].get<double>(), 0);
  EXPECT_GT(j["full_cache"]["cache_entries"].get<int64_t>(),
            j["schedules"][0]["cache_entries"].get<int64_t>());
  // The prefill's work, counted by each run's profile: FM and IM read the
  // same chunks, so their products are the same ops to the last one, and
  // IM's smaller memory gives its attention fewer keys.
  const auto& fm = j["schedules"][0];
  const auto& im = j["schedules"][1];
  ASSERT_TRUE(fm.contains("prefill_matmul_ops")) << fm.dump();
  EXPECT_GT(fm["prefill_matmul_ops"].get<double>(), 0);
  EXPECT_EQ(im["prefill_matmul_ops"].get<double>(), fm["prefill_matmul_ops"].get<double>());
  EXPECT_LT(im["prefill_attention_ops"].get<double>(), fm["prefill_attention_ops"].get<double>());
  EXPECT_GT(im["prefill_attention_ops"].get<double>(), 0);
  EXPECT_GT(fm["prefill_window_ops"].get<double>(), 0);
  // Where this machine's instructions were measured (not the portable
  // kernels), the floor is that work at their peaks, and its share of the
  // prefill's time is given.
  for (const auto& s : j["schedules"]) {
    if (s["prefill_floor_seconds"].get<double>() == 0) continue;
    EXPECT_GT(s["prefill_matmul_ops_per_second"].get<double>(), 0);
    EXPECT_GT(s["prefill_floor_share"].get<double>(), 0);
  }
  EXPECT_NE(r.out.find("prefill against this machine's peaks"), std::string::npos) << r.out;
}

// With two threads the probes after a run use two: the round trip of a line
// between them is measured (and each batch is cut at 20 ms).
TEST_F(BenchCliTest, BenchProbesWithTheRunsThreads) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs 2 CPUs";
  nlohmann::json j;
  Result r = Bench("--schedules imdc --memory 128 --chunk 128 --repetitions 1 --full_tokens 0 -n 8", &j,
                   /*threads=*/2);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto& s = j["schedules"][0];
  ASSERT_EQ(s["cpu_round_trip_ns"].size(), 1u);
  EXPECT_GT(s["cpu_round_trip_ns"][0].get<double>(), 1.0);
  EXPECT_LT(s["cpu_round_trip_ns"][0].get<double>(), 2e7);
  EXPECT_GT(s["read_bandwidth_bytes_per_second"][0].get<double>(), 1e8);
}

// A list without fm runs no FM: the table shows "-" for the ratios (not a
// 0.00x that reads as a measurement), says why, and the JSON has no baseline.
TEST_F(BenchCliTest, BenchWithoutFmComparesNothing) {
  nlohmann::json j;
  Result r = Bench("--schedules imdc --memory 128 --chunk 128 --repetitions 1 --full_tokens 0 -n 4", &j);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("no FM run to compare with"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("0.00x"), std::string::npos) << r.out;
  ASSERT_EQ(j["schedules"].size(), 1u);
  EXPECT_EQ(j["schedules"][0]["schedule"], "imdc");
  EXPECT_EQ(j["schedules"][0]["baseline"], "");
}

// Rows of the question-less pruners beside SnapKV's (schedule/pruner),
// each compared with the FM row of its chunk.
TEST_F(BenchCliTest, BenchRunsRowsOfOtherPruners) {
  nlohmann::json j;
  Result r = Bench("--schedules fm,fm/reconstruct,fm/streaming --memory 128 --chunk 64"
                   " --repetitions 1 --full_tokens 0 -n 4 --repeat_stride 2", &j);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(j["schedules"].size(), 3u);
  EXPECT_EQ(j["schedules"][1]["schedule"], "fm/reconstruct");
  EXPECT_EQ(j["schedules"][1]["baseline"], "fm");
  EXPECT_EQ(j["schedules"][2]["schedule"], "fm/streaming");
  for (const auto& s : j["schedules"]) EXPECT_GT(s["ttft_median"].get<double>(), 0);
}

TEST_F(BenchCliTest, BenchRefusesBadFlags) {
  const std::string base = "bench --model " + tiny_ + " --input " + text_;
  EXPECT_FAILS_WITH(Run(base + " --schedules fm,im:bogus"), 2, "im:bogus");
  EXPECT_FAILS_WITH(Run(base + " --schedules xyz"), 2, "xyz");
  EXPECT_FAILS_WITH(Run(base + " --schedules fm,imdc@0"), 2, "imdc@0");
  EXPECT_FAILS_WITH(Run(base + " --schedules fm@x"), 2, "fm@x");
  EXPECT_FAILS_WITH(Run(base + " --schedules fm/bogus"), 2, "fm/bogus");
  EXPECT_FAILS_WITH(Run(base + " --repetitions 0"), 2, "--repetitions");
  EXPECT_FAILS_WITH(Run("bench --model " + tiny_), 2, "--input");
}

}  // namespace
}  // namespace snapfill
