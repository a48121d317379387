// Model fingerprints: a short, stable name for the exact bytes of a model
// file, stored in everything derived from that model (cache files) so that a
// derived file is never used with another model.
//
// The fingerprint is "xxh3:" followed by the 16 lowercase hex digits of the
// XXH3-64 hash (seed 0) of every byte of the file. Hashing the whole file
// (not only the metadata) catches re-quantized or patched weights, and XXH3
// reads a 100 MB model in tens of milliseconds.
#ifndef SNAPFILL_GGUF_FINGERPRINT_H_
#define SNAPFILL_GGUF_FINGERPRINT_H_

#include <string>
#include <string_view>

#include "src/gguf/gguf_reader.h"

namespace snapfill {

// FingerprintBytes(file.bytes()), read with pread rather than through the
// mapping so that it leaves no page of the file resident.
std::string ModelFingerprint(const GgufFile& file);
// "xxh3:" + hex XXH3-64 of `bytes`.
std::string FingerprintBytes(std::string_view bytes);

}  // namespace snapfill

#endif  // SNAPFILL_GGUF_FINGERPRINT_H_
