// GGUF reader: a memory-mapped, bounds-checked view of a GGUF v2/v3 file.
//
// File layout (little-endian), as documented in ggml's gguf.h:
//   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv × { gguf_string key | u32 value_type | value }
//     gguf_string = u64 length + bytes (no terminator)
//     array value = u32 element_type + u64 count + elements
//   n_tensors × { gguf_string name | u32 n_dims | n_dims × u64 ne |
//                 u32 ggml_type | u64 offset (relative to the data section) }
//   padding to `general.alignment` (default 32)
//   data section: tensor bytes, each tensor at data_start + offset
// ne[0] is the contiguous (fastest-varying) dimension.
//
// Every offset and size is checked against the file before it is used; a
// corrupt or truncated file returns DataLoss, an unknown type Unimplemented.
// Tensor data are views into the mapping and live as long as the GgufFile.
#ifndef SNAPFILL_GGUF_GGUF_READER_H_
#define SNAPFILL_GGUF_GGUF_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "snapfill/dtype.h"

namespace snapfill {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// Returns "uint8", "string", "array", ...; "unknown" for other ids.
const char* GgufValueTypeName(GgufValueType type);

// The value type families (shared by the reader and the writer).
inline bool IsGgufUnsigned(GgufValueType t) {
  return t == GgufValueType::kUint8 || t == GgufValueType::kUint16 || t == GgufValueType::kUint32 ||
         t == GgufValueType::kUint64;
}
inline bool IsGgufSigned(GgufValueType t) {
  return t == GgufValueType::kInt8 || t == GgufValueType::kInt16 || t == GgufValueType::kInt32 ||
         t == GgufValueType::kInt64;
}
inline bool IsGgufFloat(GgufValueType t) {
  return t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64;
}

// One metadata value. Scalars are widened: all unsigned integers to uint64_t,
// signed to int64_t, floats to double; `type` keeps the stored type.
struct GgufValue {
  GgufValueType type;
  GgufValueType array_type = GgufValueType::kUint8;  // element type if kArray
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<uint64_t>,
               std::vector<int64_t>, std::vector<double>, std::vector<bool>,
               std::vector<std::string>>
      value;
  // Number of elements for arrays, 1 otherwise.
  uint64_t size() const;
};

struct GgufKv {
  std::string key;
  GgufValue value;
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type;
  std::vector<int64_t> shape;  // ne[0] first (contiguous dimension)
  uint64_t offset = 0;         // relative to the data section
  uint64_t size_bytes = 0;     // bytes of tensor data
  const uint8_t* data = nullptr;  // into the mapping; valid while the file lives
  int64_t num_elements() const;
};

class GgufFile {
 public:
  // Maps and validates `path` (read-only, MAP_PRIVATE). Errors, each message
  // prefixed with the path: NotFound/PermissionDenied for the path,
  // FailedPrecondition for a directory or other non-regular file, DataLoss for
  // an empty or malformed file (bad magic, truncation, data past the end,
  // overlapping or misaligned tensors, absurd counts, duplicate keys or tensor
  // names, bad dimensions or alignment), Unimplemented for an unsupported
  // version, nested arrays or an unknown tensor type id.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Same checks over an in-memory copy (used by tests and fuzzers); messages
  // carry no path. The copy starts 64-byte aligned, so tensor data are
  // aligned in memory to min(alignment(), 64) (mapped files: min(alignment(),
  // page size)).
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBytes(std::string bytes);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t file_size() const { return size_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& path() const { return path_; }
  // Gives back to the OS the pages of the mapping that lie wholly inside
  // [data, data + bytes) (madvise MADV_DONTNEED on the read-only private
  // mapping): they leave the resident set, and a later read maps them again
  // from the page cache with the same contents. Returns the bytes given back;
  // 0 for an in-memory file (FromBytes), whose bytes only exist there.
  uint64_t ReleasePages(const void* data, uint64_t bytes) const;
  // Maps the pages of [data, data + bytes) into the resident set now
  // (MADV_POPULATE_READ, else a read of each page), so that what a tensor
  // read in place holds resident is all of it, not whichever pages its reads
  // and the kernel's fault-around (or a huge page of the page cache) happened
  // to map. Returns the bytes populated; 0 for an in-memory file.
  uint64_t Populate(const void* data, uint64_t bytes) const;
  // Copies `bytes` bytes of the file from `offset` into `dst` with pread, not
  // through the mapping, so the file's pages do not enter the resident set
  // (in-memory files: a copy). OutOfRange past the end; DataLoss on a read
  // error or a file cut short since it was opened.
  absl::Status ReadAt(uint64_t offset, void* dst, uint64_t bytes) const;
  // The descriptor ReadAt reads (-1 for an in-memory file), and the file
  // offset of a pointer into the mapping.
  int fd() const { return fd_; }
  uint64_t OffsetOf(const void* p) const {
    return static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(p) - base_);
  }
  // All bytes of the file (the mapping), e.g. to fingerprint it.
  std::string_view bytes() const {
    return std::string_view(reinterpret_cast<const char*>(base_), size_);
  }

  const std::vector<GgufKv>& metadata() const { return kvs_; }
  const GgufValue* Find(std::string_view key) const;
  bool Has(std::string_view key) const { return Find(key) != nullptr; }

  // Typed getters: NotFound if the key is absent, InvalidArgument naming the
  // key, the stored type and the wanted type if it cannot convert. Integer
  // getters accept any integer type whose value fits; GetFloat accepts floats
  // and integers.
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<uint64_t> GetUint(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(std::string_view name) const;

 private:
  GgufFile() = default;
  absl::Status Parse();

  std::string path_;
  const uint8_t* base_ = nullptr;  // start of the mapping (or of owned_)
  uint64_t size_ = 0;
  void* mapping_ = nullptr;        // mmap result, unmapped in the destructor
  int fd_ = -1;                    // kept open for ReadAt, closed in the destructor
  std::string owned_;              // FromBytes storage (base_ is 64-byte aligned in it)
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<GgufKv> kvs_;
  std::vector<GgufTensorInfo> tensors_;
  // Name -> index into kvs_ / tensors_, built by Parse() (names are unique).
  std::unordered_map<std::string, size_t> kv_index_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace snapfill

#endif  // SNAPFILL_GGUF_GGUF_READER_H_
