// How the recall tier's store keeps evicted keys and values (src/kv/
// recall_store.h has the store), part of the engine's public configuration.
#ifndef SNAPFILL_RECALL_FORMAT_H_
#define SNAPFILL_RECALL_FORMAT_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace snapfill {

// f16: exact to fp16; q8: 8 bits, half the disk.
enum class RecallFormat { kF16, kQ8 };

// "f16" | "q8"; InvalidArgument otherwise.
absl::StatusOr<RecallFormat> ParseRecallFormat(std::string_view name);
const char* RecallFormatName(RecallFormat format);
// One key or value as the store keeps it: f16 2 · head_dim bytes, q8
// 4 + head_dim (its f32 scale, then int8s).
uint64_t RecallVectorBytes(RecallFormat format, int64_t head_dim);

}  // namespace snapfill

#endif  // SNAPFILL_RECALL_FORMAT_H_
