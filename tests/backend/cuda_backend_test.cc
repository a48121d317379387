// The CUDA backend against the scalar twins (kernels/ref) op by op on odd
// shapes, and against the CPU backend on a whole tiny model: logits, the
// entries SnapKV keeps, and caches that cross from one device to the other.
// Each test skips, saying why, where no GPU can be used (label "cuda").
//
// Tolerances, stated once:
//  - element-wise ops and the attention family: f32 arithmetic against the
//    twins' double, 2e-5 of the operands' scale (the online softmax's
//    rescaling and expf's ulp);
//  - exact products (f32 weights, f32 sums, no TF32): 3e-5 of Σ|x·w|
//    per output (k = 256 f32 additions: about k·2⁻²⁴ at worst);
//  - bf16 products: against ref::MatMulBf16 (the same rounded operands,
//    exact sums), 3e-5 of Σ|x·w| (cuBLAS sums the exact bf16 products in
//    f32);
//  - whole-model logits, exact: 1e-4 of the largest logit and the same
//    top-1 (llama.cpp's backend tests compare logits with NMSE ~1e-7; this
//    is of that order); bf16: 5e-2 of the largest logit.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/quant_blocks.h"
#include "kernels/ref/ops_ref.h"
#include "kernels/ref/quant_ref.h"
#include "snapfill/backend.h"
#include "snapfill/engine.h"
#include "snapfill/status.h"
#include "src/base/half.h"
#include "src/base/int8_rows.h"
#include "src/engine/generate.h"
#include "src/gguf/fingerprint.h"
#include "src/kv/cache_file.h"
#include "src/kv/kv_cache.h"
#include "src/model/llama_forward.h"
#include "tests/testing/complement_data.h"
#include "tests/testing/engine_run.h"
#include "tests/testing/gate_data.h"
#include "tests/testing/gather_data.h"
#include "tests/testing/matmul_data.h"
#include "tests/testing/ref_backend.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_model.h"
#include "tools/testmodel/tiny_llama.h"

namespace snapfill {
namespace {

std::unique_ptr<Backend> MakeCuda(bool exact, std::string* why, bool host_buffers = false) {
  BackendOptions o;
  o.exact_matmul = exact;
  o.host_buffers = host_buffers;
  auto b = CreateBackend(Device::kCuda, o);
  if (!b.ok()) {
    *why = b.status().ToString();
    return nullptr;
  }
  return std::move(*b);
}

#define CUDA_BACKEND_OR_SKIP(name, exact)                                   \
  std::string name##_why;                                                   \
  std::unique_ptr<Backend> name = MakeCuda(exact, &name##_why);             \
  if (name == nullptr) GTEST_SKIP() << "no CUDA backend here: " << name##_why

std::vector<float> Normal(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

TEST(CudaBackend, ElementwiseOpsMatchTheTwins) {
  CUDA_BACKEND_OR_SKIP(b, false);
  // RmsNorm over padded rows.
  const int64_t rows = 7, dim = 333, xs = 340, ys = 350;
  std::vector<float> x = Normal(rows * xs, 1), w = Normal(dim, 2);
  std::vector<float> got(rows * ys, -7.0f), want(rows * ys, -7.0f);
  SNAPFILL_ASSERT_OK(b->RmsNorm(x.data(), xs, w.data(), got.data(), ys, rows, dim, 1e-5f));
  ref::RmsNorm(x.data(), xs, w.data(), want.data(), ys, rows, dim, 1e-5f);
  for (int64_t i = 0; i < rows * ys; ++i) ASSERT_NEAR(got[i], want[i], 2e-5 * MaxAbs(want)) << "rms_norm " << i;

  // Rope at positions up to a million, both pairings, a partial rotation.
  for (bool neox : {false, true}) {
    const int64_t tokens = 5, heads = 3, hd = 24, rot = 16, stride = 80;
    std::vector<float> r = Normal(tokens * stride, 3), r_ref = r;
    const std::vector<int32_t> pos = {0, 1, 4097, 131071, 1000003};
    SNAPFILL_ASSERT_OK(b->Rope(r.data(), tokens, heads, hd, stride, pos.data(), RopeSpec{rot, 10000.0f, 1.0f, neox}));
    ref::Rope(r_ref.data(), tokens, heads, hd, stride, pos.data(), rot, 10000.0f, 1.0f, neox);
    for (int64_t i = 0; i < tokens * stride; ++i) ASSERT_NEAR(r[i], r_ref[i], 2e-5 * MaxAbs(r_ref)) << neox << " " << i;
    // Llama 3.1's frequency factors (rope_freqs), uploaded by the backend.
    std::vector<float> factors(rot / 2);
    for (int64_t i = 0; i < rot / 2; ++i) factors[i] = 1.0f + static_cast<float>(i % 4) * 2.5f;
    std::vector<float> f = Normal(tokens * stride, 30), f_ref = f;
    SNAPFILL_ASSERT_OK(
        b->Rope(f.data(), tokens, heads, hd, stride, pos.data(), RopeSpec{rot, 500000.0f, 1.0f, neox, factors.data()}));
    ref::Rope(f_ref.data(), tokens, heads, hd, stride, pos.data(), rot, 500000.0f, 1.0f, neox, factors.data());
    for (int64_t i = 0; i < tokens * stride; ++i) {
      ASSERT_NEAR(f[i], f_ref[i], 2e-5 * MaxAbs(f_ref)) << "freq_factors " << neox << " " << i;
    }
  }

  // RopeHeads: the chunk loop's per-head runs, in one call, with shared and
  // per-head positions.
  for (int64_t pos_stride : {0, 40}) {
    const int64_t heads = 3, tokens = 33, hd = 64, head_stride = 40 * hd;
    std::vector<float> r = Normal(heads * head_stride, 6), r_ref = r;
    std::vector<int32_t> pos(heads * 40);
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(7 * i + 3);
    SNAPFILL_ASSERT_OK(b->RopeHeads(r.data(), heads, head_stride, tokens, hd, pos.data(), pos_stride,
                                    RopeSpec{hd, 10000.0f, 1.0f, false}));
    for (int64_t h = 0; h < heads; ++h) {
      ref::Rope(r_ref.data() + h * head_stride, tokens, 1, hd, hd, pos.data() + h * pos_stride, hd, 10000.0f, 1.0f,
                false);
    }
    for (size_t i = 0; i < r.size(); ++i) ASSERT_NEAR(r[i], r_ref[i], 2e-5 * MaxAbs(r_ref)) << pos_stride << " " << i;
  }

  const int64_t n = 1001;
  std::vector<float> g = Normal(n, 4, 3.0f), u = Normal(n, 5), out(n), out_ref(n);
  SNAPFILL_ASSERT_OK(b->SwiGlu(g.data(), u.data(), out.data(), n));
  ref::SwiGlu(g.data(), u.data(), out_ref.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(out[i], out_ref[i], 2e-5 * MaxAbs(out_ref)) << "swiglu " << i;
  SNAPFILL_ASSERT_OK(b->GeluGlu(g.data(), u.data(), out.data(), n));
  ref::GeluGlu(g.data(), u.data(), out_ref.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(out[i], out_ref[i], 2e-5 * MaxAbs(out_ref)) << "geluglu " << i;
}

// The host's f16 conversions (the recall store's): the twin's bits, over
// pieces and a tail, with zeros of both signs, subnormals, the largest
// halves, overflow to infinity and NaN; back, every half there is.
TEST(CudaBackend, HalfConversionsAreTheTwins) {
  CUDA_BACKEND_OR_SKIP(b, false);
  const int64_t n = 300001;
  std::vector<float> x = Normal(n, 41, 1000.0f);
  const float specials[] = {0.0f,
                            -0.0f,
                            5.96e-8f,
                            -3e-8f,
                            6.1e-5f,
                            65504.0f,
                            65520.0f,
                            -1e9f,
                            INFINITY,
                            -INFINITY,
                            std::numeric_limits<float>::quiet_NaN()};
  for (size_t i = 0; i < std::size(specials); ++i) x[i * 7919] = specials[i];
  for (int64_t i = 0; i < n; i += 97) x[i] *= 1e-7f;  // subnormal halves
  std::vector<uint16_t> got(n);
  b->ToHalf(x.data(), got.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], Fp32ToFp16(x[i])) << i << " " << x[i];
  std::vector<uint16_t> all(65536);
  std::iota(all.begin(), all.end(), uint16_t{0});
  std::vector<float> back(all.size());
  b->FromHalf(all.data(), back.data(), static_cast<int64_t>(all.size()));
  for (size_t i = 0; i < all.size(); ++i) {
    const float want = Fp16ToFp32(all[i]);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(back[i])) << i;  // (F16C quiets a signaling NaN)
    } else {
      ASSERT_EQ(std::signbit(back[i]), std::signbit(want)) << i;
      ASSERT_EQ(back[i], want) << i;
    }
  }
}

struct AttentionCase {
  int64_t num_q, num_keys, heads, kv_heads, head_dim, key_pad;
};

// A case's operands at padded strides: the queries at q_stride, keys and
// values head-major with room past the keys, outputs at out_stride.
struct AttentionOperands {
  AttentionOperands(const AttentionCase& c, uint32_t* seed, float q_scale = 1.0f)
      : key_stride(c.head_dim + c.key_pad),
        head_stride((c.num_keys + 3) * key_stride),
        q_stride(c.heads * c.head_dim + 3),
        out_stride(c.heads * c.head_dim + 5),
        scale(1.0f / std::sqrt(static_cast<float>(c.head_dim))),
        q(Normal(c.num_q * q_stride, ++*seed, q_scale)),
        k(Normal(c.kv_heads * head_stride, ++*seed)),
        v(Normal(c.kv_heads * head_stride, ++*seed)),
        queries{q.data(), q_stride, c.num_q, c.heads, c.kv_heads, c.head_dim, scale} {
    kv.k = k.data();
    kv.v = v.data();
    kv.head_stride = head_stride;
    kv.key_stride = key_stride;
    kv.num_keys = c.num_keys;
  }
  AttentionOperands(const AttentionOperands&) = delete;
  AttentionOperands& operator=(const AttentionOperands&) = delete;

  const int64_t key_stride, head_stride, q_stride, out_stride;
  const float scale;
  const std::vector<float> q, k, v;
  const Queries queries;
  KvView kv;
};

TEST(CudaBackend, AttentionFamilyMatchesTheTwins) {
  CUDA_BACKEND_OR_SKIP(b, true);  // f32 attention (the bf16 backend's chunks take tensor cores: below)
  const AttentionCase cases[] = {{1, 1, 2, 1, 16, 0},     {37, 101, 6, 2, 24, 4}, {32, 300, 9, 3, 64, 0},
                                 {5, 70, 4, 4, 128, 0},   {3, 40, 2, 1, 256, 0},  {64, 64, 4, 2, 96, 2},
                                 {1, 2049, 32, 32, 128, 0}};
  uint32_t seed = 10;
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.num_q << " queries, " << c.num_keys << " keys, " << c.heads << "/"
                                      << c.kv_heads << " heads of " << c.head_dim);
    const AttentionOperands a(c, &seed);
    const auto& [key_stride, head_stride, q_stride, out_stride, scale, q, k, v, queries, kv] = a;
    std::vector<float> out(c.num_q * out_stride, 9.0f), out_ref(c.num_q * out_stride, 9.0f);
    SNAPFILL_ASSERT_OK(b->Attention(queries, kv, out.data(), out_stride));
    ref::Attention(q.data(), q_stride, k.data(), v.data(), head_stride, key_stride, out_ref.data(), out_stride,
                   c.num_q, c.num_keys, c.heads, c.kv_heads, c.head_dim, scale);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], out_ref[i], 2e-5 * MaxAbs(out_ref)) << "attention " << i;
    // A sliding window (a local layer's): shorter than a tile, longer, the
    // width of the keys.
    for (int64_t window : {int64_t{7}, int64_t{40}, c.num_keys}) {
      Queries windowed = queries;
      windowed.window = window;
      std::fill(out.begin(), out.end(), 9.0f);
      std::fill(out_ref.begin(), out_ref.end(), 9.0f);
      SNAPFILL_ASSERT_OK(b->Attention(windowed, kv, out.data(), out_stride));
      ref::Attention(q.data(), q_stride, k.data(), v.data(), head_stride, key_stride, out_ref.data(), out_stride,
                     c.num_q, c.num_keys, c.heads, c.kv_heads, c.head_dim, scale, window);
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_NEAR(out[i], out_ref[i], 2e-5 * MaxAbs(out_ref)) << "window " << window << ", attention " << i;
      }
    }

    const int64_t votes_stride = c.num_keys + 7;
    std::vector<float> votes(c.kv_heads * votes_stride, -1.0f), votes_ref(c.kv_heads * votes_stride, -1.0f);
    SNAPFILL_ASSERT_OK(b->WindowScores(queries, kv, votes.data(), votes_stride));
    ref::WindowScores(q.data(), q_stride, k.data(), head_stride, key_stride, votes_ref.data(), votes_stride, c.num_q,
                      c.num_keys, c.heads, c.kv_heads, c.head_dim, scale);
    for (size_t i = 0; i < votes.size(); ++i) ASSERT_NEAR(votes[i], votes_ref[i], 2e-5 * MaxAbs(votes_ref)) << i;

    std::vector<float> lse(c.heads * c.num_q), lse_ref(c.heads * c.num_q);
    SNAPFILL_ASSERT_OK(b->QueryLogSumExp(queries, kv, lse.data()));
    ref::QueryLogSumExp(q.data(), q_stride, k.data(), head_stride, key_stride, c.num_q, c.num_keys, c.heads,
                        c.kv_heads, c.head_dim, scale, lse_ref.data());
    for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], lse_ref[i], 2e-5 * std::max(1.0, MaxAbs(lse_ref)));
    // AttentionWithLse, the base class's here: Attention, then QueryLogSumExp
    // (the same results); a window with denominators is refused.
    std::vector<float> with(out.size(), 9.0f), with_lse(lse.size());
    SNAPFILL_ASSERT_OK(b->Attention(queries, kv, out.data(), out_stride));
    SNAPFILL_ASSERT_OK(b->AttentionWithLse(queries, kv, with.data(), out_stride, with_lse.data()));
    EXPECT_EQ(with, out);
    EXPECT_EQ(with_lse, lse);
    Queries windowed = queries;
    windowed.window = 7;
    EXPECT_EQ(b->AttentionWithLse(windowed, kv, with.data(), out_stride, with_lse.data()).code(),
              absl::StatusCode::kInvalidArgument);

    // The recall tier's scores of other keys (every one visible), stored
    // token-major as the recall store reads them: a key's heads side by side.
    const int64_t stored = 2 * c.num_keys + 1;
    std::vector<float> sk = Normal(c.kv_heads * stored * c.head_dim, ++seed);
    KvView keys;
    keys.k = sk.data();
    keys.head_stride = c.head_dim;
    keys.key_stride = c.kv_heads * c.head_dim;
    keys.num_keys = stored;
    std::vector<float> rs(c.kv_heads * stored), rs_ref(c.kv_heads * stored);
    SNAPFILL_ASSERT_OK(b->RecallScores(queries, lse_ref.data(), keys, rs.data(), stored, /*max_weight=*/false));
    ref::RecallScores(q.data(), q_stride, c.num_q, lse_ref.data(), sk.data(), keys.head_stride, keys.key_stride,
                      stored, rs_ref.data(), stored, c.heads, c.kv_heads, c.head_dim, scale);
    for (size_t i = 0; i < rs.size(); ++i) ASSERT_NEAR(rs[i], rs_ref[i], 2e-5 * MaxAbs(rs_ref)) << "recall " << i;
    // The largest weight instead of the sum (context reconstruction).
    SNAPFILL_ASSERT_OK(b->RecallScores(queries, lse_ref.data(), keys, rs.data(), stored, /*max_weight=*/true));
    ref::RecallScores(q.data(), q_stride, c.num_q, lse_ref.data(), sk.data(), keys.head_stride, keys.key_stride, stored,
                      rs_ref.data(), stored, c.heads, c.kv_heads, c.head_dim, scale, /*max_weight=*/true);
    for (size_t i = 0; i < rs.size(); ++i) {
      ASSERT_NEAR(rs[i], rs_ref[i], 2e-5 * MaxAbs(rs_ref)) << "recall, largest weight " << i;
    }
  }
}

// The bf16 backend's chunk attention (kernels/cuda/flash_attention.cu),
// twice:
//  - against its twin, ref::AttentionBf16 (the same roundings, double
//    sums), as the CPU's AMX attention is (tests/kernels/attention_test.cc):
//    each weight is the twin's times a factor near 1, rounded to bf16
//    separately, so an output moves by at most 2⁻⁷ of Σ|p̂·v̂| / Σp;
//  - with sliding windows (which that twin lacks): against ref::Attention
//    given the operands the kernel sees (bf16(q·scale) with scale 1, bf16
//    k and v), so that only the weights' rounding is left: within 2⁻⁸ of
//    max|v|.
// A wrong fragment layout, mask or scale is off by the values' scale. The
// shapes: every head_dim the kernel takes, rows that leave warps and blocks
// part-filled, keys that leave a tile part-filled, GQA, padded strides;
// 15 queries take the f32 kernel.
void CheckTensorCoreAttention(Backend* b, const std::vector<AttentionCase>& cases) {
  auto bf16 = [](float x) { return Bf16ToFp32(Fp32ToBf16(x)); };
  uint32_t seed = 100;
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.num_q << " queries, " << c.num_keys << " keys, " << c.heads << "/"
                                      << c.kv_heads << " heads of " << c.head_dim);
    // Scores of a few units, as a trained model's: the softmax is neither
    // flat nor one-hot.
    const AttentionOperands a(c, &seed, /*q_scale=*/2.0f);
    const auto& [key_stride, head_stride, q_stride, out_stride, scale, q, k, v, queries, kv] = a;

    std::vector<float> out(c.num_q * out_stride, 9.0f), want(c.num_q * out_stride, 9.0f),
        abs_out(c.num_q * out_stride, 0.0f);
    SNAPFILL_ASSERT_OK(b->Attention(queries, kv, out.data(), out_stride));
    if (c.num_q < 16) {
      // The f32 kernel: the f32 twin's tolerance (against the bf16 twin its
      // unrounded weights come within 4% of that twin's bound).
      ref::Attention(q.data(), q_stride, k.data(), v.data(), head_stride, key_stride, want.data(), out_stride, c.num_q,
                     c.num_keys, c.heads, c.kv_heads, c.head_dim, scale, 0);
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_NEAR(out[i], want[i], 2e-5 * MaxAbs(v)) << "f32 attention " << i;
      }
    } else {
      ref::AttentionBf16(q.data(), q_stride, k.data(), v.data(), head_stride, key_stride, want.data(), out_stride,
                         c.num_q, c.num_keys, c.heads, c.kv_heads, c.head_dim, scale, abs_out.data());
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_NEAR(out[i], want[i], std::ldexp(abs_out[i], -7) + 1e-6) << "attention " << i;
      }
    }

    std::vector<float> qr(q.size()), kr(k.size()), vr(v.size());
    for (size_t i = 0; i < q.size(); ++i) qr[i] = bf16(q[i] * scale);
    for (size_t i = 0; i < k.size(); ++i) kr[i] = bf16(k[i]);
    for (size_t i = 0; i < v.size(); ++i) vr[i] = bf16(v[i]);
    const double tolerance = std::ldexp(MaxAbs(vr), -8);
    for (int64_t window : {int64_t{7}, int64_t{100}, c.num_keys}) {
      Queries windowed = queries;
      windowed.window = window;
      std::fill(out.begin(), out.end(), 9.0f);
      std::fill(want.begin(), want.end(), 9.0f);
      SNAPFILL_ASSERT_OK(b->Attention(windowed, kv, out.data(), out_stride));
      ref::Attention(qr.data(), q_stride, kr.data(), vr.data(), head_stride, key_stride, want.data(), out_stride,
                     c.num_q, c.num_keys, c.heads, c.kv_heads, c.head_dim, 1.0f, window);
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_NEAR(out[i], want[i], tolerance) << "window " << window << ", attention " << i;
      }
    }
  }
}

TEST(CudaBackend, TensorCoreAttentionMatchesTheTwins) {
  CUDA_BACKEND_OR_SKIP(b, false);
  CheckTensorCoreAttention(b.get(), {{16, 16, 2, 1, 16, 0},
                                     {37, 101, 6, 2, 32, 4},
                                     {64, 300, 9, 3, 64, 0},
                                     {100, 100, 4, 4, 96, 2},
                                     {65, 200, 2, 1, 256, 0},
                                     {15, 70, 4, 2, 64, 0}});
}

// A chunk's shapes (many tiles, many blocks); apart, so that racecheck
// (tools/gpu_check.sh) can leave them out.
TEST(CudaBackend, TensorCoreAttentionOnChunkShapes) {
  CUDA_BACKEND_OR_SKIP(b, false);
  CheckTensorCoreAttention(b.get(), {{300, 1500, 8, 2, 128, 0}, {129, 2049, 32, 32, 128, 3}});
}

// --kernels attention=f32 on cuda: the chunk's attention on the f32 kernel
// (the exact backend's, bit for bit) with bf16 products; the CPU's kernel
// names are refused.
TEST(CudaBackend, AttentionKernelByName) {
  CUDA_BACKEND_OR_SKIP(exact, true);
  BackendOptions o;
  o.attention_kernel = "f32";
  auto f32 = CreateBackend(Device::kCuda, o);
  SNAPFILL_ASSERT_OK(f32);
  EXPECT_NE((*f32)->kernels().find("attention tiled f32"), std::string::npos) << (*f32)->kernels();
  uint32_t seed = 7;
  const AttentionCase c{100, 300, 8, 2, 64, 0};
  const AttentionOperands a(c, &seed);
  std::vector<float> want(c.num_q * a.out_stride), got(want.size());
  SNAPFILL_ASSERT_OK(exact->Attention(a.queries, a.kv, want.data(), a.out_stride));
  SNAPFILL_ASSERT_OK((*f32)->Attention(a.queries, a.kv, got.data(), a.out_stride));
  EXPECT_EQ(got, want);
  o.attention_kernel = "amx-bf16";
  EXPECT_TRUE(absl::IsInvalidArgument(CreateBackend(Device::kCuda, o).status()));
}

TEST(CudaBackend, SelectionMatchesTheTwins) {
  CUDA_BACKEND_OR_SKIP(b, false);
  for (int64_t n : {1, 5, 33, 1000, 100003}) {
    std::vector<float> votes = Normal(n, static_cast<uint32_t>(n));
    for (float& x : votes) x = std::fabs(x);
    for (int64_t i = 0; i + 7 < n; i += 7) votes[i + 7] = votes[i];  // ties go to the lower position
    for (int64_t kernel : {1, 3, 7}) {
      for (Backend::PoolOp op : {Backend::PoolOp::kAvg, Backend::PoolOp::kMax}) {
        std::vector<float> got(n), want(n);
        SNAPFILL_ASSERT_OK(b->Pool1d(votes.data(), got.data(), n, kernel, op));
        if (kernel <= 1) {
          want = votes;
        } else if (op == Backend::PoolOp::kAvg) {
          ref::AvgPool1d(votes.data(), want.data(), n, kernel);
        } else {
          ref::MaxPool1d(votes.data(), want.data(), n, kernel);
        }
        // The host's kernels below kDeviceSelectMin values, the device's
        // above: both the CPU backend's bits (f32 sums), within 1e-6 of
        // the twin's double sums.
        std::vector<float> cpu(n);
        SNAPFILL_ASSERT_OK(testing::SharedCpuBackend().Pool1d(votes.data(), cpu.data(), n, kernel, op));
        ASSERT_EQ(got, cpu) << n << " " << kernel;
        for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], want[i], 1e-6f) << n << " " << kernel << " " << i;
      }
    }
    for (int64_t k : {int64_t{0}, int64_t{1}, n / 2, n}) {
      std::vector<int32_t> got(k), want(k);
      SNAPFILL_ASSERT_OK(b->TopK(votes.data(), n, k, got.data()));
      ref::TopKIndices(votes.data(), n, k, want.data());
      ASSERT_EQ(got, want) << n << " " << k;
    }
  }
}

// SelectHeads on the device (votes and kept indices in its buffers, one
// block per head) keeps the twin's indices exactly: the same f32 pooling,
// ties to the lower index, -0 with +0, single entries and a question's
// spans of 32 (the warp's walk over tile maxima), each also followed by a
// second pick over other votes among what it left; from one candidate to
// the 7B shape's 32 heads over 2,048; a non-finite vote named, its row
// [0, count).
// Host operands take the host's selection, the same indices. (Named
// Selection* so that tools/gpu_check.sh's memcheck and racecheck run it.)
TEST(CudaBackend, SelectionOfAllHeadsMatchesTheTwin) {
  CUDA_BACKEND_OR_SKIP(b, false);
  struct Shape {
    int64_t heads, n, sinks, window;
  };
  int cases = 0, then_cases = 0;
  for (const Shape sh : {Shape{1, 1, 0, 0}, Shape{3, 9, 0, 1}, Shape{3, 300, 4, 8}, Shape{5, 1201, 0, 32},
                         Shape{32, 2048, 4, 32}, Shape{2, 70000, 4, 64}}) {
    const int64_t stride = sh.n + 3, window_begin = sh.n - sh.window, rest = window_begin - sh.sinks;
    std::vector<float> votes = Normal(sh.heads * stride, static_cast<uint32_t>(sh.n));
    for (int64_t i = 0; i < static_cast<int64_t>(votes.size()); ++i) {
      // Few distinct values (ties), zeros of both signs.
      votes[i] = std::floor(std::fabs(votes[i]) * 8) / 8;
      if (votes[i] == 0.0f && i % 2 == 1) votes[i] = -0.0f;
    }
    // (A second row, for a second pick: the window's votes after a question's.)
    std::vector<float> then_votes = Normal(sh.heads * stride, static_cast<uint32_t>(sh.n + 1));
    for (float& x : then_votes) x = std::floor(std::fabs(x) * 4) / 4;
    auto votes_d = b->NewBuffer(2 * votes.size() * sizeof(float));
    SNAPFILL_ASSERT_OK(votes_d);
    SNAPFILL_ASSERT_OK(b->Upload(votes.data(), (*votes_d)->data(), votes.size() * sizeof(float)));
    float* const then_d = (*votes_d)->f32() + votes.size();
    SNAPFILL_ASSERT_OK(b->Upload(then_votes.data(), then_d, votes.size() * sizeof(float)));
    for (const int64_t pick : {int64_t{0}, std::min<int64_t>(1, rest), rest / 3, rest}) {
      for (const int64_t kernel : {1, 7}) {
        for (const Backend::PoolOp op : {Backend::PoolOp::kAvg, Backend::PoolOp::kMax}) {
          for (const int64_t span : {1, 32}) {
            const int64_t half = (rest - pick) / 2;
            for (const int64_t then : half > 0 ? std::vector<int64_t>{0, half} : std::vector<int64_t>{0}) {
              // (A question's spans at 70,000 candidates, whose tiles hold 64
              // keys, once per pick: the twin searches every entry per peak.)
              if (span > 1 && sh.n > 10000 && (kernel != 7 || op != Backend::PoolOp::kAvg)) continue;
              SCOPED_TRACE(::testing::Message() << sh.heads << " heads, " << sh.n << " candidates, pick " << pick
                                                << " then " << then << ", kernel " << kernel
                                                << (op == Backend::PoolOp::kMax ? " max" : "") << ", span " << span);
              Backend::HeadSelection s{.votes_stride = stride,
                                       .num_heads = sh.heads,
                                       .num_candidates = sh.n,
                                       .rest_begin = sh.sinks,
                                       .window_begin = window_begin,
                                       .pick = pick,
                                       .pool_kernel = kernel,
                                       .pool = op,
                                       .span = span,
                                       .then_votes_stride = stride,
                                       .then_pick = then};
              s.keep_stride = s.count() + 2;
              std::vector<int32_t> want(sh.heads * s.keep_stride, -9), got(want.size(), -9), host(want.size(), -9);
              ref::SelectHeads(votes.data(), stride, sh.heads, sh.n, sh.sinks, window_begin, pick, kernel,
                               op == Backend::PoolOp::kMax, span, then_votes.data(), stride, then, want.data(),
                               s.keep_stride);
              auto keep_d = b->NewBuffer(got.size() * sizeof(int32_t));
              SNAPFILL_ASSERT_OK(keep_d);
              SNAPFILL_ASSERT_OK(b->Upload(got.data(), (*keep_d)->data(), got.size() * sizeof(int32_t)));
              Backend::HeadSelection on_device = s;
              on_device.votes = (*votes_d)->f32();
              if (then > 0) on_device.then_votes = then_d;
              on_device.keep = static_cast<int32_t*>((*keep_d)->data());
              SNAPFILL_ASSERT_OK(b->SelectHeads(on_device));
              SNAPFILL_ASSERT_OK(b->Download((*keep_d)->data(), got.data(), got.size() * sizeof(int32_t)));
              ASSERT_EQ(got, want);
              Backend::HeadSelection on_host = s;
              on_host.votes = votes.data();
              if (then > 0) on_host.then_votes = then_votes.data();
              on_host.keep = host.data();
              SNAPFILL_ASSERT_OK(b->SelectHeads(on_host));
              ASSERT_EQ(host, want);
              if (then > 0) {
                ++then_cases;
              } else {
                ++cases;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 6 * 4 * 2 * 2 + 5 * 4 * 2 * 2 + 4);
  EXPECT_GT(then_cases, 100);
  // One row of votes for every head (votes_stride 0, then_votes_stride 0:
  // a question's shared votes, as the engine passes them).
  {
    const int64_t heads = 3, n = 300, sinks = 4, window_begin = 292;
    std::vector<float> rows = Normal(2 * n, 77);
    for (float& x : rows) x = std::floor(std::fabs(x) * 8) / 8;
    auto rows_d = b->NewBuffer(rows.size() * sizeof(float));
    SNAPFILL_ASSERT_OK(rows_d);
    SNAPFILL_ASSERT_OK(b->Upload(rows.data(), (*rows_d)->data(), rows.size() * sizeof(float)));
    Backend::HeadSelection s{.votes = (*rows_d)->f32(),
                             .votes_stride = 0,
                             .num_heads = heads,
                             .num_candidates = n,
                             .rest_begin = sinks,
                             .window_begin = window_begin,
                             .pick = 50,
                             .pool_kernel = 7,
                             .span = 32,
                             .then_votes = (*rows_d)->f32() + n,
                             .then_votes_stride = 0,
                             .then_pick = 40};
    s.keep_stride = s.count() + 2;
    std::vector<int32_t> want(heads * s.keep_stride, -9), got(want.size(), -9);
    ref::SelectHeads(rows.data(), 0, heads, n, sinks, window_begin, 50, 7, false, 32, rows.data() + n, 0, 40,
                     want.data(), s.keep_stride);
    auto keep_d = b->NewBuffer(got.size() * sizeof(int32_t));
    SNAPFILL_ASSERT_OK(keep_d);
    SNAPFILL_ASSERT_OK(b->Upload(got.data(), (*keep_d)->data(), got.size() * sizeof(int32_t)));
    s.keep = static_cast<int32_t*>((*keep_d)->data());
    SNAPFILL_ASSERT_OK(b->SelectHeads(s));
    SNAPFILL_ASSERT_OK(b->Download((*keep_d)->data(), got.data(), got.size() * sizeof(int32_t)));
    EXPECT_EQ(got, want) << "votes shared by the heads";
    for (int64_t h = 1; h < heads; ++h) {
      EXPECT_TRUE(std::equal(got.begin(), got.begin() + s.count(), got.begin() + h * s.keep_stride))
          << "one row, the same entries in every head";
    }
  }
  // A non-finite vote in head 1 (and a later one): named, the row [0, count).
  std::vector<float> votes = Normal(2 * 50, 3);
  for (float& x : votes) x = std::fabs(x);
  votes[50 + 20] = std::numeric_limits<float>::quiet_NaN();
  votes[50 + 30] = std::numeric_limits<float>::infinity();
  auto votes_d = b->NewBuffer(votes.size() * sizeof(float));
  SNAPFILL_ASSERT_OK(votes_d);
  SNAPFILL_ASSERT_OK(b->Upload(votes.data(), (*votes_d)->data(), votes.size() * sizeof(float)));
  Backend::HeadSelection s{.votes = (*votes_d)->f32(), .votes_stride = 50, .num_heads = 2, .num_candidates = 50,
                           .rest_begin = 2, .window_begin = 44, .pick = 12, .pool_kernel = 3};
  s.keep_stride = s.count() + 1;
  std::vector<int32_t> got(2 * s.keep_stride, -9);
  auto keep_d = b->NewBuffer(got.size() * sizeof(int32_t));
  SNAPFILL_ASSERT_OK(keep_d);
  s.keep = static_cast<int32_t*>((*keep_d)->data());
  SNAPFILL_ASSERT_OK(b->SelectHeads(s));
  SNAPFILL_ASSERT_OK(b->Download((*keep_d)->data(), got.data(), got.size() * sizeof(int32_t)));
  EXPECT_EQ(got[s.count()], -1);
  EXPECT_EQ(got[s.keep_stride + s.count()], 20);
  for (int64_t t = 0; t < s.count(); ++t) EXPECT_EQ(got[s.keep_stride + t], t);
  // Votes on the device, the result on the host: refused.
  std::vector<int32_t> host(got.size());
  s.keep = host.data();
  EXPECT_TRUE(absl::IsInvalidArgument(b->SelectHeads(s)));
}

// Σ|x·w| per output, with w dequantized as the twins do.
std::vector<double> AbsTerms(const float* x, int64_t m, int64_t k, int64_t x_stride, const std::vector<float>& w,
                             int64_t n) {
  std::vector<double> out(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t t = 0; t < k; ++t) s += std::fabs(static_cast<double>(x[i * x_stride + t]) * w[j * k + t]);
      out[i * n + j] = s;
    }
  }
  return out;
}

TEST(CudaBackend, ProductsMatchTheTwins) {
  const int64_t n = 67, k = 256;
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    // One backend per matrix: its copies are known by the matrix's address,
    // which the next type's bytes may take (and a backend per model is the
    // contract; see Backend::PrepareWeights).
    CUDA_BACKEND_OR_SKIP(exact, true);
    CUDA_BACKEND_OR_SKIP(bf16, false);
    const size_t row_bytes = RowBytes(type, k) + 16;
    const std::vector<uint8_t> wq = testing::QuantizedWeights(type, n, k, row_bytes, 7, 0.01f);
    const WeightView w = testing::ViewOf(wq, type, n, k, row_bytes);
    std::vector<float> wf(n * k);
    for (int64_t j = 0; j < n; ++j) ASSERT_TRUE(ref::DequantizeRow(type, wq.data() + j * row_bytes, wf.data() + j * k, k));
    for (int64_t m : {1, 37}) {
      SCOPED_TRACE(::testing::Message() << "type " << static_cast<int>(type) << ", m = " << m);
      const int64_t x_stride = k + 9, y_stride = n + 3;
      const std::vector<float> x = testing::HiddenStates(m, k, x_stride, 11);
      const std::vector<double> abs_terms = AbsTerms(x.data(), m, k, x_stride, wf, n);
      std::vector<float> got(m * y_stride, 5.0f);
      SNAPFILL_ASSERT_OK(exact->MatMul(x.data(), m, x_stride, w, got.data(), y_stride));
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double want = 0;
          for (int64_t t = 0; t < k; ++t) want += static_cast<double>(x[i * x_stride + t]) * wf[j * k + t];
          ASSERT_NEAR(got[i * y_stride + j], want, 3e-5 * abs_terms[i * n + j] + 1e-30) << i << " " << j;
        }
        for (int64_t j = n; j < y_stride; ++j) ASSERT_EQ(got[i * y_stride + j], 5.0f) << "wrote past the row";
      }
      // MatMulAdd adds the same product.
      std::vector<float> added(m * y_stride, 0.5f);
      SNAPFILL_ASSERT_OK(exact->MatMulAdd(x.data(), m, x_stride, w, added.data(), y_stride));
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_NEAR(added[i * y_stride + j], got[i * y_stride + j] + 0.5f, 3e-5 * abs_terms[i * n + j] + 1e-6);
        }
      }

      std::vector<float> b16(m * y_stride), want16(m * y_stride);
      std::vector<double> abs16(m * y_stride);
      SNAPFILL_ASSERT_OK(bf16->MatMul(x.data(), m, x_stride, w, b16.data(), y_stride));
      ASSERT_TRUE(ref::MatMulBf16(x.data(), m, k, x_stride, wq.data(), type, n, row_bytes, want16.data(), y_stride,
                                  abs16.data()));
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_NEAR(b16[i * y_stride + j], want16[i * y_stride + j], 3e-5 * abs16[i * n + j] + 1e-30) << i << " " << j;
        }
      }
    }
  }
}

// The fused feed-forward block (norm, gate and up, SwiGLU, down, the
// residual add) against the same steps through the twins.
TEST(CudaBackend, FusedFeedForwardMatchesItsSteps) {
  CUDA_BACKEND_OR_SKIP(b, true);
  const int64_t m = 19, dim = 96, ffn = 160;
  auto weight = [](int64_t rows, int64_t cols, uint32_t seed, std::vector<uint8_t>* bytes) {
    *bytes = testing::QuantizedWeights(GgmlType::kF32, rows, cols, cols * sizeof(float), seed, 0.0f);
    WeightView w;
    w.data = bytes->data();
    w.type = GgmlType::kF32;
    w.rows = rows;
    w.cols = cols;
    w.row_bytes = cols * sizeof(float);
    return w;
  };
  std::vector<uint8_t> gb, ub, db;
  const WeightView gate = weight(ffn, dim, 1, &gb), up = weight(ffn, dim, 2, &ub), down = weight(dim, ffn, 3, &db);
  const std::vector<float> norm = Normal(dim, 4);
  std::vector<float> x = Normal(m * dim, 5), want = x;
  Backend::FeedForwardBlock f{&gate, &up, &down, Backend::Norm{norm.data(), 1e-5f, nullptr, dim}, nullptr, nullptr, ffn};
  ASSERT_TRUE(b->FusesLayer({&gate, &gate, &gate, &down, &gate, &up, &down}, m));
  SNAPFILL_ASSERT_OK(b->FeedForward(x.data(), m, dim, f, x.data(), dim, /*add=*/true));

  std::vector<float> xn(m * dim), g(m * ffn), u(m * ffn), h(m * ffn), y(m * dim);
  ref::RmsNorm(want.data(), dim, norm.data(), xn.data(), dim, m, dim, 1e-5f);
  auto product = [](const std::vector<float>& in, int64_t m, int64_t k, const WeightView& w, std::vector<float>* out) {
    const float* wf = static_cast<const float*>(w.data);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < w.rows; ++j) {
        double s = 0;
        for (int64_t t = 0; t < k; ++t) s += static_cast<double>(in[i * k + t]) * wf[j * k + t];
        (*out)[i * w.rows + j] = static_cast<float>(s);
      }
    }
  };
  product(xn, m, dim, gate, &g);
  product(xn, m, dim, up, &u);
  ref::SwiGlu(g.data(), u.data(), h.data(), m * ffn);
  product(h, m, ffn, down, &y);
  for (int64_t i = 0; i < m * dim; ++i) want[i] += y[i];
  for (int64_t i = 0; i < m * dim; ++i) ASSERT_NEAR(x[i], want[i], 1e-4 * MaxAbs(want)) << i;
}

TEST(CudaBackend, BadArgumentsAreRefused) {
  CUDA_BACKEND_OR_SKIP(b, false);
  std::vector<float> v(4096, 1.0f), out(4096);
  std::vector<int32_t> pos(9);
  EXPECT_EQ(b->Pool1d(v.data(), out.data(), 8, 4, Backend::PoolOp::kAvg).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->TopK(v.data(), 8, 9, pos.data()).code(), absl::StatusCode::kInvalidArgument);
  KvView kv;
  kv.k = v.data();
  kv.v = v.data();
  kv.head_stride = 512;
  kv.key_stride = 512;
  kv.num_keys = 2;
  // A head wider than the kernels take, and more queries than keys.
  EXPECT_EQ(b->Attention(Queries{v.data(), 512, 1, 1, 1, 512, 1.0f}, kv, out.data(), 512).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->Attention(Queries{v.data(), 64, 3, 1, 1, 64, 1.0f}, kv, out.data(), 64).code(),
            absl::StatusCode::kInvalidArgument);
  WeightView w;
  w.data = v.data();
  w.type = GgmlType::kF32;
  w.rows = 4;
  w.cols = 8;
  w.row_bytes = 32;
  EXPECT_EQ(b->MatMul(v.data(), 2, 4, w, out.data(), 4).code(), absl::StatusCode::kInvalidArgument);
}

std::unique_ptr<LlamaModel> TinyModel(GgmlType type) {
  TinyLlamaOptions opts;
  opts.num_layers = 3;
  opts.model_dim = 128;
  opts.num_heads = 4;
  opts.num_kv_heads = 2;
  opts.ffn_dim = 256;
  opts.matrix_type = type;
  opts.context_length = 4096;
  return testing::LoadTinyModel(opts);
}

std::vector<float> Logits(const LlamaModel& model, Backend* backend, const std::vector<int32_t>& ids, int64_t rows) {
  auto fwd = LlamaForward::Create(model, backend, 64);
  SNAPFILL_CHECK(fwd.ok());
  auto kv = (*fwd)->NewKvCache(ids.size());
  SNAPFILL_CHECK(kv.ok());
  std::vector<int32_t> pos(ids.size());
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<float> logits(rows * model.config().vocab_size);
  const absl::Status s = (*fwd)->Forward(ids.data(), ids.size(), pos.data(), **kv, rows, logits.data());
  SNAPFILL_CHECK(s.ok());
  return logits;
}

TEST(CudaBackend, TinyModelLogitsMatchTheReference) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kQ8_0}) {
    CUDA_BACKEND_OR_SKIP(exact, true);  // one backend per model
    CUDA_BACKEND_OR_SKIP(bf16, false);
    auto model = TinyModel(type);
    const int64_t vocab = model->config().vocab_size;
    const std::vector<int32_t> ids = testing::TestTokens(150, vocab);  // three batches of 64
    const int64_t rows = 4;
    std::unique_ptr<Backend> ref = testing::CreateRefBackend(/*quantized_activations=*/false);
    const std::vector<float> want = Logits(*model, ref.get(), ids, rows);
    const std::vector<float> got = Logits(*model, exact.get(), ids, rows);
    const std::vector<float> got16 = Logits(*model, bf16.get(), ids, rows);
    const double scale = MaxAbs(want);
    double worst16 = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* w = want.data() + r * vocab;
      const float* g = got.data() + r * vocab;
      for (int64_t i = 0; i < vocab; ++i) ASSERT_NEAR(g[i], w[i], 1e-4 * scale) << "row " << r << " logit " << i;
      EXPECT_EQ(std::max_element(g, g + vocab) - g, std::max_element(w, w + vocab) - w) << "row " << r;
      for (int64_t i = 0; i < vocab; ++i) worst16 = std::max(worst16, std::fabs(double(got16[r * vocab + i]) - w[i]));
    }
    EXPECT_LT(worst16, 5e-2 * scale) << "bf16 logits";
    std::printf("type %d: bf16 logits within %.3g of the exact ones (largest %.3g)\n", static_cast<int>(type), worst16,
                scale);
  }
}

// The chunk loop with SnapKV on each device; what it keeps, per layer and
// KV head.
std::vector<std::vector<int32_t>> Kept(const LlamaModel& model, Backend* backend, const std::vector<int32_t>& ids,
                                       std::unique_ptr<KvCache>* decoder_cache, int64_t* next_position) {
  PrefillConfig config;
  config.schedule.kind = ScheduleKind::kIncrementalDecremental;
  config.schedule.chunk = 128;
  config.schedule.memory = 96;
  config.schedule.window = 16;
  auto engine = PrefillEngine::Create(model, backend, config, ids.size());
  SNAPFILL_CHECK(engine.ok());
  SNAPFILL_CHECK((*engine)->Run(ids, nullptr).ok());
  std::vector<std::vector<int32_t>> kept;
  const KvCache& mem = (*engine)->memory();
  for (int64_t l = 0; l < model.config().num_layers; ++l) {
    for (int64_t h = 0; h < model.config().num_kv_heads; ++h) {
      kept.emplace_back(mem.pos(l, h), mem.pos(l, h) + mem.size(l));
    }
  }
  if (decoder_cache != nullptr) {
    auto c = (*engine)->MakeDecoderCache(0);
    SNAPFILL_CHECK(c.ok());
    *decoder_cache = std::move(*c);
    *next_position = (*engine)->next_position();
  }
  return kept;
}

TEST(CudaBackend, SnapKvKeepsWhatTheCpuKeeps) {
  CUDA_BACKEND_OR_SKIP(exact, true);
  CUDA_BACKEND_OR_SKIP(bf16, false);
  auto model = TinyModel(GgmlType::kF32);
  const std::vector<int32_t> ids = testing::TestTokens(900, model->config().vocab_size);
  BackendOptions o;
  o.exact_matmul = true;
  auto cpu = CreateBackend(Device::kCpu, o);
  SNAPFILL_ASSERT_OK(cpu);
  const auto want = Kept(*model, cpu->get(), ids, nullptr, nullptr);
  EXPECT_EQ(Kept(*model, exact.get(), ids, nullptr, nullptr), want);
  // bf16 products and tensor-core attention: most of the same entries
  // (each layer's input moves by the roundings, and a vote near the cut
  // flips).
  const auto got16 = Kept(*model, bf16.get(), ids, nullptr, nullptr);
  int64_t same = 0, total = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    std::vector<int32_t> both;
    std::set_intersection(want[i].begin(), want[i].end(), got16[i].begin(), got16[i].end(), std::back_inserter(both));
    same += both.size();
    total += want[i].size();
  }
  EXPECT_GE(same, 0.85 * total) << same << " of " << total << " kept entries in common";
  std::printf("bf16: %lld of %lld kept entries as the exact CPU backend's\n", static_cast<long long>(same),
              static_cast<long long>(total));
}

// The device memory a prefill takes, against its prediction (--dry_run and
// --max_memory on cuda): the weights' copies and the engine's buffers are
// exact, the ops' scratch an upper bound, so the backend's measured peak
// lies between the exact part and the whole.
TEST(CudaBackend, DevicePeakIsWithinItsPrediction) {
  for (bool exact : {false, true}) {
    for (bool scored : {false, true}) {
      CUDA_BACKEND_OR_SKIP(b, exact);
      SCOPED_TRACE(::testing::Message() << (exact ? "exact" : "bf16") << (scored ? ", scored" : ""));
      auto model = TinyModel(GgmlType::kQ8_0);
      PrefillConfig config;
      config.schedule.kind = ScheduleKind::kIncrementalDecremental;
      config.schedule.chunk = 128;
      config.schedule.memory = 96;
      config.schedule.window = 16;
      config.score_tokens = scored;
      const int64_t n = 900;
      auto fp = PrefillEngine::Footprint(model->config(), config, n, false, /*buffers_on_device=*/true);
      SNAPFILL_ASSERT_OK(fp);
      auto engine = PrefillEngine::Create(*model, b.get(), config, n);
      SNAPFILL_ASSERT_OK(engine);
      SNAPFILL_ASSERT_OK((*engine)->Run(testing::TestTokens(n, model->config().vocab_size), nullptr));
      SNAPFILL_ASSERT_OK(b->Synchronize());
      const uint64_t weights = LlamaForward::DeviceWeightBytes(*model, *b);
      const uint64_t scratch = b->DeviceScratchBytes(fp->ops);
      const uint64_t measured = b->DevicePeakBytes();
      EXPECT_GT(weights, 0u);
      EXPECT_GE(measured, weights / 2 + fp->buffer_bytes) << "the weights' copies or the buffers are not counted";
      EXPECT_LE(measured, weights + fp->buffer_bytes + scratch);
      std::printf("device peak %.2f MiB, predicted %.2f MiB (weights %.2f, buffers %.2f, scratch at most %.2f)\n",
                  measured / 1048576.0, (weights + fp->buffer_bytes + scratch) / 1048576.0, weights / 1048576.0,
                  fp->buffer_bytes / 1048576.0, scratch / 1048576.0);
    }
  }
}

// A cache compressed on one device decodes on the other: the same greedy
// tokens as decoding where it was made.
TEST(CudaBackend, CachesCrossDevices) {
  CUDA_BACKEND_OR_SKIP(gpu, true);
  auto model = TinyModel(GgmlType::kF32);
  const std::vector<int32_t> ids = testing::TestTokens(700, model->config().vocab_size);
  BackendOptions o;
  o.exact_matmul = true;
  auto cpu = CreateBackend(Device::kCpu, o);
  SNAPFILL_ASSERT_OK(cpu);
  const std::vector<int32_t> prompt = {5, 77, 140, 3};
  GenerateOptions gen;
  gen.max_new_tokens = 12;
  const std::string path = ::testing::TempDir() + "/snapfill_cuda_cache.kv";
  auto decode = [&](Backend* backend) {
    auto loaded = LoadCacheFile(path, ModelFingerprint(model->gguf()), prompt.size() + gen.max_new_tokens);
    SNAPFILL_CHECK(loaded.ok());
    auto fwd = LlamaForward::Create(*model, backend, 16);
    SNAPFILL_CHECK(fwd.ok());
    auto r = Generate(**fwd, *loaded->kv, loaded->next_position, prompt, gen, nullptr);
    SNAPFILL_CHECK(r.ok());
    return r->tokens;
  };
  for (Backend* maker : {gpu.get(), cpu->get()}) {
    PromptCache cache;
    Kept(*model, maker, ids, &cache.kv, &cache.next_position);
    cache.model_fingerprint = ModelFingerprint(model->gguf());
    cache.config = "{\"test\":true}";
    cache.input_tokens = ids.size();
    std::remove(path.c_str());
    SNAPFILL_ASSERT_OK(SaveCacheFile(path, cache, /*overwrite=*/false));
    const std::vector<int32_t> on_gpu = decode(gpu.get());
    const std::vector<int32_t> on_cpu = decode(cpu->get());
    EXPECT_EQ(on_gpu, on_cpu) << "cache made on " << (maker == gpu.get() ? "the GPU" : "the CPU");
    EXPECT_EQ(on_gpu.size(), 12u);
  }
  std::remove(path.c_str());
}

// SmolLM2-135M's shapes (30 layers, 576 wide, 9 query and 3 KV heads of 64,
// feed-forward 1,536) with random F16 weights: the chunk loop with SnapKV
// on the exact CPU backend and on the exact GPU backend keeps the same
// entries, ends on the same logits (1e-4 of the largest, same top-1) and
// the caches decode to the same greedy tokens.
TEST(CudaBackend, SmolLm2ShapedModelMatchesTheCpu) {
  CUDA_BACKEND_OR_SKIP(gpu, true);
  TinyLlamaOptions opts;
  SNAPFILL_ASSERT_OK(ApplyTinyLlamaPreset("smollm2-135m", &opts));
  opts.f16_matrices = true;
  opts.rope_freq_base = 100000.0f;
  auto model = testing::LoadTinyModel(opts);
  const std::vector<int32_t> ids = testing::TestTokens(2048, model->config().vocab_size);
  BackendOptions o;
  o.exact_matmul = true;
  auto cpu = CreateBackend(Device::kCpu, o);
  SNAPFILL_ASSERT_OK(cpu);
  struct Result {
    std::vector<std::vector<int32_t>> kept;
    std::vector<float> logits;
    std::vector<int32_t> tokens;
  };
  auto run = [&](Backend* backend) {
    Result r;
    PrefillConfig config;
    config.schedule.kind = ScheduleKind::kIncrementalDecremental;
    config.schedule.chunk = 512;
    config.schedule.memory = 256;
    config.schedule.window = 32;
    auto engine = PrefillEngine::Create(*model, backend, config, ids.size());
    SNAPFILL_CHECK(engine.ok());
    SNAPFILL_CHECK((*engine)->Run(ids, nullptr).ok());
    const KvCache& mem = (*engine)->memory();
    for (int64_t l = 0; l < opts.num_layers; ++l) {
      for (int64_t h = 0; h < opts.num_kv_heads; ++h) r.kept.emplace_back(mem.pos(l, h), mem.pos(l, h) + mem.size(l));
    }
    r.logits = (*engine)->last_logits();
    auto cache = (*engine)->MakeDecoderCache(24);
    SNAPFILL_CHECK(cache.ok());
    auto fwd = LlamaForward::Create(*model, backend, 16);
    SNAPFILL_CHECK(fwd.ok());
    GenerateOptions gen;
    gen.max_new_tokens = 16;
    auto g = Generate(**fwd, **cache, (*engine)->next_position(), {5, 77, 140, 3}, gen, nullptr);
    SNAPFILL_CHECK(g.ok());
    r.tokens = g->tokens;
    return r;
  };
  const Result want = run(cpu->get());
  const Result got = run(gpu.get());
  // Over 30 layers and four compressions a near-tie in the votes may fall
  // the other way in another summation order; then what follows differs a
  // little too. Identical sets are the expectation, and then the logits
  // and the greedy tokens must agree.
  int64_t same = 0, total = 0;
  for (size_t i = 0; i < want.kept.size(); ++i) {
    std::vector<int32_t> both;
    std::set_intersection(want.kept[i].begin(), want.kept[i].end(), got.kept[i].begin(), got.kept[i].end(),
                          std::back_inserter(both));
    same += both.size();
    total += want.kept[i].size();
  }
  std::printf("SmolLM2-shaped, exact: %lld of %lld kept entries as the CPU's\n", static_cast<long long>(same),
              static_cast<long long>(total));
  EXPECT_GE(same, 0.99 * total);
  const double scale = MaxAbs(want.logits);
  double worst = 0;
  for (size_t i = 0; i < want.logits.size(); ++i) worst = std::max(worst, std::fabs(double(got.logits[i]) - want.logits[i]));
  std::printf("last logits within %.3g of the CPU's (largest %.3g)\n", worst, scale);
  if (same == total) {
    EXPECT_LT(worst, 1e-4 * scale);
    EXPECT_EQ(std::max_element(got.logits.begin(), got.logits.end()) - got.logits.begin(),
              std::max_element(want.logits.begin(), want.logits.end()) - want.logits.begin());
    EXPECT_EQ(got.tokens, want.tokens);
  } else {
    EXPECT_LT(worst, 1e-2 * scale);
  }
}

// ---- The backend's memory on the device.

// A new buffer of `b` holding `host`.
std::unique_ptr<BackendBuffer> Uploaded(Backend& b, const std::vector<float>& host) {
  auto made = b.NewBuffer(host.size() * sizeof(float));
  SNAPFILL_CHECK(made.ok()) << made.status();
  SNAPFILL_CHECK(b.Upload(host.data(), (*made)->data(), host.size() * sizeof(float)).ok());
  return std::move(*made);
}

std::vector<float> DownloadAll(Backend& b, const void* d, size_t n) {
  std::vector<float> out(n);
  SNAPFILL_CHECK(b.Download(d, out.data(), n * sizeof(float)).ok());
  return out;
}

// The backend's buffers are device memory: out of the host's reach, zeros
// at first, reached through Download and Upload, counted in the device's
// peak; ReleaseFrom zeroes the tail; a buffer may outlive its backend.
TEST(CudaBackend, BuffersLiveOnTheDevice) {
  CUDA_BACKEND_OR_SKIP(b, false);
  const size_t n = 4099;
  const uint64_t peak = b->DevicePeakBytes();
  auto made = b->NewBuffer(n * sizeof(float));
  SNAPFILL_ASSERT_OK(made);
  std::unique_ptr<BackendBuffer> d = std::move(*made);
  EXPECT_EQ(d->host(), nullptr);
  ASSERT_NE(d->data(), nullptr);
  EXPECT_EQ(d->bytes(), n * sizeof(float));
  EXPECT_GE(b->DevicePeakBytes(), peak + n * sizeof(float));
  EXPECT_EQ(DownloadAll(*b, d->data(), n), std::vector<float>(n, 0.0f));
  const std::vector<float> x = Normal(n, 11);
  SNAPFILL_ASSERT_OK(b->Upload(x.data(), d->data(), n * sizeof(float)));
  EXPECT_EQ(DownloadAll(*b, d->data(), n), x);
  d->ReleaseFrom(1000 * sizeof(float));
  const std::vector<float> after = DownloadAll(*b, d->data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(after[i], i < 1000 ? x[i] : 0.0f) << i;
  b.reset();
  d.reset();  // (freed through the memory it shares with the backend)
}

// The conversion on the device's own memory (the recall tier's evicted
// rows): Fp32ToFp16's bits for every sign and exponent, with mantissas at
// the rounding's edges and at random (NaNs with payloads among them); on
// the host where both operands are the host's; refused where they are
// split.
TEST(CudaBackend, ToHalfInBuffersIsTheTwin) {
  CUDA_BACKEND_OR_SKIP(b, false);
  std::mt19937 rng(43);
  std::vector<float> x;
  const uint32_t edges[] = {0,      1,      0xFFF,    0x1000,   0x1001,   0x1FFF,
                            0x2000, 0x3000, 0x400000, 0x7FE000, 0x7FF000, 0x7FFFFF};
  for (uint32_t sign : {0u, 1u}) {
    for (uint32_t exp = 0; exp < 256; ++exp) {
      auto add = [&](uint32_t mant) { x.push_back(BitsToFloat(sign << 31 | exp << 23 | (mant & 0x7FFFFF))); };
      for (uint32_t m : edges) add(m);
      for (int i = 0; i < 500; ++i) add(static_cast<uint32_t>(rng()));
    }
  }
  const int64_t n = static_cast<int64_t>(x.size());
  auto xd = Uploaded(*b, x);
  auto yd = b->NewBuffer(n * sizeof(uint16_t));
  SNAPFILL_ASSERT_OK(yd);
  auto* y = static_cast<uint16_t*>((*yd)->data());
  SNAPFILL_ASSERT_OK(b->ToHalfInBuffers(xd->f32(), y, n));
  std::vector<uint16_t> got(n);
  SNAPFILL_ASSERT_OK(b->Download(y, got.data(), n * sizeof(uint16_t)));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], Fp32ToFp16(x[i])) << i << " " << x[i];
  // On the host: the CPU's vector kernels, the same bits (NaNs' payloads
  // included).
  std::vector<uint16_t> host(n);
  SNAPFILL_ASSERT_OK(b->ToHalfInBuffers(x.data(), host.data(), n));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(host[i], got[i]) << i << " " << x[i];
  EXPECT_EQ(b->ToHalfInBuffers(x.data(), y, n).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->ToHalfInBuffers(xd->f32(), y, -1).code(), absl::StatusCode::kInvalidArgument);
}

// The int8 rows on the device's own memory (a q8 store's evicted rows):
// the twin's bytes for rows of 128 (a 7B head), 64 and an odd 37 (records
// not 4-byte aligned), with rows of zeros, of tiny and huge magnitudes and
// of exact ties among them; more rows than the grid's warps; on the host
// where both operands are the host's; refused where they are split.
TEST(CudaBackend, ToInt8RowsInBuffersIsTheTwin) {
  CUDA_BACKEND_OR_SKIP(b, false);
  std::mt19937 rng(44);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  for (const int64_t dim : {128, 64, 37}) {
    SCOPED_TRACE(dim);
    const int64_t rows = dim == 37 ? 40000 : 1000;  // (40,000: over 4,096 blocks of 8 warps)
    std::vector<float> x(rows * dim);
    for (float& v : x) v = dist(rng);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = x.data() + r * dim;
      switch (r % 7) {
        case 1:
          std::fill(row, row + dim, 0.0f);
          break;
        case 2:  // (every other one so small that its scale's reciprocal overflows: every q 0)
          for (int64_t i = 0; i < dim; ++i) row[i] *= (r / 7) % 2 == 0 ? 1e-30f : 1e-38f;
          break;
        case 5:  // (a NaN, then infinities: scale NaN, every q 0, as the twin writes)
          row[(r * 5) % dim] = std::numeric_limits<float>::quiet_NaN();
          break;
        case 6:
          row[r % dim] = std::numeric_limits<float>::infinity();
          row[dim - 1] = -std::numeric_limits<float>::infinity();
          break;
        case 3:
          for (int64_t i = 0; i < dim; ++i) row[i] *= 1e30f;
          break;
        case 4:
          for (int64_t i = 0; i < dim; ++i) row[i] = 0.5f * static_cast<float>((i * 37 + r) % 255) - 63.5f;
          row[dim - 1] = -127.0f;
          break;
        default:
          break;
      }
    }
    const int64_t bytes = rows * Int8RowBytes(dim);
    std::vector<uint8_t> want(bytes);
    EncodeInt8Rows(x.data(), rows, dim, want.data());
    auto xd = Uploaded(*b, x);
    auto yd = b->NewBuffer(bytes);
    SNAPFILL_ASSERT_OK(yd);
    auto* y = static_cast<uint8_t*>((*yd)->data());
    SNAPFILL_ASSERT_OK(b->ToInt8RowsInBuffers(xd->f32(), y, rows, dim));
    std::vector<uint8_t> got(bytes);
    SNAPFILL_ASSERT_OK(b->Download(y, got.data(), bytes));
    for (int64_t i = 0; i < bytes; ++i) {
      ASSERT_EQ(got[i], want[i]) << "row " << i / Int8RowBytes(dim) << " byte " << i % Int8RowBytes(dim);
    }
    std::vector<uint8_t> host(bytes);
    SNAPFILL_ASSERT_OK(b->ToInt8RowsInBuffers(x.data(), host.data(), rows, dim));
    EXPECT_EQ(host, want);
    EXPECT_EQ(b->ToInt8RowsInBuffers(x.data(), y, rows, dim).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(b->ToInt8RowsInBuffers(xd->f32(), y, -1, dim).code(), absl::StatusCode::kInvalidArgument);
  }
}

// Gather between the backend's memory and the host's, in each direction,
// runs of rows and indexed rows, rows of floats and of odd byte counts:
// the bytes the host's gather moves. In one call as well, where a later
// gather reads what an earlier one wrote.
TEST(CudaBackend, GatherMovesRowsEveryWay) {
  CUDA_BACKEND_OR_SKIP(b, false);
  auto cpu = CreateBackend(Device::kCpu, BackendOptions{});
  SNAPFILL_ASSERT_OK(cpu);
  const int64_t src_rows = 37, count = 21;
  std::mt19937 rng(5);
  std::vector<int32_t> rows(count);
  for (int32_t& r : rows) r = static_cast<int32_t>(rng() % src_rows);
  for (size_t row_bytes : {size_t{64 * sizeof(float)}, size_t{6}}) {
    const size_t src_stride = row_bytes + 8, dst_stride = row_bytes + (row_bytes % 4 == 0 ? 4 : 3);
    std::vector<uint8_t> src(src_rows * src_stride);
    for (uint8_t& v : src) v = static_cast<uint8_t>(rng());
    const std::vector<uint8_t> fill(count * dst_stride, 0xAB);
    auto src_d = b->NewBuffer(src.size());
    auto dst_d = b->NewBuffer(fill.size());
    SNAPFILL_ASSERT_OK(src_d);
    SNAPFILL_ASSERT_OK(dst_d);
    SNAPFILL_ASSERT_OK(b->Upload(src.data(), (*src_d)->data(), src.size()));
    for (bool src_device : {false, true}) {
      for (bool dst_device : {false, true}) {
        for (bool indexed : {false, true}) {
          SCOPED_TRACE(::testing::Message() << row_bytes << "-byte rows, from the " << (src_device ? "device" : "host")
                                            << " to the " << (dst_device ? "device" : "host")
                                            << (indexed ? ", indexed" : ", a run"));
          std::vector<uint8_t> want = fill, got = fill;
          SNAPFILL_ASSERT_OK(b->Upload(fill.data(), (*dst_d)->data(), fill.size()));
          const int32_t* idx = indexed ? rows.data() : nullptr;
          SNAPFILL_ASSERT_OK((*cpu)->Gather({{src.data(), src_stride, idx, want.data(), dst_stride, count, row_bytes}}));
          const void* from = src_device ? (*src_d)->data() : src.data();
          void* to = dst_device ? (*dst_d)->data() : got.data();
          SNAPFILL_ASSERT_OK(b->Gather({{from, src_stride, idx, to, dst_stride, count, row_bytes}}));
          if (dst_device) {
            SNAPFILL_ASSERT_OK(b->Download((*dst_d)->data(), got.data(), got.size()));
          }
          EXPECT_EQ(got, want);
        }
      }
    }
    // Row indices in device memory (the kept entries SelectHeads chose):
    // read where they are, from a device source; refused for a host one.
    auto rows_d = b->NewBuffer(rows.size() * sizeof(int32_t));
    SNAPFILL_ASSERT_OK(rows_d);
    SNAPFILL_ASSERT_OK(b->Upload(rows.data(), (*rows_d)->data(), rows.size() * sizeof(int32_t)));
    const auto* idx_d = static_cast<const int32_t*>((*rows_d)->data());
    for (bool dst_device : {false, true}) {
      SCOPED_TRACE(::testing::Message() << row_bytes << "-byte rows by device indices to the "
                                        << (dst_device ? "device" : "host"));
      std::vector<uint8_t> want = fill, got = fill;
      SNAPFILL_ASSERT_OK(b->Upload(fill.data(), (*dst_d)->data(), fill.size()));
      SNAPFILL_ASSERT_OK(
          (*cpu)->Gather({{src.data(), src_stride, rows.data(), want.data(), dst_stride, count, row_bytes}}));
      void* to = dst_device ? (*dst_d)->data() : got.data();
      SNAPFILL_ASSERT_OK(b->Gather({{(*src_d)->data(), src_stride, idx_d, to, dst_stride, count, row_bytes}}));
      if (dst_device) {
        SNAPFILL_ASSERT_OK(b->Download((*dst_d)->data(), got.data(), got.size()));
      }
      EXPECT_EQ(got, want);
    }
    std::vector<uint8_t> unused = fill;
    EXPECT_TRUE(absl::IsInvalidArgument(
        b->Gather({{src.data(), src_stride, idx_d, unused.data(), dst_stride, count, row_bytes}})));
    // Device -> host (indexed), then those host rows -> device, in one call.
    std::vector<uint8_t> host_rows(count * row_bytes), want(count * row_bytes), got(count * row_bytes);
    SNAPFILL_ASSERT_OK(
        (*cpu)->Gather({{src.data(), src_stride, rows.data(), want.data(), row_bytes, count, row_bytes}}));
    SNAPFILL_ASSERT_OK(b->Gather({{(*src_d)->data(), src_stride, rows.data(), host_rows.data(), row_bytes, count,
                                   row_bytes},
                                  {host_rows.data(), row_bytes, nullptr, (*dst_d)->data(), row_bytes, count, row_bytes}}));
    SNAPFILL_ASSERT_OK(b->Download((*dst_d)->data(), got.data(), got.size()));
    EXPECT_EQ(host_rows, want);
    EXPECT_EQ(got, want);
  }
  // More rows than the kernel's grid (65,536 blocks: the grid-stride loop),
  // by device indices, each head's rows interleaved in the destination as
  // the recall tier gathers its evicted rows in the store's slot order.
  {
    const int64_t heads = 2, per_head = 70000, head_rows = 100000;
    const size_t row_bytes = 8 * sizeof(float);
    std::vector<uint8_t> src(heads * head_rows * row_bytes);
    for (uint8_t& v : src) v = static_cast<uint8_t>(rng());
    std::vector<int32_t> idx(heads * per_head);
    for (int32_t& r : idx) r = static_cast<int32_t>(rng() % head_rows);
    const std::vector<uint8_t> fill(heads * per_head * row_bytes, 0xAB);
    std::vector<uint8_t> want = fill, got = fill;
    auto src_d = b->NewBuffer(src.size());
    auto dst_d = b->NewBuffer(fill.size());
    auto idx_d = b->NewBuffer(idx.size() * sizeof(int32_t));
    SNAPFILL_ASSERT_OK(src_d);
    SNAPFILL_ASSERT_OK(dst_d);
    SNAPFILL_ASSERT_OK(idx_d);
    SNAPFILL_ASSERT_OK(b->Upload(src.data(), (*src_d)->data(), src.size()));
    SNAPFILL_ASSERT_OK(b->Upload(fill.data(), (*dst_d)->data(), fill.size()));
    SNAPFILL_ASSERT_OK(b->Upload(idx.data(), (*idx_d)->data(), idx.size() * sizeof(int32_t)));
    std::vector<Backend::RowGather> on_host, on_device;
    for (int64_t h = 0; h < heads; ++h) {
      const size_t from = h * head_rows * row_bytes, to = h * row_bytes;
      on_host.push_back({src.data() + from, row_bytes, idx.data() + h * per_head, want.data() + to, heads * row_bytes,
                         per_head, row_bytes});
      on_device.push_back({static_cast<const uint8_t*>((*src_d)->data()) + from, row_bytes,
                           static_cast<const int32_t*>((*idx_d)->data()) + h * per_head,
                           static_cast<uint8_t*>((*dst_d)->data()) + to, heads * row_bytes, per_head, row_bytes});
    }
    SNAPFILL_ASSERT_OK((*cpu)->Gather(on_host));
    SNAPFILL_ASSERT_OK(b->Gather(on_device));
    SNAPFILL_ASSERT_OK(b->Download((*dst_d)->data(), got.data(), got.size()));
    EXPECT_EQ(got, want) << "70,000 rows a head, interleaved";
  }
}

// A layer's worth of copies in one call, as the chunk loop makes them: the
// copies within the device go kGatherBatch to a launch, so 150 of them
// (runs and rows by device indices, every word size, copies of nothing)
// take three; rows by host indices, and copies to and from the host, come
// between them and keep their place in the list.
TEST(CudaBackend, GatherBatchesManyCopiesInOneCall) {
  CUDA_BACKEND_OR_SKIP(b, false);
  auto cpu = CreateBackend(Device::kCpu, BackendOptions{});
  SNAPFILL_ASSERT_OK(cpu);
  const testing::GatherShapes shapes = testing::MakeGatherShapes(160, 200, 17);
  std::mt19937 rng(17);
  std::vector<uint8_t> src(shapes.src_bytes), fill(shapes.dst_bytes);
  for (uint8_t& v : src) v = static_cast<uint8_t>(rng());
  for (uint8_t& v : fill) v = static_cast<uint8_t>(rng());
  std::vector<int32_t> rows;
  std::vector<size_t> rows_at;
  for (const testing::GatherShape& g : shapes.copies) {
    rows_at.push_back(rows.size());
    rows.insert(rows.end(), g.rows.begin(), g.rows.end());
  }
  auto src_d = b->NewBuffer(src.size()), dst_d = b->NewBuffer(fill.size());
  auto rows_d = b->NewBuffer(rows.size() * sizeof(int32_t));
  SNAPFILL_ASSERT_OK(src_d);
  SNAPFILL_ASSERT_OK(dst_d);
  SNAPFILL_ASSERT_OK(rows_d);
  SNAPFILL_ASSERT_OK(b->Upload(src.data(), (*src_d)->data(), src.size()));
  SNAPFILL_ASSERT_OK(b->Upload(fill.data(), (*dst_d)->data(), fill.size()));
  SNAPFILL_ASSERT_OK(b->Upload(rows.data(), (*rows_d)->data(), rows.size() * sizeof(int32_t)));
  auto* src_dev = static_cast<const uint8_t*>((*src_d)->data());
  auto* dst_dev = static_cast<uint8_t*>((*dst_d)->data());
  auto* rows_dev = static_cast<const int32_t*>((*rows_d)->data());
  std::vector<uint8_t> want = fill, got_host = fill, want_host = fill;
  std::vector<Backend::RowGather> on_cpu, on_cuda;
  for (size_t i = 0; i < shapes.copies.size(); ++i) {
    const testing::GatherShape& g = shapes.copies[i];
    // Every seventh copy by host indices (staged, launched alone); every
    // 23rd from the device to the host, every 29th from the host in.
    const int kind = i % 23 == 7 ? 1 : i % 29 == 11 ? 2 : 0;
    const int32_t* idx = g.rows.empty() ? nullptr : g.rows.data();
    const int32_t* idx_cuda = idx == nullptr || i % 7 == 3 || kind == 2 ? idx : rows_dev + rows_at[i];
    const size_t from = g.src_offset, to = g.dst_offset;
    if (kind == 1) {
      on_cpu.push_back(
          {src.data() + from, g.src_stride, idx, want_host.data() + to, g.dst_stride, g.count, g.row_bytes});
      on_cuda.push_back(
          {src_dev + from, g.src_stride, idx_cuda, got_host.data() + to, g.dst_stride, g.count, g.row_bytes});
    } else {
      const uint8_t* source = kind == 2 ? src.data() + from : src_dev + from;
      on_cpu.push_back({src.data() + from, g.src_stride, idx, want.data() + to, g.dst_stride, g.count, g.row_bytes});
      on_cuda.push_back({source, g.src_stride, idx_cuda, dst_dev + to, g.dst_stride, g.count, g.row_bytes});
    }
  }
  SNAPFILL_ASSERT_OK((*cpu)->Gather(on_cpu));
  SNAPFILL_ASSERT_OK(b->Gather(on_cuda));
  std::vector<uint8_t> got(fill.size());
  SNAPFILL_ASSERT_OK(b->Download(dst_dev, got.data(), got.size()));
  EXPECT_TRUE(got == want) << "the device's rows";
  EXPECT_TRUE(got_host == want_host) << "the rows brought to the host";
}

// The forward pass's element-wise ops on the device's memory compute the
// host's bits (one IEEE operation per value), and the ops read and write
// operands in the backend's buffers as they do host ones, to the bit.
TEST(CudaBackend, OpsTakeTheBuffersAsTheyTakeHostMemory) {
  CUDA_BACKEND_OR_SKIP(b, true);
  auto cpu = CreateBackend(Device::kCpu, BackendOptions{});
  SNAPFILL_ASSERT_OK(cpu);
  auto buffer = [&](const std::vector<float>& host) { return Uploaded(*b, host); };
  const int64_t rows = 9, dim = 70, stride = 75, n = rows * stride;
  const std::vector<float> x = Normal(n, 21), y = Normal(n, 22), bias = Normal(dim, 23);
  {
    std::vector<float> want = x;
    SNAPFILL_ASSERT_OK((*cpu)->Add(want.data(), y.data(), n));
    auto xd = buffer(x), yd = buffer(y);
    SNAPFILL_ASSERT_OK(b->Add(xd->f32(), yd->f32(), n));
    EXPECT_EQ(DownloadAll(*b, xd->data(), n), want) << "add, both on the device";
    auto xd2 = buffer(x);
    SNAPFILL_ASSERT_OK(b->Add(xd2->f32(), y.data(), n));
    EXPECT_EQ(DownloadAll(*b, xd2->data(), n), want) << "add, y on the host";
    std::vector<float> on_host = x;
    SNAPFILL_ASSERT_OK(b->Add(on_host.data(), y.data(), n));
    EXPECT_EQ(on_host, want) << "add on the host";
  }
  {
    std::vector<float> want = x;
    SNAPFILL_ASSERT_OK((*cpu)->AddRows(want.data(), stride, bias.data(), rows, dim));
    auto xd = buffer(x);
    SNAPFILL_ASSERT_OK(b->AddRows(xd->f32(), stride, bias.data(), rows, dim));
    EXPECT_EQ(DownloadAll(*b, xd->data(), n), want) << "add_rows";
  }
  {
    std::vector<float> want = x;
    SNAPFILL_ASSERT_OK((*cpu)->Scale(want.data(), n, 24.0f));
    auto xd = buffer(x);
    SNAPFILL_ASSERT_OK(b->Scale(xd->f32(), n, 24.0f));
    EXPECT_EQ(DownloadAll(*b, xd->data(), n), want) << "scale";
  }
  {
    // Fill: a range inside a buffer, the rest untouched.
    std::vector<float> want = x;
    std::fill(want.begin() + 3, want.end() - 5, 1.0f);
    auto xd = buffer(x);
    SNAPFILL_ASSERT_OK(b->Fill(xd->f32() + 3, n - 8, 1.0f));
    EXPECT_EQ(DownloadAll(*b, xd->data(), n), want) << "fill";
  }
  {
    // RmsNorm from a buffer into another, and on the host.
    std::vector<float> want(n, -3.0f);
    SNAPFILL_ASSERT_OK(b->RmsNorm(x.data(), stride, bias.data(), want.data(), stride, rows, dim, 1e-5f));
    auto xd = buffer(x), yd = buffer(std::vector<float>(n, -3.0f));
    SNAPFILL_ASSERT_OK(b->RmsNorm(xd->f32(), stride, bias.data(), yd->f32(), stride, rows, dim, 1e-5f));
    EXPECT_EQ(DownloadAll(*b, yd->data(), n), want) << "rms_norm";
  }
  {
    // A product, its rows in buffers.
    const int64_t k = 64, out = 48, m = 7;
    const size_t row_bytes = RowBytes(GgmlType::kQ8_0, k);
    const std::vector<uint8_t> wq = testing::QuantizedWeights(GgmlType::kQ8_0, out, k, row_bytes, 9, 0.02f);
    const WeightView w = testing::ViewOf(wq, GgmlType::kQ8_0, out, k, row_bytes);
    const std::vector<float> xs = testing::HiddenStates(m, k, k, 12);
    std::vector<float> want(m * out);
    SNAPFILL_ASSERT_OK(b->MatMul(xs.data(), m, k, w, want.data(), out));
    auto xd = buffer(xs), yd = buffer(std::vector<float>(m * out));
    SNAPFILL_ASSERT_OK(b->MatMul(xd->f32(), m, k, w, yd->f32(), out));
    EXPECT_EQ(DownloadAll(*b, yd->data(), m * out), want) << "matmul";
    // The embedding lookup into a buffer.
    const std::vector<int32_t> ids = {3, 0, 47, 3};
    std::vector<float> rows_want(ids.size() * stride, 1.0f);
    SNAPFILL_ASSERT_OK(b->GetRows(w, ids.data(), ids.size(), rows_want.data(), stride));
    auto rd = buffer(std::vector<float>(ids.size() * stride, 1.0f));
    SNAPFILL_ASSERT_OK(b->GetRows(w, ids.data(), ids.size(), rd->f32(), stride));
    EXPECT_EQ(DownloadAll(*b, rd->data(), ids.size() * stride), rows_want) << "get_rows";
  }
  {
    // RoPE in place on a buffer (padded token stride), and the candidates'
    // RoPE over heads (head stride past the span).
    const int64_t tokens = 6, heads = 3, hd = 16, token_stride = heads * hd + 5;
    RopeSpec r;
    r.rot_dim = hd;
    r.freq_base = 10000.0f;
    r.freq_scale = 1.0f;
    const std::vector<float> xr = Normal(tokens * token_stride, 41);
    const std::vector<int32_t> pos = {0, 5, 9, 1000, 77, 3};
    std::vector<float> want = xr;
    SNAPFILL_ASSERT_OK(b->Rope(want.data(), tokens, heads, hd, token_stride, pos.data(), r));
    auto xd = buffer(xr);
    SNAPFILL_ASSERT_OK(b->Rope(xd->f32(), tokens, heads, hd, token_stride, pos.data(), r));
    EXPECT_EQ(DownloadAll(*b, xd->data(), xr.size()), want) << "rope";
    const int64_t head_stride = tokens * hd + 7;
    const std::vector<float> xh = Normal(heads * head_stride, 42);
    std::vector<int32_t> head_pos(heads * tokens);
    for (size_t i = 0; i < head_pos.size(); ++i) head_pos[i] = static_cast<int32_t>(3 * i + 1);
    std::vector<float> want_h = xh;
    SNAPFILL_ASSERT_OK(b->RopeHeads(want_h.data(), heads, head_stride, tokens, hd, head_pos.data(), tokens, r));
    auto hd_buf = buffer(xh);
    SNAPFILL_ASSERT_OK(b->RopeHeads(hd_buf->f32(), heads, head_stride, tokens, hd, head_pos.data(), tokens, r));
    EXPECT_EQ(DownloadAll(*b, hd_buf->data(), xh.size()), want_h) << "rope over heads";
  }
  // Attention and the votes: queries, keys and values in buffers (padded
  // strides, read in place), the output into one; a few queries (the f32
  // kernel) and a chunk's worth on the bf16 backend (tensor cores).
  CUDA_BACKEND_OR_SKIP(bf16, false);
  for (Backend* be : {b.get(), bf16.get()}) {
    for (int64_t q_count : {int64_t{5}, int64_t{40}}) {
      SCOPED_TRACE(::testing::Message() << (be == b.get() ? "exact, " : "bf16, ") << q_count << " queries");
      uint32_t seed = 30;
      const AttentionOperands a({q_count, 70, 4, 2, 32, 4}, &seed);
      const int64_t keys = a.kv.num_keys, kv_heads = 2;
      auto on = [&](const std::vector<float>& host) { return Uploaded(*be, host); };
      Queries qs = a.queries;
      KvView kv = a.kv;
      const int64_t out_stride = a.out_stride;
      std::vector<float> want(q_count * out_stride, 5.0f), votes_want(kv_heads * keys);
      SNAPFILL_ASSERT_OK(be->Attention(qs, kv, want.data(), out_stride));
      SNAPFILL_ASSERT_OK(be->WindowScores(qs, kv, votes_want.data(), keys));
      auto qd = on(a.q), kd = on(a.k), vd = on(a.v), od = on(std::vector<float>(want.size(), 5.0f));
      qs.q = qd->f32();
      kv.k = kd->f32();
      kv.v = vd->f32();
      SNAPFILL_ASSERT_OK(be->Attention(qs, kv, od->f32(), out_stride));
      EXPECT_EQ(DownloadAll(*be, od->data(), want.size()), want) << "attention";
      std::vector<float> votes(kv_heads * keys);
      SNAPFILL_ASSERT_OK(be->WindowScores(qs, kv, votes.data(), keys));
      // (cuBLAS may pick another algorithm for another batch stride: the
      // same sums in another order.)
      for (size_t i = 0; i < votes.size(); ++i) ASSERT_NEAR(votes[i], votes_want[i], 1e-5 * MaxAbs(votes_want)) << i;
    }
  }
}

// SmartKV's gates, every head in one launch, against the twin in double:
// odd shapes (head_dim 256, a hidden layer of 33, one key), strides wider
// than the rows; with every operand in device buffers (the chunk loop's),
// and with every operand in host memory (copied in and out). The bound is
// f32 rounding of the terms' magnitudes, as on the CPU.
TEST(CudaBackend, GateScoresMatchTheTwin) {
  CUDA_BACKEND_OR_SKIP(b, false);
  uint32_t seed = 5;
  for (const int64_t heads : {1, 3}) {
    for (const auto& [d, hidden] : {std::pair<int64_t, int64_t>{64, 16}, {5, 1}, {256, 8}, {17, 33}}) {
      for (const int64_t n : {1, 7, 300, 5000}) {
        const testing::GateData data = testing::MakeGateData(heads, d, hidden, n, seed++);
        auto pd = Uploaded(*b, data.params), kd = Uploaded(*b, data.keys);
        auto yd = Uploaded(*b, std::vector<float>(data.want.size(), -9.0f));
        SNAPFILL_ASSERT_OK(b->GateScores(data.Op(pd->f32(), kd->f32(), yd->f32())));
        const std::vector<float> on_device = DownloadAll(*b, yd->data(), data.want.size());
        testing::ExpectGateScores(data, on_device, "device operands");
        std::vector<float> on_host(data.want.size(), -9.0f);
        SNAPFILL_ASSERT_OK(b->GateScores(data.Op(data.params.data(), data.keys.data(), on_host.data())));
        EXPECT_EQ(on_host, on_device) << "the same launch, wherever the operands are";
      }
    }
  }
}

// The candidates a selection left, every head in one launch, against the
// twin: none kept, all kept, random subsets up to 70,000 candidates (many
// blocks a head), strides wider than the rows; device operands (the chunk
// loop's) and host operands (the host's walk) give the same indices.
TEST(CudaBackend, ComplementMatchesTheTwin) {
  CUDA_BACKEND_OR_SKIP(b, false);
  uint32_t seed = 13;
  for (const int64_t heads : {1, 3}) {
    for (const int64_t num : {1, 37, 2049, 70000}) {
      for (const int64_t kept : {int64_t{0}, num / 3, num - 1, num}) {
        const testing::ComplementData data = testing::MakeComplementData(heads, num, kept, seed++);
        const std::vector<int32_t>& keep = data.keep;
        const std::vector<int32_t>& want = data.want;
        const int64_t keep_stride = data.keep_stride, out_stride = data.out_stride;
        auto kd = b->NewBuffer(keep.size() * sizeof(int32_t));
        auto od = b->NewBuffer(want.size() * sizeof(int32_t));
        SNAPFILL_ASSERT_OK(kd);
        SNAPFILL_ASSERT_OK(od);
        std::vector<int32_t> got(want.size(), -5);
        SNAPFILL_ASSERT_OK(b->Upload(keep.data(), (*kd)->data(), keep.size() * sizeof(int32_t)));
        SNAPFILL_ASSERT_OK(b->Upload(got.data(), (*od)->data(), got.size() * sizeof(int32_t)));
        SNAPFILL_ASSERT_OK(b->Complement(static_cast<const int32_t*>((*kd)->data()), keep_stride, kept, heads, num,
                                         static_cast<int32_t*>((*od)->data()), out_stride));
        SNAPFILL_ASSERT_OK(b->Download((*od)->data(), got.data(), got.size() * sizeof(int32_t)));
        EXPECT_EQ(got, want) << heads << " heads, " << kept << " of " << num << " kept, device operands";
        std::vector<int32_t> on_host(want.size(), -5);
        SNAPFILL_ASSERT_OK(b->Complement(keep.data(), keep_stride, kept, heads, num, on_host.data(), out_stride));
        EXPECT_EQ(on_host, want) << heads << " heads, " << kept << " of " << num << " kept, host operands";
      }
    }
  }
}

// DownloadAsync into page-locked memory: each copy holds the source as it
// was when queued (a kernel that rewrites the source after it is ordered
// after it), the bytes are there once a fence at or after the copy's is
// waited for, and fences grow; many copies in flight recycle their events.
TEST(CudaBackend, DownloadAsyncHoldsTheBytesAfterItsFence) {
  CUDA_BACKEND_OR_SKIP(b, false);
  const int64_t n = 1 << 20;
  std::vector<float> x = Normal(n, 3);
  auto src = Uploaded(*b, x);
  auto host = b->NewHostBuffer(2 * n * sizeof(float));
  SNAPFILL_ASSERT_OK(host);
  ASSERT_NE((*host)->host(), nullptr);
  float* h = static_cast<float*>((*host)->host());
  auto first = b->DownloadAsync(src->data(), h, n * sizeof(float));
  SNAPFILL_ASSERT_OK(first);
  SNAPFILL_ASSERT_OK(b->Scale(src->f32(), n, 2.0f));  // (queued after the copy)
  auto second = b->DownloadAsync(src->data(), h + n, n * sizeof(float));
  SNAPFILL_ASSERT_OK(second);
  EXPECT_GT(*second, *first);
  SNAPFILL_ASSERT_OK(b->WaitDownload(*second));
  EXPECT_EQ(std::vector<float>(h, h + n), x);
  for (float& v : x) v *= 2.0f;
  EXPECT_EQ(std::vector<float>(h + n, h + 2 * n), x);
  uint64_t last = 0;
  for (int i = 0; i < 100; ++i) {
    auto f = b->DownloadAsync(src->f32() + i, h + i, sizeof(float));
    SNAPFILL_ASSERT_OK(f);
    EXPECT_GT(*f, last);
    last = *f;
    if (i % 7 == 0) {
      SNAPFILL_ASSERT_OK(b->WaitDownload(*f));
    }
  }
  SNAPFILL_ASSERT_OK(b->WaitDownload(last));
  for (int i = 0; i < 100; ++i) ASSERT_EQ(h[i], x[i]) << i;
}

// The whole engine with the backend's buffers on the device computes the
// bits it computes with them in host memory (BackendOptions::host_buffers,
// how the backend ran before): a question-guided IMDC prefill with
// eviction and 8 decoded tokens, for each architecture's extra ops (Qwen's
// biases, Gemma's embedding scale and sliding-window layers), the recall
// tier (the evicted rows found and gathered on the device, copied to the
// host a layer behind; the host buffers' run selects on the host and hands
// the store its rows), the gate, the
// window's votes alone, and a question's largest weights with half the
// share (the log-denominators, the last step's Fill and the second pick on
// the device), and context reconstruction. The question's runs (spans of
// 32), the window's and the stored scores' (gate, reconstruct: made on the
// device, the memory's kept there too) select on the device, their kept
// indices there: the host's selection's indices, to the bit.
TEST(CudaBackend, DeviceBuffersComputeWhatHostBuffersDo) {
  struct Case {
    const char* architecture;
    testing::EngineScores scores;
  };
  for (const Case& c :
       {Case{"llama", testing::EngineScores::kGuided}, Case{"qwen2", testing::EngineScores::kGuided},
        Case{"gemma3", testing::EngineScores::kGuided}, Case{"llama", testing::EngineScores::kGuidedRecall},
        Case{"llama", testing::EngineScores::kGate}, Case{"llama", testing::EngineScores::kWindow},
        Case{"gemma3", testing::EngineScores::kWindow}, Case{"qwen2", testing::EngineScores::kGuidedShareMax},
        Case{"gemma3", testing::EngineScores::kReconstruct}}) {
    SCOPED_TRACE(::testing::Message() << c.architecture << ", scores " << static_cast<int>(c.scores));
    CUDA_BACKEND_OR_SKIP(device, true);
    std::string why;
    std::unique_ptr<Backend> host = MakeCuda(true, &why, /*host_buffers=*/true);
    ASSERT_NE(host, nullptr) << why;
    const std::unique_ptr<LlamaModel> model = testing::EngineRunModel(c.architecture);
    const testing::EngineOutcome want = testing::PrefillAndDecode(*model, host.get(), c.scores);
    const testing::EngineOutcome got = testing::PrefillAndDecode(*model, device.get(), c.scores);
    testing::ExpectSameOutcome(want, got);
  }
}

}  // namespace
}  // namespace snapfill
