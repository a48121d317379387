// Chunking of FM and IM: every chunk has the requested size, except the last,
// which holds what is left.
#include <cstdint>
#include <vector>

#include "schedules/schedule_internal.h"

namespace snapfill::schedule_internal {

std::vector<int64_t> FixedChunks(int64_t total_tokens, int64_t chunk, int64_t window) {
  const int64_t n = CeilDiv(total_tokens, chunk);
  std::vector<int64_t> chunks(n, chunk);
  chunks.back() = total_tokens - (n - 1) * chunk;
  // A tail at or below the window could not vote (the window would reach back
  // into the memory) and costs a whole step for a handful of tokens, so it
  // joins the chunk before it, which grows by at most `window` tokens.
  if (n > 1 && chunks.back() <= window) {
    const int64_t tail = chunks.back();
    chunks.pop_back();
    chunks.back() += tail;
  }
  return chunks;
}

}  // namespace snapfill::schedule_internal
