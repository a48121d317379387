// Row-scaled int8, scalar: the recall store's q8 records, one per row of
// `dim` floats:
//   [f32 scale = max|x| / 127][dim int8 q = round-half-even(x · (1 / scale))]
// (4 + dim bytes, the scale's bytes as the host's memcpy lays them; a row
// of zeros has scale 0 and every q 0). Each q · scale is within
// max|x| / 254 of its x, half a step. These are the twins of the vector
// kernels (cpu::ToInt8Rows, cuda::ToInt8Rows), which compute the same
// operations in the same order, so the bits agree: the maximum is exact in
// any order, and the division, reciprocal, product and rounding are IEEE's.
// A row holding a NaN or an infinity (the model broke before it) is a
// record of its own, scale NaN and every q 0: each path's maximum and
// float-to-int conversion would treat those values its own way, and the
// record decodes to NaNs, so a recall that scores it reports it. Like
// half.h, they compile for CUDA devices as well.
#ifndef SNAPFILL_BASE_INT8_ROWS_H_
#define SNAPFILL_BASE_INT8_ROWS_H_

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define SNAPFILL_INT8_HOST_DEVICE __host__ __device__
#else
#define SNAPFILL_INT8_HOST_DEVICE
#endif

namespace snapfill {

// One record's bytes.
SNAPFILL_INT8_HOST_DEVICE constexpr int64_t Int8RowBytes(int64_t dim) {
  return static_cast<int64_t>(sizeof(float)) + dim;
}

// The scale of a row whose largest magnitude is `amax`, and the factor its
// values are multiplied by: 0 for a row of zeros, so that every q is 0, and
// for a row under about 3.7e-37, whose reciprocal overflows (an infinite
// factor would make each path's float-to-int conversion give its own
// bytes: the device saturates, x86 gives 0x80000000).
SNAPFILL_INT8_HOST_DEVICE inline float Int8RowScale(float amax) { return amax / 127.0f; }
SNAPFILL_INT8_HOST_DEVICE inline float Int8RowInverse(float scale) {
  const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
  return inverse <= FLT_MAX ? inverse : 0.0f;
}
// |x · inverse| <= 127 by construction; rintf rounds half to even (the
// default rounding mode, and the device's rintf).
SNAPFILL_INT8_HOST_DEVICE inline int8_t Int8Quantize(float x, float inverse) {
  return static_cast<int8_t>(rintf(x * inverse));
}

// Whether a magnitude |x| is a NaN or an infinity.
SNAPFILL_INT8_HOST_DEVICE inline bool Int8NotFinite(float a) { return !(a <= FLT_MAX); }

// The record of a row that is not finite: scale NaN (the quiet NaN's
// bits), every q 0. (q written by the caller on the device, a lane each.)
SNAPFILL_INT8_HOST_DEVICE inline void EncodeInt8NotFiniteScale(uint8_t* out) {
  const uint32_t nan_bits = 0x7FC00000u;
  std::memcpy(out, &nan_bits, sizeof(float));
}
SNAPFILL_INT8_HOST_DEVICE inline void EncodeInt8NotFiniteRow(int64_t dim, uint8_t* out) {
  EncodeInt8NotFiniteScale(out);
  for (int64_t i = 0; i < dim; ++i) out[sizeof(float) + i] = 0;
}

SNAPFILL_INT8_HOST_DEVICE inline void EncodeInt8Row(const float* x, int64_t dim, uint8_t* out) {
  float amax = 0.0f;
  bool not_finite = false;
  for (int64_t i = 0; i < dim; ++i) {
    // (A comparison, not fmaxf: the compiler makes it a vector max where
    // fmaxf stays a library call: 4x slower over a 7B layer's rows.)
    const float a = fabsf(x[i]);
    amax = a > amax ? a : amax;
    not_finite |= Int8NotFinite(a);
  }
  if (not_finite) {
    EncodeInt8NotFiniteRow(dim, out);
    return;
  }
  const float scale = Int8RowScale(amax);
  const float inverse = Int8RowInverse(scale);
  std::memcpy(out, &scale, sizeof(float));
  int8_t* q = reinterpret_cast<int8_t*>(out + sizeof(float));
  for (int64_t i = 0; i < dim; ++i) q[i] = Int8Quantize(x[i], inverse);
}

SNAPFILL_INT8_HOST_DEVICE inline void DecodeInt8Row(const uint8_t* in, int64_t dim, float* x) {
  float scale;
  std::memcpy(&scale, in, sizeof(float));
  const int8_t* q = reinterpret_cast<const int8_t*>(in + sizeof(float));
  for (int64_t i = 0; i < dim; ++i) x[i] = static_cast<float>(q[i]) * scale;
}

// `rows` rows of `dim` floats, one record each, and back.
inline void EncodeInt8Rows(const float* x, int64_t rows, int64_t dim, uint8_t* out) {
  for (int64_t r = 0; r < rows; ++r) EncodeInt8Row(x + r * dim, dim, out + r * Int8RowBytes(dim));
}
inline void DecodeInt8Rows(const uint8_t* in, int64_t rows, int64_t dim, float* x) {
  for (int64_t r = 0; r < rows; ++r) DecodeInt8Row(in + r * Int8RowBytes(dim), dim, x + r * dim);
}

}  // namespace snapfill

#endif  // SNAPFILL_BASE_INT8_ROWS_H_
