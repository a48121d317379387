// The CPU backend's decode copy (BackendOptions::pack_decode_weights): a
// one-token product over the copy gives ggml's arithmetic like the product
// over the GGUF rows; the copy's size is reported; and a matrix whose bytes
// change at the same address (another model mapped where one was) is not
// served from the stale copy.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/matmul.h"
#include "kernels/ref/quant_ref.h"
#include "snapfill/backend.h"
#include "tests/testing/matmul_data.h"

namespace snapfill {
namespace {

std::unique_ptr<Backend> MakeBackend(bool pack, bool exact = false) {
  BackendOptions o;
  o.pack_decode_weights = pack;
  o.exact_matmul = exact;
  auto b = CreateBackend(Device::kCpu, o);
  EXPECT_TRUE(b.ok());
  return std::move(*b);
}

WeightView View(const std::vector<uint8_t>& w, GgmlType type, int64_t n, int64_t k) {
  WeightView v;
  v.data = w.data();
  v.type = type;
  v.rows = n;
  v.cols = k;
  v.row_bytes = RowBytes(type, k);
  return v;
}

// Backend::PrepareWeights for one matrix: whether it is read through a copy
// now; `copied` sees the ranges of its bytes the copy took.
bool Prepare(Backend& b, const WeightView& v, WeightUse use,
             const std::function<void(const void*, size_t)>& copied = nullptr) {
  const std::vector<bool> made = b.PrepareWeights({&v}, use, [&](size_t i, const void* data, size_t bytes) {
    EXPECT_EQ(i, 0u);
    if (copied) copied(data, bytes);
  });
  EXPECT_EQ(made.size(), 1u);
  return made.at(0);
}

// |y - ggml| within the f32 summation bound of matmul_test.cc, every row.
void ExpectGgml(const std::vector<float>& x, const std::vector<uint8_t>& w, GgmlType type, int64_t n,
                int64_t k, const std::vector<float>& y) {
  std::vector<float> ref(n);
  std::vector<double> abs_terms(n);
  ASSERT_TRUE(ref::MatMulQuantizedActivations(x.data(), 1, k, k, w.data(), type, n, RowBytes(type, k),
                                              ref.data(), n, abs_terms.data()));
  const double sum_n = static_cast<double>(k) / 16.0 + 64.0;
  for (int64_t j = 0; j < n; ++j) {
    ASSERT_LE(std::fabs(static_cast<double>(y[j]) - ref[j]), sum_n * 0x1p-24 * abs_terms[j])
        << "row " << j << ": " << y[j] << " vs " << ref[j];
  }
}

TEST(CpuBackendDecodeCopy, OneTokenProductsMatchGgmlWithAndWithoutTheCopy) {
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    const int64_t n = 203, k = 576;
    const auto w = testing::QuantizedWeights(t, n, k, RowBytes(t, k), 21, 0.02f);
    const auto x = testing::HiddenStates(1, k, k, 4);
    for (bool pack : {true, false}) {
      auto b = MakeBackend(pack);
      std::vector<float> y(n);
      for (int rep = 0; rep < 3; ++rep) {  // the rows, then the copy made at the second call, then kept
        ASSERT_TRUE(b->MatMul(x.data(), 1, k, View(w, t, n, k), y.data(), n).ok());
        ExpectGgml(x, w, t, n, k, y);
      }
    }
  }
}

// MatMulShared with one token (Q, K and V in decode): the products over the
// copies in one region (all copies there), each over its copy or its rows
// (a weight of another type, one with no copy, or no copies), all give ggml's arithmetic,
// on every call from the first (no copies yet) on.
TEST(CpuBackendDecodeCopy, OneTokenSharedProductsMatchGgml) {
  const int64_t k = 768;  // Q4_K (no copy) needs whole 256-blocks
  const auto x = testing::HiddenStates(1, k, k, 9);
  struct W {
    GgmlType type;
    int64_t n;
    std::vector<uint8_t> data;
  };
  for (GgmlType second : {GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kQ4_K}) {
    std::vector<W> ws = {{GgmlType::kQ4_1, 576, {}}, {second, 192, {}}, {GgmlType::kQ4_1, 200, {}}};
    for (size_t c = 0; c < ws.size(); ++c) {
      ws[c].data = testing::QuantizedWeights(ws[c].type, ws[c].n, k, RowBytes(ws[c].type, k), 50 + c, 0.02f);
    }
    for (bool pack : {true, false}) {
      auto b = MakeBackend(pack);
      std::vector<WeightView> views;
      for (const W& w : ws) views.push_back(View(w.data, w.type, w.n, k));
      std::vector<std::vector<float>> y;
      std::vector<Backend::SharedOut> outs;
      for (const W& w : ws) y.emplace_back(w.n);
      for (size_t c = 0; c < ws.size(); ++c) outs.push_back({&views[c], y[c].data(), ws[c].n});
      for (int rep = 0; rep < 3; ++rep) {
        ASSERT_TRUE(b->MatMulShared(x.data(), 1, k, outs.data(), static_cast<int>(outs.size())).ok());
        for (size_t c = 0; c < ws.size(); ++c) ExpectGgml(x, ws[c].data, ws[c].type, ws[c].n, k, y[c]);
      }
    }
  }
}

TEST(CpuBackendDecodeCopy, PrepareCopiesInSlicesAndReportsEachOnce) {
  const GgmlType t = GgmlType::kQ8_0;
  const int64_t n = 2500, k = 64;  // three slices of up to 1024 rows
  const auto w = testing::QuantizedWeights(t, n, k, RowBytes(t, k), 5, 0.02f);
  const auto x = testing::HiddenStates(1, k, k, 6);
  auto b = MakeBackend(true);
  std::vector<std::pair<const uint8_t*, size_t>> ranges;
  const bool made = Prepare(*b, View(w, t, n, k), WeightUse::kDecode, [&](const void* data, size_t bytes) {
    ranges.emplace_back(static_cast<const uint8_t*>(data), bytes);
  });
  ASSERT_EQ(made, cpu::DecodePackedBytes(t, n, k) > 0);
  if (!made) return;
  ASSERT_EQ(ranges.size(), 3u);
  const uint8_t* next = w.data();
  for (const auto& [data, bytes] : ranges) {  // in order, adjacent, covering w
    EXPECT_EQ(data, next);
    next = data + bytes;
  }
  EXPECT_EQ(next, w.data() + w.size());
  std::vector<float> y(n);
  ASSERT_TRUE(b->MatMul(x.data(), 1, k, View(w, t, n, k), y.data(), n).ok());
  ExpectGgml(x, w, t, n, k, y);  // the first one-token product already reads the copy
  EXPECT_FALSE(Prepare(*MakeBackend(false), View(w, t, n, k), WeightUse::kDecode));
}

TEST(CpuBackendDecodeCopy, ReportsTheCopyItKeeps) {
  const std::vector<uint8_t> w(RowBytes(GgmlType::kQ4_1, 576) * 40);
  const WeightView v = View(w, GgmlType::kQ4_1, 40, 576);
  const uint64_t packed = cpu::DecodePackedBytes(GgmlType::kQ4_1, 40, 576);
  const WeightCopy decode = MakeBackend(true)->CopyOf(v, WeightUse::kDecode);
  EXPECT_EQ(decode.copied, packed > 0);
  EXPECT_EQ(decode.bytes, packed);
  EXPECT_FALSE(decode.on_device);
  if (cpu::MatMulHasDecodeLayout()) {
    EXPECT_TRUE(decode.copied);
    EXPECT_GT(decode.bytes, 0u);
  }
  // Batches read the copy only where their kernels read that layout.
  const WeightCopy batch = MakeBackend(true)->CopyOf(v, WeightUse::kBatch);
  EXPECT_EQ(batch.copied, packed > 0 && cpu::MatMulReadsDecodeLayout(GgmlType::kQ4_1));
  EXPECT_EQ(batch.bytes, batch.copied ? packed : 0u);
  for (WeightUse use : {WeightUse::kDecode, WeightUse::kBatch}) {
    EXPECT_FALSE(MakeBackend(false)->CopyOf(v, use).copied);
    EXPECT_FALSE(MakeBackend(true, /*exact=*/true)->CopyOf(v, use).copied);
  }
  const std::vector<uint8_t> k_quant(RowBytes(GgmlType::kQ4_K, 256) * 16);
  EXPECT_FALSE(MakeBackend(true)->CopyOf(View(k_quant, GgmlType::kQ4_K, 16, 256), WeightUse::kDecode).copied);
}

// One call prepares many matrices: each gets its own answer, and the
// ranges it reports name their matrix by index.
TEST(CpuBackendDecodeCopy, PrepareWeightsAnswersForEachMatrix) {
  const int64_t n = 40, k = 576;
  const auto q41 = testing::QuantizedWeights(GgmlType::kQ4_1, n, k, RowBytes(GgmlType::kQ4_1, k), 3, 0.02f);
  const auto q4k = testing::QuantizedWeights(GgmlType::kQ4_K, n, 256, RowBytes(GgmlType::kQ4_K, 256), 4, 0.02f);
  const auto q80 = testing::QuantizedWeights(GgmlType::kQ8_0, n, k, RowBytes(GgmlType::kQ8_0, k), 5, 0.02f);
  const WeightView views[3] = {View(q41, GgmlType::kQ4_1, n, k), View(q4k, GgmlType::kQ4_K, n, 256),
                               View(q80, GgmlType::kQ8_0, n, k)};
  const std::vector<const WeightView*> weights = {&views[0], &views[1], &views[2]};
  for (WeightUse use : {WeightUse::kDecode, WeightUse::kBatch}) {
    auto b = MakeBackend(true);
    std::vector<size_t> reported(3, 0);
    const std::vector<bool> made = b->PrepareWeights(weights, use, [&](size_t i, const void* data, size_t bytes) {
      ASSERT_LT(i, 3u);
      const auto* p = static_cast<const uint8_t*>(data);
      const auto* base = static_cast<const uint8_t*>(views[i].data);
      EXPECT_GE(p, base);
      EXPECT_LE(p + bytes, base + views[i].rows * views[i].row_bytes);
      reported[i] += bytes;
    });
    ASSERT_EQ(made.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(made[i], b->CopyOf(views[i], use).copied) << i;
      EXPECT_EQ(reported[i], made[i] ? views[i].rows * views[i].row_bytes : 0u) << i;
    }
    EXPECT_FALSE(made[1]) << "Q4_K has no decode layout";
    const std::vector<bool> none = MakeBackend(false)->PrepareWeights(weights, use, nullptr);
    EXPECT_EQ(none, std::vector<bool>(3, false));
  }
}

TEST(CpuBackendDecodeCopy, NewBytesAtTheSameAddressArePackedAgain) {
  const GgmlType t = GgmlType::kQ4_1;
  const int64_t n = 64, k = 96;
  auto b = MakeBackend(true);
  std::vector<uint8_t> w = testing::QuantizedWeights(t, n, k, RowBytes(t, k), 1, 0.02f);
  const auto x = testing::HiddenStates(1, k, k, 2);
  std::vector<float> y(n);
  for (int rep = 0; rep < 2; ++rep) {  // packed at the second
    ASSERT_TRUE(b->MatMul(x.data(), 1, k, View(w, t, n, k), y.data(), n).ok());
    ExpectGgml(x, w, t, n, k, y);
  }
  // Other weights written into the same buffer: the same view, other bytes.
  // A new model's decode starts after a batch (its prefill) or with
  // PrepareWeights; either checks the copy again.
  const auto other = testing::QuantizedWeights(t, n, k, RowBytes(t, k), 99, 0.05f);
  const uint8_t* before = w.data();
  std::copy(other.begin(), other.end(), w.begin());
  ASSERT_EQ(before, w.data());
  const auto x2 = testing::HiddenStates(2, k, k, 3);
  std::vector<float> y2(2 * n);
  ASSERT_TRUE(b->MatMul(x2.data(), 2, k, View(w, t, n, k), y2.data(), n).ok());
  for (int rep = 0; rep < 3; ++rep) {
    ASSERT_TRUE(b->MatMul(x.data(), 1, k, View(w, t, n, k), y.data(), n).ok());
    ExpectGgml(x, w, t, n, k, y);
  }
  // And through PrepareWeights, with no batch in between.
  const auto third = testing::QuantizedWeights(t, n, k, RowBytes(t, k), 7, 0.03f);
  std::copy(third.begin(), third.end(), w.begin());
  // (Where the CPU has no decode layout, e.g. AVX2 only, there is no copy to
  // prepare and nothing is reported; the products must still be right.)
  const bool copies = b->CopyOf(View(w, t, n, k), WeightUse::kDecode).copied;
  size_t reported = 0;
  ASSERT_EQ(Prepare(*b, View(w, t, n, k), WeightUse::kDecode,
                    [&](const void* data, size_t bytes) {
                      EXPECT_GE(static_cast<const uint8_t*>(data), w.data());
                      EXPECT_LE(static_cast<const uint8_t*>(data) + bytes, w.data() + w.size());
                      reported += bytes;
                    }),
            copies);
  EXPECT_EQ(reported, copies ? w.size() : 0u) << "every copied byte is reported once";
  ASSERT_TRUE(b->MatMul(x.data(), 1, k, View(w, t, n, k), y.data(), n).ok());
  ExpectGgml(x, w, t, n, k, y);
}

// Batch products (m > 3) over the copies PrepareWeights made for them
// (CopyOf(w, kBatch): AVX-512 with Q4_0 / Q4_1): the same results as over
// the rows, bit for bit, alone and shared; the copy stands for the bytes
// until PrepareWeights is asked again, which then packs the new bytes.
TEST(CpuBackendDecodeCopy, BatchProductsReadTheCopyPrepareWeightsMade) {
  const GgmlType t = GgmlType::kQ4_1;
  const int64_t n = 80, k = 576, m = 200;
  const size_t row_bytes = RowBytes(t, k);
  std::vector<uint8_t> w = testing::QuantizedWeights(t, n, k, row_bytes, 31, 0.02f);
  const auto w2 = testing::QuantizedWeights(t, n, k, row_bytes, 32, 0.02f);
  const auto x = testing::HiddenStates(m, k, k, 33);
  auto rows_product = [&](const std::vector<uint8_t>& bytes, const std::vector<uint8_t>& other) {
    std::vector<float> y(2 * m * n);
    cpu::MatMul(x.data(), m, k, k, bytes.data(), t, n, row_bytes, y.data(), n);
    cpu::MatMul(x.data(), m, k, k, other.data(), t, n, row_bytes, y.data() + m * n, n);
    return y;
  };
  auto b = MakeBackend(true);
  const bool reads = b->CopyOf(View(w, t, n, k), WeightUse::kBatch).copied;
  EXPECT_EQ(reads, cpu::MatMulReadsDecodeLayout(t) && cpu::DecodePackedBytes(t, n, k) > 0);
  EXPECT_FALSE(b->CopyOf(View(w, GgmlType::kQ8_0, n, k), WeightUse::kBatch).copied);
  EXPECT_FALSE(MakeBackend(false)->CopyOf(View(w, t, n, k), WeightUse::kBatch).copied);
  // Y = X·Wᵀ alone and X·W2ᵀ shared with it, through the backend.
  auto backend_product = [&] {
    std::vector<float> y(2 * m * n);
    const WeightView v = View(w, t, n, k), v2 = View(w2, t, n, k);
    EXPECT_TRUE(b->MatMul(x.data(), m, k, v, y.data(), n).ok());
    std::vector<float> shared(2 * m * n);
    const Backend::SharedOut outs[2] = {{&v, shared.data(), n}, {&v2, shared.data() + m * n, n}};
    EXPECT_TRUE(b->MatMulShared(x.data(), m, k, outs, 2).ok());
    EXPECT_EQ(std::memcmp(shared.data(), y.data(), m * n * sizeof(float)), 0) << "alone and shared differ";
    std::copy(shared.begin() + m * n, shared.end(), y.begin() + m * n);
    return y;
  };
  const auto expected = rows_product(w, w2);
  ASSERT_EQ(backend_product(), expected);  // no copies yet: the rows
  const std::vector<uint8_t>* both[] = {&w, &w2};
  for (const std::vector<uint8_t>* bytes : both) {
    ASSERT_EQ(Prepare(*b, View(*bytes, t, n, k), WeightUse::kBatch), reads);
  }
  ASSERT_EQ(backend_product(), expected);  // the copies where they are read
  // Other bytes at w's address, not prepared again: the copy still stands
  // for them where batches read it.
  const std::vector<uint8_t> old = w;
  const auto w3 = testing::QuantizedWeights(t, n, k, row_bytes, 34, 0.05f);
  std::copy(w3.begin(), w3.end(), w.begin());
  ASSERT_EQ(backend_product(), reads ? rows_product(old, w2) : rows_product(w, w2));
  ASSERT_EQ(Prepare(*b, View(w, t, n, k), WeightUse::kBatch), reads);
  ASSERT_EQ(backend_product(), rows_product(w, w2));  // packed again
}

// The residual adds the CPU backend fuses into its products (AMX-BF16): it
// says so for batches only (never one token, nor with exact_matmul), and
// MatMulAdd / SwiGluMatMul with add give MatMul (or SwiGlu then MatMul) and
// a separate f32 add, bit for bit. Where it does not fuse, MatMulAdd refuses
// with a message instead of computing something else.
TEST(CpuBackendResidualAdd, FusedAddsEqualTheProductThenTheAdd) {
  const GgmlType t = GgmlType::kQ4_1;
  const int64_t n = 576, k = 1536, m = 40;
  const auto w = testing::QuantizedWeights(t, n, k, RowBytes(t, k), 5, 0.02f);
  const WeightView v = View(w, t, n, k);
  auto b = MakeBackend(/*pack=*/true);
  EXPECT_EQ(b->FusesResidualAdd(v, m), cpu::MatMulHasAmxBf16());
  EXPECT_FALSE(b->FusesResidualAdd(v, 1));
  EXPECT_FALSE(MakeBackend(true, /*exact=*/true)->FusesResidualAdd(v, m));
  const auto x = testing::HiddenStates(m, k, k, 6), up = testing::HiddenStates(m, k, k, 7);
  const auto y0 = testing::HiddenStates(m, n, n, 8);
  if (!b->FusesResidualAdd(v, m)) {
    std::vector<float> y = y0;
    const absl::Status s = b->MatMulAdd(x.data(), m, k, v, y.data(), n);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
    GTEST_SKIP() << "no fused residual add on this CPU (AMX-BF16 unavailable or SNAPFILL_AMX set)";
  }
  std::vector<float> prod(m * n), want = y0, got = y0;
  ASSERT_TRUE(b->MatMul(x.data(), m, k, v, prod.data(), n).ok());
  for (size_t i = 0; i < want.size(); ++i) want[i] += prod[i];
  ASSERT_TRUE(b->MatMulAdd(x.data(), m, k, v, got.data(), n).ok());
  ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);

  std::vector<float> gate = x, h = x;
  ASSERT_TRUE(b->SwiGlu(h.data(), up.data(), h.data(), m * k).ok());
  ASSERT_TRUE(b->MatMul(h.data(), m, k, v, prod.data(), n).ok());
  want = y0;
  got = y0;
  for (size_t i = 0; i < want.size(); ++i) want[i] += prod[i];
  ASSERT_TRUE(b->SwiGluMatMul(gate.data(), up.data(), m, k, v, got.data(), n, /*add=*/true).ok());
  ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

// The feed-forward block (Backend::FeedForward) and Q/K/V behind the
// attention norm (Backend::NormMatMulShared): the CPU backend's (one fused
// cpu::FeedForward / cpu::NormMatMulShared where AMX-BF16 takes the products,
// the norm folded into their conversion of x) equal the defaults' RmsNorm,
// MatMulShared and SwiGluMatMul, bit for bit, with and without the norm, with
// the residual add where the backend fuses it, in exact mode too.
TEST(CpuBackendFeedForward, EqualsTheUnfusedSteps) {
  const GgmlType t = GgmlType::kQ4_1;
  const int64_t dim = 576, ff = 1536, m = 40;
  const auto wg = testing::QuantizedWeights(t, ff, dim, RowBytes(t, dim), 11, 0.05f);
  const auto wu = testing::QuantizedWeights(t, ff, dim, RowBytes(t, dim), 12, 0.05f);
  const auto wd = testing::QuantizedWeights(t, dim, ff, RowBytes(t, ff), 13, 0.02f);
  const WeightView g = View(wg, t, ff, dim), u = View(wu, t, ff, dim), d = View(wd, t, dim, ff);
  const auto x = testing::HiddenStates(m, dim, dim, 14), y0 = testing::HiddenStates(m, dim, dim, 15);
  std::vector<float> norm_w(dim);
  for (int64_t i = 0; i < dim; ++i) norm_w[i] = 0.5f + static_cast<float>(i % 7) * 0.25f;
  for (bool exact : {false, true}) {
    for (bool with_norm : {false, true}) {
      auto b = MakeBackend(/*pack=*/true, exact);
      const bool add = b->FusesResidualAdd(d, m);
      EXPECT_EQ(add, !exact && cpu::MatMulHasAmxBf16());
      std::vector<float> xn1(m * dim), xn2(m * dim, 5.0f);
      const Backend::Norm n1{with_norm ? norm_w.data() : nullptr, 1e-5f, xn1.data(), dim};
      const Backend::Norm n2{with_norm ? norm_w.data() : nullptr, 1e-5f, xn2.data(), dim};
      std::vector<float> gb(m * ff), ub(m * ff), want = y0, got = y0, gb2(m * ff, 3.0f), ub2(m * ff, 3.0f);
      const Backend::FeedForwardBlock f1{&g, &u, &d, n1, gb.data(), ub.data(), ff};
      const Backend::FeedForwardBlock f2{&g, &u, &d, n2, gb2.data(), ub2.data(), ff};
      ASSERT_TRUE(b->Backend::FeedForward(x.data(), m, dim, f1, want.data(), dim, add).ok());
      ASSERT_TRUE(b->FeedForward(x.data(), m, dim, f2, got.data(), dim, add).ok());
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << "exact " << exact << " norm " << with_norm;

      // Q, K and V (the model's widths) over the normalized rows.
      const auto wq = testing::QuantizedWeights(t, dim, dim, RowBytes(t, dim), 16, 0.05f);
      const auto wk = testing::QuantizedWeights(t, 192, dim, RowBytes(t, dim), 17, 0.05f);
      const WeightView q = View(wq, t, dim, dim), k = View(wk, t, 192, dim);
      std::vector<float> qa(m * dim), ka(m * 192), qb(m * dim, 1.0f), kb(m * 192, 1.0f);
      const Backend::SharedOut oa[2] = {{&q, qa.data(), dim}, {&k, ka.data(), 192}};
      const Backend::SharedOut ob[2] = {{&q, qb.data(), dim}, {&k, kb.data(), 192}};
      ASSERT_TRUE(b->Backend::NormMatMulShared(x.data(), m, dim, n1, oa, 2).ok());
      ASSERT_TRUE(b->NormMatMulShared(x.data(), m, dim, n2, ob, 2).ok());
      ASSERT_EQ(std::memcmp(qa.data(), qb.data(), qa.size() * sizeof(float)), 0) << "exact " << exact;
      ASSERT_EQ(std::memcmp(ka.data(), kb.data(), ka.size() * sizeof(float)), 0) << "exact " << exact;
    }
  }
}

// FusesLayer says whether a layer's batch runs every step fused (and so never
// writes the callers' xn and gate/up buffers): with AMX-BF16 for the model's
// Q4_1 shapes and a chunk of tokens; not for one token, nor in exact mode,
// nor when gate and up differ in type.
TEST(CpuBackendFeedForward, FusesLayerOnlyWhereEveryStepFuses) {
  const GgmlType t = GgmlType::kQ4_1;
  const int64_t dim = 576, ff = 1536, kv = 192;
  const auto a = testing::QuantizedWeights(t, dim, dim, RowBytes(t, dim), 1, 0.05f);
  const auto b = testing::QuantizedWeights(t, kv, dim, RowBytes(t, dim), 2, 0.05f);
  const auto g = testing::QuantizedWeights(t, ff, dim, RowBytes(t, dim), 3, 0.05f);
  const auto d = testing::QuantizedWeights(t, dim, ff, RowBytes(t, ff), 4, 0.05f);
  const auto g8 = testing::QuantizedWeights(GgmlType::kQ8_0, ff, dim, RowBytes(GgmlType::kQ8_0, dim), 5, 0.05f);
  const WeightView wq = View(a, t, dim, dim), wk = View(b, t, kv, dim), wg = View(g, t, ff, dim),
                   wd = View(d, t, dim, ff), wg8 = View(g8, GgmlType::kQ8_0, ff, dim);
  const Backend::LayerProducts layer{&wq, &wk, &wk, &wq, &wg, &wg, &wd};
  const Backend::LayerProducts mixed{&wq, &wk, &wk, &wq, &wg8, &wg, &wd};
  auto cpu = MakeBackend(/*pack=*/true);
  EXPECT_EQ(cpu->FusesLayer(layer, 1024), cpu::MatMulHasAmxBf16());
  EXPECT_FALSE(cpu->FusesLayer(layer, 1));
  EXPECT_FALSE(cpu->FusesLayer(mixed, 1024));
  EXPECT_FALSE(MakeBackend(true, /*exact=*/true)->FusesLayer(layer, 1024));
}

}  // namespace
}  // namespace snapfill
