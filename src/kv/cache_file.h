// The prompt-cache file: the compressed KV cache left by a long prefill,
// saved by `snapfill prefill --out CACHE` and answered from later by
// `snapfill generate --cache CACHE`. This module owns the file format; the
// in-memory layout is KvCache's (kv_cache.h).
//
// File layout, version 2 (little-endian, fixed width, no padding):
//   offset 0   char[12]  magic "SNAPFILL-KV\0"
//   offset 12  u32       format version (kCacheFileVersion)
//   offset 16  u64       fingerprint length F (<= kMaxFingerprintBytes)
//              F bytes   ModelFingerprint() of the model that made the cache
//              u64       config length C
//              C bytes   the run configuration as text (JSON)
//              u64       kernels length N (<= kMaxKernelsBytes)
//              N bytes   Backend::kernels() of the run (a record: other
//                        kernels round differently)
//              i64       next_position (>= 0)
//              i64       input_tokens (>= 0)
//              u64       num_layers   (1..kMaxCacheLayers)
//              u64       num_kv_heads (1..kMaxCacheKvHeads)
//              u64       head_dim     (1..kMaxCacheHeadDim)
//              u32       entry fields: bits of what each entry stores beyond
//                        K, V and its position (kEntryScores); others refused
//              num_layers x (u64 size, u64 capacity): the valid entries per
//                        head, and the entries the layer may hold (size <=
//                        capacity <= kMaxLayerCapacity; a sliding-window
//                        layer may hold fewer than the others)
//   payload, for layer in [0, num_layers), for head in [0, num_kv_heads):
//              f32 K[size(layer)][head_dim]  keys as the decoder reads them
//                                            (already rotated)
//              f32 V[size(layer)][head_dim]
//              i32 pos[size(layer)]          original input positions (>= 0)
//              f32 score[size(layer)]        with kEntryScores only
//   trailer:   u64       XXH3-64 (seed 0) of every byte before it
// Only the valid entries are stored, not the whole capacity. The file ends
// exactly after the trailer. Version 1 had no kernels, entry fields or
// capacities; its files are refused, saying to make the cache again.
//
// Loading checks, in order: magic, version, the header's counts against the
// file size (before anything is allocated), the exact file size, the
// checksum, the model fingerprint, then the payload (positions).
// Errors: NotFound for a missing file; DataLoss for a file that is not a
// cache file, is truncated, has trailing bytes, absurd counts or a checksum
// mismatch ("cache file X is damaged: checksum mismatch ..."); Unimplemented
// for a newer format version or entry fields it does not know;
// FailedPrecondition for an older version, or a cache made by another model
// (naming both fingerprints).
//
// Files are written through AtomicFileWriter (base/file_util.h): an existing
// file is replaced only with overwrite, and a failed write (a full disk
// included) leaves no partial file.
#ifndef SNAPFILL_KV_CACHE_FILE_H_
#define SNAPFILL_KV_CACHE_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/kv/kv_cache.h"

namespace snapfill {

inline constexpr char kCacheFileMagic[12] = {'S', 'N', 'A', 'P', 'F', 'I',
                                             'L', 'L', '-', 'K', 'V', '\0'};
inline constexpr uint32_t kCacheFileVersion = 2;
// Sanity limits, far above any Llama-family model; a header outside them is
// damaged, not a model we cannot run.
inline constexpr uint64_t kMaxFingerprintBytes = 1024;
inline constexpr uint64_t kMaxCacheLayers = 4096;
inline constexpr uint64_t kMaxCacheKvHeads = 4096;
inline constexpr uint64_t kMaxCacheHeadDim = 65536;
inline constexpr uint64_t kMaxKernelsBytes = 1024;
inline constexpr uint64_t kMaxLayerCapacity = uint64_t{1} << 40;
// Entry fields (a bit each) beyond K, V and the position.
inline constexpr uint32_t kEntryScores = 1;  // f32 per entry: a selection score

struct PromptCache {
  std::string model_fingerprint;  // ModelFingerprint() of the model that made it
  std::string config;             // the run configuration as text (JSON), for `snapfill info`
  std::string kernels;            // Backend::kernels() that computed the entries (a record)
  // Entries each layer may hold: loaded, the file's; saving, empty writes
  // the KvCache's capacity for every layer.
  std::vector<int64_t> capacities;
  int64_t next_position = 0;      // position of the first token appended after the cache
  int64_t input_tokens = 0;       // tokens read to build it
  // Keys as the decoder uses them (already rotated), values, original
  // positions and per-layer sizes. Loaded caches have capacity
  // max_layer_size + extra_capacity.
  std::unique_ptr<KvCache> kv;
};

// Writes `cache` to `path` atomically. InvalidArgument if the cache cannot
// be represented (no kv, negative counts or positions, shape beyond the
// limits above); AlreadyExists if `path` exists and !overwrite; file errors
// as AtomicFileWriter reports them.
absl::Status SaveCacheFile(const std::string& path, const PromptCache& cache, bool overwrite);

// Reads a cache file. If `expected_fingerprint` is non-empty, a file made by
// another model is refused (FailedPrecondition naming both fingerprints).
// The returned KvCache has room for `extra_capacity` more entries per layer
// than its largest layer holds (InvalidArgument if extra_capacity < 0).
absl::StatusOr<PromptCache> LoadCacheFile(const std::string& path,
                                          std::string_view expected_fingerprint,
                                          int64_t extra_capacity);

// The same checks over bytes in memory (tests and fuzzers); `name` stands
// for the path in messages.
absl::StatusOr<PromptCache> ParseCacheFile(std::string_view bytes, std::string_view name,
                                           std::string_view expected_fingerprint,
                                           int64_t extra_capacity);

}  // namespace snapfill

#endif  // SNAPFILL_KV_CACHE_FILE_H_
