#include "src/backend/backend_common.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cpu/ops.h"

namespace snapfill {

std::string OpTableReport(const char* const* names, const double* seconds, const int64_t* calls, const double* ops,
                          int n) {
  double total = 0;
  for (int i = 0; i < n; ++i) total += seconds[i];
  std::string out =
      absl::StrFormat("%-14s %10s %8s %8s %12s %10s\n", "op", "seconds", "share", "calls", "GOP", "GOP/s");
  for (int i = 0; i < n; ++i) {
    absl::StrAppendFormat(&out, "%-14s %10.3f %7.1f%% %8d", names[i], seconds[i],
                          total > 0 ? 100 * seconds[i] / total : 0.0, calls[i]);
    if (ops[i] > 0) {
      absl::StrAppendFormat(&out, " %12.1f %10.1f", ops[i] * 1e-9, seconds[i] > 0 ? ops[i] * 1e-9 / seconds[i] : 0.0);
    }
    out += "\n";
  }
  absl::StrAppendFormat(&out, "%-14s %10.3f\n", "backend total", total);
  return out;
}

std::vector<std::pair<std::string, double>> OpTablePairs(const char* const* names, const double* values, int n) {
  std::vector<std::pair<std::string, double>> out;
  for (int i = 0; i < n; ++i) out.emplace_back(names[i], values[i]);
  return out;
}

absl::Status CheckQueries(const char* op, const Queries& q, const KvView& kv, bool causal) {
  if (q.num_kv_heads <= 0 || q.num_heads % q.num_kv_heads != 0 || q.count < 0 || (causal && q.count > kv.num_keys) ||
      q.stride < q.num_heads * q.head_dim || kv.key_stride < q.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": bad shapes: ", q.count, " queries (stride ", q.stride,
                                                   "), ", kv.num_keys, " keys (stride ", kv.key_stride, "), ",
                                                   q.num_heads, "/", q.num_kv_heads, " heads of ", q.head_dim));
  }
  return absl::OkStatus();
}

absl::Status HostPool1d(const float* in, float* out, int64_t n, int64_t kernel, Backend::PoolOp op) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("pool1d: n = ", n));
  if (kernel <= 1) {
    std::copy(in, in + n, out);
  } else if (kernel % 2 == 0) {
    return absl::InvalidArgumentError(absl::StrCat("pool1d: kernel ", kernel, " is even"));
  } else if (op == Backend::PoolOp::kAvg) {
    cpu::AvgPool1d(in, out, n, kernel);
  } else {
    cpu::MaxPool1d(in, out, n, kernel);
  }
  return absl::OkStatus();
}

absl::Status HostTopK(const float* scores, int64_t n, int64_t k, int32_t* positions) {
  if (k < 0 || k > n) return absl::InvalidArgumentError(absl::StrCat("top_k: k = ", k, " of ", n));
  cpu::TopKIndices(scores, n, k, positions);
  return absl::OkStatus();
}

absl::Status CheckGathers(const std::vector<Backend::RowGather>& gathers) {
  for (size_t g = 0; g < gathers.size(); ++g) {
    const Backend::RowGather& r = gathers[g];
    if (r.count < 0) return absl::InvalidArgumentError(absl::StrCat("gather ", g, ": count ", r.count, " < 0"));
    if (r.count > 0 && r.row_bytes > 0 && (r.src == nullptr || r.dst == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("gather ", g, ": null source or destination"));
    }
  }
  return absl::OkStatus();
}


void GatherRows(const Backend::RowGather& r, int64_t r0, int64_t r1) {
  const auto* src = static_cast<const uint8_t*>(r.src);
  auto* dst = static_cast<uint8_t*>(r.dst);
  if (r.rows == nullptr && r.src_stride == r.row_bytes && r.dst_stride == r.row_bytes) {
    std::memcpy(dst + r0 * r.row_bytes, src + r0 * r.row_bytes, (r1 - r0) * r.row_bytes);
    return;
  }
  for (int64_t i = r0; i < r1; ++i) {
    const int64_t from = r.rows != nullptr ? r.rows[i] : i;
    std::memcpy(dst + i * r.dst_stride, src + from * r.src_stride, r.row_bytes);
  }
}

}  // namespace snapfill
