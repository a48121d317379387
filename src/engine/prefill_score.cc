// The loss of each chunk's tokens given the memory (PrefillConfig::
// score_tokens; `snapfill ppl`).
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "snapfill/status.h"
#include "src/engine/prefill_engine.h"
#include "src/engine/prefill_internal.h"

namespace snapfill {

using prefill_internal::RunItems;

absl::Status PrefillEngineImpl::ScoreChunk(int64_t total, const ScheduleStep& step) {
  const int64_t vocab = model_.config().vocab_size;
  // tokens[t] for t in [start, end], from the batch.
  const int32_t* tokens = batch_.data() + step_query_rows_ - step.start_token;
  const int64_t end = step.start_token + step.chunk_tokens;
  std::vector<float>& nll = telemetry_.token_nll;
  nll.clear();
  nll.reserve(step.chunk_tokens);
  double nll_sum = 0;
  // Token start_i, predicted by chunk i-1's last position.
  if (has_carry_nll_) {
    nll.push_back(static_cast<float>(carry_nll_));
    nll_sum += carry_nll_;
  }
  has_carry_nll_ = false;
  // Position t predicts token t + 1: positions start..end-2 score this
  // chunk's tokens, end-1 the next chunk's first (carried); the input's last
  // position predicts nothing.
  const int64_t last_position = std::min(end, total - 1);  // exclusive
  std::vector<double> row_nll(score_rows_);
  for (int64_t first = step.start_token; first < last_position; first += score_rows_) {
    const int64_t rows = std::min(score_rows_, last_position - first);
    SNAPFILL_RETURN_IF_ERROR(
        forward_->BatchLogits(step_query_rows_ + first - step.start_token, rows, score_logits_.data()));
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t target = tokens[first + r + 1];
      if (target < 0 || target >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("token ", first + r + 1, " is id ", target,
                                                       ", outside the vocabulary of ", vocab));
      }
    }
    // -log softmax(row)[target] = logsumexp(row) - row[target], in double.
    RunItems(*backend_, rows, rows > 1, [&](int64_t r) {
      const float* row = score_logits_.data() + r * vocab;
      const float max = *std::max_element(row, row + vocab);
      double sum = 0;
      for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(row[j] - max));
      row_nll[r] = std::log(sum) + max - row[tokens[first + r + 1]];
    });
    for (int64_t r = 0; r < rows; ++r) {
      if (first + r + 1 < end) {
        nll.push_back(static_cast<float>(row_nll[r]));
        nll_sum += row_nll[r];
      } else {
        carry_nll_ = row_nll[r];
        has_carry_nll_ = true;
      }
    }
  }
  telemetry_.scored_tokens = static_cast<int64_t>(nll.size());
  telemetry_.nll_sum = nll_sum;
  return absl::OkStatus();
}

}  // namespace snapfill
