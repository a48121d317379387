// The CUDA gather's copy (kernels/cuda/gather_copy.h) run on the host: the
// kernel's own code, every thread of every block of the grid its launcher
// makes, against the CPU backend's Gather. What a GPU adds (the launch, the
// memory) the CUDA tests check where one is present.
#include "kernels/cuda/gather_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "snapfill/backend.h"
#include "tests/testing/gather_data.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

using cuda::GatherCopy;

// What the device does for these copies: batches as the launcher packs
// them, each batch's grid (GatherBatchBlocks × kGatherThreads threads a
// copy), every thread's share. Returns the number of launches.
int RunOnHost(const std::vector<GatherCopy>& copies) {
  cuda::GatherBatch batch;
  int launches = 0;
  const int n = static_cast<int>(copies.size());
  for (int next = 0; next < n;) {
    next = cuda::PackGatherBatch(copies.data(), next, n, &batch);
    if (batch.num_copies == 0) continue;
    ++launches;
    const uint64_t threads = uint64_t{cuda::GatherBatchBlocks(batch)} * cuda::kGatherThreads;
    for (int32_t c = 0; c < batch.num_copies; ++c) {
      for (uint64_t t = 0; t < threads; ++t) cuda::GatherCopyThread(batch.copies[c], t, threads);
    }
  }
  return launches;
}

struct Arena {
  Arena(size_t size, uint32_t seed) : bytes(size + 64) {
    std::mt19937 rng(seed);
    for (uint8_t& b : this->bytes) b = static_cast<uint8_t>(rng());
  }
  // 64-byte aligned storage, so that the offsets below set the alignment.
  uint8_t* at(size_t offset) {
    const uintptr_t base = (reinterpret_cast<uintptr_t>(bytes.data()) + 63) & ~uintptr_t{63};
    return reinterpret_cast<uint8_t*>(base) + offset;
  }
  std::vector<uint8_t> bytes;
};

// The word each copy is read in: the widest that every address, stride and
// the row size are multiples of.
TEST(GatherCopy, ChoosesTheWidestWordEverythingAllows) {
  alignas(64) static char buffer[4096];
  struct Case {
    size_t src_offset, dst_offset, src_stride, dst_stride, row_bytes;
    uint32_t shift;
  };
  const Case cases[] = {
      {0, 0, 512, 512, 512, 4},    // a head of 128 floats
      {0, 0, 256, 16384, 256, 4},  // a head of 64 out of a batch row
      {0, 64, 4, 4, 4, 2},         // scores
      {0, 0, 24, 24, 24, 3},       // 8-byte words
      {0, 0, 6, 8, 6, 1},          // 2-byte words
      {0, 0, 7, 7, 7, 0},          // bytes
      {4, 0, 512, 512, 512, 2},    // a source 4 bytes off
      {0, 8, 512, 512, 512, 3},    // a destination 8 bytes off
      {0, 0, 512, 520, 512, 3},    // a stride
      {0, 0, 512, 512, 510, 1},    // the row size
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.src_offset << " " << c.dst_offset << " " << c.src_stride << " "
                                      << c.dst_stride << " " << c.row_bytes);
    const GatherCopy copy{
        buffer + c.src_offset, c.src_stride, nullptr, buffer + c.dst_offset, c.dst_stride, 3, c.row_bytes};
    const cuda::GatherDescriptor d = cuda::DescribeGather(copy);
    EXPECT_EQ(d.word_shift, c.shift);
    EXPECT_EQ(uint64_t{d.words} << d.word_shift, c.row_bytes);
    EXPECT_EQ(d.count, 3u);
  }
}

// Many copies of every kind in one call, as the chunk loop makes them:
// runs and indexed rows, rows of every word size, strided sources and
// destinations, copies of nothing among them; more than one launch's worth.
TEST(GatherCopy, MovesWhatTheHostGatherMoves) {
  auto cpu = CreateBackend(Device::kCpu, BackendOptions{});
  SNAPFILL_ASSERT_OK(cpu);
  const testing::GatherShapes shapes = testing::MakeGatherShapes(150, 300, 11);
  Arena src(shapes.src_bytes, 1);
  Arena got(shapes.dst_bytes, 2);
  std::vector<uint8_t> want(got.bytes);  // (the same bytes, the same base offset)
  const ptrdiff_t want_shift = want.data() - got.bytes.data();
  std::vector<GatherCopy> copies;
  std::vector<Backend::RowGather> on_host;
  for (const testing::GatherShape& g : shapes.copies) {
    const int32_t* idx = g.rows.empty() ? nullptr : g.rows.data();
    uint8_t* s = src.at(g.src_offset);
    uint8_t* d = got.at(g.dst_offset);
    copies.push_back({s, g.src_stride, idx, d, g.dst_stride, g.count, g.row_bytes});
    on_host.push_back({s, g.src_stride, idx, d + want_shift, g.dst_stride, g.count, g.row_bytes});
  }
  SNAPFILL_ASSERT_OK((*cpu)->Gather(on_host));
  // 141 copies move rows: 64 + 64 + 13 a launch, the empty ones left out.
  cuda::GatherBatch first;
  const int next = cuda::PackGatherBatch(copies.data(), 0, static_cast<int>(copies.size()), &first);
  EXPECT_EQ(first.num_copies, cuda::kGatherBatch);
  EXPECT_EQ(next, 68);  // (copies 5, 22, 39 and 56 move nothing)
  EXPECT_EQ(RunOnHost(copies), 3);
  EXPECT_TRUE(got.bytes == want) << "the kernel's copies differ from the host's";
}

// A copy larger than the grid (kGatherMaxBlocks × kGatherThreads words:
// each thread loops), and the 64-bit arithmetic on the same copies.
TEST(GatherCopy, LargeCopiesLoopAndBothIndexWidthsAgree) {
  const int64_t count = 300000;
  const size_t row_bytes = 16;
  ASSERT_GT(count * (row_bytes / 16), static_cast<int64_t>(cuda::kGatherMaxBlocks * cuda::kGatherThreads));
  std::mt19937 rng(3);
  std::vector<int32_t> rows(count);
  for (int32_t& r : rows) r = static_cast<int32_t>(rng() % count);
  Arena src(count * row_bytes, 4);
  Arena got(count * row_bytes, 5);
  Arena wide(count * row_bytes, 5);
  std::vector<uint8_t> want(count * row_bytes);
  for (int64_t i = 0; i < count; ++i) std::memcpy(&want[i * row_bytes], src.at(rows[i] * row_bytes), row_bytes);
  const GatherCopy copy{src.at(0), row_bytes, rows.data(), got.at(0), row_bytes, count, row_bytes};
  EXPECT_EQ(RunOnHost({copy}), 1);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), got.at(0)));
  // The 64-bit loop (taken where a copy's words reach 2^32), by hand.
  GatherCopy copy64 = copy;
  copy64.dst = wide.at(0);
  const cuda::GatherDescriptor d = cuda::DescribeGather(copy64);
  const uint64_t threads = cuda::kGatherMaxBlocks * cuda::kGatherThreads;
  for (uint64_t t = 0; t < threads; ++t) cuda::GatherCopyIndexed<uint64_t>(d, t, threads);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), wide.at(0)));
}

}  // namespace
}  // namespace snapfill
