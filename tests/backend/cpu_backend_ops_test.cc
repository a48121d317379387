// The CPU backend's selection ops against their scalar twins, its gathers
// against plain loops, its checks of their arguments, and the kernels'
// process-wide choices it makes (ConfigureCpuKernels).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_variants.h"
#include "kernels/cpu/kernel_config.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/ref/ops_ref.h"
#include "snapfill/backend.h"
#include "snapfill/status.h"
#include "tests/testing/complement_data.h"
#include "tests/testing/files.h"
#include "tests/testing/gate_data.h"
#include "tests/testing/matmul_data.h"
#include "tests/testing/ref_backend.h"

namespace snapfill {
namespace {

// The CPU backend with its buffers guarded: only its ops reach them, as
// on a device.
std::unique_ptr<Backend> GuardedCpuBackend() {
  BackendOptions o;
  o.guard_buffers = true;
  auto b = CreateBackend(Device::kCpu, o);
  SNAPFILL_CHECK(b.ok()) << b.status();
  return std::move(*b);
}

std::vector<float> Votes(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unif(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = unif(rng);
  // Ties, which the top-k breaks towards the lower position.
  for (int64_t i = 0; i + 7 < n; i += 7) v[i + 7] = v[i];
  return v;
}

TEST(CpuBackendOps, PoolAndTopKMatchTheTwins) {
  Backend& b = testing::SharedCpuBackend();
  for (int64_t n : {1, 5, 33, 1000}) {
    const std::vector<float> votes = Votes(n, static_cast<uint32_t>(n));
    for (int64_t kernel : {1, 3, 7}) {
      for (Backend::PoolOp op : {Backend::PoolOp::kAvg, Backend::PoolOp::kMax}) {
        std::vector<float> got(n), want(n);
        ASSERT_TRUE(b.Pool1d(votes.data(), got.data(), n, kernel, op).ok());
        if (kernel <= 1) {
          want = votes;
        } else if (op == Backend::PoolOp::kAvg) {
          ref::AvgPool1d(votes.data(), want.data(), n, kernel);
        } else {
          ref::MaxPool1d(votes.data(), want.data(), n, kernel);
        }
        for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], want[i], 1e-6f) << n << " " << kernel << " " << i;
      }
    }
    for (int64_t k : {int64_t{0}, int64_t{1}, n / 2, n}) {
      std::vector<int32_t> got(k), want(k);
      ASSERT_TRUE(b.TopK(votes.data(), n, k, got.data()).ok());
      ref::TopKIndices(votes.data(), n, k, want.data());
      EXPECT_EQ(got, want) << n << " " << k;
      for (int64_t span : {1, 2, 9}) {
        ASSERT_TRUE(b.TopSpans(votes.data(), n, k, span, got.data()).ok());
        ref::TopSpanIndices(votes.data(), n, k, span, want.data());
        EXPECT_EQ(got, want) << n << " " << k << " span " << span;
      }
    }
    std::vector<int32_t> top(n);
    EXPECT_FALSE(b.TopSpans(votes.data(), n, n + 1, 3, top.data()).ok());
    EXPECT_FALSE(b.TopSpans(votes.data(), n, 1, 0, top.data()).ok());
  }
}

// SelectHeads (SnapKV's selection of a layer as one op) against its twin
// on odd shapes: sinks or none, windows of 0 to every candidate, picks of
// none to all of the rest, ties (broken towards the lower index) and
// zeros of both signs, both poolings at kernels 1, 3 and 7, single entries
// and spans of 3 and 33 (a question's rule); the unguarded
// CPU backend in place, the guarded one through its buffers, and the test
// twin backend. The word after each row's status is left alone.
TEST(CpuBackendOps, SelectHeadsMatchesTheTwin) {
  const std::unique_ptr<Backend> guarded = GuardedCpuBackend();
  const std::unique_ptr<Backend> twin = testing::CreateRefBackend(/*quantized_activations=*/false);
  int cases = 0, then_cases = 0;
  for (const int64_t heads : {1, 3}) {
    for (const int64_t n : {1, 9, 300, 1201}) {
      const int64_t stride = n + 5;
      // (The second row, for a second pick: other votes, with ties.)
      std::vector<float> votes(heads * stride, -7.0f), then_votes(heads * stride, -7.0f);
      for (int64_t h = 0; h < heads; ++h) {
        const std::vector<float> v = Votes(n, static_cast<uint32_t>(n * 10 + h));
        std::copy(v.begin(), v.end(), votes.begin() + h * stride);
        for (int64_t j = 3; j < n; j += 11) votes[h * stride + j] = (j % 2 == 0) ? 0.0f : -0.0f;
        const std::vector<float> t = Votes(n, static_cast<uint32_t>(n * 10 + h + 5));
        std::copy(t.begin(), t.end(), then_votes.begin() + h * stride);
        for (int64_t j = 2; j < n; j += 5) then_votes[h * stride + j] = 0.25f;
      }
      for (const int64_t sinks : {int64_t{0}, std::min<int64_t>(4, n)}) {
        for (const int64_t window :
             {int64_t{0}, std::min<int64_t>(1, n - sinks), std::min<int64_t>(8, n - sinks), n - sinks}) {
          const int64_t window_begin = n - window, rest = window_begin - sinks;
          for (const int64_t pick : {int64_t{0}, std::min<int64_t>(1, rest), rest / 2, rest}) {
            for (const int64_t then : {int64_t{0}, std::min<int64_t>(1, rest - pick), (rest - pick) / 2}) {
              for (const int64_t kernel : {1, 3, 7}) {
                for (const int64_t span : {1, 3, 33}) {
                  for (const Backend::PoolOp op : {Backend::PoolOp::kAvg, Backend::PoolOp::kMax}) {
                    Backend::HeadSelection s{.votes = votes.data(),
                                             .votes_stride = stride,
                                             .num_heads = heads,
                                             .num_candidates = n,
                                             .rest_begin = sinks,
                                             .window_begin = window_begin,
                                             .pick = pick,
                                             .pool_kernel = kernel,
                                             .pool = op,
                                             .span = span,
                                             .then_votes = then > 0 ? then_votes.data() : nullptr,
                                             .then_votes_stride = stride,
                                             .then_pick = then};
                    s.keep_stride = s.count() + 2;
                    std::vector<int32_t> want(heads * s.keep_stride, -9);
                    ref::SelectHeads(votes.data(), stride, heads, n, sinks, window_begin, pick, kernel,
                                     op == Backend::PoolOp::kMax, span, s.then_votes, stride, then, want.data(),
                                     s.keep_stride);
                    const std::string where = ::testing::PrintToString(
                        std::vector<int64_t>{heads, n, sinks, window, pick, then, kernel, span});
                    for (Backend* b : {&testing::SharedCpuBackend(), twin.get()}) {
                      std::vector<int32_t> got(want.size(), -9);
                      s.keep = got.data();
                      ASSERT_TRUE(b->SelectHeads(s).ok()) << where;
                      ASSERT_EQ(got, want) << where;
                    }
                    // Guarded: votes and result in the backend's buffers.
                    Backend& g = *guarded;
                    auto votes_buffer = g.NewBuffer(2 * votes.size() * sizeof(float));
                    auto keep_buffer = g.NewBuffer(want.size() * sizeof(int32_t));
                    ASSERT_TRUE(votes_buffer.ok() && keep_buffer.ok());
                    std::vector<int32_t> got(want.size(), -9);
                    float* const then_in_buffer = (*votes_buffer)->f32() + votes.size();
                    ASSERT_TRUE(g.Upload(votes.data(), (*votes_buffer)->data(), votes.size() * sizeof(float)).ok());
                    ASSERT_TRUE(g.Upload(then_votes.data(), then_in_buffer, votes.size() * sizeof(float)).ok());
                    ASSERT_TRUE(g.Upload(got.data(), (*keep_buffer)->data(), got.size() * sizeof(int32_t)).ok());
                    Backend::HeadSelection in_buffers = s;
                    in_buffers.votes = (*votes_buffer)->f32();
                    if (then > 0) in_buffers.then_votes = then_in_buffer;
                    in_buffers.keep = static_cast<int32_t*>((*keep_buffer)->data());
                    ASSERT_TRUE(g.SelectHeads(in_buffers).ok()) << where;
                    ASSERT_TRUE(g.Download((*keep_buffer)->data(), got.data(), got.size() * sizeof(int32_t)).ok());
                    ASSERT_EQ(got, want) << where;
                    for (int64_t h = 0; h < heads; ++h) {
                      const int32_t* row = want.data() + h * s.keep_stride;
                      ASSERT_EQ(row[s.count()], -1) << where;
                      ASSERT_EQ(row[s.count() + 1], -9) << where;
                      ASSERT_TRUE(std::is_sorted(row, row + s.count())) << where;
                    }
                    ++cases;
                    then_cases += then > 0;
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 4000);
  EXPECT_GT(then_cases, 1500);
  // Ties and zeros: equal pooled votes keep the lower indices, and -0
  // ranks with +0 (index 1 is kept before index 3).
  const std::vector<float> tied = {0.5f, -0.0f, 0.5f, 0.0f, 0.5f, 0.0f, 1.0f};
  std::vector<int32_t> keep(6, -9);
  Backend::HeadSelection s{.votes = tied.data(), .votes_stride = 7, .num_heads = 1, .num_candidates = 7,
                           .window_begin = 6, .pick = 4, .keep_stride = 6};
  ref::SelectHeads(tied.data(), 7, 1, 7, 0, 6, 4, 1, false, 1, nullptr, 0, 0, keep.data(), 6);
  EXPECT_EQ(keep, (std::vector<int32_t>{0, 1, 2, 4, 6, -1}));
  std::fill(keep.begin(), keep.end(), -9);
  s.keep = keep.data();
  ASSERT_TRUE(testing::SharedCpuBackend().SelectHeads(s).ok());
  EXPECT_EQ(keep, (std::vector<int32_t>{0, 1, 2, 4, 6, -1}));
  // Spans of 3 over the same votes: the first 0.5 (index 0) takes 1 with
  // it; the next peak, index 2, takes 3 (its lower side is taken), which
  // makes four: the 0.5 at index 4 goes.
  std::fill(keep.begin(), keep.end(), -9);
  s.span = 3;
  ASSERT_TRUE(testing::SharedCpuBackend().SelectHeads(s).ok());
  EXPECT_EQ(keep, (std::vector<int32_t>{0, 1, 2, 3, 6, -1}));
  // Two single entries by the first votes (0 and 2), then two by the
  // second among the others: 0 and 2 score 9 there but are taken; 3 and 5
  // tie at 3 above 4's 2 and 1's 1.
  const std::vector<float> second = {9.0f, 1.0f, 9.0f, 3.0f, 2.0f, 3.0f, 0.0f};
  for (Backend* b : {&testing::SharedCpuBackend(), twin.get()}) {
    Backend::HeadSelection two = s;
    two.span = 1;
    two.pick = 2;
    two.then_votes = second.data();
    two.then_votes_stride = 7;
    two.then_pick = 2;
    std::fill(keep.begin(), keep.end(), -9);
    two.keep = keep.data();
    ASSERT_TRUE(b->SelectHeads(two).ok());
    EXPECT_EQ(keep, (std::vector<int32_t>{0, 2, 3, 5, 6, -1}));
  }
  std::fill(keep.begin(), keep.end(), -9);
  ref::SelectHeads(tied.data(), 7, 1, 7, 0, 6, 2, 1, false, 1, second.data(), 7, 2, keep.data(), 6);
  EXPECT_EQ(keep, (std::vector<int32_t>{0, 2, 3, 5, 6, -1}));
}

// votes_stride 0: every head reads one row (a question's votes summed
// over the heads) and keeps what one head over it keeps.
// SmartKV's gates, every head in one op, against the twin in double: odd
// shapes, strides wider than the rows, on the CPU backend, in guarded
// buffers (keys, parameters and scores where only ops reach them, as on a
// device) and on the RefBackend. The bound is f32 rounding of the terms'
// magnitudes: a misread parameter or key is off by the order of them.
TEST(CpuBackendOps, GateScoresMatchTheTwin) {
  const std::unique_ptr<Backend> guarded = GuardedCpuBackend();
  const std::unique_ptr<Backend> twin = testing::CreateRefBackend(/*quantized_activations=*/false);
  int64_t cases = 0;
  for (const int64_t heads : {1, 3}) {
    for (const auto& [d, hidden] : {std::pair<int64_t, int64_t>{64, 16}, {5, 1}, {256, 8}, {17, 33}}) {
      for (const int64_t n : {0, 1, 7, 300}) {
        const testing::GateData data = testing::MakeGateData(heads, d, hidden, n, static_cast<uint32_t>(5 + cases));
        for (Backend* b : {&testing::SharedCpuBackend(), guarded.get(), twin.get()}) {
          // (Operands in the backend's buffers: guarded, only its ops reach them.)
          auto pb = b->NewBuffer(data.params.size() * sizeof(float));
          auto kb = b->NewBuffer(data.keys.size() * sizeof(float));
          auto yb = b->NewBuffer(data.want.size() * sizeof(float));
          ASSERT_TRUE(pb.ok() && kb.ok() && yb.ok());
          std::vector<float> got(data.want.size(), -9.0f);
          ASSERT_TRUE(b->Upload(data.params.data(), (*pb)->data(), data.params.size() * sizeof(float)).ok());
          ASSERT_TRUE(b->Upload(data.keys.data(), (*kb)->data(), data.keys.size() * sizeof(float)).ok());
          ASSERT_TRUE(b->Upload(got.data(), (*yb)->data(), got.size() * sizeof(float)).ok());
          ASSERT_TRUE(b->GateScores(data.Op((*pb)->f32(), (*kb)->f32(), (*yb)->f32())).ok());
          ASSERT_TRUE(b->Download((*yb)->data(), got.data(), got.size() * sizeof(float)).ok());
          testing::ExpectGateScores(data, got, b == twin.get() ? "twin" : b == guarded.get() ? "guarded" : "cpu");
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 2 * 4 * 4 * 3);
}

TEST(CpuBackendOps, SelectHeadsReadsOneRowForEveryHead) {
  const std::unique_ptr<Backend> twin = testing::CreateRefBackend(/*quantized_activations=*/false);
  const std::vector<float> votes = Votes(300, 9);
  Backend::HeadSelection one{.votes = votes.data(),
                             .votes_stride = 300,
                             .num_heads = 1,
                             .num_candidates = 300,
                             .rest_begin = 4,
                             .window_begin = 300,
                             .pick = 100,
                             .pool_kernel = 7,
                             .span = 8};
  one.keep_stride = one.count() + 1;
  std::vector<int32_t> want(one.keep_stride);
  one.keep = want.data();
  ASSERT_TRUE(testing::SharedCpuBackend().SelectHeads(one).ok());
  for (Backend* b : {&testing::SharedCpuBackend(), twin.get()}) {
    Backend::HeadSelection all = one;
    all.num_heads = 3;
    all.votes_stride = 0;
    std::vector<int32_t> got(3 * all.keep_stride, -9);
    all.keep = got.data();
    ASSERT_TRUE(b->SelectHeads(all).ok());
    for (int64_t h = 0; h < 3; ++h) {
      EXPECT_EQ(std::vector<int32_t>(got.begin() + h * all.keep_stride, got.begin() + (h + 1) * all.keep_stride), want)
          << h;
    }
  }
}

// A vote that is not finite: the row is [0, count) (a gather by it stays
// in bounds) and the status word names the first such candidate of R.
TEST(CpuBackendOps, SelectHeadsNamesANonFiniteVote) {
  const std::unique_ptr<Backend> twin = testing::CreateRefBackend(/*quantized_activations=*/false);
  for (Backend* b : {&testing::SharedCpuBackend(), twin.get()}) {
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      std::vector<float> votes = Votes(40, 3);
      votes.insert(votes.end(), votes.begin(), votes.end());  // head 1 as head 0
      votes[40 + 17] = bad;                                   // head 1, candidate 17
      votes[40 + 30] = bad;                                   // a later one
      votes[38] = bad;                                        // in head 0's window: not read
      Backend::HeadSelection s{.votes = votes.data(), .votes_stride = 40, .num_heads = 2, .num_candidates = 40,
                               .rest_begin = 2, .window_begin = 36, .pick = 10, .pool_kernel = 3};
      s.keep_stride = s.count() + 1;
      std::vector<int32_t> keep(2 * s.keep_stride, -9);
      s.keep = keep.data();
      ASSERT_TRUE(b->SelectHeads(s).ok());
      EXPECT_EQ(keep[s.count()], -1) << "head 0's rest is finite";
      const int32_t* row = keep.data() + s.keep_stride;
      EXPECT_EQ(row[s.count()], 17);
      for (int64_t t = 0; t < s.count(); ++t) EXPECT_EQ(row[t], t);
      // A second row's vote is checked too, whatever the first's.
      std::vector<float> then_votes = Votes(80, 4);
      then_votes[9] = bad;  // head 0, candidate 9
      s.then_votes = then_votes.data();
      s.then_votes_stride = 40;
      s.then_pick = 5;
      s.keep_stride = s.count() + 1;
      keep.assign(2 * s.keep_stride, -9);
      s.keep = keep.data();
      ASSERT_TRUE(b->SelectHeads(s).ok());
      EXPECT_EQ(keep[s.count()], 9);
      EXPECT_EQ(keep[s.keep_stride + s.count()], 17);
    }
  }
}

// Complement: the candidates a selection left, every head, as the twin
// finds them: none kept, all kept, random subsets of odd sizes, strides
// wider than the rows; in the CPU's host memory, in guarded buffers, and on
// the RefBackend. Kept indices out of order are refused, naming the head.
TEST(CpuBackendOps, ComplementMatchesTheTwin) {
  const std::unique_ptr<Backend> guarded = GuardedCpuBackend();
  const std::unique_ptr<Backend> twin = testing::CreateRefBackend(/*quantized_activations=*/false);
  int64_t cases = 0;
  for (const int64_t heads : {1, 3}) {
    for (const int64_t num : {1, 2, 37, 300, 2049}) {
      for (const int64_t kept : {int64_t{0}, num / 3, num - 1, num}) {
        const testing::ComplementData data = testing::MakeComplementData(heads, num, kept, 11 + cases);
        const std::vector<int32_t>& keep = data.keep;
        const std::vector<int32_t>& want = data.want;
        const int64_t keep_stride = data.keep_stride, out_stride = data.out_stride;
        for (int64_t h = 0; h < heads; ++h) {  // (the twin itself: the rest of 0..num, ascending)
          const int32_t* row = want.data() + h * out_stride;
          EXPECT_TRUE(std::is_sorted(row, row + num - kept));
          if (num > kept) {
            EXPECT_TRUE(row[0] >= 0 && row[num - kept - 1] < num);
          }
        }
        for (Backend* b : {&testing::SharedCpuBackend(), guarded.get(), twin.get()}) {
          auto kb = b->NewBuffer(keep.size() * sizeof(int32_t));
          auto ob = b->NewBuffer(want.size() * sizeof(int32_t));
          ASSERT_TRUE(kb.ok() && ob.ok());
          std::vector<int32_t> got(want.size(), -5);
          ASSERT_TRUE(b->Upload(keep.data(), (*kb)->data(), keep.size() * sizeof(int32_t)).ok());
          ASSERT_TRUE(b->Upload(got.data(), (*ob)->data(), got.size() * sizeof(int32_t)).ok());
          ASSERT_TRUE(b->Complement(static_cast<const int32_t*>((*kb)->data()), keep_stride, kept, heads, num,
                                    static_cast<int32_t*>((*ob)->data()), out_stride)
                          .ok());
          ASSERT_TRUE(b->Download((*ob)->data(), got.data(), got.size() * sizeof(int32_t)).ok());
          EXPECT_EQ(got, want) << heads << " heads, " << kept << " of " << num;
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 2 * 5 * 4 * 3);
  Backend& b = testing::SharedCpuBackend();
  std::vector<int32_t> keep = {0, 2, 5, 1, 4, 3}, out(8);
  const absl::Status unordered = b.Complement(keep.data(), 3, 3, 2, 7, out.data(), 4);
  EXPECT_EQ(unordered.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unordered.message().find("head 1"), std::string::npos) << unordered;
  const std::vector<int32_t> past = {0, 2, 9};
  EXPECT_EQ(b.Complement(past.data(), 3, 3, 1, 7, out.data(), 4).code(), absl::StatusCode::kInvalidArgument)
      << "a kept index past the candidates";
  EXPECT_EQ(b.Complement(keep.data(), 3, 4, 1, 3, out.data(), 4).code(), absl::StatusCode::kInvalidArgument)
      << "more kept than candidates";
  EXPECT_EQ(b.Complement(keep.data(), 2, 3, 2, 7, out.data(), 4).code(), absl::StatusCode::kInvalidArgument)
      << "kept rows wider than their stride";
  EXPECT_EQ(b.Complement(keep.data(), 3, 3, 2, 7, out.data(), 3).code(), absl::StatusCode::kInvalidArgument)
      << "the left rows wider than their stride";
  EXPECT_EQ(b.Complement(nullptr, 3, 3, 1, 7, out.data(), 4).code(), absl::StatusCode::kInvalidArgument);
}

// DownloadAsync: the bytes are the host's once the fence is waited for,
// in queue order (a later fence covers the earlier copies); guarded, as a
// device's queued copy, they are not before (the engine's use is checked
// by backend_selection_test); a host buffer is plain host memory.
TEST(CpuBackendOps, DownloadAsyncHoldsTheBytesAfterItsFence) {
  const std::unique_ptr<Backend> guarded = GuardedCpuBackend();
  for (Backend* b : {&testing::SharedCpuBackend(), guarded.get()}) {
    const bool guard = b == guarded.get();
    std::vector<float> a(1000), c(77);
    std::iota(a.begin(), a.end(), 1.0f);
    std::iota(c.begin(), c.end(), -50.0f);
    auto src = b->NewBuffer((a.size() + c.size()) * sizeof(float));
    auto host = b->NewHostBuffer((a.size() + c.size()) * sizeof(float));
    ASSERT_TRUE(src.ok() && host.ok());
    ASSERT_NE((*host)->host(), nullptr);
    EXPECT_EQ((*host)->data(), (*host)->host());
    ASSERT_TRUE(b->Upload(a.data(), (*src)->data(), a.size() * sizeof(float)).ok());
    ASSERT_TRUE(b->Upload(c.data(), (*src)->f32() + a.size(), c.size() * sizeof(float)).ok());
    float* h = static_cast<float*>((*host)->host());
    auto first = b->DownloadAsync((*src)->data(), h, a.size() * sizeof(float));
    ASSERT_TRUE(first.ok());
    // The source written after the copy was queued: the copy has the bytes
    // as they were (the queue's order).
    std::vector<float> later(c.size(), 9.0f);
    auto second = b->DownloadAsync((*src)->f32() + a.size(), h + a.size(), c.size() * sizeof(float));
    ASSERT_TRUE(second.ok());
    ASSERT_TRUE(b->Upload(later.data(), (*src)->f32() + a.size(), later.size() * sizeof(float)).ok());
    if (guard) {
      EXPECT_GT(*second, *first);
      EXPECT_TRUE(std::isnan(h[0])) << "a queued copy's bytes before its fence";
    }
    ASSERT_TRUE(b->WaitDownload(*second).ok());
    EXPECT_EQ(std::vector<float>(h, h + a.size()), a) << (guard ? "guarded" : "cpu");
    EXPECT_EQ(std::vector<float>(h + a.size(), h + a.size() + c.size()), c) << (guard ? "guarded" : "cpu");
    ASSERT_TRUE(b->WaitDownload(*second).ok());  // (again: nothing left to wait for)
  }
}

// Gather: strided blocks and indexed rows, small (one thread) and large
// (the rows split over the team), every byte where the loop puts it and
// nothing else written; the base class's row-at-a-time copy the same.
TEST(CpuBackendOps, GatherCopiesTheRowsItIsGiven) {
  std::mt19937 rng(7);
  for (int64_t rows : {5, 3000}) {
    const int64_t width = 64, src_stride = 96;  // floats; the source's rows wider than a row
    std::vector<float> src(rows * src_stride);
    for (float& x : src) x = std::uniform_real_distribution<float>(-1, 1)(rng);
    std::vector<int32_t> idx(rows / 2 + 1);
    for (int32_t& i : idx) i = static_cast<int32_t>(rng() % rows);
    std::vector<int32_t> pos(rows);
    for (int64_t i = 0; i < rows; ++i) pos[i] = static_cast<int32_t>(1000 + i);
    auto run = [&](Backend& b) {
      std::vector<float> strided(rows * width, -9), picked(idx.size() * width, -9);
      std::vector<int32_t> pos_out(idx.size() + 2, -9);
      const size_t row = width * sizeof(float);
      const std::vector<Backend::RowGather> gathers = {
          {src.data() + 16, src_stride * sizeof(float), nullptr, strided.data(), row, rows, row},
          {src.data(), src_stride * sizeof(float), idx.data(), picked.data(), row, static_cast<int64_t>(idx.size()), row},
          {pos.data(), sizeof(int32_t), idx.data(), pos_out.data() + 1, sizeof(int32_t),
           static_cast<int64_t>(idx.size()), sizeof(int32_t)},
          {nullptr, 0, nullptr, nullptr, 0, 0, row},  // nothing to copy
      };
      EXPECT_TRUE(b.Gather(gathers).ok());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t e = 0; e < width; ++e) ASSERT_EQ(strided[r * width + e], src[r * src_stride + 16 + e]) << r;
      }
      for (size_t j = 0; j < idx.size(); ++j) {
        for (int64_t e = 0; e < width; ++e) ASSERT_EQ(picked[j * width + e], src[idx[j] * src_stride + e]) << j;
        EXPECT_EQ(pos_out[j + 1], 1000 + idx[j]);
      }
      EXPECT_EQ(pos_out.front(), -9);
      EXPECT_EQ(pos_out.back(), -9) << "nothing past the rows";
    };
    run(testing::SharedCpuBackend());
    run(*testing::CreateRefBackend(/*quantized_activations=*/false));
  }
  float x = 0;
  Backend& b = testing::SharedCpuBackend();
  EXPECT_EQ(b.Gather({{&x, 4, nullptr, &x, 4, -1, 4}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.Gather({{nullptr, 4, nullptr, &x, 4, 1, 4}}).code(), absl::StatusCode::kInvalidArgument);
}

// RopeHeads (the base class's loop over the heads): each head's run as
// Rope of that head alone, with shared and with per-head positions.
TEST(CpuBackendOps, RopeHeadsRotatesEachHeadsRun) {
  Backend& b = testing::SharedCpuBackend();
  const int64_t heads = 3, tokens = 21, hd = 16, head_stride = 30 * hd;
  for (int64_t pos_stride : {0, 30}) {
    std::mt19937 rng(static_cast<uint32_t>(pos_stride));
    std::normal_distribution<float> normal;
    std::vector<float> x(heads * head_stride), want;
    for (float& v : x) v = normal(rng);
    want = x;
    std::vector<int32_t> pos(heads * 30);
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(5 * i + 1);
    ASSERT_TRUE(b.RopeHeads(x.data(), heads, head_stride, tokens, hd, pos.data(), pos_stride,
                            RopeSpec{hd, 10000.0f, 1.0f, false})
                    .ok());
    for (int64_t h = 0; h < heads; ++h) {
      ASSERT_TRUE(b.Rope(want.data() + h * head_stride, tokens, 1, hd, hd, pos.data() + h * pos_stride,
                         RopeSpec{hd, 10000.0f, 1.0f, false})
                      .ok());
    }
    EXPECT_EQ(x, want) << pos_stride;
  }
}

// The prefill attention's implementation: by measurement (the fastest, or
// f32 unless another is more than 10% faster), by name, or refused.
TEST(CpuBackendOps, AttentionIsChosenByMeasurementOrByName) {
  const std::vector<cpu::AttentionImpl> here = cpu::AvailableAttentionImpls();
  ASSERT_FALSE(here.empty());
  EXPECT_EQ(here.front(), cpu::AttentionImpl::kF32);
  const std::vector<cpu::AttentionRate> rates = cpu::MeasureAttentionImpls();
  ASSERT_EQ(rates.size(), here.size());
  for (size_t i = 0; i < rates.size(); ++i) {
    EXPECT_EQ(rates[i].impl, here[i]);
    EXPECT_GT(rates[i].gops, 0.0) << cpu::AttentionImplName(rates[i].impl);
  }
  // At another model's heads (Gemma 3's: 4 of 256 on 1 KV head), the same
  // implementations.
  const std::vector<cpu::AttentionRate> wide = cpu::MeasureAttentionImpls(4, 1, 256);
  ASSERT_EQ(wide.size(), here.size());
  for (size_t i = 0; i < wide.size(); ++i) EXPECT_GT(wide[i].gops, 0.0) << cpu::AttentionImplName(wide[i].impl);
  BackendOptions o;
  o.attention_kernel = "measure";
  ASSERT_TRUE(ConfigureCpuKernels(o).ok());
  const cpu::AttentionImpl chosen = cpu::ActiveAttentionImpl();
  EXPECT_NE(std::find(here.begin(), here.end(), chosen), here.end()) << cpu::AttentionImplName(chosen);
  auto backend = CreateBackend(Device::kCpu, o);
  ASSERT_TRUE(backend.ok());
  // The rates are apart from the record (kernels()), which must not change
  // with timing noise.
  EXPECT_NE((*backend)->kernel_timings().find("prefill attention, GOP/s: f32"), std::string::npos)
      << (*backend)->kernel_timings();
  EXPECT_EQ((*backend)->kernels().find("GOP/s"), std::string::npos) << (*backend)->kernels();
  EXPECT_NE((*backend)->kernels().find(std::string("prefill attention ") + cpu::AttentionImplName(chosen)),
            std::string::npos)
      << (*backend)->kernels();

  o.attention_kernel = "f32";
  ASSERT_TRUE(ConfigureCpuKernels(o).ok());
  EXPECT_EQ(cpu::ActiveAttentionImpl(), cpu::AttentionImpl::kF32);
  EXPECT_FALSE(cpu::AttentionHasAvx512Bf16());
  EXPECT_FALSE(cpu::AttentionHasAmx());
  o.attention_kernel = "avx1024-fp4";
  EXPECT_EQ(ConfigureCpuKernels(o).code(), absl::StatusCode::kInvalidArgument);
  for (const char* name : {"avx512-bf16", "amx-bf16"}) {
    const cpu::AttentionImpl impl = *cpu::AttentionImplFromName(name);
    o.attention_kernel = name;
    const absl::Status s = ConfigureCpuKernels(o);
    if (std::find(here.begin(), here.end(), impl) != here.end()) {
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_EQ(cpu::ActiveAttentionImpl(), impl);
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
      EXPECT_NE(s.message().find("it runs: f32"), absl::string_view::npos) << s;
    }
  }
  cpu::SetAttentionImpl(cpu::AttentionImpl::kAuto);  // as the other tests assume
}

// The chooser: the reference unless another is more than 10% faster.
TEST(CpuBackendOps, TheFastestIsTakenUnlessWithinTenPercentOfTheReference) {
  EXPECT_EQ(FastestKernel({}), "");
  EXPECT_EQ(FastestKernel({{"f32", 100}}), "f32");
  EXPECT_EQ(FastestKernel({{"f32", 100}, {"bf16", 109}}), "f32");
  EXPECT_EQ(FastestKernel({{"f32", 100}, {"bf16", 111}}), "bf16");
  EXPECT_EQ(FastestKernel({{"f32", 100}, {"bf16", 150}, {"amx", 200}}), "amx");
  EXPECT_EQ(FastestKernel({{"f32", 100}, {"bf16", 150}, {"amx", 160}}), "bf16");
  EXPECT_EQ(FastestKernel({{"ref", 300}, {"a", 100}, {"b", 200}}), "ref");
}

// The products' paths: the flags' choice first, each path once, each timed.
TEST(CpuBackendOps, ProductPathsAreNamedAndTimed) {
  const std::vector<cpu::MatMulImpl> impls = cpu::AvailableProductImpls();
  ASSERT_FALSE(impls.empty());
  EXPECT_EQ(impls.front(), cpu::MatMulImpl::kAuto);
  std::vector<std::string> names;
  for (cpu::MatMulImpl m : impls) {
    const std::string name = cpu::ProductPathName(m);
    EXPECT_EQ(std::count(names.begin(), names.end(), name), 0) << name;
    if (impls.size() > 1) {
      EXPECT_NE(name, "portable");
    }
    names.push_back(name);
  }
  if (cpu::ActiveCpuLevel() != cpu::CpuLevel::kGeneric) {
    EXPECT_NE(names.front(), "portable");
  }
  cpu::SetMatMulImpl(cpu::MatMulImpl::kAvx2);
  for (GgmlType type : {GgmlType::kQ4_1, GgmlType::kQ4_K, GgmlType::kF16}) {
    const std::vector<cpu::ProductRate> rates = cpu::MeasureProductImpls(type, 32, 256, 48);
    ASSERT_EQ(rates.size(), impls.size());
    for (size_t i = 0; i < rates.size(); ++i) {
      EXPECT_EQ(rates[i].impl, impls[i]);
      EXPECT_GT(rates[i].gops, 0.0) << names[i];
    }
  }
  EXPECT_EQ(cpu::ActiveMatMulImpl(), cpu::MatMulImpl::kAvx2);  // left as it was
  EXPECT_TRUE(cpu::MeasureProductImpls(GgmlType::kQ4_1, 32, 250, 48).empty());  // not whole blocks
  cpu::SetMatMulImpl(cpu::MatMulImpl::kAuto);
}

// Rates given to the backend (a file of them) decide where they name
// implementations this CPU runs; a name is honoured; others are refused.
TEST(CpuBackendOps, PlantedRatesDecideAndANamedPathIsHonoured) {
  std::vector<std::string> here;
  for (cpu::MatMulImpl m : cpu::AvailableProductImpls()) here.push_back(cpu::ProductPathName(m));
  BackendOptions o;
  o.products_kernel = "measure";
  // The last path planted far faster; a path this CPU lacks, faster still.
  o.kernel_rates = {{"products", {{here.front(), 1.0}, {here.back(), 100.0}, {"no-such-path", 1000.0}}}};
  ASSERT_TRUE(ConfigureCpuKernels(o).ok());
  EXPECT_EQ(cpu::ProductPathName(cpu::ActiveMatMulImpl()), here.back());
  {
    auto backend = CreateBackend(Device::kCpu, o);
    ASSERT_TRUE(backend.ok());
    EXPECT_NE((*backend)->kernels().find("products " + here.back()), std::string::npos) << (*backend)->kernels();
    EXPECT_NE((*backend)->kernel_timings().find("products, GOP/s: " + here.front() + " 1"), std::string::npos)
        << (*backend)->kernel_timings();
    EXPECT_EQ((*backend)->kernel_timings().find("no-such-path"), std::string::npos);
  }
  // The reference planted within 10% of the fastest: the reference.
  o.kernel_rates = {{"products", {{here.front(), 95.0}, {here.back(), 100.0}}}};
  ASSERT_TRUE(ConfigureCpuKernels(o).ok());
  EXPECT_EQ(cpu::ActiveMatMulImpl(), cpu::MatMulImpl::kAuto);
  // No rate of a path here: timed now.
  o.kernel_rates = {{"products", {{"no-such-path", 1000.0}}}};
  ASSERT_TRUE(ConfigureCpuKernels(o).ok());
  EXPECT_NE(std::find(here.begin(), here.end(), cpu::ProductPathName(cpu::ActiveMatMulImpl())), here.end());
  // By name.
  o.kernel_rates.clear();
  for (const std::string& name : here) {
    o.products_kernel = name;
    ASSERT_TRUE(ConfigureCpuKernels(o).ok()) << name;
    EXPECT_EQ(cpu::ProductPathName(cpu::ActiveMatMulImpl()), name);
  }
  for (const char* name : {"amx-bf16", "amx-int8", "avx512-vnni", "avx-vnni", "avx2"}) {
    if (std::find(here.begin(), here.end(), name) != here.end()) continue;
    o.products_kernel = name;
    const absl::Status s = ConfigureCpuKernels(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(s.message().find("it runs: " + here.front()), absl::string_view::npos) << s;
  }
  o.products_kernel = "sse9";
  EXPECT_EQ(ConfigureCpuKernels(o).code(), absl::StatusCode::kInvalidArgument);
  // The attention likewise.
  std::vector<std::string> attention;
  for (cpu::AttentionImpl a : cpu::AvailableAttentionImpls()) attention.push_back(cpu::AttentionImplName(a));
  o = BackendOptions();
  o.attention_kernel = "measure";
  o.kernel_rates = {{"prefill attention", {{"f32", 1.0}, {attention.back(), 100.0}}}};
  ASSERT_TRUE(ConfigureCpuKernels(o).ok());
  EXPECT_EQ(cpu::AttentionImplName(cpu::ActiveAttentionImpl()), attention.back());
  o.kernel_rates = {{"prefill attention", {{"f32", 100.0}, {attention.back(), 105.0}}}};
  ASSERT_TRUE(ConfigureCpuKernels(o).ok());
  EXPECT_EQ(cpu::ActiveAttentionImpl(), cpu::AttentionImpl::kF32);
  cpu::SetMatMulImpl(cpu::MatMulImpl::kAuto);  // as the other tests assume
  cpu::SetAttentionImpl(cpu::AttentionImpl::kAuto);
}

// Timing both ops: each list starts with its reference.
TEST(CpuBackendOps, MeasureCpuKernelsTimesBothOps) {
  BackendOptions o;
  o.product_shape = {GgmlType::kQ4_0, 256, 64};
  const absl::StatusOr<std::vector<KernelRates>> rates = MeasureCpuKernels(o);
  ASSERT_TRUE(rates.ok()) << rates.status();
  ASSERT_EQ(rates->size(), 2u);
  EXPECT_EQ((*rates)[0].op, "prefill attention");
  ASSERT_FALSE((*rates)[0].rates.empty());
  EXPECT_EQ((*rates)[0].rates[0].name, "f32");
  EXPECT_EQ((*rates)[1].op, "products");
  ASSERT_FALSE((*rates)[1].rates.empty());
  EXPECT_EQ((*rates)[1].rates[0].name, cpu::ProductPathName(cpu::MatMulImpl::kAuto));
  for (const KernelRates& op : *rates) {
    for (const KernelRate& r : op.rates) EXPECT_GT(r.gops, 0.0) << op.op << " " << r.name;
  }
  EXPECT_NE(CpuIdentity().find(cpu::CpuLevelName(cpu::MaxCpuLevel())), std::string::npos) << CpuIdentity();
}

// The threads of this process now.
int ProcessThreads() { return static_cast<int>(testing::ListDir("/proc/self/task").size()); }

// A backend's kernels run on threads of its own, as many as it was made
// with (whatever OpenMP's count), which end with it; the buffers its
// kernels keep are its scratch, counted and freed, and a product after the
// release equals the one before.
TEST(CpuBackendOps, ThreadsAndScratchAreTheBackends) {
  const int before = ProcessThreads();
  {
    BackendOptions o;
    o.num_threads = 3;
    auto b = CreateBackend(Device::kCpu, o);
    ASSERT_TRUE(b.ok()) << b.status();
    Backend& backend = **b;
    EXPECT_EQ(backend.num_threads(), 3);
    constexpr int64_t kM = 64, kK = 512, kN = 512;
    const size_t row_bytes = static_cast<size_t>(RowBytes(GgmlType::kQ4_0, kK));
    const std::vector<uint8_t> w = testing::QuantizedWeights(GgmlType::kQ4_0, kN, kK, row_bytes, 7, 0.1f);
    const std::vector<float> x = testing::HiddenStates(kM, kK, kK, 3);
    const WeightView view = testing::ViewOf(w, GgmlType::kQ4_0, kN, kK, row_bytes);
    std::vector<float> first(kM * kN), again(kM * kN);
    ASSERT_TRUE(backend.MatMul(x.data(), kM, kK, view, first.data(), kN).ok());
    EXPECT_GT(backend.KernelScratchBytes(), 0u);
    EXPECT_EQ(ProcessThreads(), before + 2) << "a backend of 3 threads: 2 workers beside the caller";
    backend.ReleaseKernelScratch();
    EXPECT_EQ(backend.KernelScratchBytes(), 0u);
    ASSERT_TRUE(backend.MatMul(x.data(), kM, kK, view, again.data(), kN).ok());
    EXPECT_EQ(first, again);
    EXPECT_GT(backend.KernelScratchBytes(), 0u);
  }
  EXPECT_EQ(ProcessThreads(), before) << "the backend's threads outlived it";
}

// BackendOptions::guard_buffers: a buffer's bytes are out of the host's
// reach except inside the backend's ops (the copies in and out, the
// element-wise ops), which see and keep what was written; unguarded, a
// buffer is plain host memory.
TEST(CpuBackendOps, GuardedBuffersOpenOnlyInsideOps) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (const bool guard : {false, true}) {
    BackendOptions o;
    o.guard_buffers = guard;
    auto b = CreateBackend(Device::kCpu, o);
    ASSERT_TRUE(b.ok()) << b.status();
    Backend& backend = **b;
    constexpr int64_t kRows = 10, kDim = 100, kN = kRows * kDim;
    auto made = backend.NewBuffer(kN * sizeof(float));
    ASSERT_TRUE(made.ok()) << made.status();
    BackendBuffer& buffer = **made;
    EXPECT_EQ(buffer.bytes(), kN * sizeof(float));
    std::vector<float> host(kN), bias(kDim), back(kN);
    for (int64_t i = 0; i < kN; ++i) host[i] = static_cast<float>(i % 17) - 8.0f;
    for (int64_t i = 0; i < kDim; ++i) bias[i] = 0.25f * static_cast<float>(i % 5);
    ASSERT_TRUE(backend.Upload(host.data(), buffer.data(), kN * sizeof(float)).ok());
    ASSERT_TRUE(backend.Scale(buffer.f32(), kN, 2.0f).ok());
    ASSERT_TRUE(backend.Add(buffer.f32(), buffer.f32(), kN).ok());
    ASSERT_TRUE(backend.AddRows(buffer.f32(), kDim, bias.data(), kRows, kDim).ok());
    ASSERT_TRUE(backend.Fill(buffer.f32() + 5, 7, -3.5f).ok());
    ASSERT_TRUE(backend.Download(buffer.data(), back.data(), kN * sizeof(float)).ok());
    for (int64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(back[i], i >= 5 && i < 12 ? -3.5f : 4.0f * host[i] + bias[i % kDim]) << i;
    }
    const float* bytes = buffer.f32();
    if (guard) {
      EXPECT_DEATH({ std::printf("%f\n", static_cast<double>(*(volatile const float*)bytes)); }, "")
          << "a guarded buffer read by the host";
    } else {
      EXPECT_EQ(bytes[1], 4.0f * host[1] + bias[1]);
    }
  }
}

// Attention with its queries' log-denominators (what context reconstruction
// weighs the chunk's keys by): the output is Attention's, bit for bit; the
// denominators QueryLogSumExp's, or with a window those of the window's keys
// (ref::Attention's), within the bf16 scores' roundings where the process's
// kernel takes them (the kernel tests hold each path to its own twin); a
// row or head out of place, or the window ignored, moves them by tenths or
// more.
TEST(CpuBackendOps, AttentionWithLseKeepsTheQueriesDenominators) {
  Backend& b = testing::SharedCpuBackend();
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (const int64_t head_dim : {int64_t{24}, int64_t{64}}) {
    const int64_t num_q = 70, num_keys = 300, heads = 9, kv_heads = 3;
    const int64_t q_stride = heads * head_dim + 5, key_stride = head_dim + 3, head_stride = num_keys * key_stride;
    std::vector<float> q(num_q * q_stride), k(kv_heads * head_stride), v(k.size());
    for (std::vector<float>* x : {&q, &k, &v}) {
      for (float& f : *x) f = normal(rng);
    }
    Queries queries{.q = q.data(),
                    .stride = q_stride,
                    .count = num_q,
                    .num_heads = heads,
                    .num_kv_heads = kv_heads,
                    .head_dim = head_dim,
                    .scale = 1.0f / std::sqrt(static_cast<float>(head_dim))};
    KvView kv;
    kv.k = k.data();
    kv.v = v.data();
    kv.head_stride = head_stride;
    kv.key_stride = key_stride;
    kv.num_keys = num_keys;
    for (const int64_t window : {int64_t{0}, int64_t{40}}) {
      SCOPED_TRACE(::testing::Message() << "head_dim " << head_dim << ", window " << window);
      queries.window = window;
      std::vector<float> out(num_q * q_stride, 3.0f), with(out), lse(heads * num_q, -9.0f), want(lse.size());
      ASSERT_TRUE(b.Attention(queries, kv, out.data(), q_stride).ok());
      ASSERT_TRUE(b.AttentionWithLse(queries, kv, with.data(), q_stride, lse.data()).ok());
      EXPECT_EQ(with, out);
      if (window == 0) {
        ASSERT_TRUE(b.QueryLogSumExp(queries, kv, want.data()).ok());
      } else {
        ref::Attention(q.data(), q_stride, k.data(), v.data(), head_stride, key_stride, out.data(), q_stride, num_q,
                       num_keys, heads, kv_heads, head_dim, queries.scale, window, want.data());
      }
      for (size_t i = 0; i < lse.size(); ++i)
        ASSERT_NEAR(lse[i], want[i], 0.05) << "head " << i / num_q << " query " << i % num_q;
    }
  }
}

TEST(CpuBackendOps, BadArgumentsAreRefused) {
  Backend& b = testing::SharedCpuBackend();
  std::vector<float> v(8, 1.0f), out(8);
  std::vector<int32_t> pos(9);
  EXPECT_EQ(b.Pool1d(v.data(), out.data(), 8, 4, Backend::PoolOp::kAvg).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.TopK(v.data(), 8, 9, pos.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.TopK(v.data(), 8, -1, pos.data()).code(), absl::StatusCode::kInvalidArgument);
  const Backend::HeadSelection s{.votes = v.data(), .votes_stride = 8, .num_heads = 1, .num_candidates = 8,
                                 .rest_begin = 1, .window_begin = 6, .pick = 3, .pool_kernel = 3, .keep = pos.data(),
                                 .keep_stride = 7};
  ASSERT_TRUE(b.SelectHeads(s).ok());
  for (auto bad : std::vector<std::function<void(Backend::HeadSelection&)>>{
           [](Backend::HeadSelection& x) { x.pick = 6; },          // more than the rest
           [](Backend::HeadSelection& x) { x.window_begin = 9; },  // past the candidates
           [](Backend::HeadSelection& x) { x.rest_begin = 7; },    // after the window
           [](Backend::HeadSelection& x) { x.pool_kernel = 4; },
           [](Backend::HeadSelection& x) { x.keep_stride = 6; },  // no room for the status word
           [](Backend::HeadSelection& x) { x.votes_stride = 5; },
           [](Backend::HeadSelection& x) { x.keep = nullptr; },
           [](Backend::HeadSelection& x) { x.span = 0; },
           [](Backend::HeadSelection& x) { x.then_pick = 1; },  // no second votes
           [&](Backend::HeadSelection& x) {                     // more than the rest, both picks
             x.then_votes = v.data();
             x.then_votes_stride = 8;
             x.then_pick = 3;
             x.keep_stride = 10;
           },
           [&](Backend::HeadSelection& x) {
             x.then_votes = v.data();
             x.then_votes_stride = 5;
             x.then_pick = 1;
             x.keep_stride = 9;
           },
           [](Backend::HeadSelection& x) { x.then_pick = -1; },
       }) {
    Backend::HeadSelection x = s;
    bad(x);
    EXPECT_EQ(b.SelectHeads(x).code(), absl::StatusCode::kInvalidArgument);
  }
  // Gates: 2 heads of 3 keys, head_dim 4, 2 hidden units.
  const int64_t pf = Backend::GateParamFloats(4, 2);
  std::vector<float> params(2 * pf, 0.5f), keys(2 * 3 * 4, 1.0f), y(2 * 3);
  const Backend::GateScoring g{.num_heads = 2,
                               .head_dim = 4,
                               .hidden = 2,
                               .n = 3,
                               .params = params.data(),
                               .params_stride = pf,
                               .keys = keys.data(),
                               .keys_head_stride = 12,
                               .key_stride = 4,
                               .y = y.data(),
                               .y_stride = 3};
  ASSERT_TRUE(b.GateScores(g).ok());
  for (auto bad : std::vector<std::function<void(Backend::GateScoring&)>>{
           [](Backend::GateScoring& x) { x.key_stride = 3; },         // narrower than a key
           [](Backend::GateScoring& x) { x.keys_head_stride = 11; },  // heads overlap
           [](Backend::GateScoring& x) { x.params_stride = 10; },     // heads' parameters overlap
           [](Backend::GateScoring& x) { x.y_stride = 2; },
           [](Backend::GateScoring& x) { x.hidden = 0; },
           [](Backend::GateScoring& x) { x.head_dim = 0; },
           [](Backend::GateScoring& x) { x.n = -1; },
           [](Backend::GateScoring& x) { x.keys = nullptr; },
           [](Backend::GateScoring& x) { x.params = nullptr; },
           [](Backend::GateScoring& x) { x.y = nullptr; },
       }) {
    Backend::GateScoring x = g;
    bad(x);
    EXPECT_EQ(b.GateScores(x).code(), absl::StatusCode::kInvalidArgument);
  }
}

// The kernels decide once: before, a backend's choices are taken; after,
// the same choices (or none) are, and others are refused, naming what runs.
TEST(CpuBackendOps, KernelChoicesHoldForTheProcess) {
  BackendOptions bogus;
  bogus.kernel_level = "avx1024";
  EXPECT_EQ(ConfigureCpuKernels(bogus).code(), absl::StatusCode::kInvalidArgument);
  const cpu::CpuLevel active = cpu::ActiveCpuLevel();  // decided from here on
  BackendOptions same;
  same.kernel_level = cpu::CpuLevelName(active);
  EXPECT_TRUE(ConfigureCpuKernels(same).ok());
  EXPECT_TRUE(ConfigureCpuKernels(BackendOptions{}).ok());
  if (active != cpu::CpuLevel::kGeneric) {
    BackendOptions lower;
    lower.kernel_level = "generic";
    const absl::Status s = ConfigureCpuKernels(lower);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(std::string(s.message()).find("cannot change now"), std::string::npos) << s;
  }
  BackendOptions other_waits;
  other_waits.thread_waits = cpu::ActiveKernelConfig().passive_waits ? BackendOptions::Waits::kSpin
                                                                     : BackendOptions::Waits::kPassive;
  EXPECT_EQ(ConfigureCpuKernels(other_waits).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace snapfill
