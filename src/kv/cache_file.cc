#include "src/kv/cache_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "snapfill/status.h"
#include "src/base/file_util.h"
#include "src/kv/kv_file_format.h"

namespace snapfill {
namespace {

// The payload is written and read with memcpy of host floats and ints.
static_assert(std::endian::native == std::endian::little,
              "cache files are little-endian; add byte swapping for big-endian hosts");

// This Abseil's StrCat takes absl::string_view, which is not std::string_view.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr uint64_t kMagicBytes = internal::kKvFileMagicBytes;
constexpr uint64_t kChecksumBytes = 8;
// A header that would make the loader allocate far more than the file holds
// (one huge layer among thousands of empty ones) is refused: the padded
// cache may use this many times the stored bytes, plus a fixed allowance.
constexpr uint64_t kMaxPaddingFactor = 64;
constexpr uint64_t kPaddingAllowanceBytes = uint64_t{64} << 20;

// Bytes one entry of one head takes in the payload: K and V rows, position.
uint64_t EntryBytes(uint64_t head_dim) { return 2 * head_dim * sizeof(float) + sizeof(int32_t); }

// Checks that a cache with these per-layer sizes can be loaded without
// allocating absurdly more than it stores. All factors are bounded by the
// kMax* limits and the file size, so the 128-bit products cannot overflow.
absl::Status CheckPadding(uint64_t num_layers, uint64_t num_kv_heads, uint64_t head_dim,
                          uint64_t max_size, unsigned __int128 total_entries,
                          std::string_view what) {
  const unsigned __int128 entry = EntryBytes(head_dim);
  // The loader allocates at least one entry per head even when every layer
  // is empty, so a wide shape with no entries is checked too.
  const unsigned __int128 padded = static_cast<unsigned __int128>(num_layers) * num_kv_heads *
                                   std::max<uint64_t>(max_size, 1) * entry;
  const unsigned __int128 stored = total_entries * num_kv_heads * entry;
  if (padded > stored * kMaxPaddingFactor + kPaddingAllowanceBytes) {
    return absl::DataLossError(absl::StrCat(
        Sv(what), ": its largest layer (", max_size, " entries) over ", num_layers,
        " layers would need ", static_cast<double>(padded) / (1 << 20), " MiB for ",
        static_cast<double>(stored) / (1 << 20), " MiB stored"));
  }
  return absl::OkStatus();
}

// Writes through an AtomicFileWriter and hashes what it writes.
class HashingWriter {
 public:
  explicit HashingWriter(AtomicFileWriter* out) : out_(out), state_(XXH3_createState()) {
    SNAPFILL_CHECK(state_ != nullptr);
    XXH3_64bits_reset(state_);
  }
  ~HashingWriter() { XXH3_freeState(state_); }
  absl::Status Write(const void* data, size_t n) {
    XXH3_64bits_update(state_, data, n);
    return out_->Write(std::string_view(static_cast<const char*>(data), n));
  }
  template <typename T>
  absl::Status Put(T value) {
    return Write(&value, sizeof(value));
  }
  absl::Status PutString(std::string_view s) {
    SNAPFILL_RETURN_IF_ERROR(Put<uint64_t>(s.size()));
    return Write(s.data(), s.size());
  }
  uint64_t Digest() const { return XXH3_64bits_digest(state_); }

 private:
  AtomicFileWriter* out_;
  XXH3_state_t* state_;
};

// Bounds-checked sequential reads over the file bytes.
class Reader {
 public:
  Reader(std::string_view bytes, std::string_view label, std::string_view name)
      : bytes_(bytes), label_(label), name_(name) {}
  uint64_t offset() const { return offset_; }
  uint64_t remaining() const { return bytes_.size() - offset_; }
  void Skip(uint64_t n) { offset_ += std::min(n, remaining()); }

  absl::Status Truncated(std::string_view field, uint64_t need) const {
    return absl::DataLossError(absl::StrCat(Sv(label_), " ", Sv(name_), " is truncated: ", Sv(field),
                                            " at byte ", offset_, " needs ", need,
                                            " bytes but the file has ", bytes_.size()));
  }
  template <typename T>
  absl::StatusOr<T> Get(std::string_view field) {
    if (remaining() < sizeof(T)) return Truncated(field, sizeof(T));
    T value;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }
  // A u64 length followed by that many bytes, at most `max_length`.
  absl::StatusOr<std::string_view> GetString(std::string_view field, uint64_t max_length) {
    SNAPFILL_ASSIGN_OR_RETURN(const uint64_t length, Get<uint64_t>(field));
    if (length > max_length) {
      return absl::DataLossError(absl::StrCat(Sv(label_), " ", Sv(name_), " is damaged: ", Sv(field),
                                              " length ", length, " exceeds the limit ",
                                              max_length));
    }
    if (length > remaining()) return Truncated(field, length);
    std::string_view s = bytes_.substr(offset_, length);
    offset_ += length;
    return s;
  }

 private:
  std::string_view bytes_;
  std::string_view label_;
  std::string_view name_;
  uint64_t offset_ = 0;
};

}  // namespace

namespace internal {

absl::Status Damaged(const KvFileFormat& f, std::string_view name, std::string_view why) {
  return absl::DataLossError(absl::StrCat(Sv(f.label), " ", Sv(name), " is damaged: ", Sv(why)));
}

}  // namespace internal

namespace {
using internal::Damaged;
using internal::KvFileFormat;
using internal::KvFileHeader;
}  // namespace

namespace internal {

absl::Status SaveKvFile(const KvFileFormat& format, const std::string& path,
                        const KvFileHeader& cache, const KvCache& kv, bool overwrite) {
  const std::string what = absl::StrCat("cannot save ", Sv(format.label), " ", path);
  if (cache.model_fingerprint.size() > kMaxFingerprintBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": model fingerprint of ",
                                                   cache.model_fingerprint.size(),
                                                   " bytes exceeds ", kMaxFingerprintBytes));
  }
  if (cache.kernels.size() > kMaxKernelsBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": kernels record of ", cache.kernels.size(), " bytes exceeds ", kMaxKernelsBytes));
  }
  if (cache.next_position < 0 || cache.input_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": next_position=", cache.next_position,
                                                   " and input_tokens=", cache.input_tokens,
                                                   " must be >= 0"));
  }
  const KvCacheShape& shape = kv.shape();
  if (shape.num_layers < 1 || static_cast<uint64_t>(shape.num_layers) > kMaxCacheLayers ||
      shape.num_kv_heads < 1 || static_cast<uint64_t>(shape.num_kv_heads) > kMaxCacheKvHeads ||
      shape.head_dim < 1 || static_cast<uint64_t>(shape.head_dim) > kMaxCacheHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": shape layers=", shape.num_layers, " kv_heads=", shape.num_kv_heads,
        " head_dim=", shape.head_dim, " is outside the file format's limits (", kMaxCacheLayers,
        ", ", kMaxCacheKvHeads, ", ", kMaxCacheHeadDim, ")"));
  }
  if (!cache.capacities.empty() && static_cast<int64_t>(cache.capacities.size()) != shape.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", cache.capacities.size(), " layer capacities for ",
                                                   shape.num_layers, " layers"));
  }
  auto capacity = [&](int64_t l) { return cache.capacities.empty() ? kv.capacity(l) : cache.capacities[l]; };
  // Refuse here what LoadCacheFile would refuse, so a saved file always loads.
  uint64_t max_size = 0;
  unsigned __int128 total_entries = 0;
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    const int64_t n = kv.size(l);
    if (n < 0 || n > kv.capacity(l)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": layer ", l, " size ", n,
                                                     " is outside [0, ", kv.capacity(l), "]"));
    }
    if (capacity(l) < n || static_cast<uint64_t>(capacity(l)) > kMaxLayerCapacity) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": layer ", l, " capacity ", capacity(l),
                                                     " is outside [", n, ", ", kMaxLayerCapacity, "]"));
    }
    for (int64_t h = 0; h < shape.num_kv_heads; ++h) {
      const int32_t* pos = kv.pos(l, h);
      for (int64_t i = 0; i < n; ++i) {
        if (pos[i] < 0) {
          return absl::InvalidArgumentError(absl::StrCat(what, ": layer ", l, " head ", h,
                                                         " entry ", i, " has position ",
                                                         pos[i]));
        }
        if (kv.has_scores() && !std::isfinite(kv.score(l, h)[i])) {
          return absl::InvalidArgumentError(absl::StrCat(what, ": layer ", l, " head ", h, " entry ", i,
                                                         " has score ", kv.score(l, h)[i]));
        }
      }
    }
    max_size = std::max<uint64_t>(max_size, n);
    total_entries += n;
  }
  if (absl::Status s = CheckPadding(shape.num_layers, shape.num_kv_heads, shape.head_dim,
                                    max_size, total_entries, what);
      !s.ok()) {
    return absl::InvalidArgumentError(s.message());
  }

  SNAPFILL_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> file,
                            AtomicFileWriter::Create(path, overwrite));
  HashingWriter out(file.get());
  SNAPFILL_RETURN_IF_ERROR(out.Write(format.magic.data(), kMagicBytes));
  SNAPFILL_RETURN_IF_ERROR(out.Put<uint32_t>(format.version));
  SNAPFILL_RETURN_IF_ERROR(out.PutString(cache.model_fingerprint));
  SNAPFILL_RETURN_IF_ERROR(out.PutString(cache.config));
  SNAPFILL_RETURN_IF_ERROR(out.PutString(cache.kernels));
  SNAPFILL_RETURN_IF_ERROR(out.Put<int64_t>(cache.next_position));
  SNAPFILL_RETURN_IF_ERROR(out.Put<int64_t>(cache.input_tokens));
  SNAPFILL_RETURN_IF_ERROR(out.Put<uint64_t>(shape.num_layers));
  SNAPFILL_RETURN_IF_ERROR(out.Put<uint64_t>(shape.num_kv_heads));
  SNAPFILL_RETURN_IF_ERROR(out.Put<uint64_t>(shape.head_dim));
  // Entry fields: K, V and positions, and the scores where the cache keeps them.
  const bool scores = kv.has_scores();
  SNAPFILL_RETURN_IF_ERROR(out.Put<uint32_t>(scores ? kEntryScores : 0));
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    SNAPFILL_RETURN_IF_ERROR(out.Put<uint64_t>(kv.size(l)));
    SNAPFILL_RETURN_IF_ERROR(out.Put<uint64_t>(capacity(l)));
  }
  // Head-major storage keeps each head's first size(l) rows contiguous.
  // (A cache in a backend's buffers comes out a head at a time.)
  std::vector<float> host_k, host_v;
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    const size_t n = static_cast<size_t>(kv.size(l));
    for (int64_t h = 0; h < shape.num_kv_heads; ++h) {
      const float* k = kv.k(l, h);
      const float* v = kv.v(l, h);
      if (!kv.on_host()) {
        host_k.resize(n * shape.head_dim);
        host_v.resize(n * shape.head_dim);
        SNAPFILL_RETURN_IF_ERROR(kv.CopyOut(l, h, static_cast<int64_t>(n), host_k.data(), host_v.data()));
        k = host_k.data();
        v = host_v.data();
      }
      SNAPFILL_RETURN_IF_ERROR(out.Write(k, n * shape.head_dim * sizeof(float)));
      SNAPFILL_RETURN_IF_ERROR(out.Write(v, n * shape.head_dim * sizeof(float)));
      SNAPFILL_RETURN_IF_ERROR(out.Write(kv.pos(l, h), n * sizeof(int32_t)));
      if (scores) SNAPFILL_RETURN_IF_ERROR(out.Write(kv.score(l, h), n * sizeof(float)));
    }
  }
  const uint64_t checksum = out.Digest();
  SNAPFILL_RETURN_IF_ERROR(file->Write(
      std::string_view(reinterpret_cast<const char*>(&checksum), sizeof(checksum))));
  return file->Commit();
}

absl::StatusOr<KvFileContents> ParseKvFile(const KvFileFormat& format, std::string_view bytes,
                                           std::string_view name,
                                           std::string_view expected_fingerprint,
                                           int64_t extra_capacity) {
  if (extra_capacity < 0 || extra_capacity > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        absl::StrCat("extra_capacity=", extra_capacity, " must be in [0, 2^40]"));
  }
  if (bytes.empty()) {
    return absl::DataLossError(absl::StrCat(Sv(format.label), " ", Sv(name), " is empty"));
  }
  const std::string_view magic = format.magic;
  // A short file that starts like the magic is truncated, not foreign.
  const size_t head = std::min<size_t>(bytes.size(), kMagicBytes);
  if (bytes.substr(0, head) != magic.substr(0, head)) {
    return absl::DataLossError(absl::StrCat(
        Sv(name), " is not a snapfill ", Sv(format.label), " (bad magic: expected \"",
        Sv(magic.substr(0, magic.find('\0'))), "\")"));
  }
  Reader in(bytes, format.label, name);
  if (bytes.size() < kMagicBytes) return in.Truncated("magic", kMagicBytes);
  in.Skip(kMagicBytes);
  SNAPFILL_ASSIGN_OR_RETURN(const uint32_t version, in.Get<uint32_t>("version"));
  if (version > format.version) {
    return absl::UnimplementedError(absl::StrCat(Sv(format.label), " ", Sv(name), " version ",
                                                 version, " is newer than this snapfill (",
                                                 format.version, ")"));
  }
  if (version == 0) return Damaged(format, name, "format version 0");
  if (version < format.version) {
    return absl::FailedPreconditionError(absl::StrCat(
        Sv(format.label), " ", Sv(name), " is format version ", version, ", from an earlier snapfill; this one reads ",
        "version ", format.version, " only: ", Sv(format.remake)));
  }

  // Header: every count is checked against the bytes left before it is used.
  KvFileContents cache;
  SNAPFILL_ASSIGN_OR_RETURN(const std::string_view fingerprint,
                            in.GetString("model fingerprint", kMaxFingerprintBytes));
  SNAPFILL_ASSIGN_OR_RETURN(const std::string_view config, in.GetString("config", bytes.size()));
  SNAPFILL_ASSIGN_OR_RETURN(const std::string_view kernels, in.GetString("kernels", kMaxKernelsBytes));
  SNAPFILL_ASSIGN_OR_RETURN(cache.header.next_position, in.Get<int64_t>("next_position"));
  SNAPFILL_ASSIGN_OR_RETURN(cache.header.input_tokens, in.Get<int64_t>("input_tokens"));
  SNAPFILL_ASSIGN_OR_RETURN(const uint64_t num_layers, in.Get<uint64_t>("num_layers"));
  SNAPFILL_ASSIGN_OR_RETURN(const uint64_t num_kv_heads, in.Get<uint64_t>("num_kv_heads"));
  SNAPFILL_ASSIGN_OR_RETURN(const uint64_t head_dim, in.Get<uint64_t>("head_dim"));
  if (num_layers < 1 || num_layers > kMaxCacheLayers || num_kv_heads < 1 ||
      num_kv_heads > kMaxCacheKvHeads || head_dim < 1 || head_dim > kMaxCacheHeadDim) {
    return Damaged(format, name, absl::StrCat("shape layers=", num_layers, " kv_heads=", num_kv_heads,
                                      " head_dim=", head_dim, " is outside [1, ",
                                      kMaxCacheLayers, "] x [1, ", kMaxCacheKvHeads, "] x [1, ",
                                      kMaxCacheHeadDim, "]"));
  }
  SNAPFILL_ASSIGN_OR_RETURN(const uint32_t entry_fields, in.Get<uint32_t>("entry fields"));
  if ((entry_fields & ~kEntryScores) != 0) {
    return absl::UnimplementedError(absl::StrFormat(
        "%s %s stores entry fields 0x%x that this snapfill does not read (a newer one made it)",
        Sv(format.label), Sv(name), entry_fields & ~kEntryScores));
  }
  const bool scores = (entry_fields & kEntryScores) != 0;
  if (num_layers * 2 * sizeof(uint64_t) > in.remaining()) {
    return in.Truncated("layer sizes", num_layers * 2 * sizeof(uint64_t));
  }
  // Sizes are bounded by the file: every entry of every head takes
  // EntryBytes(head_dim) >= 12 bytes of payload.
  const uint64_t bytes_per_entry = num_kv_heads * (EntryBytes(head_dim) + (scores ? sizeof(float) : 0));
  std::vector<uint64_t> sizes(num_layers);
  cache.header.capacities.resize(num_layers);
  uint64_t max_size = 0;
  unsigned __int128 total_entries = 0;
  for (uint64_t l = 0; l < num_layers; ++l) {
    SNAPFILL_ASSIGN_OR_RETURN(sizes[l], in.Get<uint64_t>("layer size"));
    SNAPFILL_ASSIGN_OR_RETURN(const uint64_t capacity, in.Get<uint64_t>("layer capacity"));
    if (capacity < sizes[l] || capacity > kMaxLayerCapacity) {
      return Damaged(format, name, absl::StrCat("layer ", l, " capacity ", capacity, " is outside [", sizes[l],
                                                ", ", kMaxLayerCapacity, "]"));
    }
    cache.header.capacities[l] = static_cast<int64_t>(capacity);
    if (sizes[l] > bytes.size() / bytes_per_entry) {
      return absl::DataLossError(absl::StrCat(
          Sv(format.label), " ", Sv(name), " is truncated or damaged: layer ", l, " holds ", sizes[l],
          " entries of ", bytes_per_entry, " bytes but the file has ", bytes.size(), " bytes"));
    }
    max_size = std::max(max_size, sizes[l]);
    total_entries += sizes[l];
  }
  if (cache.header.next_position < 0 || cache.header.input_tokens < 0) {
    return Damaged(format, name, absl::StrCat("next_position=", cache.header.next_position,
                                      " input_tokens=", cache.header.input_tokens, " (must be >= 0)"));
  }

  // The whole file must be exactly header + payload + checksum.
  const unsigned __int128 expected =
      static_cast<unsigned __int128>(in.offset()) + total_entries * bytes_per_entry +
      kChecksumBytes;
  if (expected > bytes.size()) {
    return absl::DataLossError(absl::StrCat(
        Sv(format.label), " ", Sv(name), " is truncated: its header describes ",
        static_cast<double>(expected), " bytes but the file has ", bytes.size()));
  }
  if (expected < bytes.size()) {
    return Damaged(format, name, absl::StrCat(bytes.size() - static_cast<uint64_t>(expected),
                                      " bytes after the end of the cache"));
  }
  uint64_t stored_checksum;
  std::memcpy(&stored_checksum, bytes.data() + bytes.size() - kChecksumBytes, kChecksumBytes);
  const uint64_t checksum = XXH3_64bits(bytes.data(), bytes.size() - kChecksumBytes);
  if (checksum != stored_checksum) {
    return Damaged(format, name, absl::StrFormat("checksum mismatch (stored %016x, computed %016x)",
                                         stored_checksum, checksum));
  }

  cache.header.model_fingerprint = std::string(fingerprint);
  cache.header.config = std::string(config);
  cache.header.kernels = std::string(kernels);
  if (!expected_fingerprint.empty() && fingerprint != expected_fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(
        Sv(format.label), " ", Sv(name), " was made by model ",
        fingerprint.empty() ? "(no fingerprint)" : Sv(fingerprint),
        ", not by the loaded model ", Sv(expected_fingerprint)));
  }
  SNAPFILL_RETURN_IF_ERROR(CheckPadding(num_layers, num_kv_heads, head_dim, max_size,
                                        total_entries, absl::StrCat(Sv(format.label), " ", Sv(name),
                                                                    " is damaged")));

  KvCacheShape shape;
  shape.num_layers = static_cast<int64_t>(num_layers);
  shape.num_kv_heads = static_cast<int64_t>(num_kv_heads);
  shape.head_dim = static_cast<int64_t>(head_dim);
  shape.capacity = std::max<int64_t>(1, static_cast<int64_t>(max_size) + extra_capacity);
  SNAPFILL_ASSIGN_OR_RETURN(cache.kv, KvCache::Create(shape));
  if (scores) SNAPFILL_RETURN_IF_ERROR(cache.kv->EnableScores());
  const char* p = bytes.data() + in.offset();
  for (uint64_t l = 0; l < num_layers; ++l) {
    const size_t n = sizes[l];
    const size_t row_bytes = n * head_dim * sizeof(float);
    for (uint64_t h = 0; h < num_kv_heads; ++h) {
      std::memcpy(cache.kv->k(l, h), p, row_bytes);
      p += row_bytes;
      std::memcpy(cache.kv->v(l, h), p, row_bytes);
      p += row_bytes;
      int32_t* pos = cache.kv->pos(l, h);
      std::memcpy(pos, p, n * sizeof(int32_t));
      p += n * sizeof(int32_t);
      for (size_t i = 0; i < n; ++i) {
        if (pos[i] < 0) {
          return Damaged(format, name, absl::StrCat("layer ", l, " head ", h, " entry ", i,
                                            " has position ", pos[i]));
        }
      }
      if (scores) {
        float* score = cache.kv->score(l, h);
        std::memcpy(score, p, n * sizeof(float));
        p += n * sizeof(float);
        for (size_t i = 0; i < n; ++i) {
          if (!std::isfinite(score[i])) {
            return Damaged(format, name, absl::StrCat("layer ", l, " head ", h, " entry ", i,
                                                      " has score ", score[i]));
          }
        }
      }
    }
    cache.kv->set_size(l, static_cast<int64_t>(n));
  }
  return cache;
}

absl::Status MapKvFile(const KvFileFormat& format, const std::string& path,
                       const std::function<void(std::string_view)>& use) {
  const std::string label(format.label);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FileErrnoStatus(errno, "cannot open " + label, path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const absl::Status s = FileErrnoStatus(errno, "cannot stat " + label, path);
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(label, " ", path, " is not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(label, " ", path, " is empty"));
  }
  // Mapped rather than read so that loading needs no second copy of the
  // payload in memory.
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) return FileErrnoStatus(map_errno, "cannot map " + label, path);
  ::madvise(map, size, MADV_SEQUENTIAL);
  use(std::string_view(static_cast<const char*>(map), size));
  ::munmap(map, size);
  return absl::OkStatus();
}

absl::StatusOr<KvFileContents> LoadKvFile(const KvFileFormat& format, const std::string& path,
                                          std::string_view expected_fingerprint,
                                          int64_t extra_capacity) {
  absl::StatusOr<KvFileContents> contents = absl::InternalError("not read");
  SNAPFILL_RETURN_IF_ERROR(MapKvFile(format, path, [&](std::string_view bytes) {
    contents = ParseKvFile(format, bytes, path, expected_fingerprint, extra_capacity);
  }));
  return contents;
}

}  // namespace internal

namespace {

constexpr KvFileFormat kCacheFormat{std::string_view(kCacheFileMagic, sizeof(kCacheFileMagic)),
                                    kCacheFileVersion, "cache file",
                                    "make it again with snapfill prefill --out"};

PromptCache ToPromptCache(internal::KvFileContents c) {
  PromptCache p;
  p.model_fingerprint = std::move(c.header.model_fingerprint);
  p.config = std::move(c.header.config);
  p.kernels = std::move(c.header.kernels);
  p.capacities = std::move(c.header.capacities);
  p.next_position = c.header.next_position;
  p.input_tokens = c.header.input_tokens;
  p.kv = std::move(c.kv);
  return p;
}

}  // namespace

absl::Status SaveCacheFile(const std::string& path, const PromptCache& cache, bool overwrite) {
  if (cache.kv == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot save cache file ", path,
                                                   ": no KV cache"));
  }
  KvFileHeader h;
  h.model_fingerprint = cache.model_fingerprint;
  h.config = cache.config;
  h.kernels = cache.kernels;
  h.next_position = cache.next_position;
  h.input_tokens = cache.input_tokens;
  h.capacities = cache.capacities;
  return internal::SaveKvFile(kCacheFormat, path, h, *cache.kv, overwrite);
}

absl::StatusOr<PromptCache> ParseCacheFile(std::string_view bytes, std::string_view name,
                                           std::string_view expected_fingerprint,
                                           int64_t extra_capacity) {
  SNAPFILL_ASSIGN_OR_RETURN(
      internal::KvFileContents c,
      internal::ParseKvFile(kCacheFormat, bytes, name, expected_fingerprint, extra_capacity));
  return ToPromptCache(std::move(c));
}

absl::StatusOr<PromptCache> LoadCacheFile(const std::string& path,
                                          std::string_view expected_fingerprint,
                                          int64_t extra_capacity) {
  SNAPFILL_ASSIGN_OR_RETURN(
      internal::KvFileContents c,
      internal::LoadKvFile(kCacheFormat, path, expected_fingerprint, extra_capacity));
  return ToPromptCache(std::move(c));
}

}  // namespace snapfill
