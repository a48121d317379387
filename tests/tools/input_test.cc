// The long input as a stream (tools/cli/input.h): ids equal to tokenizing
// the whole text, from a file, a FIFO, with --max_tokens; an input that
// changes while it is read is refused; resident memory stays about a block.
#include "tools/cli/input.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "src/base/sys_stats.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_model.h"

namespace snapfill::cli {
namespace {

class InputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("input");
    // The tiny model's byte-level BPE vocabulary.
    model_ = testing::LoadTinyModel(TinyLlamaOptions());
    auto tok = Tokenizer::FromGguf(model_->gguf());
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
    for (int i = 0; i < 3000; ++i) {
      text_ += "Line " + std::to_string(i) + ": the quick brown fox jumps over the lazy dog.\n";
    }
    path_ = dir_ + "/input.txt";
    testing::WriteRaw(path_, text_);
    frame_.document_add_special = true;
    options_.spool.dir = dir_;
    options_.block_bytes = 4096;
  }

  std::vector<int32_t> All(const TokenSpool& spool) {
    std::vector<int32_t> ids(spool.size());
    EXPECT_TRUE(spool.Read(0, ids.size(), ids.data()).ok());
    return ids;
  }

  std::string dir_, text_, path_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  PromptFrame frame_;
  InputOptions options_;
};

TEST_F(InputTest, FileGivesTheIdsOfTheWholeText) {
  frame_.prefix = {7, 8};
  frame_.suffix = {9};
  for (const int64_t memory_ids : {int64_t{0}, int64_t{1} << 22}) {
    options_.spool.memory_ids = memory_ids;
    auto file = InputFile::Open(path_);
    SNAPFILL_ASSERT_OK(file);
    auto in = TokenizeInput(**file, *tokenizer_, frame_, options_);
    SNAPFILL_ASSERT_OK(in);
    std::vector<int32_t> expected = {7, 8};
    const std::vector<int32_t> doc = tokenizer_->Encode(text_, true, false);
    expected.insert(expected.end(), doc.begin(), doc.end());
    expected.push_back(9);
    EXPECT_EQ(All(*in->tokens), expected);
    EXPECT_EQ(in->document_tokens, static_cast<int64_t>(doc.size()));
    EXPECT_EQ(in->document_end, static_cast<int64_t>(doc.size()) + 2);
    EXPECT_EQ(in->bytes_read, text_.size());
    EXPECT_TRUE(in->read_to_end);
    EXPECT_EQ(in->tokens->on_disk(), memory_ids == 0);
    EXPECT_LE(in->held_bytes, options_.block_bytes + Tokenizer::kSplitLookahead) << "a block, whatever the reads";
  }
}

TEST_F(InputTest, MaxTokensStopsReading) {
  std::string big;
  for (int i = 0; i < 40; ++i) big += text_;
  testing::WriteRaw(path_, big);
  options_.max_tokens = 1000;
  auto file = InputFile::Open(path_);
  SNAPFILL_ASSERT_OK(file);
  auto in = TokenizeInput(**file, *tokenizer_, frame_, options_);
  SNAPFILL_ASSERT_OK(in);
  const std::vector<int32_t> whole = tokenizer_->Encode(big, true, false);
  EXPECT_EQ(All(*in->tokens), std::vector<int32_t>(whole.begin(), whole.begin() + 1000));
  EXPECT_FALSE(in->read_to_end);
  EXPECT_GT(in->document_tokens_seen, 1000);
  EXPECT_LT(in->bytes_read, big.size() / 4) << "reading stops once the tokens are known";
}

TEST_F(InputTest, FifoGivesTheSameIds) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] {
    std::ofstream out(fifo, std::ios::binary);
    for (size_t at = 0; at < text_.size(); at += 777) out << text_.substr(at, 777) << std::flush;
  });
  auto file = InputFile::Open(fifo);
  SNAPFILL_ASSERT_OK(file);
  EXPECT_EQ((*file)->size(), -1);
  auto in = TokenizeInput(**file, *tokenizer_, frame_, options_);
  writer.join();
  SNAPFILL_ASSERT_OK(in);
  EXPECT_EQ(All(*in->tokens), tokenizer_->Encode(text_, true, false));
}

// The file grows, shrinks, or is rewritten in place after it was opened:
// refused, saying so, rather than tokenizing a mix of two versions.
TEST_F(InputTest, AnInputThatChangesWhileReadIsRefused) {
  for (const std::string& change : {std::string("grow"), std::string("shrink"), std::string("rewrite")}) {
    testing::WriteRaw(path_, text_);
    auto file = InputFile::Open(path_);
    SNAPFILL_ASSERT_OK(file);
    if (change == "grow") {
      std::ofstream(path_, std::ios::app) << "one more line\n";
    } else if (change == "shrink") {
      ASSERT_EQ(::truncate(path_.c_str(), text_.size() / 2), 0);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a later modification time
      std::string other = text_;
      other[10] = 'X';
      std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
      f.write(other.data(), other.size());
    }
    auto in = TokenizeInput(**file, *tokenizer_, frame_, options_);
    ASSERT_FALSE(in.ok()) << change;
    EXPECT_EQ(in.status().code(), absl::StatusCode::kFailedPrecondition) << in.status();
    EXPECT_NE(in.status().message().find("changed while it was read"), std::string::npos) << in.status();
  }
}

TEST_F(InputTest, EmptyMissingAndDirectoryInputsAreRefused) {
  testing::WriteRaw(path_, "");
  auto file = InputFile::Open(path_);
  SNAPFILL_ASSERT_OK(file);
  auto in = TokenizeInput(**file, *tokenizer_, frame_, options_);
  EXPECT_EQ(in.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(in.status().message().find("is empty"), std::string::npos) << in.status();
  EXPECT_EQ(InputFile::Open(dir_ + "/none.txt").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(InputFile::Open(dir_).status().code(), absl::StatusCode::kInvalidArgument);
}

// What tokenizing adds to resident memory stays within its stated working
// set, however long the input: 30 MB of text, ids spooled to disk.
TEST_F(InputTest, ResidentMemoryStaysFlat) {
  {
    // Written in pieces: a 30 MB string would leave glibc's thresholds
    // raised and its heap holding freed memory that the tokenizer reuses.
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    for (size_t written = 0; written < (30u << 20); written += text_.size()) out << text_;
  }
  options_.spool.memory_ids = 1 << 16;
  options_.block_bytes = StreamingEncoder::kDefaultBlockBytes;
  const uint64_t before = CurrentRssBytes();
  auto file = InputFile::Open(path_);
  SNAPFILL_ASSERT_OK(file);
  uint64_t peak = 0;
  std::atomic<bool> done{false};
  std::thread sampler([&] {
    while (!done) {
      peak = std::max(peak, CurrentRssBytes());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  auto in = TokenizeInput(**file, *tokenizer_, frame_, options_);
  done = true;
  sampler.join();
  SNAPFILL_ASSERT_OK(in);
  EXPECT_GT(in->tokens->size(), 5000000);
  const uint64_t bound = TokenizeWorkingSetBytes(options_);
  EXPECT_LT(peak - std::min(peak, before), bound) << "peak " << peak << " before " << before;
  std::printf("tokenizing %zu bytes added %.1f MiB at the peak (bound %.1f MiB)\n", static_cast<size_t>(in->bytes_read),
              (peak - std::min(peak, before)) / 1048576.0, bound / 1048576.0);
  EXPECT_LT(bound, 64u << 20) << "a block's working set, not the input's";
}

}  // namespace
}  // namespace snapfill::cli
