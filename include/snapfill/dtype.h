// Tensor element types, numbered as in GGUF/ggml so that a type read from a
// file can be used directly. Pure std: kernels include this header too.
#ifndef SNAPFILL_DTYPE_H_
#define SNAPFILL_DTYPE_H_

#include <cstddef>
#include <cstdint>

namespace snapfill {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

// Layout of one type: `block_size` elements are stored in `type_size` bytes.
struct GgmlTypeTraits {
  const char* name;     // "Q4_1"; nullptr for an id that names no type
  int64_t block_size;   // elements per block (1 for plain types)
  int64_t type_size;    // bytes per block
};

// Returns the traits of `type`, or {nullptr, 0, 0} for an unknown id.
constexpr GgmlTypeTraits GetTypeTraits(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return {"F32", 1, 4};
    case GgmlType::kF16: return {"F16", 1, 2};
    case GgmlType::kQ4_0: return {"Q4_0", 32, 18};
    case GgmlType::kQ4_1: return {"Q4_1", 32, 20};
    case GgmlType::kQ5_0: return {"Q5_0", 32, 22};
    case GgmlType::kQ5_1: return {"Q5_1", 32, 24};
    case GgmlType::kQ8_0: return {"Q8_0", 32, 34};
    case GgmlType::kQ8_1: return {"Q8_1", 32, 36};
    case GgmlType::kQ2_K: return {"Q2_K", 256, 84};
    case GgmlType::kQ3_K: return {"Q3_K", 256, 110};
    case GgmlType::kQ4_K: return {"Q4_K", 256, 144};
    case GgmlType::kQ5_K: return {"Q5_K", 256, 176};
    case GgmlType::kQ6_K: return {"Q6_K", 256, 210};
    case GgmlType::kQ8_K: return {"Q8_K", 256, 292};
    case GgmlType::kIQ2_XXS: return {"IQ2_XXS", 256, 66};
    case GgmlType::kIQ2_XS: return {"IQ2_XS", 256, 74};
    case GgmlType::kIQ3_XXS: return {"IQ3_XXS", 256, 98};
    case GgmlType::kIQ1_S: return {"IQ1_S", 256, 50};
    case GgmlType::kIQ4_NL: return {"IQ4_NL", 32, 18};
    case GgmlType::kIQ3_S: return {"IQ3_S", 256, 110};
    case GgmlType::kIQ2_S: return {"IQ2_S", 256, 82};
    case GgmlType::kIQ4_XS: return {"IQ4_XS", 256, 136};
    case GgmlType::kI8: return {"I8", 1, 1};
    case GgmlType::kI16: return {"I16", 1, 2};
    case GgmlType::kI32: return {"I32", 1, 4};
    case GgmlType::kI64: return {"I64", 1, 8};
    case GgmlType::kF64: return {"F64", 1, 8};
    case GgmlType::kIQ1_M: return {"IQ1_M", 256, 56};
    case GgmlType::kBF16: return {"BF16", 1, 2};
    case GgmlType::kTQ1_0: return {"TQ1_0", 256, 54};
    case GgmlType::kTQ2_0: return {"TQ2_0", 256, 66};
    case GgmlType::kMXFP4: return {"MXFP4", 32, 17};
  }
  return {nullptr, 0, 0};
}

// Returns true for the weight types snapfill can compute with.
constexpr bool IsSupportedWeightType(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

// Returns the bytes of one row of `n` elements, or -1 if `n` is not a whole
// number of blocks or the type is unknown.
constexpr int64_t RowBytes(GgmlType type, int64_t n) {
  const GgmlTypeTraits t = GetTypeTraits(type);
  if (t.block_size <= 0 || n < 0 || n % t.block_size != 0) return -1;
  return n / t.block_size * t.type_size;
}

}  // namespace snapfill

#endif  // SNAPFILL_DTYPE_H_
