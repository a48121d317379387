#include "src/gguf/fingerprint.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_format.h"

namespace snapfill {

namespace {

std::string Format(XXH64_hash_t h) { return absl::StrFormat("xxh3:%016x", static_cast<uint64_t>(h)); }

}  // namespace

std::string FingerprintBytes(std::string_view bytes) {
  return Format(XXH3_64bits(bytes.data(), bytes.size()));
}

std::string ModelFingerprint(const GgufFile& file) {
  if (file.fd() < 0) return FingerprintBytes(file.bytes());
  // Read with pread, not through the mapping: hashing would otherwise map
  // every page of the file into the resident set, beside the copies the
  // backend makes of the matrices. XXH3's streaming digest equals the
  // one-shot hash of the same bytes.
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<uint8_t> block(1 << 20);
  bool read_all = true;
  for (uint64_t at = 0; at < file.file_size(); at += block.size()) {
    const uint64_t n = std::min<uint64_t>(block.size(), file.file_size() - at);
    if (!file.ReadAt(at, block.data(), n).ok()) {
      read_all = false;
      break;
    }
    XXH3_64bits_update(state, block.data(), n);
  }
  const XXH64_hash_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  // A read error: the mapping's bytes give the same hash (or fail loudly).
  if (!read_all) return FingerprintBytes(file.bytes());
  return Format(h);
}

}  // namespace snapfill
