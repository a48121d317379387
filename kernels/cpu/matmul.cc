// Quantized and float matrix products on the CPU; see matmul.h. The kernels
// are in matmul_variant.inc, compiled here once per x86-64 level
// (cpu_variants.h); the functions of matmul.h forward to the active level's
// copy.
#include "kernels/cpu/matmul.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <deque>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_variants.h"
#include "kernels/cpu/matmul_amx.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/spin_team.h"
#include "kernels/quant_blocks.h"

#if SNAPFILL_CPU_HAS_VARIANTS
// GCC 12's AVX-512 intrinsics initialize their "undefined" operands with
// themselves, which trips -Wuninitialized once inlined; the warning points
// into the header, so silencing it around the include is enough.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace snapfill::cpu::internal {
// MatMulImpl, for every level's copy.
std::atomic<int> g_matmul_impl{static_cast<int>(MatMulImpl::kAuto)};

// The packed operands' scratch starts on a cache line: malloc gives 16-byte
// alignment, with which a kernel's 32-byte loads can split lines.
template <class T>
struct LineAllocator {
  using value_type = T;
  LineAllocator() = default;
  template <class U>
  LineAllocator(const LineAllocator<U>&) {}  // NOLINT(google-explicit-constructor): rebinding
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{64}); }
  template <class U>
  bool operator==(const LineAllocator<U>&) const {
    return true;
  }
};
template <class T>
using LineVector = std::vector<T, LineAllocator<T>>;
}  // namespace snapfill::cpu::internal

#define SNAPFILL_CPU_VARIANT_BODY "kernels/cpu/matmul_variant.inc"
#define SNAPFILL_CPU_WANT_AVXVNNI
#include "kernels/cpu/cpu_variants_foreach.inc"
#undef SNAPFILL_CPU_VARIANT_BODY
#undef SNAPFILL_CPU_WANT_AVXVNNI

namespace snapfill::cpu {

bool MatMulSupports(GgmlType type) { return IsSupportedWeightType(type); }
bool MatMulQuantizesActivations(GgmlType type) {
  return MatMulSupports(type) && generic::MatMulQuantizesActivations(type);  // (RowsToF32: one list for all levels)
}
bool MatMulQuantizesActivations(GgmlType type, int64_t m) {
  return MatMulSupports(type) && generic::MatMulQuantizesActivations(type, m);
}

void SetMatMulImpl(MatMulImpl impl) {
  internal::g_matmul_impl.store(static_cast<int>(impl), std::memory_order_relaxed);
}

MatMulImpl ActiveMatMulImpl() {
  return static_cast<MatMulImpl>(internal::g_matmul_impl.load(std::memory_order_relaxed));
}

const char* ProductPathName(MatMulImpl impl) {
  // Each implementation falls to the next path where the CPU lacks its own
  // (the order of UseAmxBf16, UseAmx and PickPackedIsa).
  switch (impl) {
    case MatMulImpl::kGeneric: return "portable";
    case MatMulImpl::kAuto:
      if (MatMulHasAmxBf16()) return "amx-bf16";
      [[fallthrough]];
    case MatMulImpl::kAmxInt8:
      if (MatMulHasAmx()) return "amx-int8";
      [[fallthrough]];
    case MatMulImpl::kNoAmx:
      if (MatMulHasSimd()) return "avx512-vnni";
      [[fallthrough]];
    case MatMulImpl::kAvx2:
      if (MatMulHasAvx2()) return MatMulHasAvxVnni() ? "avx-vnni" : "avx2";
      return "portable";
  }
  return "portable";
}

std::vector<MatMulImpl> AvailableProductImpls() {
  std::vector<MatMulImpl> out = {MatMulImpl::kAuto};
  std::vector<std::string_view> names = {ProductPathName(MatMulImpl::kAuto)};
  for (MatMulImpl impl : {MatMulImpl::kAmxInt8, MatMulImpl::kNoAmx, MatMulImpl::kAvx2}) {
    const std::string_view name = ProductPathName(impl);
    if (name == "portable" || std::find(names.begin(), names.end(), name) != names.end()) continue;
    out.push_back(impl);
    names.push_back(name);
  }
  return out;
}

std::vector<ProductRate> MeasureProductImpls(GgmlType type, int64_t m, int64_t k, int64_t n) {
  const int64_t row_bytes = RowBytes(type, k);
  std::vector<ProductRate> rates;
  if (!MatMulSupports(type) || row_bytes <= 0 || m <= 0 || n <= 0) return rates;
  // Bytes of at most 0x3B: every f16 / bf16 / f32 field they form is finite
  // (its exponent below the maximum), whatever the block layout.
  uint32_t state = 2463534242u;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return state;
  };
  std::vector<uint8_t> w(static_cast<size_t>(row_bytes * n));
  for (uint8_t& b : w) b = static_cast<uint8_t>(next() & 0x3B);
  std::vector<float> x(static_cast<size_t>(m * k)), y(static_cast<size_t>(m * n));
  for (float& f : x) f = static_cast<float>(next() >> 8) / 16777216.0f - 0.5f;
  const double ops = 2.0 * m * n * k;
  const MatMulImpl was = ActiveMatMulImpl();
  for (MatMulImpl impl : AvailableProductImpls()) {
    SetMatMulImpl(impl);
    rates.push_back({impl, BestRateGops(ops, [&] {
                       MatMul(x.data(), m, k, k, w.data(), type, n, static_cast<size_t>(row_bytes), y.data(), n);
                     })});
  }
  SetMatMulImpl(was);
  return rates;
}

bool MatMulHasSimd() { SNAPFILL_CPU_DISPATCH(MatMulHasSimd); }
bool MatMulHasAvx2() { SNAPFILL_CPU_DISPATCH(MatMulHasAvx2); }
bool MatMulHasAvxVnni() { SNAPFILL_CPU_DISPATCH(MatMulHasAvxVnni); }
bool MatMulHasDecodeLayout() { SNAPFILL_CPU_DISPATCH(MatMulHasDecodeLayout); }
bool MatMulHasAmx() { SNAPFILL_CPU_DISPATCH(MatMulHasAmx); }
bool MatMulHasAmxBf16() { SNAPFILL_CPU_DISPATCH(MatMulHasAmxBf16); }

uint64_t ProductScratchBytes(int64_t m, int64_t widest, int64_t ffn_dim, int threads) {
  if (m < internal::kAmxMinTokens || ActiveMatMulImpl() != MatMulImpl::kAuto || !MatMulHasAmxBf16()) return 0;
  return internal::AmxBf16ScratchBytes(m, widest, ffn_dim, threads);
}
bool MatMulReadsDecodeLayout(GgmlType type) { SNAPFILL_CPU_DISPATCH(MatMulReadsDecodeLayout, type); }

void MatMul(const float* x, int64_t m, int64_t k, int64_t x_stride, const void* w, GgmlType w_type, int64_t n,
            size_t w_row_bytes, float* y, int64_t y_stride) {
  SNAPFILL_CPU_DISPATCH(MatMul, x, m, k, x_stride, w, w_type, n, w_row_bytes, y, y_stride);
}

void MatMulShared(const float* x, int64_t m, int64_t k, int64_t x_stride, GgmlType w_type, const MatMulOut* outs,
                  int count) {
  SNAPFILL_CPU_DISPATCH(MatMulShared, x, m, k, x_stride, w_type, outs, count);
}

void MatMulSwiGlu(float* gate, const float* up, int64_t m, int64_t k, int64_t x_stride, const void* w,
                  GgmlType w_type, int64_t n, size_t w_row_bytes, float* y, int64_t y_stride, bool add) {
  SNAPFILL_CPU_DISPATCH(MatMulSwiGlu, gate, up, m, k, x_stride, w, w_type, n, w_row_bytes, y, y_stride, add);
}

void MatMulAdd(const float* x, int64_t m, int64_t k, int64_t x_stride, const void* w, GgmlType w_type, int64_t n,
               size_t w_row_bytes, float* y, int64_t y_stride) {
  SNAPFILL_CPU_DISPATCH(MatMulAdd, x, m, k, x_stride, w, w_type, n, w_row_bytes, y, y_stride);
}

bool MatMulFuses(GgmlType w_type, int64_t m, int64_t k, size_t w_row_bytes) {
  SNAPFILL_CPU_DISPATCH(MatMulFuses, w_type, m, k, w_row_bytes);
}

void FeedForward(const float* x, int64_t m, int64_t k, int64_t x_stride, const void* gate, const void* up,
                 GgmlType gu_type, int64_t n_ff, size_t gu_row_bytes, const void* down, GgmlType d_type, int64_t n,
                 size_t d_row_bytes, float* y, int64_t y_stride, bool add, const RowNorm& norm) {
  SNAPFILL_CPU_DISPATCH(FeedForward, x, m, k, x_stride, gate, up, gu_type, n_ff, gu_row_bytes, down, d_type, n,
                        d_row_bytes, y, y_stride, add, norm);
}

void NormMatMulShared(const float* x, int64_t m, int64_t k, int64_t x_stride, const RowNorm& norm, GgmlType w_type,
                      const MatMulOut* outs, int count) {
  SNAPFILL_CPU_DISPATCH(NormMatMulShared, x, m, k, x_stride, norm, w_type, outs, count);
}

bool FeedForwardFuses(GgmlType gu_type, GgmlType d_type, int64_t m, int64_t k, int64_t n_ff, size_t gu_row_bytes,
                      size_t d_row_bytes) {
  SNAPFILL_CPU_DISPATCH(FeedForwardFuses, gu_type, d_type, m, k, n_ff, gu_row_bytes, d_row_bytes);
}

void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t k) {
  SNAPFILL_CPU_DISPATCH(DequantizeRow, type, src, dst, k);
}

void QuantizeActivationsForTesting(GgmlType w_type, const float* x, int64_t k, uint8_t* q, float* s, float* aux) {
  SNAPFILL_CPU_DISPATCH(QuantizeActivationsForTesting, w_type, x, k, q, s, aux);
}
void QuantizeRowQ8_0(const float* x, void* y, int64_t k) { SNAPFILL_CPU_DISPATCH(QuantizeRowQ8_0, x, y, k); }
void QuantizeRowQ8_1(const float* x, void* y, int64_t k) { SNAPFILL_CPU_DISPATCH(QuantizeRowQ8_1, x, y, k); }
void QuantizeRowQ8_K(const float* x, void* y, int64_t k) { SNAPFILL_CPU_DISPATCH(QuantizeRowQ8_K, x, y, k); }

size_t DecodePackedBytes(GgmlType type, int64_t n, int64_t k) {
  SNAPFILL_CPU_DISPATCH(DecodePackedBytes, type, n, k);
}

void PackForDecode(const void* w, GgmlType type, int64_t n, int64_t k, size_t w_row_bytes, void* out) {
  SNAPFILL_CPU_DISPATCH(PackForDecode, w, type, n, k, w_row_bytes, out);
}

void MatMulDecodePacked(const float* x, int64_t k, const void* packed, GgmlType type, int64_t n, float* y) {
  SNAPFILL_CPU_DISPATCH(MatMulDecodePacked, x, k, packed, type, n, y);
}

void MatMulDecodePackedShared(const float* x, int64_t k, GgmlType type, const DecodeOut* outs, int count) {
  SNAPFILL_CPU_DISPATCH(MatMulDecodePackedShared, x, k, type, outs, count);
}

}  // namespace snapfill::cpu
