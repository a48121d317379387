#include "tools/testmodel/gguf_writer.h"

#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "snapfill/status.h"
#include "src/base/file_util.h"

namespace snapfill {
namespace {

constexpr uint32_t kMaxValueType = static_cast<uint32_t>(GgufValueType::kFloat64);
constexpr size_t kMaxDims = 4;

absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }


// Range of a stored integer type, for AddValue's fit check.
uint64_t UnsignedMax(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
      return std::numeric_limits<uint8_t>::max();
    case GgufValueType::kUint16:
      return std::numeric_limits<uint16_t>::max();
    case GgufValueType::kUint32:
      return std::numeric_limits<uint32_t>::max();
    default:
      return std::numeric_limits<uint64_t>::max();
  }
}
std::pair<int64_t, int64_t> SignedRange(GgufValueType t) {
  switch (t) {
    case GgufValueType::kInt8:
      return {INT8_MIN, INT8_MAX};
    case GgufValueType::kInt16:
      return {INT16_MIN, INT16_MAX};
    case GgufValueType::kInt32:
      return {INT32_MIN, INT32_MAX};
    default:
      return {INT64_MIN, INT64_MAX};
  }
}

template <typename T>
void PutRaw(std::string& out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));  // little-endian host, as GGUF
  out.append(buf, sizeof(T));
}

void PutString(std::string& out, std::string_view s) {
  PutRaw<uint64_t>(out, s.size());
  out.append(s.data(), s.size());
}

// Scalar encoders; values were range-checked when added.
void PutUnsigned(std::string& out, GgufValueType t, uint64_t v) {
  switch (t) {
    case GgufValueType::kUint8:
      PutRaw<uint8_t>(out, static_cast<uint8_t>(v));
      break;
    case GgufValueType::kUint16:
      PutRaw<uint16_t>(out, static_cast<uint16_t>(v));
      break;
    case GgufValueType::kUint32:
      PutRaw<uint32_t>(out, static_cast<uint32_t>(v));
      break;
    default:
      PutRaw<uint64_t>(out, v);
      break;
  }
}
void PutSigned(std::string& out, GgufValueType t, int64_t v) {
  switch (t) {
    case GgufValueType::kInt8:
      PutRaw<int8_t>(out, static_cast<int8_t>(v));
      break;
    case GgufValueType::kInt16:
      PutRaw<int16_t>(out, static_cast<int16_t>(v));
      break;
    case GgufValueType::kInt32:
      PutRaw<int32_t>(out, static_cast<int32_t>(v));
      break;
    default:
      PutRaw<int64_t>(out, v);
      break;
  }
}
void PutFloat(std::string& out, GgufValueType t, double v) {
  if (t == GgufValueType::kFloat32) {
    PutRaw<float>(out, static_cast<float>(v));
  } else {
    PutRaw<double>(out, v);
  }
}

void PutValue(std::string& out, const GgufValue& v) {
  PutRaw<uint32_t>(out, static_cast<uint32_t>(v.type));
  const GgufValueType t = v.type == GgufValueType::kArray ? v.array_type : v.type;
  if (v.type == GgufValueType::kArray) {
    PutRaw<uint32_t>(out, static_cast<uint32_t>(t));
    PutRaw<uint64_t>(out, v.size());
  }
  std::visit(
      [&](const auto& x) {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, uint64_t>) {
          PutUnsigned(out, t, x);
        } else if constexpr (std::is_same_v<X, int64_t>) {
          PutSigned(out, t, x);
        } else if constexpr (std::is_same_v<X, double>) {
          PutFloat(out, t, x);
        } else if constexpr (std::is_same_v<X, bool>) {
          PutRaw<uint8_t>(out, x ? 1 : 0);
        } else if constexpr (std::is_same_v<X, std::string>) {
          PutString(out, x);
        } else if constexpr (std::is_same_v<X, std::vector<uint64_t>>) {
          for (uint64_t e : x) PutUnsigned(out, t, e);
        } else if constexpr (std::is_same_v<X, std::vector<int64_t>>) {
          for (int64_t e : x) PutSigned(out, t, e);
        } else if constexpr (std::is_same_v<X, std::vector<double>>) {
          for (double e : x) PutFloat(out, t, e);
        } else if constexpr (std::is_same_v<X, std::vector<bool>>) {
          for (bool e : x) PutRaw<uint8_t>(out, e ? 1 : 0);
        } else {
          static_assert(std::is_same_v<X, std::vector<std::string>>);
          for (const std::string& e : x) PutString(out, e);
        }
      },
      v.value);
}

// Returns the variant index GgufValue uses for a value (or array elements) of
// type `t`: 0 uint64_t, 1 int64_t, 2 double, 3 bool, 4 string; +5 for arrays.
size_t ExpectedIndex(GgufValueType t, bool array) {
  size_t i = 4;
  if (IsGgufUnsigned(t)) i = 0;
  if (IsGgufSigned(t)) i = 1;
  if (IsGgufFloat(t)) i = 2;
  if (t == GgufValueType::kBool) i = 3;
  return array ? i + 5 : i;
}

absl::Status CheckFits(std::string_view key, GgufValueType t, const GgufValue& v) {
  auto out_of_range = [&](auto x) {
    return absl::InvalidArgumentError(absl::StrCat("metadata key '", Sv(key), "': value ", x,
                                                   " does not fit in ", GgufValueTypeName(t)));
  };
  auto check_u = [&](uint64_t x) -> absl::Status {
    return x > UnsignedMax(t) ? out_of_range(x) : absl::OkStatus();
  };
  auto check_s = [&](int64_t x) -> absl::Status {
    auto [lo, hi] = SignedRange(t);
    return (x < lo || x > hi) ? out_of_range(x) : absl::OkStatus();
  };
  if (const auto* u = std::get_if<uint64_t>(&v.value)) return check_u(*u);
  if (const auto* s = std::get_if<int64_t>(&v.value)) return check_s(*s);
  if (const auto* us = std::get_if<std::vector<uint64_t>>(&v.value)) {
    for (uint64_t x : *us) SNAPFILL_RETURN_IF_ERROR(check_u(x));
  }
  if (const auto* ss = std::get_if<std::vector<int64_t>>(&v.value)) {
    for (int64_t x : *ss) SNAPFILL_RETURN_IF_ERROR(check_s(x));
  }
  return absl::OkStatus();
}

}  // namespace

void GgufWriter::Put(std::string_view key, GgufValue value) {
  for (GgufKv& kv : kvs_) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  }
  kvs_.push_back(GgufKv{std::string(key), std::move(value)});
}

absl::Status GgufWriter::SetAlignment(uint32_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("alignment ", alignment, " is not a nonzero power of two"));
  }
  alignment_ = alignment;
  AddUint32("general.alignment", alignment);
  return absl::OkStatus();
}

void GgufWriter::AddString(std::string_view key, std::string_view value) {
  Put(key, GgufValue{GgufValueType::kString, GgufValueType::kUint8, std::string(value)});
}
void GgufWriter::AddUint32(std::string_view key, uint32_t value) {
  Put(key, GgufValue{GgufValueType::kUint32, GgufValueType::kUint8, uint64_t{value}});
}
void GgufWriter::AddInt32(std::string_view key, int32_t value) {
  Put(key, GgufValue{GgufValueType::kInt32, GgufValueType::kUint8, int64_t{value}});
}
void GgufWriter::AddUint64(std::string_view key, uint64_t value) {
  Put(key, GgufValue{GgufValueType::kUint64, GgufValueType::kUint8, value});
}
void GgufWriter::AddFloat32(std::string_view key, float value) {
  Put(key, GgufValue{GgufValueType::kFloat32, GgufValueType::kUint8, double{value}});
}
void GgufWriter::AddBool(std::string_view key, bool value) {
  Put(key, GgufValue{GgufValueType::kBool, GgufValueType::kUint8, value});
}
void GgufWriter::AddStringArray(std::string_view key, const std::vector<std::string>& values) {
  Put(key, GgufValue{GgufValueType::kArray, GgufValueType::kString, values});
}
void GgufWriter::AddFloat32Array(std::string_view key, const std::vector<float>& values) {
  Put(key, GgufValue{GgufValueType::kArray, GgufValueType::kFloat32,
                     std::vector<double>(values.begin(), values.end())});
}
void GgufWriter::AddInt32Array(std::string_view key, const std::vector<int32_t>& values) {
  Put(key, GgufValue{GgufValueType::kArray, GgufValueType::kInt32,
                     std::vector<int64_t>(values.begin(), values.end())});
}

absl::Status GgufWriter::AddValue(std::string_view key, GgufValue value) {
  const uint32_t type_id = static_cast<uint32_t>(value.type);
  if (type_id > kMaxValueType) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata key '", Sv(key), "': unknown value type id ", type_id));
  }
  const bool is_array = value.type == GgufValueType::kArray;
  const GgufValueType elem = is_array ? value.array_type : value.type;
  if (is_array) {
    const uint32_t elem_id = static_cast<uint32_t>(elem);
    if (elem_id > kMaxValueType || elem == GgufValueType::kArray) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metadata key '", Sv(key), "': unsupported array element type id ", elem_id));
    }
  }
  const size_t want = ExpectedIndex(elem, is_array);
  if (value.value.index() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metadata key '", Sv(key), "': value holds variant alternative ", value.value.index(),
        " but type ", is_array ? "array of " : "", GgufValueTypeName(elem), " needs ", want));
  }
  SNAPFILL_RETURN_IF_ERROR(CheckFits(key, elem, value));
  Put(key, std::move(value));
  return absl::OkStatus();
}

absl::Status GgufWriter::CheckTensor(std::string_view name, GgmlType type, const std::vector<int64_t>& shape,
                                     uint64_t* bytes_out) const {
  const std::string where = absl::StrCat("tensor ", Sv(name));
  for (const Tensor& t : tensors_) {
    if (t.name == name) return absl::InvalidArgumentError(absl::StrCat(where, ": already added"));
  }
  const GgmlTypeTraits traits = GetTypeTraits(type);
  if (traits.name == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unknown ggml type id ", static_cast<uint32_t>(type)));
  }
  if (shape.empty() || shape.size() > kMaxDims) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", shape.size(), " dimensions; expected 1..", kMaxDims));
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": dimension ", d, " is ", shape[d], "; expected > 0"));
    }
  }
  if (shape[0] % traits.block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ne[0] = ", shape[0],
                                                   " is not a multiple of the ", traits.name,
                                                   " block size ", traits.block_size));
  }
  uint64_t bytes = 0;
  bool overflow = __builtin_mul_overflow(static_cast<uint64_t>(shape[0] / traits.block_size),
                                         static_cast<uint64_t>(traits.type_size), &bytes);
  for (size_t d = 1; d < shape.size() && !overflow; ++d) {
    overflow = __builtin_mul_overflow(bytes, static_cast<uint64_t>(shape[d]), &bytes);
  }
  if (overflow) return absl::InvalidArgumentError(absl::StrCat(where, ": byte size overflows"));
  *bytes_out = bytes;
  return absl::OkStatus();
}

absl::Status GgufWriter::AddTensor(std::string_view name, GgmlType type, std::vector<int64_t> shape,
                                   std::string_view data) {
  uint64_t bytes = 0;
  SNAPFILL_RETURN_IF_ERROR(CheckTensor(name, type, shape, &bytes));
  if (bytes != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", Sv(name), ": shape and type ",
                                                   GetTypeTraits(type).name, " need ", bytes,
                                                   " bytes but ", data.size(), " were given"));
  }
  tensors_.push_back(Tensor{std::string(name), type, std::move(shape), std::string(data), bytes, nullptr});
  return absl::OkStatus();
}

absl::Status GgufWriter::AddTensorGenerated(std::string_view name, GgmlType type, std::vector<int64_t> shape,
                                            TensorFill fill) {
  uint64_t bytes = 0;
  SNAPFILL_RETURN_IF_ERROR(CheckTensor(name, type, shape, &bytes));
  if (!fill) return absl::InvalidArgumentError(absl::StrCat("tensor ", Sv(name), ": no fill function"));
  tensors_.push_back(Tensor{std::string(name), type, std::move(shape), std::string(), bytes, std::move(fill)});
  return absl::OkStatus();
}

absl::Status GgufWriter::AddTensorF32(std::string_view name, std::vector<int64_t> shape,
                                      const std::vector<float>& values) {
  std::string_view bytes(reinterpret_cast<const char*>(values.data()),
                         values.size() * sizeof(float));
  return AddTensor(name, GgmlType::kF32, std::move(shape), bytes);
}

std::string GgufWriter::Head() const {
  std::string out;
  out.append("GGUF", 4);
  PutRaw<uint32_t>(out, version_);
  PutRaw<uint64_t>(out, tensors_.size());
  PutRaw<uint64_t>(out, kvs_.size());
  for (const GgufKv& kv : kvs_) {
    PutString(out, kv.key);
    PutValue(out, kv.value);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    PutString(out, t.name);
    PutRaw<uint32_t>(out, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) PutRaw<int64_t>(out, d);
    PutRaw<uint32_t>(out, static_cast<uint32_t>(t.type));
    PutRaw<uint64_t>(out, offset);
    offset += (t.bytes + alignment_ - 1) / alignment_ * alignment_;
  }
  out.resize((out.size() + alignment_ - 1) / alignment_ * alignment_, '\0');
  return out;
}

std::string GgufWriter::Serialize() const {
  std::string out = Head();
  for (const Tensor& t : tensors_) {
    if (t.fill) {
      const size_t at = out.size();
      out.resize(at + t.bytes);
      t.fill(out.data() + at, t.bytes);
    } else {
      out.append(t.data);
    }
    out.resize((out.size() + alignment_ - 1) / alignment_ * alignment_, '\0');
  }
  return out;
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  // A temporary beside the file, synced and renamed over it: a reader never
  // sees half a model.
  SNAPFILL_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> out, AtomicFileWriter::Create(path, /*overwrite=*/true));
  SNAPFILL_RETURN_IF_ERROR(out->Write(Head()));
  // Tensor i's bytes are written on a second thread while tensor i + 1 is
  // filled: two buffers, each grown to the largest generated tensor it held.
  // One write is in flight at a time, so the writer is used by one thread at
  // a time (the future's wait orders the hand-over).
  const std::string zeros(alignment_, '\0');
  struct Buffer {
    std::unique_ptr<char[]> data;
    uint64_t capacity = 0;
  };
  Buffer buffers[2];
  std::future<absl::Status> pending;
  auto wait_pending = [&]() -> absl::Status {
    if (!pending.valid()) return absl::OkStatus();
    return pending.get();
  };
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    std::string_view bytes = t.data;
    if (t.fill) {
      // This buffer's last write (tensor i - 2) finished before tensor i - 1's began.
      Buffer& b = buffers[i % 2];
      if (t.bytes > b.capacity) {
        b.data.reset();
        b.data.reset(new char[t.bytes]);
        b.capacity = t.bytes;
      }
      t.fill(b.data.get(), t.bytes);
      bytes = std::string_view(b.data.get(), t.bytes);
    }
    SNAPFILL_RETURN_IF_ERROR(wait_pending());
    const uint64_t pad = (alignment_ - t.bytes % alignment_) % alignment_;
    pending = std::async(std::launch::async, [&out, &zeros, bytes, pad]() -> absl::Status {
      SNAPFILL_RETURN_IF_ERROR(out->Write(bytes));
      return out->Write(std::string_view(zeros.data(), pad));
    });
  }
  SNAPFILL_RETURN_IF_ERROR(wait_pending());
  return out->Commit();
}

}  // namespace snapfill
