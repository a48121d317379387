// The file that keeps the kernels' timings between runs (--kernels auto):
// it round-trips, and a file that does not belong to this run (truncated,
// damaged, of another version, made on another CPU or by another build) is
// refused with a reason, which the command prints as a warning before it
// times the kernels again and replaces the file.
#include "tools/cli/kernel_cache.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "tests/testing/files.h"

namespace snapfill::cli {
namespace {

KernelCacheKey Key() {
  KernelCacheKey key;
  key.cpu = "GenuineIntel Some CPU (family 6 model 207 stepping 2), avx512";
  key.build = "0123abcd";
  key.threads = 2;
  key.shape = {GgmlType::kQ4_K, 640, 2048};
  return key;
}

std::vector<KernelRates> Rates() {
  return {{"prefill attention", {{"f32", 206.1}, {"avx512-bf16", 150.3}}}, {"products", {{"avx512-vnni", 812.5}}}};
}

TEST(KernelCache, RoundTrips) {
  const std::string dir = testing::MakeTempDir("kernel_cache_rt") + "/made/here";  // folders made
  const std::string path = KernelCacheFile(dir, Key());
  EXPECT_NE(path.find("kernels-t2-Q4_K-640x2048-h9x3x64.txt"), std::string::npos) << path;
  EXPECT_EQ(ReadKernelCache(path, Key()).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(WriteKernelCache(path, Key(), Rates()).ok());
  const absl::StatusOr<std::vector<KernelRates>> back = ReadKernelCache(path, Key());
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].op, "prefill attention");
  ASSERT_EQ((*back)[0].rates.size(), 2u);
  EXPECT_EQ((*back)[0].rates[1].name, "avx512-bf16");
  EXPECT_DOUBLE_EQ((*back)[0].rates[1].gops, 150.3);
  EXPECT_EQ((*back)[1].op, "products");
  EXPECT_DOUBLE_EQ((*back)[1].rates[0].gops, 812.5);
  KernelCacheKey lower = Key();
  lower.config = "avx2-amx0";
  EXPECT_NE(KernelCacheFile(dir, lower), path);
  KernelCacheKey gemma = Key();
  gemma.heads = {4, 1, 256};
  EXPECT_NE(KernelCacheFile(dir, gemma).find("kernels-t2-Q4_K-640x2048-h4x1x256.txt"), std::string::npos);
}

TEST(KernelCache, ForeignOrDamagedFilesAreRefusedWithTheReason) {
  const std::string dir = testing::MakeTempDir("kernel_cache_bad");
  const std::string path = KernelCacheFile(dir, Key());
  ASSERT_TRUE(WriteKernelCache(path, Key(), Rates()).ok());
  const std::string good = testing::ReadAll(path);
  struct Case {
    std::string text;
    absl::StatusCode code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {good.substr(0, good.size() / 2), absl::StatusCode::kDataLoss, "truncated"},
      {good.substr(0, good.rfind("end")), absl::StatusCode::kDataLoss, "truncated"},
      {"", absl::StatusCode::kDataLoss, "not a file of kernel timings"},
      {"\x7f" "ELF garbage\n", absl::StatusCode::kDataLoss, "not a file of kernel timings"},
      {absl::StrReplaceAll(good, {{"timings 2", "timings 1"}}), absl::StatusCode::kFailedPrecondition,
       "format version \"1\""},
      {absl::StrReplaceAll(good, {{"model 207", "model 143"}}), absl::StatusCode::kFailedPrecondition,
       "another CPU"},
      {absl::StrReplaceAll(good, {{"0123abcd", "feedbeef"}}), absl::StatusCode::kFailedPrecondition,
       "another build"},
      {absl::StrReplaceAll(good, {{"threads 2", "threads 8"}}), absl::StatusCode::kFailedPrecondition,
       "another thread count"},
      {absl::StrReplaceAll(good, {{"640x2048", "576x1536"}}), absl::StatusCode::kFailedPrecondition,
       "another product shape"},
      {absl::StrReplaceAll(good, {{"heads 9 on 3 of 64", "heads 4 on 1 of 256"}}),
       absl::StatusCode::kFailedPrecondition, "other attention heads"},
      {absl::StrReplaceAll(good, {{"812.5", "fast"}}), absl::StatusCode::kDataLoss, "damaged"},
      {absl::StrReplaceAll(good, {{"812.5", "-3"}}), absl::StatusCode::kDataLoss, "damaged"},
      {absl::StrReplaceAll(good, {{"rates products", "products"}}), absl::StatusCode::kDataLoss, "damaged"},
  };
  for (const Case& c : cases) {
    testing::WriteRaw(path, c.text);
    const absl::Status s = ReadKernelCache(path, Key()).status();
    EXPECT_EQ(s.code(), c.code) << c.text << "\n" << s;
    EXPECT_NE(s.message().find(c.says), absl::string_view::npos) << s;
    EXPECT_NE(s.message().find(path), absl::string_view::npos) << s;
  }
}

TEST(KernelCache, TheBuildIdIsThisExecutables) {
  const std::string id = ExecutableBuildId();
  EXPECT_FALSE(id.empty());
  EXPECT_EQ(id, ExecutableBuildId());
}

// --kernels auto: timed once and kept; read back by the next run; a damaged
// file warned about, timed again and replaced.
TEST(KernelCache, TimedOnceThenReadBackAndADamagedFileReplaced) {
  const std::string dir = testing::MakeTempDir("kernel_cache_cli");
  const char* old_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old_xdg != nullptr ? old_xdg : "";
  ::setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  EXPECT_EQ(KernelCacheDir(), dir + "/snapfill");
  BackendOptions o;
  o.num_threads = 1;
  o.product_shape = {GgmlType::kQ4_0, 256, 64};
  std::string source;
  ASSERT_TRUE(LoadOrMeasureKernelRates(&o, &source).ok());
  const std::string path = dir + "/snapfill/kernels-t1-Q4_0-256x64-h9x3x64.txt";
  EXPECT_EQ(source, "timed now, kept in " + path);
  ASSERT_EQ(o.kernel_rates.size(), 2u);
  const std::string kept = testing::ReadAll(path);
  EXPECT_NE(kept.find("rates products: "), std::string::npos) << kept;

  BackendOptions again = o;
  again.kernel_rates.clear();
  ASSERT_TRUE(LoadOrMeasureKernelRates(&again, &source).ok());
  EXPECT_EQ(source, path);
  ASSERT_EQ(again.kernel_rates.size(), 2u);
  EXPECT_EQ(again.kernel_rates[1].rates[0].name, o.kernel_rates[1].rates[0].name);

  testing::WriteRaw(path, kept.substr(0, kept.size() - 4));  // no "end"
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(LoadOrMeasureKernelRates(&again, &source).ok());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("warning: kernel timings ignored: " + path + ": truncated"), std::string::npos) << err;
  EXPECT_EQ(source, "timed now, kept in " + path);
  EXPECT_TRUE(ReadKernelCache(path, KernelCacheKey{CpuIdentity(), ExecutableBuildId(), "", 1, o.product_shape}).ok());

  // An unwritable folder: the rates are still timed and used, with a warning.
  ::setenv("XDG_CACHE_HOME", "/proc/no-such-folder", 1);
  ::testing::internal::CaptureStderr();
  again.kernel_rates.clear();
  ASSERT_TRUE(LoadOrMeasureKernelRates(&again, &source).ok());
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("warning: the kernel timings are not kept"),
            std::string::npos);
  EXPECT_EQ(source, "timed now");
  EXPECT_EQ(again.kernel_rates.size(), 2u);
  if (old_xdg != nullptr) {
    ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  } else {
    ::unsetenv("XDG_CACHE_HOME");
  }
}

}  // namespace
}  // namespace snapfill::cli
