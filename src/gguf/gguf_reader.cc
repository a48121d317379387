// GGUF reader implementation. See gguf_reader.h for the file layout.
//
// The parser treats the file as untrusted input (it is fuzzed): every read goes
// through a bounds-checked cursor, every count is checked against the bytes
// that remain before anything is allocated for it, and every size computation
// is overflow-checked. Validation follows ggml's gguf.cpp (gguf_init_from_file)
// with two differences: tensors need not be packed in file order (we only
// require alignment and no overlap), and zero-sized dimensions are rejected.
#include "src/gguf/gguf_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "snapfill/status.h"
#include "src/base/file_util.h"

namespace snapfill {
namespace {

constexpr uint64_t kHeaderBytes = 4 + 4 + 8 + 8;  // magic, version, n_tensors, n_kv
constexpr uint32_t kMaxDims = 4;                  // GGML_MAX_DIMS
constexpr uint64_t kDefaultAlignment = 32;        // GGUF_DEFAULT_ALIGNMENT
// Smallest possible encodings, used to reject absurd counts before allocating:
// a KV is at least an empty key (8) + type (4) + a 1-byte value; a tensor info
// is at least an empty name (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
constexpr uint32_t kMaxValueType = static_cast<uint32_t>(GgufValueType::kFloat64);

// Returns `s` with its message prefixed by `context` and the same code.
absl::Status WithContext(const absl::Status& s, absl::string_view context) {
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

// Our APIs use std::string_view, which this Abseil does not alias.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Bytes of a scalar value of `type` in the file; 8 (the length prefix) for a
// string, the minimum it can occupy. 0 for kArray and unknown ids.
uint64_t MinEncodedSize(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
    case GgufValueType::kString:
      return 8;
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}


// A bounds-checked little-endian cursor over [data, data + size).
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  absl::Status Need(uint64_t n, absl::string_view what) const {
    if (n > remaining()) {
      return absl::DataLossError(absl::StrCat("truncated file: ", what, " needs ", n,
                                              " bytes at offset ", pos_, " but only ", remaining(),
                                              " remain (file has ", size_, " bytes)"));
    }
    return absl::OkStatus();
  }

  absl::Status Skip(uint64_t n, absl::string_view what) {
    SNAPFILL_RETURN_IF_ERROR(Need(n, what));
    pos_ += n;
    return absl::OkStatus();
  }

  template <typename T>
  absl::StatusOr<T> Read(absl::string_view what) {
    static_assert(std::is_trivially_copyable_v<T>);
    SNAPFILL_RETURN_IF_ERROR(Need(sizeof(T), what));
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));  // GGUF is little-endian, as is x86/ARM
    pos_ += sizeof(T);
    return v;
  }

  absl::StatusOr<std::string> ReadString(absl::string_view what) {
    SNAPFILL_ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(what));
    if (len > remaining()) {
      return absl::DataLossError(absl::StrCat(what, ": string length ", len, " at offset ",
                                              pos_ - 8, " exceeds the ", remaining(),
                                              " bytes left in the file"));
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

// Reads one scalar of `type` (not kArray), widened as GgufValue documents.
template <typename Emit>
absl::Status ReadScalar(Cursor& c, GgufValueType type, Emit&& emit) {
  switch (type) {
    case GgufValueType::kUint8: {
      SNAPFILL_ASSIGN_OR_RETURN(uint8_t v, c.Read<uint8_t>("uint8 value"));
      emit(uint64_t{v});
      return absl::OkStatus();
    }
    case GgufValueType::kInt8: {
      SNAPFILL_ASSIGN_OR_RETURN(int8_t v, c.Read<int8_t>("int8 value"));
      emit(int64_t{v});
      return absl::OkStatus();
    }
    case GgufValueType::kUint16: {
      SNAPFILL_ASSIGN_OR_RETURN(uint16_t v, c.Read<uint16_t>("uint16 value"));
      emit(uint64_t{v});
      return absl::OkStatus();
    }
    case GgufValueType::kInt16: {
      SNAPFILL_ASSIGN_OR_RETURN(int16_t v, c.Read<int16_t>("int16 value"));
      emit(int64_t{v});
      return absl::OkStatus();
    }
    case GgufValueType::kUint32: {
      SNAPFILL_ASSIGN_OR_RETURN(uint32_t v, c.Read<uint32_t>("uint32 value"));
      emit(uint64_t{v});
      return absl::OkStatus();
    }
    case GgufValueType::kInt32: {
      SNAPFILL_ASSIGN_OR_RETURN(int32_t v, c.Read<int32_t>("int32 value"));
      emit(int64_t{v});
      return absl::OkStatus();
    }
    case GgufValueType::kUint64: {
      SNAPFILL_ASSIGN_OR_RETURN(uint64_t v, c.Read<uint64_t>("uint64 value"));
      emit(v);
      return absl::OkStatus();
    }
    case GgufValueType::kInt64: {
      SNAPFILL_ASSIGN_OR_RETURN(int64_t v, c.Read<int64_t>("int64 value"));
      emit(v);
      return absl::OkStatus();
    }
    case GgufValueType::kFloat32: {
      SNAPFILL_ASSIGN_OR_RETURN(float v, c.Read<float>("float32 value"));
      emit(double{v});
      return absl::OkStatus();
    }
    case GgufValueType::kFloat64: {
      SNAPFILL_ASSIGN_OR_RETURN(double v, c.Read<double>("float64 value"));
      emit(v);
      return absl::OkStatus();
    }
    case GgufValueType::kBool: {
      SNAPFILL_ASSIGN_OR_RETURN(uint8_t v, c.Read<uint8_t>("bool value"));
      emit(v != 0);
      return absl::OkStatus();
    }
    case GgufValueType::kString: {
      SNAPFILL_ASSIGN_OR_RETURN(std::string v, c.ReadString("string value"));
      emit(std::move(v));
      return absl::OkStatus();
    }
    case GgufValueType::kArray:
      break;
  }
  return absl::InternalError("ReadScalar called with a non-scalar type");
}

// Reads `count` elements of `type` into a vector of the widened element type.
template <typename Elem>
absl::Status ReadArray(Cursor& c, GgufValueType type, uint64_t count, GgufValue* out) {
  std::vector<Elem> v;
  v.reserve(static_cast<size_t>(count));  // count was checked against the file size
  for (uint64_t i = 0; i < count; ++i) {
    absl::Status s = ReadScalar(c, type, [&](auto x) {
      if constexpr (std::is_same_v<decltype(x), Elem>) v.push_back(std::move(x));
    });
    if (!s.ok()) return WithContext(s, absl::StrCat("array element ", i, " of ", count));
  }
  out->value = std::move(v);
  return absl::OkStatus();
}

absl::StatusOr<GgufValue> ReadValue(Cursor& c, uint32_t type_id) {
  if (type_id > kMaxValueType) {
    return absl::DataLossError(
        absl::StrCat("unknown value type id ", type_id, " (expected 0..", kMaxValueType, ")"));
  }
  GgufValue out;
  out.type = static_cast<GgufValueType>(type_id);
  if (out.type != GgufValueType::kArray) {
    SNAPFILL_RETURN_IF_ERROR(ReadScalar(c, out.type, [&](auto x) { out.value = std::move(x); }));
    return out;
  }
  SNAPFILL_ASSIGN_OR_RETURN(uint32_t elem_id, c.Read<uint32_t>("array element type"));
  if (elem_id == static_cast<uint32_t>(GgufValueType::kArray)) {
    return absl::UnimplementedError("nested arrays (array of array) are not supported");
  }
  if (elem_id > kMaxValueType) {
    return absl::DataLossError(absl::StrCat("unknown array element type id ", elem_id,
                                            " (expected 0..", kMaxValueType, ")"));
  }
  out.array_type = static_cast<GgufValueType>(elem_id);
  SNAPFILL_ASSIGN_OR_RETURN(uint64_t count, c.Read<uint64_t>("array length"));
  const uint64_t min_size = MinEncodedSize(out.array_type);
  if (count > c.remaining() / min_size) {
    return absl::DataLossError(
        absl::StrCat("array length ", count, " cannot fit: ", GgufValueTypeName(out.array_type),
                     " elements take at least ", min_size, " bytes each but only ", c.remaining(),
                     " bytes are left in the file"));
  }
  const GgufValueType t = out.array_type;
  absl::Status s;
  if (IsGgufUnsigned(t)) {
    s = ReadArray<uint64_t>(c, t, count, &out);
  } else if (IsGgufSigned(t)) {
    s = ReadArray<int64_t>(c, t, count, &out);
  } else if (IsGgufFloat(t)) {
    s = ReadArray<double>(c, t, count, &out);
  } else if (t == GgufValueType::kBool) {
    s = ReadArray<bool>(c, t, count, &out);
  } else {
    s = ReadArray<std::string>(c, t, count, &out);
  }
  if (!s.ok()) return s;
  return out;
}

// Returns a printable form of up to 4 magic bytes: 'GGUF' or hex.
std::string DescribeMagic(const uint8_t* p, uint64_t n) {
  std::string raw(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
  bool printable =
      std::all_of(raw.begin(), raw.end(), [](char ch) { return ch >= 0x20 && ch < 0x7f; });
  if (printable) return absl::StrCat("'", raw, "'");
  return absl::StrCat("0x", absl::BytesToHexString(raw));
}

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}
bool AddOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_add_overflow(a, b, out);
}

absl::Status ErrnoStatus(int err, absl::string_view what) {
  const std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ENOMEM:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::UnknownError(msg);
  }
}

}  // namespace

const char* GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return "unknown";
}

uint64_t GgufValue::size() const {
  if (type != GgufValueType::kArray) return 1;
  return std::visit(
      [](const auto& v) -> uint64_t {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::string> || !std::is_class_v<V>) {
          return 1;
        } else {
          return v.size();
        }
      },
      value);
}

int64_t GgufTensorInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // the reader checked this product for overflow
  return n;
}

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) munmap(mapping_, static_cast<size_t>(size_));
  if (fd_ >= 0) ::close(fd_);
}

// [data, data + bytes) clipped to the mapping [lo, hi), its ends rounded to
// pages: outward (every page it touches) or inward (the pages wholly inside).
// false if nothing is left.
static bool PageSpan(uintptr_t lo, uintptr_t hi, const void* data, uint64_t bytes, bool outward,
              uintptr_t* first, uintptr_t* last) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = std::max(reinterpret_cast<uintptr_t>(data), lo);
  const auto end = std::min(reinterpret_cast<uintptr_t>(data) + bytes, hi);
  if (end <= begin) return false;
  *first = outward ? begin / page * page : (begin + page - 1) / page * page;
  *last = outward ? (end + page - 1) / page * page : end / page * page;
  return *last > *first;
}

uint64_t GgufFile::Populate(const void* data, uint64_t bytes) const {
  uintptr_t first = 0, last = 0;
  const auto lo = reinterpret_cast<uintptr_t>(base_);
  if (mapping_ == nullptr || !PageSpan(lo, lo + size_, data, bytes, /*outward=*/true, &first, &last)) return 0;
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif
  if (madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_READ) != 0) {
    // Older kernels: a read of each page faults it in.
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    volatile uint8_t sink = 0;
    for (uintptr_t p = std::max(first, lo); p < last; p += page) {
      sink = sink + *reinterpret_cast<const volatile uint8_t*>(p);
    }
  }
  return last - first;
}

absl::Status GgufFile::ReadAt(uint64_t offset, void* dst, uint64_t bytes) const {
  if (offset > size_ || bytes > size_ - offset) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": read of ", bytes, " bytes at ", offset,
                                              " is past the end (", size_, " bytes)"));
  }
  if (fd_ < 0) {
    if (bytes > 0) std::memcpy(dst, base_ + offset, bytes);
    return absl::OkStatus();
  }
  return ReadAllAt(fd_, dst, bytes, offset, path_);
}

uint64_t GgufFile::ReleasePages(const void* data, uint64_t bytes) const {
  uintptr_t first = 0, last = 0;
  const auto lo = reinterpret_cast<uintptr_t>(base_);
  if (mapping_ == nullptr || !PageSpan(lo, lo + size_, data, bytes, /*outward=*/false, &first, &last)) return 0;
  if (madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) return 0;
  return last - first;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  // O_NONBLOCK so that opening a FIFO cannot hang; it is rejected below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat(path, ": cannot open"));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat(path, ": cannot stat"));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": is a directory; expected a GGUF file"));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": is not a regular file; expected a GGUF file"));
  }
  if (st.st_size == 0) {
    ::close(fd);
    return absl::DataLossError(
        absl::StrCat(path, ": file is empty (0 bytes); expected a GGUF header"));
  }
  file->size_ = static_cast<uint64_t>(st.st_size);
  void* m = ::mmap(nullptr, static_cast<size_t>(file->size_), PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  if (m == MAP_FAILED) {
    ::close(fd);
    return ErrnoStatus(err, absl::StrCat(path, ": mmap failed"));
  }
  file->fd_ = fd;
  file->mapping_ = m;
  // Page-sized mappings only: a read in place maps the page it needs (and
  // fault-around's few neighbours), never a 2 MiB folio of the page cache
  // whose other pages belong to tensors read through copies. Where the
  // kernel ignores it, LlamaForward's Populate/ReleasePages still settle
  // the resident set once the copies are made.
  madvise(m, static_cast<size_t>(file->size_), MADV_NOHUGEPAGE);
  file->base_ = static_cast<const uint8_t*>(m);
  absl::Status s = file->Parse();
  if (!s.ok()) return WithContext(s, path);
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(std::string bytes) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  // Copy into a 64-byte-aligned spot of owned_, so tensor data are as aligned
  // in memory as in a mapped file (for any general.alignment up to 64) and
  // SIMD kernels behave the same on files loaded either way.
  constexpr size_t kBufferAlign = 64;
  file->owned_.resize(bytes.size() + kBufferAlign);
  const uintptr_t addr = reinterpret_cast<uintptr_t>(file->owned_.data());
  const size_t skew = (kBufferAlign - addr % kBufferAlign) % kBufferAlign;
  if (!bytes.empty()) std::memcpy(file->owned_.data() + skew, bytes.data(), bytes.size());
  file->base_ = reinterpret_cast<const uint8_t*>(file->owned_.data() + skew);
  file->size_ = bytes.size();
  if (file->size_ == 0) {
    return absl::DataLossError("file is empty (0 bytes); expected a GGUF header");
  }
  SNAPFILL_RETURN_IF_ERROR(file->Parse());
  return file;
}

absl::Status GgufFile::Parse() {
  Cursor c(base_, size_);

  // Header.
  if (size_ < 4 || std::memcmp(base_, "GGUF", 4) != 0) {
    const uint64_t n = std::min<uint64_t>(size_, 4);
    if (size_ < 4 && std::memcmp(base_, "GGUF", static_cast<size_t>(n)) == 0) {
      return absl::DataLossError(
          absl::StrCat("truncated file: ", size_, " bytes is too short for the GGUF magic"));
    }
    return absl::DataLossError(
        absl::StrCat("not a GGUF file: magic is ", DescribeMagic(base_, n), ", expected 'GGUF'"));
  }
  SNAPFILL_RETURN_IF_ERROR(c.Skip(4, "magic"));
  SNAPFILL_ASSIGN_OR_RETURN(version_, c.Read<uint32_t>("version"));
  if (version_ == 1) {
    return absl::UnimplementedError(
        "GGUF version 1 is not supported (it uses 32-bit counts); expected version 2 or 3");
  }
  if (version_ != 2 && version_ != 3) {
    if ((version_ & 0xFFFF) == 0 && version_ != 0) {
      return absl::UnimplementedError(absl::StrCat(
          "GGUF version ", version_, " looks like a big-endian file (byte-swapped version ",
          __builtin_bswap32(version_), "); only little-endian version 2 or 3 is supported"));
    }
    return absl::UnimplementedError(
        absl::StrCat("GGUF version ", version_, " is not supported; expected version 2 or 3"));
  }
  SNAPFILL_ASSIGN_OR_RETURN(const uint64_t n_tensors, c.Read<uint64_t>("tensor count"));
  SNAPFILL_ASSIGN_OR_RETURN(const uint64_t n_kv, c.Read<uint64_t>("metadata count"));
  if (n_kv > c.remaining() / kMinKvBytes) {
    return absl::DataLossError(absl::StrCat(
        "metadata count n_kv = ", n_kv, " cannot fit: each entry takes at least ", kMinKvBytes,
        " bytes but only ", c.remaining(), " bytes follow the header (truncated or corrupt)"));
  }
  if (n_tensors > c.remaining() / kMinTensorInfoBytes) {
    return absl::DataLossError(absl::StrCat("tensor count n_tensors = ", n_tensors,
                                            " cannot fit: each tensor takes at least ",
                                            kMinTensorInfoBytes, " bytes but only ", c.remaining(),
                                            " bytes follow the header (truncated or corrupt)"));
  }

  // Metadata.
  kvs_.reserve(static_cast<size_t>(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string where = absl::StrCat("metadata entry ", i, " of ", n_kv);
    auto key = c.ReadString("key");
    if (!key.ok()) return WithContext(key.status(), where);
    auto type_id = c.Read<uint32_t>("value type");
    if (!type_id.ok()) return WithContext(type_id.status(), absl::StrCat(where, " '", *key, "'"));
    auto value = ReadValue(c, *type_id);
    if (!value.ok()) return WithContext(value.status(), absl::StrCat(where, " '", *key, "'"));
    auto [it, inserted] = kv_index_.emplace(*key, kvs_.size());
    if (!inserted) {
      return absl::DataLossError(absl::StrCat("duplicate metadata key '", *key, "' (entries ",
                                              it->second, " and ", i, ")"));
    }
    kvs_.push_back(GgufKv{std::move(*key), std::move(*value)});
  }

  // general.alignment: uint32 in the spec; any integer type is accepted here.
  alignment_ = kDefaultAlignment;
  if (const GgufValue* a = Find("general.alignment"); a != nullptr) {
    uint64_t align = 0;
    if (IsGgufUnsigned(a->type)) {
      align = std::get<uint64_t>(a->value);
    } else if (IsGgufSigned(a->type) && std::get<int64_t>(a->value) >= 0) {
      align = static_cast<uint64_t>(std::get<int64_t>(a->value));
    } else {
      return absl::DataLossError(absl::StrCat("general.alignment has type ",
                                              GgufValueTypeName(a->type),
                                              "; expected a non-negative uint32"));
    }
    if (align == 0 || (align & (align - 1)) != 0 || align > (uint64_t{1} << 30)) {
      return absl::DataLossError(
          absl::StrCat("general.alignment = ", align, "; expected a nonzero power of two <= 2^30"));
    }
    alignment_ = align;
  }

  // Tensor directory.
  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    auto name_or = c.ReadString("tensor name");
    if (!name_or.ok()) {
      return WithContext(name_or.status(), absl::StrCat("tensor ", i, " of ", n_tensors));
    }
    GgufTensorInfo t;
    t.name = std::move(*name_or);
    const std::string where = absl::StrCat("tensor ", t.name);
    auto n_dims = c.Read<uint32_t>("n_dims");
    if (!n_dims.ok()) return WithContext(n_dims.status(), where);
    if (*n_dims == 0 || *n_dims > kMaxDims) {
      return absl::DataLossError(
          absl::StrCat(where, ": n_dims = ", *n_dims, "; expected 1..", kMaxDims));
    }
    uint64_t num_elements = 1;
    for (uint32_t d = 0; d < *n_dims; ++d) {
      auto ne = c.Read<int64_t>("dimension");
      if (!ne.ok()) return WithContext(ne.status(), where);
      if (*ne <= 0) {
        return absl::DataLossError(
            absl::StrCat(where, ": dimension ", d, " is ", *ne, "; expected a positive size"));
      }
      if (MulOverflows(num_elements, static_cast<uint64_t>(*ne), &num_elements) ||
          num_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::DataLossError(
            absl::StrCat(where, ": element count overflows int64 at dimension ", d));
      }
      t.shape.push_back(*ne);
    }
    auto type_id = c.Read<uint32_t>("tensor type");
    if (!type_id.ok()) return WithContext(type_id.status(), where);
    t.type = static_cast<GgmlType>(*type_id);
    const GgmlTypeTraits traits = GetTypeTraits(t.type);
    if (traits.name == nullptr) {
      return absl::UnimplementedError(absl::StrCat(where, ": unknown ggml type id ", *type_id));
    }
    if (t.shape[0] % traits.block_size != 0) {
      return absl::DataLossError(absl::StrCat(where, ": ne[0] = ", t.shape[0],
                                              " is not a multiple of the ", traits.name,
                                              " block size ", traits.block_size));
    }
    // RowBytes(type, ne[0]) * ne[1] * ..., overflow-checked (RowBytes itself
    // is not, so it is not called with a file-controlled ne[0]).
    uint64_t bytes = 0;
    if (MulOverflows(static_cast<uint64_t>(t.shape[0] / traits.block_size),
                     static_cast<uint64_t>(traits.type_size), &bytes)) {
      return absl::DataLossError(absl::StrCat(where, ": byte size overflows 64 bits"));
    }
    for (size_t d = 1; d < t.shape.size(); ++d) {
      if (MulOverflows(bytes, static_cast<uint64_t>(t.shape[d]), &bytes)) {
        return absl::DataLossError(absl::StrCat(where, ": byte size overflows 64 bits"));
      }
    }
    t.size_bytes = bytes;
    auto offset = c.Read<uint64_t>("tensor data offset");
    if (!offset.ok()) return WithContext(offset.status(), where);
    t.offset = *offset;
    if (t.offset % alignment_ != 0) {
      return absl::DataLossError(absl::StrCat(where, ": data offset ", t.offset,
                                              " is not a multiple of the alignment ", alignment_));
    }
    auto [it, inserted] = tensor_index_.emplace(t.name, tensors_.size());
    if (!inserted) {
      return absl::DataLossError(absl::StrCat("duplicate tensor name '", t.name, "' (tensors ",
                                              it->second, " and ", i, ")"));
    }
    tensors_.push_back(std::move(t));
  }

  // Data section: starts at the first aligned offset after the directory.
  uint64_t data_start = 0;
  if (AddOverflows(c.pos(), alignment_ - 1, &data_start)) {
    return absl::DataLossError("data section start overflows");
  }
  data_start -= data_start % alignment_;
  for (GgufTensorInfo& t : tensors_) {
    uint64_t begin = 0;
    uint64_t end = 0;
    if (AddOverflows(data_start, t.offset, &begin) || AddOverflows(begin, t.size_bytes, &end)) {
      return absl::DataLossError(absl::StrCat("tensor ", t.name, ": data offset ", t.offset,
                                              " + size ", t.size_bytes, " overflows"));
    }
    if (end > size_) {
      return absl::DataLossError(absl::StrCat("tensor ", t.name, ": data ends at byte ", end,
                                              " but file has ", size_, " bytes"));
    }
    t.data = base_ + begin;
  }

  // No two tensors may share bytes (ggml requires them packed in order; we only
  // require that they do not overlap).
  std::vector<size_t> order(tensors_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const GgufTensorInfo& prev = tensors_[order[k - 1]];
    const GgufTensorInfo& cur = tensors_[order[k]];
    if (prev.offset + prev.size_bytes > cur.offset) {  // no overflow: both end in the file
      return absl::DataLossError(absl::StrCat("tensors ", prev.name, " and ", cur.name,
                                              " overlap: ", prev.name, " occupies data bytes [",
                                              prev.offset, ", ", prev.offset + prev.size_bytes,
                                              ") and ", cur.name, " starts at ", cur.offset));
    }
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

absl::Status KeyNotFound(absl::string_view key) {
  return absl::NotFoundError(absl::StrCat("metadata key '", key, "' not found"));
}

absl::Status WrongType(absl::string_view key, const GgufValue& v, absl::string_view wanted) {
  std::string stored = GgufValueTypeName(v.type);
  if (v.type == GgufValueType::kArray) {
    stored = absl::StrCat("array of ", GgufValueTypeName(v.array_type));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("metadata key '", key, "' has type ", stored, "; wanted ", wanted));
}

absl::Status DoesNotFit(absl::string_view key, absl::string_view value, absl::string_view wanted) {
  return absl::InvalidArgumentError(
      absl::StrCat("metadata key '", key, "' = ", value, " does not fit in ", wanted));
}

}  // namespace

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return KeyNotFound(Sv(key));
  if (v->type != GgufValueType::kString) return WrongType(Sv(key), *v, "string");
  return std::get<std::string>(v->value);
}

absl::StatusOr<uint64_t> GgufFile::GetUint(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return KeyNotFound(Sv(key));
  if (IsGgufUnsigned(v->type)) return std::get<uint64_t>(v->value);
  if (IsGgufSigned(v->type)) {
    const int64_t x = std::get<int64_t>(v->value);
    if (x < 0) return DoesNotFit(Sv(key), absl::StrCat(x), "an unsigned integer");
    return static_cast<uint64_t>(x);
  }
  return WrongType(Sv(key), *v, "an unsigned integer");
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return KeyNotFound(Sv(key));
  if (IsGgufSigned(v->type)) return std::get<int64_t>(v->value);
  if (IsGgufUnsigned(v->type)) {
    const uint64_t x = std::get<uint64_t>(v->value);
    if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return DoesNotFit(Sv(key), absl::StrCat(x), "int64");
    }
    return static_cast<int64_t>(x);
  }
  return WrongType(Sv(key), *v, "an integer");
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return KeyNotFound(Sv(key));
  if (IsGgufFloat(v->type)) return std::get<double>(v->value);
  if (IsGgufUnsigned(v->type)) return static_cast<double>(std::get<uint64_t>(v->value));
  if (IsGgufSigned(v->type)) return static_cast<double>(std::get<int64_t>(v->value));
  return WrongType(Sv(key), *v, "a number");
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return KeyNotFound(Sv(key));
  if (v->type != GgufValueType::kBool) return WrongType(Sv(key), *v, "bool");
  return std::get<bool>(v->value);
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return KeyNotFound(Sv(key));
  if (v->type != GgufValueType::kArray || v->array_type != GgufValueType::kString) {
    return WrongType(Sv(key), *v, "array of string");
  }
  return std::get<std::vector<std::string>>(v->value);
}

absl::StatusOr<std::vector<float>> GgufFile::GetFloatArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return KeyNotFound(Sv(key));
  if (v->type == GgufValueType::kArray) {
    const GgufValueType t = v->array_type;
    if (IsGgufFloat(t)) {
      const auto& src = std::get<std::vector<double>>(v->value);
      return std::vector<float>(src.begin(), src.end());
    }
    if (IsGgufUnsigned(t)) {
      const auto& src = std::get<std::vector<uint64_t>>(v->value);
      return std::vector<float>(src.begin(), src.end());
    }
    if (IsGgufSigned(t)) {
      const auto& src = std::get<std::vector<int64_t>>(v->value);
      return std::vector<float>(src.begin(), src.end());
    }
  }
  return WrongType(Sv(key), *v, "array of numbers");
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return KeyNotFound(Sv(key));
  if (v->type == GgufValueType::kArray) {
    const GgufValueType t = v->array_type;
    if (IsGgufSigned(t)) return std::get<std::vector<int64_t>>(v->value);
    if (IsGgufUnsigned(t)) {
      const auto& src = std::get<std::vector<uint64_t>>(v->value);
      std::vector<int64_t> out;
      out.reserve(src.size());
      for (size_t i = 0; i < src.size(); ++i) {
        if (src[i] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return DoesNotFit(absl::StrCat(Sv(key), "[", i, "]"), absl::StrCat(src[i]), "int64");
        }
        out.push_back(static_cast<int64_t>(src[i]));
      }
      return out;
    }
  }
  return WrongType(Sv(key), *v, "array of integers");
}

}  // namespace snapfill
