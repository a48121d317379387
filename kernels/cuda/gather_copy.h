// Backend::Gather's copies within the device, many in one kernel launch.
//
// The chunk loop copies each KV head's rows apart (the memory and the chunk
// into the candidates, the kept candidates back, the evicted ones out): at
// 32 KV heads about 200 copies a layer, and one launch each costs more than
// most of them move. So the backend packs up to kGatherBatch of them into
// one launch's parameters: block row y of the grid copies copy y, its
// threads over that copy's rows × words.
//
// The copy itself (GatherCopyWords) is compiled for the host as well, so
// that a test runs the kernel's own index arithmetic and word choice on the
// CPU (tests/kernels/gather_copy_test.cc); this header needs no CUDA
// headers.
#ifndef SNAPFILL_KERNELS_CUDA_GATHER_COPY_H_
#define SNAPFILL_KERNELS_CUDA_GATHER_COPY_H_

#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define SNAPFILL_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SNAPFILL_HOST_DEVICE inline
#endif

namespace snapfill::cuda {

// dst + i * dst_stride <- src + rows[i] * src_stride (row i where rows is
// null), row_bytes each, for i < count; every pointer in device memory.
// (Backend::RowGather's fields: the kernels' layer does not see backend.h.)
struct GatherCopy {
  const void* src = nullptr;
  size_t src_stride = 0;
  const int32_t* rows = nullptr;
  void* dst = nullptr;
  size_t dst_stride = 0;
  int64_t count = 0;
  size_t row_bytes = 0;
};

// The most copies one launch takes: their descriptors are the kernel's
// parameters, which may hold 4,096 bytes on every architecture and driver.
inline constexpr int kGatherBatch = 64;

// A copy as the kernel reads it: rows of `words` words of 2^word_shift
// bytes (16, 8, 4, 2 or 1: the widest that every address, stride and the
// row size are multiples of).
struct GatherDescriptor {
  const char* src;
  const int32_t* rows;
  char* dst;
  uint64_t src_stride;
  uint64_t dst_stride;
  uint64_t count;
  uint32_t words;
  uint32_t word_shift;
};
struct GatherBatch {
  GatherDescriptor copies[kGatherBatch];
  int32_t num_copies;
};
static_assert(sizeof(GatherBatch) <= 4096, "a launch's parameters hold at most 4 KB");

inline GatherDescriptor DescribeGather(const GatherCopy& c) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(c.src) | reinterpret_cast<uintptr_t>(c.dst) | c.src_stride |
                        c.dst_stride | c.row_bytes;
  uint32_t shift = 4;
  while (shift > 0 && bits % (uint64_t{1} << shift) != 0) --shift;
  GatherDescriptor d;
  d.src = static_cast<const char*>(c.src);
  d.rows = c.rows;
  d.dst = static_cast<char*>(c.dst);
  d.src_stride = c.src_stride;
  d.dst_stride = c.dst_stride;
  d.count = c.count > 0 ? static_cast<uint64_t>(c.count) : 0;
  d.words = static_cast<uint32_t>(c.row_bytes >> shift);
  d.word_shift = shift;
  return d;
}

// The words of copy d that thread `thread` of `threads` moves: every
// threads-th word of the copy's rows × words, in order. Word is the copy's
// word type (sizeof(Word) == 2^d.word_shift); Index the arithmetic's
// (32 bits where the copy's words and the threads fit: a GPU divides 32-bit
// integers several times faster).
template <typename Word, typename Index>
SNAPFILL_HOST_DEVICE void GatherCopyWords(const GatherDescriptor& d, Index thread, Index threads) {
  const Index words = static_cast<Index>(d.words), total = static_cast<Index>(d.count) * words;
  for (Index i = thread; i < total; i += threads) {
    const Index row = i / words, word = i - row * words;
    const uint64_t from = d.rows != nullptr ? static_cast<uint64_t>(d.rows[row]) : static_cast<uint64_t>(row);
    const Word* s = reinterpret_cast<const Word*>(d.src + from * d.src_stride);
    Word* t = reinterpret_cast<Word*>(d.dst + static_cast<uint64_t>(row) * d.dst_stride);
    t[word] = s[word];
  }
}

// 16-byte words: CUDA's uint4 on the device (one 128-bit load and store),
// a struct of that size and alignment on the host.
#ifdef __CUDACC__
using GatherWord16 = uint4;
#else
struct alignas(16) GatherWord16 {
  uint64_t lo, hi;
};
#endif

template <typename Index>
SNAPFILL_HOST_DEVICE void GatherCopyIndexed(const GatherDescriptor& d, Index thread, Index threads) {
  switch (d.word_shift) {
    case 4:
      GatherCopyWords<GatherWord16>(d, thread, threads);
      break;
    case 3:
      GatherCopyWords<uint64_t>(d, thread, threads);
      break;
    case 2:
      GatherCopyWords<uint32_t>(d, thread, threads);
      break;
    case 1:
      GatherCopyWords<uint16_t>(d, thread, threads);
      break;
    default:
      GatherCopyWords<uint8_t>(d, thread, threads);
      break;
  }
}

// What one thread of the launch does for copy d: thread `thread` of
// `threads` along the grid's width.
SNAPFILL_HOST_DEVICE void GatherCopyThread(const GatherDescriptor& d, uint64_t thread, uint64_t threads) {
  if (d.count * d.words + threads <= UINT32_MAX) {
    GatherCopyIndexed<uint32_t>(d, static_cast<uint32_t>(thread), static_cast<uint32_t>(threads));
  } else {
    GatherCopyIndexed<uint64_t>(d, thread, threads);
  }
}

// The launch's shape: kGatherThreads a block, and enough blocks a copy to
// keep every SM streaming (132 SMs on an H100 / H200, a few blocks each),
// the larger copies' threads looping.
inline constexpr int kGatherThreads = 256;
inline constexpr uint64_t kGatherMaxBlocks = 1024;

// Fills b with copies [first, num_copies), those that move nothing left
// out, until it holds kGatherBatch; returns the index of the first copy
// not taken (num_copies when all were).
inline int PackGatherBatch(const GatherCopy* copies, int first, int num_copies, GatherBatch* b) {
  b->num_copies = 0;
  int i = first;
  for (; i < num_copies && b->num_copies < kGatherBatch; ++i) {
    if (copies[i].count <= 0 || copies[i].row_bytes == 0) continue;
    b->copies[b->num_copies++] = DescribeGather(copies[i]);
  }
  return i;
}

// The grid's width: the largest copy's words over kGatherThreads, at most
// kGatherMaxBlocks (its height is the batch's copies).
inline uint32_t GatherBatchBlocks(const GatherBatch& b) {
  uint64_t most = 0;
  for (int32_t i = 0; i < b.num_copies; ++i) {
    const uint64_t n = b.copies[i].count * b.copies[i].words;
    most = n > most ? n : most;
  }
  const uint64_t blocks = (most + kGatherThreads - 1) / kGatherThreads;
  return static_cast<uint32_t>(blocks < kGatherMaxBlocks ? blocks : kGatherMaxBlocks);
}

}  // namespace snapfill::cuda

#endif  // SNAPFILL_KERNELS_CUDA_GATHER_COPY_H_
