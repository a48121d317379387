#include "src/engine/generate.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "src/base/sys_stats.h"
#include "snapfill/status.h"

namespace snapfill {
namespace {

// Samples a token from `logits`, emits it, feeds it back, until the budget,
// an end-of-generation token or on_token says stop.
absl::Status DecodeLoop(LlamaForward& forward, KvCache& kv, int32_t next_pos,
                        std::vector<float>& logits, const GenerateOptions& options,
                        const std::function<bool(int32_t)>& on_token, const Stopwatch& total,
                        GenerateResult& result) {
  const int64_t vocab = forward.model().config().vocab_size;
  Sampler sampler(options.sampling);
  Stopwatch decode;
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    const int32_t token = sampler.Sample(logits.data(), vocab);
    if (i == 0) {
      result.ttft_seconds = total.Seconds();
      decode.Reset();
    }
    if (options.is_eog && options.is_eog(token)) {
      result.stopped_at_eog = true;
      break;
    }
    result.tokens.push_back(token);
    if (on_token && !on_token(token)) break;
    if (i + 1 == options.max_new_tokens) break;
    const double before = decode.Seconds();
    SNAPFILL_RETURN_IF_ERROR(forward.Forward(&token, 1, &next_pos, kv, 1, logits.data()));
    if (i == 0) result.first_step_seconds = decode.Seconds() - before;
    ++next_pos;
  }
  if (!result.tokens.empty()) result.decode_seconds = decode.Seconds();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GenerateResult> Generate(LlamaForward& forward, KvCache& kv, int64_t start_pos,
                                        const std::vector<int32_t>& prompt,
                                        const GenerateOptions& options,
                                        const std::function<bool(int32_t)>& on_token) {
  SNAPFILL_RETURN_IF_ERROR(ValidateSamplingParams(options.sampling));
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (options.max_new_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("-n=", options.max_new_tokens, " must be >= 0"));
  }
  const int64_t used = kv.max_size();
  const int64_t need = static_cast<int64_t>(prompt.size()) + options.max_new_tokens;
  if (need > kv.room()) {
    return absl::OutOfRangeError(absl::StrCat("prompt (", prompt.size(), " tokens) + ",
                                              options.max_new_tokens, " new tokens + ", used,
                                              " cached exceed the KV capacity of ", used + kv.room()));
  }
  const int64_t vocab = forward.model().config().vocab_size;
  std::vector<float> logits(vocab);
  std::vector<int32_t> pos(prompt.size());
  std::iota(pos.begin(), pos.end(), static_cast<int32_t>(start_pos));

  GenerateResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  Stopwatch total;
  SNAPFILL_RETURN_IF_ERROR(forward.Forward(prompt.data(), static_cast<int64_t>(prompt.size()),
                                           pos.data(), kv, 1, logits.data()));
  result.prefill_seconds = total.Seconds();

  SNAPFILL_RETURN_IF_ERROR(DecodeLoop(forward, kv, static_cast<int32_t>(start_pos + prompt.size()), logits,
                                      options, on_token, total, result));
  return result;
}

absl::StatusOr<GenerateResult> GenerateFromLogits(LlamaForward& forward, KvCache& kv,
                                                  int64_t next_position,
                                                  std::vector<float> logits,
                                                  const GenerateOptions& options,
                                                  const std::function<bool(int32_t)>& on_token) {
  SNAPFILL_RETURN_IF_ERROR(ValidateSamplingParams(options.sampling));
  if (static_cast<int64_t>(logits.size()) != forward.model().config().vocab_size) {
    return absl::InvalidArgumentError("logits do not match the vocabulary");
  }
  const int64_t used = kv.max_size();
  if (options.max_new_tokens > kv.room()) {
    return absl::OutOfRangeError(absl::StrCat(options.max_new_tokens, " new tokens + ", used,
                                              " cached exceed the KV capacity of ", used + kv.room()));
  }
  GenerateResult result;
  Stopwatch total;
  SNAPFILL_RETURN_IF_ERROR(DecodeLoop(forward, kv, static_cast<int32_t>(next_position), logits,
                                      options, on_token, total, result));
  return result;
}

}  // namespace snapfill
