// Generation over a KV cache: prefill a prompt, then decode one token at a
// time, each new token appended after the cache with positions continuing.
#ifndef SNAPFILL_ENGINE_GENERATE_H_
#define SNAPFILL_ENGINE_GENERATE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "src/engine/sampler.h"
#include "src/kv/kv_cache.h"
#include "src/model/llama_forward.h"

namespace snapfill {

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  SamplingParams sampling;
  // Stop when is_eog(token) says so (the token is not emitted).
  std::function<bool(int32_t)> is_eog;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids, without the prompt
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0;   // prompt through the model, to its logits
  double ttft_seconds = 0;      // from start to the first generated token
  double decode_seconds = 0;    // the remaining tokens
  // Of decode_seconds, the first one-token step: it also makes the decode copy
  // of the weights (once per process), so the steady rate leaves it out.
  double first_step_seconds = 0;
  bool stopped_at_eog = false;
};

// Feeds `prompt` at positions start_pos.. into `kv` (after what it holds),
// then samples up to max_new_tokens. `on_token` is called with each new id as
// soon as it is chosen; returning false stops generation.
absl::StatusOr<GenerateResult> Generate(LlamaForward& forward, KvCache& kv, int64_t start_pos,
                                        const std::vector<int32_t>& prompt,
                                        const GenerateOptions& options,
                                        const std::function<bool(int32_t)>& on_token);

// Continues from a cache that a prefill already filled: `logits` are the
// logits of the last token read, and new tokens go at positions
// next_position, next_position + 1, ... (after the compressed memory).
absl::StatusOr<GenerateResult> GenerateFromLogits(LlamaForward& forward, KvCache& kv,
                                                  int64_t next_position,
                                                  std::vector<float> logits,
                                                  const GenerateOptions& options,
                                                  const std::function<bool(int32_t)>& on_token);

}  // namespace snapfill

#endif  // SNAPFILL_ENGINE_GENERATE_H_
