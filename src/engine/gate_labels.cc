// The gates' training labels (gate_labels.h).
#include "src/engine/gate_labels.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "Eigen/Core"
#include "absl/strings/str_cat.h"
#include "snapfill/status.h"
#include "src/model/llama_forward.h"

namespace snapfill {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

}  // namespace

absl::Status CollectGateSamples(const LlamaModel& model, Backend* backend, const int32_t* tokens, int64_t n,
                                const GateLabelOptions& options, std::vector<GateSamples>* samples) {
  const LlamaConfig& c = model.config();
  if (n < 2 || n > c.context_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("a gate training sequence of ", n, " tokens; expected 2 to ", c.context_length));
  }
  if (!(options.tau > 0) || options.alive_margin < 1 || options.skip_first < 0) {
    return absl::InvalidArgumentError(absl::StrCat("gate labels: tau=", options.tau, " alive_margin=",
                                                   options.alive_margin, " skip_first=", options.skip_first,
                                                   " (tau > 0, margin >= 1, skip >= 0)"));
  }
  const int64_t d = c.head_dim, group = c.num_heads / c.num_kv_heads;
  samples->resize(c.num_layers * c.num_kv_heads);
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<int64_t> last(n);
  std::vector<uint8_t> alive(n);
  RowMatrix qh(n, d), kh(n, d), s(n, n);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // The labels are computed on the host: where the host cannot reach the
  // backend's buffers (a device), the rows come over first.
  const bool on_host = backend->HostReachesBuffers();
  std::vector<float> q_host, k_host;
  auto host_rows = [&](const float* x, int64_t stride, int64_t rows, int64_t width,
                       std::vector<float>* copy) -> absl::StatusOr<const float*> {
    if (on_host || rows == 0) return x;
    copy->resize((rows - 1) * stride + width);
    SNAPFILL_RETURN_IF_ERROR(backend->Download(x, copy->data(), copy->size() * sizeof(float)));
    return copy->data();
  };
  auto attend = [&](int64_t layer, float* q, int64_t q_stride, float* k, float* v, int64_t kv_stride, int64_t rows,
                    int64_t out_rows, float* out) -> absl::Status {
    // A sliding-window layer keeps its window in the chunk loop, whatever
    // the gates say: it attends within it here and gives no samples.
    const bool local = c.IsLocal(layer);
    const int64_t kv_dim = c.num_kv_heads * d;
    // The samples' features: the keys before RoPE.
    const float* keys = k;
    if (!local) {
      SNAPFILL_ASSIGN_OR_RETURN(keys, host_rows(k, kv_stride, rows, kv_dim, &k_host));
    }
    for (int64_t h = 0; h < c.num_kv_heads && !local; ++h) {
      GateSamples& gs = (*samples)[layer * c.num_kv_heads + h];
      gs.head_dim = d;
      for (int64_t j = options.skip_first; j < rows; ++j) {
        gs.keys.insert(gs.keys.end(), keys + j * kv_stride + h * d, keys + j * kv_stride + (h + 1) * d);
      }
    }
    SNAPFILL_RETURN_IF_ERROR(backend->Rope(q, rows, c.num_heads, d, q_stride, pos.data(), c.rope(layer)));
    SNAPFILL_RETURN_IF_ERROR(backend->Rope(k, rows, c.num_kv_heads, d, kv_stride, pos.data(), c.rope(layer)));
    if (out_rows > 0) {
      KvView view;
      view.k = k;
      view.v = v;
      view.head_stride = d;
      view.key_stride = kv_stride;
      view.num_keys = rows;
      Queries queries = LlamaQueries(c, q, q_stride, rows);
      if (local) queries.window = c.sliding_window;
      SNAPFILL_RETURN_IF_ERROR(
          backend->Attention(queries.From(rows - out_rows), view, out + (rows - out_rows) * q_stride, q_stride));
    }
    if (local) return absl::OkStatus();
    // Every weight of the causal softmax, a query head at a time, over the
    // rows after RoPE.
    const float* qr = nullptr;
    SNAPFILL_ASSIGN_OR_RETURN(qr, host_rows(q, q_stride, rows, c.num_heads * d, &q_host));
    SNAPFILL_ASSIGN_OR_RETURN(keys, host_rows(k, kv_stride, rows, kv_dim, &k_host));
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      std::iota(last.begin(), last.end(), 0);
      std::fill(alive.begin(), alive.end(), 0);
      for (int64_t j = 0; j < rows; ++j)
        kh.row(j) = Eigen::Map<const Eigen::RowVectorXf>(keys + j * kv_stride + h * d, d);
      for (int64_t g = h * group; g < (h + 1) * group; ++g) {
        for (int64_t t = 0; t < rows; ++t)
          qh.row(t) = Eigen::Map<const Eigen::RowVectorXf>(qr + t * q_stride + g * d, d);
        s.noalias() = (qh * kh.transpose()) * scale;
        for (int64_t t = 0; t < rows; ++t) {
          float* row = s.row(t).data();
          const float mx = *std::max_element(row, row + t + 1);
          float sum = 0;
          for (int64_t j = 0; j <= t; ++j) sum += (row[j] = std::exp(row[j] - mx));
          const float thr = options.tau / static_cast<float>(t + 1) * sum;  // on the unnormalized weights
          const bool end = t >= rows - options.alive_margin;
          for (int64_t j = 0; j <= t; ++j) {
            if (row[j] > thr) {
              last[j] = std::max(last[j], t);
              if (end) alive[j] = 1;
            }
          }
        }
      }
      GateSamples& gs = (*samples)[layer * c.num_kv_heads + h];
      for (int64_t j = options.skip_first; j < rows; ++j) {
        gs.label.push_back(std::log1p(static_cast<float>(last[j] - j)) / std::log(4.0f));
        gs.censored.push_back(alive[j]);
      }
    }
    return absl::OkStatus();
  };
  SNAPFILL_ASSIGN_OR_RETURN(std::unique_ptr<LlamaForward> forward, LlamaForward::Create(model, backend, n));
  std::vector<float> logits(c.vocab_size);
  return forward->ForwardWithAttention(tokens, n, attend, 0, logits.data(), 0);
}

}  // namespace snapfill
