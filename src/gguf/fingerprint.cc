#include "src/gguf/fingerprint.h"

#include <xxhash.h>

#include "absl/strings/str_format.h"

namespace snapfill {

std::string FingerprintBytes(std::string_view bytes) {
  const XXH64_hash_t h = XXH3_64bits(bytes.data(), bytes.size());
  return absl::StrFormat("xxh3:%016x", static_cast<uint64_t>(h));
}

std::string ModelFingerprint(const GgufFile& file) { return FingerprintBytes(file.bytes()); }

}  // namespace snapfill
