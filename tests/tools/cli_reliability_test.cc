// A long job is never lost and bad input never damages anything, end to
// end through the snapfill command (issue 5): a run killed with SIGKILL or
// stopped with SIGTERM resumes to the same cache, byte for byte; resuming
// another run's checkpoint is refused; --max_memory picks sizes or refuses
// up front; input from stdin, tiny and non-UTF-8 inputs work; a full disk
// leaves no partial file.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tools/testmodel/tiny_llama.h"
#include "tests/testing/cli_fixture.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

using testing::Result;

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

class ReliabilityTest : public testing::CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    // A model large enough that a run of a few hundred chunks lasts long
    // enough to be stopped in the middle (about a second here).
    TinyLlamaOptions opts;
    opts.num_layers = 4;
    opts.model_dim = 256;
    opts.num_heads = 8;
    opts.num_kv_heads = 4;
    opts.ffn_dim = 512;
    opts.context_length = 4096;
    auto bytes = MakeTinyLlamaGguf(opts);
    SNAPFILL_ASSERT_OK(bytes);
    model_ = dir_ + "/model.gguf";
    testing::WriteRaw(model_, *bytes);
    job_ = "prefill --model " + model_ + " --input " + text_ +
           " --schedule fm --memory 64 --chunk 64 --window 8 --progress=false --timing=false";
    checkpoint_ = dir_ + "/job.ck";
  }

  // The cache of a run never stopped.
  std::string Reference() {
    const std::string ref = dir_ + "/reference.kv";
    Result r = Run(job_ + " --out " + ref);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return testing::ReadAll(ref);
  }

  // A run as a user's: without the suite's SNAPFILL_KERNELS=flags, so
  // --kernels auto times the kernels (and keeps the timings in this test's
  // folder, cache/snapfill: the fixture's XDG_CACHE_HOME).
  Result RunWithoutSuiteKernels(const std::string& args) {
    const char* suite = std::getenv("SNAPFILL_KERNELS");
    const std::string saved = suite != nullptr ? suite : "";
    ::unsetenv("SNAPFILL_KERNELS");
    Result r = Run(args);
    if (suite != nullptr) ::setenv("SNAPFILL_KERNELS", saved.c_str(), 1);
    return r;
  }

  // Waits (up to 60 s) for the first checkpoint of a spawned run.
  bool WaitForCheckpoint(pid_t pid) {
    for (int i = 0; i < 60000; ++i) {
      if (Exists(checkpoint_)) return true;
      int status;
      if (::waitpid(pid, &status, WNOHANG) == pid) return false;  // ended first
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }

  // Spawns `args`, waits for its first checkpoint and a little past it (so
  // the kill lands at an arbitrary point of the chunks, possibly while the
  // next checkpoint is being written), then kills it with SIGKILL.
  void KillAfterFirstCheckpoint(const std::string& args) {
    const pid_t pid = Spawn(args);
    ASSERT_TRUE(WaitForCheckpoint(pid)) << "the run ended before its first checkpoint";
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    const int status = Wait(pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "the run finished before it could be killed; make the job longer";
  }

  std::string model_, job_, checkpoint_;
};

TEST_F(ReliabilityTest, KilledRunResumesToTheSameCache) {
  const std::string reference = Reference();
  ASSERT_FALSE(reference.empty());
  const std::string out = dir_ + "/resumed.kv";
  KillAfterFirstCheckpoint(job_ + " --out " + out + " --checkpoint " + checkpoint_ + " --checkpoint_every 2");
  if (HasFatalFailure()) return;
  EXPECT_FALSE(Exists(out)) << "a killed run must not leave an output";

  Result r = Run(job_ + " --out " + out + " --checkpoint " + checkpoint_ + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("resuming from"), std::string::npos) << r.err;
  EXPECT_TRUE(testing::ReadAll(out) == reference) << "the resumed cache differs";
  EXPECT_FALSE(Exists(checkpoint_)) << "a completed prefill removes its checkpoint";
  // Nothing else is left in the folder: no temporaries of the killed writer.
  for (const std::string& f : testing::ListDir(dir_)) {
    EXPECT_EQ(f.find(".tmp."), std::string::npos) << f;
  }
}

// Context reconstruction's entries carry their scores through the
// checkpoint: a killed run resumes to the cache of one never stopped.
TEST_F(ReliabilityTest, KilledReconstructRunResumesToTheSameCache) {
  job_ += " --pruner reconstruct --repeat_stride 2";
  const std::string reference = Reference();
  ASSERT_FALSE(reference.empty());
  const std::string out = dir_ + "/resumed.kv";
  KillAfterFirstCheckpoint(job_ + " --out " + out + " --checkpoint " + checkpoint_ + " --checkpoint_every 2");
  if (HasFatalFailure()) return;
  Result r = Run(job_ + " --out " + out + " --checkpoint " + checkpoint_ + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("resuming from"), std::string::npos) << r.err;
  EXPECT_TRUE(testing::ReadAll(out) == reference) << "the resumed cache differs";
  // Another stride is another run: its checkpoint is not taken.
  KillAfterFirstCheckpoint(job_ + " --out " + out + ".2 --checkpoint " + checkpoint_ + " --checkpoint_every 2");
  if (HasFatalFailure()) return;
  r = Run(job_ + " --repeat_stride 1 --out " + out + ".3 --checkpoint " + checkpoint_ + " --resume");
  EXPECT_NE(r.exit_code, 0) << r.err;
}

// So do the gates' predictions; and a checkpoint records which gates made
// them: resuming it with other gates (trained otherwise) is refused.
TEST_F(ReliabilityTest, KilledGateRunResumesAndOtherGatesAreRefused) {
  const std::string gates = dir_ + "/a.gates", other = dir_ + "/b.gates";
  for (const auto& [path, epochs] : {std::pair{gates, 2}, std::pair{other, 3}}) {
    Result r = Run("train-gate --model " + model_ + " --input " + text_ + " --out " + path +
                   " --seq_len 128 --max_sequences 4 --epochs " + std::to_string(epochs));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  job_ += " --pruner gate --gates " + gates;
  const std::string reference = Reference();
  ASSERT_FALSE(reference.empty());
  const std::string out = dir_ + "/resumed.kv";
  KillAfterFirstCheckpoint(job_ + " --out " + out + " --checkpoint " + checkpoint_ + " --checkpoint_every 2");
  if (HasFatalFailure()) return;
  const std::string saved = testing::ReadAll(checkpoint_);
  const std::string resume = " --out " + out + " --checkpoint " + checkpoint_ + " --resume";
  Result r = Run(job_ + " --gates " + other + resume);
  EXPECT_FAILS_WITH(r, 1, "another configuration");
  EXPECT_NE(r.err.find("\"gates\":"), std::string::npos) << r.err;
  EXPECT_TRUE(testing::ReadAll(checkpoint_) == saved) << "a refusal must not touch the checkpoint";
  r = Run(job_ + resume);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("resuming from"), std::string::npos) << r.err;
  EXPECT_TRUE(testing::ReadAll(out) == reference) << "the resumed cache differs";
}

// A resumed run computes its remaining chunks with the prefill attention the
// checkpoint records, not with what --kernels=auto would measure now: a run
// on the AVX512-BF16 kernel (not what the measurement picks where f32 is
// faster) resumes to the same cache as one never stopped. Where the CPU
// has no such kernel there is no second choice to tell apart.
TEST_F(ReliabilityTest, ResumeComputesWithTheRecordedAttention) {
  // Heads of 64, the width the bf16 kernels take.
  TinyLlamaOptions opts;
  opts.num_layers = 4;
  opts.model_dim = 256;
  opts.num_heads = 4;
  opts.num_kv_heads = 2;
  opts.ffn_dim = 512;
  opts.context_length = 4096;
  auto bytes = MakeTinyLlamaGguf(opts);
  SNAPFILL_ASSERT_OK(bytes);
  testing::WriteRaw(model_, *bytes);
  if (Run("info --model " + model_ + " --kernels attention=avx512-bf16").exit_code != 0) {
    GTEST_SKIP() << "no AVX512-BF16 attention on this CPU";
  }
  const std::string bf16 = job_ + " --kernels attention=avx512-bf16";
  const std::string ref = dir_ + "/reference.kv";
  Result r = Run(bf16 + " --out " + ref);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string f32_out = dir_ + "/f32.kv";
  r = Run(job_ + " --kernels attention=f32 --out " + f32_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_FALSE(testing::ReadAll(f32_out) == testing::ReadAll(ref)) << "the two kernels must differ for this test";

  const std::string out = dir_ + "/resumed.kv";
  KillAfterFirstCheckpoint(bf16 + " --out " + out + " --checkpoint " + checkpoint_ + " --checkpoint_every 2");
  if (HasFatalFailure()) return;
  // No --kernels, and not the suite's SNAPFILL_KERNELS=flags either (which
  // would pick the bf16 kernel here by itself): the default, auto, would
  // time the kernels and take f32.
  // (The timings it keeps go to this test's folder.)
  r = RunWithoutSuiteKernels(job_ + " --out " + out + " --checkpoint " + checkpoint_ + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(testing::ReadAll(out) == testing::ReadAll(ref)) << "the resumed cache differs";
}

// The products likewise: a run on one product path, stopped, resumes on it
// although the kept timings make auto pick another. Where the CPU runs one
// path, or two that compute alike, there is nothing to tell apart.
TEST_F(ReliabilityTest, ResumeComputesWithTheRecordedProducts) {
  std::vector<std::string> paths;
  for (const char* name : {"amx-bf16", "amx-int8", "avx512-vnni", "avx-vnni", "avx2"}) {
    if (Run("info --model " + model_ + " --kernels products=" + std::string(name)).exit_code == 0) {
      paths.push_back(name);
    }
  }
  if (paths.size() < 2) GTEST_SKIP() << "one product path on this CPU";
  const std::string first = job_ + " --kernels attention=f32,products=" + paths[0];
  const std::string ref = dir_ + "/reference.kv", other = dir_ + "/other.kv";
  ASSERT_EQ(Run(first + " --out " + ref).exit_code, 0);
  ASSERT_EQ(Run(job_ + " --kernels attention=f32,products=" + paths.back() + " --out " + other).exit_code, 0);
  if (testing::ReadAll(ref) == testing::ReadAll(other)) GTEST_SKIP() << paths[0] << " and " << paths.back() << " compute alike";

  const std::string out = dir_ + "/resumed.kv";
  KillAfterFirstCheckpoint(first + " --out " + out + " --checkpoint " + checkpoint_ + " --checkpoint_every 2");
  if (HasFatalFailure()) return;
  // Timings kept by an earlier run (this one's, rewritten) that favour the
  // other path by far.
  Result info = RunWithoutSuiteKernels("info --model " + model_);
  ASSERT_EQ(info.exit_code, 0) << info.err;
  const std::vector<std::string> kept = testing::ListDir(dir_ + "/cache/snapfill");
  ASSERT_EQ(kept.size(), 1u);
  const std::string file = dir_ + "/cache/snapfill/" + kept[0];
  std::string text = testing::ReadAll(file);
  const size_t at = text.find("rates products: ");
  ASSERT_NE(at, std::string::npos) << text;
  text = text.substr(0, at) + "rates products: " + paths[0] + " 1.0, " + paths.back() + " 1000.0\nend\n";
  testing::WriteRaw(file, text);
  info = RunWithoutSuiteKernels("info --model " + model_);
  EXPECT_NE(info.out.find("products " + paths.back()), std::string::npos) << info.out;

  Result r = RunWithoutSuiteKernels(job_ + " --out " + out + " --checkpoint " + checkpoint_ + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(testing::ReadAll(out) == testing::ReadAll(ref)) << "the resumed cache differs";
}

TEST_F(ReliabilityTest, SigtermSavesACheckpointAndStops) {
  const std::string reference = Reference();
  const std::string out = dir_ + "/resumed.kv";
  // Checkpoints only on the signal (every 10^6 chunks otherwise)... but the
  // test needs to know the run has started: wait for its first checkpoint
  // with --checkpoint_every 1, then signal.
  const pid_t pid =
      Spawn(job_ + " --out " + out + " --checkpoint " + checkpoint_ + " --checkpoint_every 1");
  ASSERT_TRUE(WaitForCheckpoint(pid));
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  const int status = Wait(pid);
  ASSERT_TRUE(WIFEXITED(status)) << "SIGTERM must be handled, not fatal";
  EXPECT_EQ(WEXITSTATUS(status), 130);
  const std::string err = testing::ReadAll(dir_ + "/stderr");
  EXPECT_NE(err.find("stopped by SIGTERM"), std::string::npos) << err;
  EXPECT_NE(err.find("--resume"), std::string::npos) << err;
  ASSERT_TRUE(Exists(checkpoint_));
  EXPECT_FALSE(Exists(out));

  // Starting over without --resume would lose it: refused, file untouched.
  const std::string saved = testing::ReadAll(checkpoint_);
  Result r = Run(job_ + " --out " + out + " --checkpoint " + checkpoint_);
  EXPECT_FAILS_WITH(r, 1, "add --resume");
  EXPECT_TRUE(testing::ReadAll(checkpoint_) == saved);

  r = Run(job_ + " --out " + out + " --checkpoint " + checkpoint_ + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(testing::ReadAll(out) == reference);
}

TEST_F(ReliabilityTest, AnotherRunsCheckpointIsRefused) {
  const pid_t pid = Spawn(job_ + " --out " + dir_ + "/x.kv --checkpoint " + checkpoint_ +
                          " --checkpoint_every 1");
  ASSERT_TRUE(WaitForCheckpoint(pid));
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  Wait(pid);
  ASSERT_TRUE(Exists(checkpoint_));
  const std::string saved = testing::ReadAll(checkpoint_);
  const std::string resume = " --out " + dir_ + "/y.kv --checkpoint " + checkpoint_ + " --resume";
  // Another configuration.
  EXPECT_FAILS_WITH(Run(job_ + " --pool_kernel 5" + resume), 1, "another configuration");
  // Another input.
  const std::string other = dir_ + "/other.txt";
  testing::WriteRaw(other, testing::ReadAll(text_) + " One more sentence.");
  Result r = Run("prefill --model " + model_ + " --input " + other +
                 " --schedule fm --memory 64 --chunk 64 --window 8 --progress=false" + resume);
  EXPECT_FAILS_WITH(r, 1, "another input");
  // Another model.
  r = Run("prefill --model " + tiny_ + " --input " + text_ +
          " --schedule fm --memory 64 --chunk 64 --window 8 --progress=false" + resume);
  EXPECT_FAILS_WITH(r, 1, "for model");
  // A cache file where a checkpoint is expected.
  EXPECT_EQ(Run(job_ + " --out " + dir_ + "/z.kv").exit_code, 0);
  r = Run(job_ + " --out " + dir_ + "/y.kv --checkpoint " + dir_ + "/z.kv --resume");
  EXPECT_FAILS_WITH(r, 1, "not a snapfill checkpoint");
  // Flags that do not make sense.
  EXPECT_FAILS_WITH(Run(job_ + " --out " + dir_ + "/y.kv --resume"), 2, "--resume needs");
  EXPECT_FAILS_WITH(Run(job_ + " --out " + dir_ + "/y.kv --checkpoint " + dir_ +
                        "/none.ck --resume"),
                    1, "does not exist");
  EXPECT_FAILS_WITH(Run(job_ + " --out " + dir_ + "/y.kv --checkpoint " + checkpoint_ +
                        " --checkpoint_every 0"),
                    2, "--checkpoint_every");
  EXPECT_TRUE(testing::ReadAll(checkpoint_) == saved) << "a refusal must not touch the file";
  EXPECT_FALSE(Exists(dir_ + "/y.kv"));
}

TEST_F(ReliabilityTest, MaxMemoryPicksSizesOrRefusesUpFront) {
  Result r = Run(job_ + " --out " + dir_ + "/a.kv --dry_run");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("predicted peak RSS"), std::string::npos) << r.out;
  // A budget that fits: the largest sizes are chosen and said.
  r = Run("prefill --model " + model_ + " --input " + text_ +
          " --window 8 --max_memory 2G --dry_run --out " + dir_ + "/a.kv");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The largest that fits the model's 4096-token context: 2048 + 2048.
  EXPECT_NE(r.out.find("--max_memory 2.00 GiB: memory 2048, chunk 2048"), std::string::npos)
      << r.out;
  // Too small for anything: refused before the prefill, with the figure.
  r = Run(job_ + " --out " + dir_ + "/a.kv --max_memory 1M");
  EXPECT_FAILS_WITH(r, 1, "no memory and chunk size fits --max_memory 1.0 MiB");
  EXPECT_NE(r.err.find("predicted peak RSS"), std::string::npos) << r.err;
  EXPECT_FALSE(Exists(dir_ + "/a.kv"));
  EXPECT_FAILS_WITH(Run(job_ + " --out " + dir_ + "/a.kv --max_memory lots"), 2,
                    "is not a size");
  EXPECT_FAILS_WITH(Run(job_ + " --out " + dir_ + "/a.kv --max_memory 0"), 2, "is not a size");
}

// The device's memory: its prediction (--dry_run), the budget --max_memory
// sets on it, and the measured peak beside the prediction. The CPU under
// SNAPFILL_GUARD_BUFFERS=1 stands in for a device: its buffers are the
// device memory, the only part it has (no weight copies, no scratch), so
// the prediction is exact and the peak must equal it.
TEST_F(ReliabilityTest, DeviceMemoryIsPredictedAndBudgeted) {
  ASSERT_EQ(::setenv("SNAPFILL_GUARD_BUFFERS", "1", 1), 0);
  struct Unset {
    ~Unset() { ::unsetenv("SNAPFILL_GUARD_BUFFERS"); }
  } unset;
  const std::string run = "run --model " + model_ + " --input " + text_ +
                          " --schedule imdc --memory 64 --chunk 64 --window 8 --progress=false -n 4"
                          " --question 'what is it'";
  Result r = Run(run + " --dry_run");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.out.find("predicted peak device memory ");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_NE(r.out.find("= weights 0 B + buffers"), std::string::npos) << r.out;

  const std::string report = dir_ + "/report.json";
  r = Run(run + " --timing=true --report " + report);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("| peak device memory "), std::string::npos) << r.err;
  const std::string json = testing::ReadAll(report);
  auto field = [&](const std::string& name) -> int64_t {
    const size_t f = json.find("\"" + name + "\":");
    return f == std::string::npos ? -1 : std::stoll(json.substr(f + name.size() + 3));
  };
  const int64_t measured = field("device_peak_bytes"), predicted = field("predicted_device_peak_bytes");
  EXPECT_GT(measured, 0) << json;
  EXPECT_EQ(measured, predicted) << json;

  // The budget is the device's: sizes chosen by the device prediction, or a
  // refusal naming it.
  r = Run("run --model " + model_ + " --input " + text_ +
          " --window 8 --progress=false -n 4 --question 'what is it' --max_memory 2G --dry_run");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("--max_memory 2.00 GiB of device memory: memory 2048, chunk 2048 (predicted peak device memory"),
            std::string::npos)
      << r.out;
  r = Run(run + " --max_memory 64K");
  EXPECT_FAILS_WITH(r, 1, "no memory and chunk size fits --max_memory 64.0 KiB of device memory");
  EXPECT_NE(r.err.find("predicted peak device memory"), std::string::npos) << r.err;
}

// The measured peak of the run comes within 15% of the prediction; the
// real model's version of this check is model_memory_prediction_test.
TEST_F(ReliabilityTest, PredictionIsCloseOnTheTinyModel) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's shadow memory and quarantine change resident memory";
#endif
  Result dry = Run(job_ + " --out " + dir_ + "/a.kv --dry_run");
  ASSERT_EQ(dry.exit_code, 0) << dry.err;
  Result run = Run(job_ + " --out " + dir_ + "/a.kv --timing=true");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  // Both print mebibytes here ("... RSS 21.3 MiB").
  auto mib = [](const std::string& text, const std::string& after) {
    const size_t at = text.find(after);
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + after.size()));
  };
  const double predicted = mib(dry.out, "predicted peak RSS ");
  const double measured = mib(run.err, "peak RSS ");
  ASSERT_GT(predicted, 0) << dry.out;
  ASSERT_GT(measured, 0) << run.err;
  // 15% here: the whole process is about 20 MiB, and its run-to-run noise
  // (allocator, page-cache of the binary) is 1-2 MiB since the prefill's
  // buffers are paged; the real model's test keeps 10%.
  EXPECT_NEAR(measured / predicted, 1.0, 0.15) << "predicted " << predicted << " MiB, measured "
                                               << measured << " MiB";
}

TEST_F(ReliabilityTest, InputFromStdinEqualsTheFile) {
  const std::string reference = Reference();
  Result r = Run(job_ + " --input - --out " + dir_ + "/stdin.kv <" + text_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(testing::ReadAll(dir_ + "/stdin.kv") == reference);
  r = Run(job_ + " --input - --out " + dir_ + "/empty.kv </dev/null");
  EXPECT_FAILS_WITH(r, 2, "is empty");
}

TEST_F(ReliabilityTest, ShortAndNonUtf8InputsWork) {
  testing::WriteRaw(dir_ + "/short.txt", "Hi.");
  Result r = Run("run --model " + model_ + " --input " + dir_ +
                 "/short.txt --memory 64 --chunk 64 --window 32 -n 3 --progress=false");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  testing::WriteRaw(dir_ + "/latin1.txt", std::string("caf\xe9 na\xefve \xff\xfe end"));
  r = Run("run --model " + model_ + " --input " + dir_ +
          "/latin1.txt --memory 64 --chunk 64 --window 8 -n 3 --progress=false");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("not valid UTF-8"), std::string::npos) << r.err;
  // A path through a regular file cannot be read.
  EXPECT_FAILS_WITH(Run(job_ + " --input " + text_ + "/x --out " + dir_ + "/a.kv"), 1, text_);
}

// A real full disk: a 16 KiB tmpfs mounted in a private mount namespace
// (unshare -rm), so no privilege is needed; skipped where namespaces are not
// allowed.
TEST_F(ReliabilityTest, FullDiskLeavesNoPartialFileAndSaysSo) {
  const std::string mnt = dir_ + "/small";
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  const std::string probe = "unshare -rm sh -c 'mount -t tmpfs -o size=16k tmpfs " + mnt +
                            "' >/dev/null 2>&1";
  if (std::system(probe.c_str()) != 0) GTEST_SKIP() << "cannot mount a tmpfs in a namespace";
  const std::string bin = std::string(SNAPFILL_BINARY_DIR) + "/bin/snapfill ";
  // Inside the namespace: an old cache to keep, then a prefill whose cache
  // does not fit, then a listing and the old file's content.
  std::string script =
      "mount -t tmpfs -o size=16k tmpfs " + mnt + " && printf precious > " + mnt +
      "/cache.kv && " + bin + job_ + " --force --out " + mnt + "/cache.kv; echo rc=\\$?; ls -a " +
      mnt + "; cat " + mnt + "/cache.kv; echo; " + bin + job_ + " --out " + dir_ +
      "/ok.kv --checkpoint " + mnt + "/job.ck --checkpoint_every 1; echo rc=\\$?; ls -a " + mnt;
  // The input's token ids spooled to the full disk (--spool_after 0: all).
  std::string big;
  for (int i = 0; i < 4; ++i) big += testing::ReadAll(text_);
  testing::WriteRaw(dir_ + "/big.txt", big);
  script += "; " + bin + "prefill --model " + model_ + " --input " + dir_ + "/big.txt --schedule fm --memory 64 " +
            "--chunk 64 --window 8 --progress=false --spool_after 0 --spool_dir " + mnt + " --out " + dir_ +
            "/spool.kv; echo rc=\\$?; ls -a " + mnt;
  const std::string log_path = dir_ + "/full_disk.log";
  std::system(("unshare -rm sh -c \"" + script + "\" >" + log_path + " 2>&1").c_str());
  const std::string log = testing::ReadAll(log_path);
  EXPECT_NE(log.find("disk full while writing " + mnt + "/cache.kv"), std::string::npos) << log;
  EXPECT_NE(log.find("rc=1"), std::string::npos) << log;
  EXPECT_NE(log.find("precious"), std::string::npos) << "the old cache must survive: " << log;
  EXPECT_NE(log.find("disk full while writing " + mnt + "/job.ck"), std::string::npos) << log;
  EXPECT_EQ(log.find(".tmp."), std::string::npos) << "no temporary may be left: " << log;
  EXPECT_EQ(log.find("job.ck\n"), std::string::npos) << "no partial checkpoint: " << log;
  EXPECT_NE(log.find("disk full while writing the token spool in " + mnt), std::string::npos) << log;
  EXPECT_EQ(log.find(".snapfill-tokens"), std::string::npos) << "no spool may be left: " << log;
  EXPECT_FALSE(Exists(dir_ + "/spool.kv"));
}

// Token ids spooled to a file (--spool_after 0) give the cache of ids kept
// in memory, byte for byte; a run over a spooled input killed and resumed
// too (the checkpoint's input digest is the spool's); nothing is left in
// the spool's folder; a folder that cannot take the spool is named.
TEST_F(ReliabilityTest, SpooledInputGivesTheSameCacheAndResumes) {
  const std::string reference = Reference();
  const std::string spool = dir_ + "/spool";
  ASSERT_EQ(::mkdir(spool.c_str(), 0755), 0);
  const std::string spooled = job_ + " --spool_after 0 --spool_dir " + spool;
  Result r = Run(spooled + " --out " + dir_ + "/spooled.kv --verbosity 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("spooled to a temporary file in " + spool), std::string::npos) << r.out;
  EXPECT_TRUE(testing::ReadAll(dir_ + "/spooled.kv") == reference);

  const std::string out = dir_ + "/resumed.kv";
  KillAfterFirstCheckpoint(spooled + " --out " + out + " --checkpoint " + checkpoint_ + " --checkpoint_every 2");
  if (HasFatalFailure()) return;
  r = Run(spooled + " --out " + out + " --checkpoint " + checkpoint_ + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("resuming from"), std::string::npos) << r.err;
  EXPECT_TRUE(testing::ReadAll(out) == reference) << "the resumed cache differs";
  EXPECT_TRUE(testing::ListDir(spool).empty()) << "the spool is unlinked as it is made";

  // The same input through a pipe, spooled.
  r = Run(job_ + " --spool_after 10 --spool_dir " + spool + " --input - --out " + dir_ + "/pipe.kv <" + text_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(testing::ReadAll(dir_ + "/pipe.kv") == reference);

  r = Run(job_ + " --spool_after 0 --spool_dir " + dir_ + "/none/here --out " + dir_ + "/x.kv");
  EXPECT_FAILS_WITH(r, 1, "cannot create the token spool in " + dir_ + "/none/here");
  EXPECT_FALSE(Exists(dir_ + "/x.kv"));
  EXPECT_FAILS_WITH(Run(job_ + " --spool_after -1 --out " + dir_ + "/x.kv"), 2, "--spool_after=-1");
}

// The recall tier through `run`: a run killed with SIGKILL and resumed
// (its store cut back to the checkpoint) answers as one never stopped;
// every finished run removes its store; a resume pointed at another
// directory is refused.
TEST_F(ReliabilityTest, RecallKilledRunResumesToTheSameAnswer) {
  const std::string run = "run --model " + model_ + " --input " + text_ +
                          " --schedule fm --memory 64 --chunk 64 --window 8 --progress=false --timing=false"
                          " --question 'what is it' -n 8 --ignore_eos --recall 16";
  Result r = Run(run + " --recall_dir " + dir_ + "/ref_store");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string reference = r.out;
  EXPECT_NE(r.err.find("recall: 16 entries per layer and KV head brought back"), std::string::npos) << r.err;
  EXPECT_FALSE(Exists(dir_ + "/ref_store")) << "a finished run removes its store";

  const std::string store = dir_ + "/store";
  const std::string job = run + " --recall_dir " + store + " --checkpoint " + checkpoint_;
  KillAfterFirstCheckpoint(job + " --checkpoint_every 2");
  if (HasFatalFailure()) return;
  ASSERT_TRUE(Exists(store + "/recall.meta"));

  r = Run(run + " --recall_dir " + dir_ + "/elsewhere --checkpoint " + checkpoint_ + " --resume");
  EXPECT_FAILS_WITH(r, 1, "holds no recall store");
  r = Run(job + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("resuming from"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, reference);
  EXPECT_FALSE(Exists(store));
  EXPECT_FALSE(Exists(checkpoint_));
}

// Bad places for the store: each refused with a clear message before or
// as it fails, the user's files untouched and no store left behind.
TEST_F(ReliabilityTest, RecallRefusesBadStoresAndSaysWhy) {
  const std::string run = "run --model " + model_ + " --input " + text_ +
                          " --schedule fm --memory 64 --chunk 64 --window 8 --progress=false -n 2"
                          " --question 'what is it' --recall 16 --recall_dir ";
  Result r = Run(run + dir_ + "/s --dry_run");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("recall: up to"), std::string::npos) << r.out;
  EXPECT_FALSE(Exists(dir_ + "/s")) << "a dry run makes no store";

  const std::string mine = dir_ + "/mine";
  ASSERT_EQ(::mkdir(mine.c_str(), 0700), 0);
  testing::WriteRaw(mine + "/notes.txt", "keep me");
  EXPECT_FAILS_WITH(Run(run + mine), 1, "is not empty");
  EXPECT_EQ(testing::ReadAll(mine + "/notes.txt"), "keep me");
  EXPECT_EQ(testing::ListDir(mine).size(), 1u);

  const std::string unwritable = ::geteuid() == 0 ? std::string("/sys/snapfill-cli-store") : dir_ + "/ro/s";
  if (::geteuid() != 0) {
    ASSERT_EQ(::mkdir((dir_ + "/ro").c_str(), 0500), 0);
  }
  r = Run(run + unwritable);
  EXPECT_FAILS_WITH(r, 1, "cannot create");
  EXPECT_NE(r.err.find(unwritable), std::string::npos) << r.err;

  // A file-size limit stands in for a full disk (SIGXFSZ ignored, so the
  // write fails with EFBIG rather than killing the process).
  const std::string report = dir_ + "/report.json";
  testing::WriteRaw(report, "the user's");
  const std::string cmd = "trap '' XFSZ; ulimit -f 64; " + std::string(SNAPFILL_BINARY_DIR) + "/bin/snapfill " +
                          run + dir_ + "/full --report " + report + " >" + dir_ + "/full.out 2>" + dir_ + "/full.err";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);
  const std::string err = testing::ReadAll(dir_ + "/full.err");
  EXPECT_NE(err.find("ran out of disk"), std::string::npos) << err;
  EXPECT_FALSE(Exists(dir_ + "/full")) << "the failed run removes its store";
  EXPECT_EQ(testing::ReadAll(report), "the user's");

  EXPECT_FAILS_WITH(Run("run --model " + model_ + " --input " + text_ + " -n 2 --recall_dir " + dir_ + "/q"), 2,
                    "needs the question");
  EXPECT_FAILS_WITH(Run(run + dir_ + "/z --recall 0"), 2, "--recall=0 must be >= 1");
  EXPECT_FAILS_WITH(Run(run + dir_ + "/z --recall_format f32"), 2, "--recall_format=f32");
  EXPECT_FAILS_WITH(Run(run + dir_ + "/z --recall_rank layers"), 2, "--recall_rank=layers: expected summed or heads");
}

// prefill --recall_dir keeps the store for the saved cache; generate
// --cache --recall_dir brings entries back for its question, and refuses a
// store that is not that cache's.
TEST_F(ReliabilityTest, RecallAnswersASavedCacheFromItsStore) {
  const std::string store = dir_ + "/kept";
  const std::string cache = dir_ + "/doc.kv";
  const std::string prefill = "prefill --model " + model_ + " --schedule fm --memory 64 --chunk 64 --window 8"
                              " --progress=false --timing=false --recall_dir ";
  Result r = Run(prefill + store + " --input " + text_ + " --out " + cache);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("kept in " + store), std::string::npos) << r.err;
  EXPECT_TRUE(Exists(store + "/recall.done"));
  const std::string generate = "generate --model " + model_ + " --prompt 'what is it' -n 4 --timing=false --cache ";
  r = Run(generate + cache + " --recall_dir " + store + " --recall 16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("recall: 16 entries per layer and KV head brought back"), std::string::npos) << r.err;
  r = Run(generate + cache + " --recall_dir " + store + " --recall 16 --recall_rank heads");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("recall: 16 entries per layer and KV head brought back"), std::string::npos) << r.err;
  EXPECT_FAILS_WITH(Run(generate + cache + " --recall_dir " + store + " --recall_rank most"), 2,
                    "--recall_rank=most: expected summed or heads");
  EXPECT_TRUE(Exists(store + "/recall.meta")) << "generate keeps the store for the next question";

  // Another input's cache with this store; a cache saved without one.
  const std::string other_text = dir_ + "/other.txt";
  testing::WriteRaw(other_text, testing::ReadAll(text_) + " And one more sentence.");
  const std::string other = dir_ + "/other.kv";
  r = Run(prefill + dir_ + "/other_store --input " + other_text + " --out " + other);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FAILS_WITH(Run(generate + other + " --recall_dir " + store), 1, "belongs to another input");
  const std::string plain = dir_ + "/plain.kv";
  r = Run("prefill --model " + model_ + " --schedule fm --memory 64 --chunk 64 --window 8 --progress=false --input " +
          text_ + " --out " + plain);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FAILS_WITH(Run(generate + plain + " --recall_dir " + store), 1, "saved without a recall store");
}

// run --recall_dir where the question does not guide the compression
// (--query_aware=false): the plan says the question recalls after the
// input, the run says it did, and the store goes; killed after a
// checkpoint, it resumes (its store cut back) and answers the same. (The
// answers are sampled: the tiny model's greedy ones are line breaks whatever
// its cache holds; sampled, the same run without the store answers
// otherwise. That it answers as prefill --recall_dir and generate --cache
// --recall_dir do: model_recall_after_test, on the real model.)
TEST_F(ReliabilityTest, RecallAfterAQuestionlessPrefill) {
  const std::string run = "run --model " + model_ + " --input " + text_ +
                          " --schedule fm --memory 64 --chunk 64 --window 8 --progress=false --timing=false"
                          " --question 'what is it' --query_aware=false -n 8 --temp 1.5 --top_k 0 --top_p 1"
                          " --seed 5 --recall 16 --recall_dir ";
  const std::string store = dir_ + "/store";
  Result r = Run(run + store + " --dry_run");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("the question, read after the input, brings back 16 per layer and KV head"), std::string::npos)
      << r.out;
  EXPECT_FALSE(Exists(store)) << "a dry run makes no store";
  r = Run(run + store);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("recall: 16 entries per layer and KV head brought back"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("by the question read after the input"), std::string::npos) << r.err;
  EXPECT_FALSE(Exists(store)) << "a finished run removes its store";
  const std::string answer = r.out;

  const std::string job = run + store + " --checkpoint " + checkpoint_;
  KillAfterFirstCheckpoint(job + " --checkpoint_every 2");
  if (HasFatalFailure()) return;
  ASSERT_TRUE(Exists(store + "/recall.meta"));
  r = Run(job + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("resuming from"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("by the question read after the input"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, answer);
  EXPECT_FALSE(Exists(store));
  EXPECT_FALSE(Exists(checkpoint_));
}

}  // namespace
}  // namespace snapfill
