// The container shared by snapfill's KV files: the prompt cache
// (cache_file.h) and the prefill checkpoint (checkpoint_file.h). Both are
// a magic, a version, a model fingerprint, a text block, two counters, the
// per-layer KV payload and an XXH3-64 trailer; the layout is documented in
// cache_file.h. Only the magic, the version and the label used in messages
// differ. Internal to src/kv.
#ifndef SNAPFILL_KV_KV_FILE_FORMAT_H_
#define SNAPFILL_KV_KV_FILE_FORMAT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/kv/kv_cache.h"

namespace snapfill::internal {

inline constexpr uint64_t kKvFileMagicBytes = 12;

struct KvFileFormat {
  std::string_view magic;  // kKvFileMagicBytes bytes
  uint32_t version = 0;
  std::string_view label;  // "cache file", "checkpoint": how messages name the file
  std::string_view remake;  // what to do with a file of an older version
};

struct KvFileHeader {
  std::string model_fingerprint;
  std::string config;
  // The kernels that computed the entries (Backend::kernels()), as a record:
  // other kernels round differently, so a cache or a resumed run is
  // identical to the bit only on the same ones.
  std::string kernels;
  int64_t next_position = 0;
  int64_t input_tokens = 0;
  // Entries each layer may hold (a sliding-window layer fewer than the
  // others). Saving: empty writes the cache's capacity for every layer.
  std::vector<int64_t> capacities;
};

struct KvFileContents {
  KvFileHeader header;
  std::unique_ptr<KvCache> kv;
};

// Writes header + the valid entries of `kv` atomically (AtomicFileWriter).
absl::Status SaveKvFile(const KvFileFormat& format, const std::string& path,
                        const KvFileHeader& header, const KvCache& kv, bool overwrite);
// Reads and checks a file written by SaveKvFile with the same format; the KV
// has room for `extra_capacity` entries beyond its largest layer.
absl::StatusOr<KvFileContents> ParseKvFile(const KvFileFormat& format, std::string_view bytes,
                                           std::string_view name,
                                           std::string_view expected_fingerprint,
                                           int64_t extra_capacity);
// Maps the regular file at `path` read-only and calls `use` on its bytes
// (NotFound, PermissionDenied, FailedPrecondition for a directory, DataLoss
// for an empty file, each naming the path).
absl::Status MapKvFile(const KvFileFormat& format, const std::string& path,
                       const std::function<void(std::string_view)>& use);
absl::StatusOr<KvFileContents> LoadKvFile(const KvFileFormat& format, const std::string& path,
                                          std::string_view expected_fingerprint,
                                          int64_t extra_capacity);
// DataLoss "<label> <name> is damaged: <why>".
absl::Status Damaged(const KvFileFormat& format, std::string_view name, std::string_view why);

}  // namespace snapfill::internal

#endif  // SNAPFILL_KV_KV_FILE_FORMAT_H_
