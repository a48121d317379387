// What the weights hold resident is decided by the engine, not by the page
// cache: once a forward has prepared its batches or its one-token steps,
// the matrices the backend reads in place (and token_embd, whose rows the
// lookups read) are mapped whole, and those it reads through its own copy
// are not mapped at all, whatever the cache held before and whichever CPU
// level runs (LlamaForward::SettleWeights).
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "src/gguf/fingerprint.h"
#include "src/model/llama_forward.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"
#include "tools/cli/environment.h"

namespace snapfill {
namespace {

uint64_t Bytes(const WeightView& w) { return static_cast<uint64_t>(w.rows) * w.row_bytes; }

class WeightsResidentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = cli::ResolveModelPath("");
    if (!std::filesystem::exists(path_)) GTEST_SKIP() << "default model not found at " << path_;
    // Start with every page of the file in the page cache: a read in place
    // could then map whatever it likes around what it reads.
    const std::string all = testing::ReadAll(path_);
    ASSERT_FALSE(all.empty());
    auto m = LlamaModel::Open(path_);
    SNAPFILL_ASSERT_OK(m);
    model_ = std::move(*m);
    auto b = CreateBackend(Device::kCpu, {});
    SNAPFILL_ASSERT_OK(b);
    backend_ = std::move(*b);
    auto f = LlamaForward::Create(*model_, backend_.get(), 64);
    SNAPFILL_ASSERT_OK(f);
    forward_ = std::move(*f);
    auto kv = forward_->NewKvCache(64);
    SNAPFILL_ASSERT_OK(kv);
    kv_ = std::move(*kv);
  }

  // Each decode matrix: resident whole where read in place, and not mapped
  // where read through a copy.
  void ExpectSettled(bool decode) {
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const WeightView& embd = model_->token_embd();
    EXPECT_GE(testing::MappedResidentBytes(embd.data, Bytes(embd)), Bytes(embd))
        << "token_embd is read in place by the lookups: all of it mapped";
    int copies = 0;
    for (const WeightView* w : model_->DecodeMatrices()) {
      const bool copy = backend_->CopyOf(*w, decode ? WeightUse::kDecode : WeightUse::kBatch).copied;
      const uint64_t mapped = testing::MappedResidentBytes(w->data, Bytes(*w));
      if (w->data == embd.data) continue;
      if (copy) {
        ++copies;
        // At most the pages it shares with its neighbours and with the
        // next of the 1024-row slices it is copied in, given back by slice.
        EXPECT_LE(mapped, (2 + (w->rows - 1) / 1024) * page)
            << "a matrix read through a copy keeps its pages mapped";
      } else {
        EXPECT_GE(mapped, Bytes(*w)) << "a matrix read in place is not mapped whole";
      }
    }
    std::printf("%s: %d of %zu matrices read through copies\n", decode ? "decode" : "batch", copies,
                model_->DecodeMatrices().size());
  }

  std::string path_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LlamaForward> forward_;
  std::unique_ptr<KvCache> kv_;
};

TEST_F(WeightsResidentTest, BatchThenDecodeSettleWhatIsMapped) {
  std::vector<int32_t> tokens(16), pos(16);
  std::iota(pos.begin(), pos.end(), 0);
  for (int i = 0; i < 16; ++i) tokens[i] = 100 + 37 * i;
  std::vector<float> logits(model_->config().vocab_size);
  SNAPFILL_ASSERT_OK(forward_->Forward(tokens.data(), 16, pos.data(), *kv_, 1, logits.data()));
  ExpectSettled(/*decode=*/false);
  const int32_t next = 7, at = 16;
  SNAPFILL_ASSERT_OK(forward_->Forward(&next, 1, &at, *kv_, 1, logits.data()));
  ExpectSettled(/*decode=*/true);
}

// The fingerprint is read with pread: it equals the hash of the mapped
// bytes and maps none of them.
TEST_F(WeightsResidentTest, FingerprintReadsTheFileWithoutMappingIt) {
  auto f = GgufFile::Open(path_);
  SNAPFILL_ASSERT_OK(f);
  const std::string_view all = (*f)->bytes();
  const uint64_t before = testing::MappedResidentBytes(all.data(), all.size());
  const std::string fingerprint = ModelFingerprint(**f);
  EXPECT_LE(testing::MappedResidentBytes(all.data(), all.size()), before);
  EXPECT_EQ(fingerprint, FingerprintBytes(all));  // maps every page
  EXPECT_GT(testing::MappedResidentBytes(all.data(), all.size()), before + all.size() / 2);
}

}  // namespace
}  // namespace snapfill
