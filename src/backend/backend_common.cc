#include "src/backend/backend_common.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cpu/ops.h"
#include "snapfill/status.h"

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

absl::Status HostTopSpans(const float* scores, int64_t n, int64_t k, int64_t span, int32_t* positions) {
  if (k < 0 || k > n || span < 1) {
    return absl::InvalidArgumentError(absl::StrCat("top_spans: k = ", k, " of ", n, ", span ", span));
  }
  cpu::TopSpanIndices(scores, n, k, span, positions);
  return absl::OkStatus();
}

absl::Status CheckHeadSelection(const Backend::HeadSelection& s) {
  if (s.num_heads < 0 || s.rest_begin < 0 || s.window_begin < s.rest_begin || s.num_candidates < s.window_begin ||
      s.pick < 0 || s.then_pick < 0 || s.pick + s.then_pick > s.window_begin - s.rest_begin) {
    return absl::InvalidArgumentError(absl::StrCat("select_heads: bad ranges: ", s.num_candidates,
                                                   " candidates, the rest [", s.rest_begin, ", ", s.window_begin, "), ",
                                                   s.pick, " then ", s.then_pick, " picked"));
  }
  if (s.pool_kernel < 1 || s.pool_kernel % 2 == 0) {
    return absl::InvalidArgumentError(absl::StrCat("select_heads: pool kernel ", s.pool_kernel, " is not odd"));
  }
  if (s.span < 1) return absl::InvalidArgumentError(absl::StrCat("select_heads: span ", s.span, " < 1"));
  if (s.num_heads > 0 && (s.keep == nullptr || s.keep_stride <= s.count() ||
                          (s.window_begin > s.rest_begin &&
                           (s.votes == nullptr || (s.votes_stride != 0 && s.votes_stride < s.window_begin))))) {
    return absl::InvalidArgumentError(absl::StrCat("select_heads: keep stride ", s.keep_stride, " for ", s.count(),
                                                   " kept and a status word, votes stride ", s.votes_stride, " for ",
                                                   s.window_begin, " candidates"));
  }
  if (s.num_heads > 0 && s.then_pick > 0 &&
      (s.then_votes == nullptr || (s.then_votes_stride != 0 && s.then_votes_stride < s.window_begin))) {
    return absl::InvalidArgumentError(absl::StrCat("select_heads: ", s.then_pick,
                                                   " picked by second votes, which are missing or have stride ",
                                                   s.then_votes_stride, " for ", s.window_begin, " candidates"));
  }
  return absl::OkStatus();
}

absl::Status CheckGateScoring(const Backend::GateScoring& g) {
  if (g.num_heads < 0 || g.n < 0 || g.head_dim < 1 || g.hidden < 1) {
    return absl::InvalidArgumentError(absl::StrCat("gate_scores: ", g.num_heads, " heads of ", g.n, " keys, head_dim ",
                                                   g.head_dim, ", hidden ", g.hidden));
  }
  if (g.num_heads == 0 || g.n == 0) return absl::OkStatus();
  if (g.params == nullptr || g.keys == nullptr || g.y == nullptr) {
    return absl::InvalidArgumentError("gate_scores: missing parameters, keys or scores");
  }
  if ((g.num_heads > 1 && g.params_stride < Backend::GateParamFloats(g.head_dim, g.hidden)) ||
      g.key_stride < g.head_dim || g.y_stride < g.n ||
      (g.num_heads > 1 && g.keys_head_stride < (g.n - 1) * g.key_stride + g.head_dim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gate_scores: strides of parameters ", g.params_stride, ", heads ", g.keys_head_stride, ", keys ",
                     g.key_stride, ", scores ", g.y_stride, " for ", g.n, " keys of ", g.head_dim, " and ", g.hidden,
                     " hidden units (", Backend::GateParamFloats(g.head_dim, g.hidden), " parameters a head)"));
  }
  return absl::OkStatus();
}

absl::Status CheckComplement(const int32_t* keep, int64_t keep_stride, int64_t kept, int64_t num_heads,
                             int64_t num_candidates, const int32_t* out, int64_t out_stride) {
  if (num_heads < 0 || kept < 0 || kept > num_candidates) {
    return absl::InvalidArgumentError(
        absl::StrCat("complement: ", num_heads, " heads keeping ", kept, " of ", num_candidates, " candidates"));
  }
  const int64_t left = num_candidates - kept;
  if (num_heads == 0 || num_candidates == 0) return absl::OkStatus();
  if ((kept > 0 && keep == nullptr) || (left > 0 && out == nullptr)) {
    return absl::InvalidArgumentError("complement: missing kept indices or output");
  }
  if (num_heads > 1 && (keep_stride < kept || out_stride < left)) {
    return absl::InvalidArgumentError(absl::StrCat("complement: strides ", keep_stride, " (kept) and ", out_stride,
                                                   " (left) for ", kept, " and ", left, " indices"));
  }
  return absl::OkStatus();
}

absl::Status HostComplement(const int32_t* keep, int64_t keep_stride, int64_t kept, int64_t num_heads,
                            int64_t num_candidates, int32_t* out, int64_t out_stride) {
  SNAPFILL_RETURN_IF_ERROR(CheckComplement(keep, keep_stride, kept, num_heads, num_candidates, out, out_stride));
  const int64_t left = num_candidates - kept;
  for (int64_t h = 0; h < num_heads; ++h) {
    const int32_t* k = keep + h * keep_stride;
    int32_t* o = out + h * out_stride;
    int64_t t = 0, n = 0;
    for (int32_t j = 0; j < num_candidates; ++j) {
      if (t < kept && k[t] == j) {
        ++t;
      } else if (n < left) {
        o[n++] = j;
      } else {
        break;  // (more left than there is room for: some kept index was not met, reported below)
      }
    }
    if (t != kept) {
      return absl::InvalidArgumentError(absl::StrCat("complement: head ", h, "'s kept indices are not ascending below ",
                                                     num_candidates, " (index ", t, " is ", k[t], ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status HostSelectHeads(const Backend::HeadSelection& s, Backend& backend) {
  SNAPFILL_RETURN_IF_ERROR(CheckHeadSelection(s));
  const int64_t num_rest = s.window_begin - s.rest_begin;
  const int64_t count = s.count();
  const int64_t picked = s.pick + s.then_pick;
  auto head = [&](int64_t h) {
    int32_t* out = s.keep + h * s.keep_stride;
    const float* rest = num_rest > 0 ? s.votes + h * s.votes_stride + s.rest_begin : nullptr;
    const float* then_rest =
        num_rest > 0 && s.then_pick > 0 ? s.then_votes + h * s.then_votes_stride + s.rest_begin : nullptr;
    int64_t bad = -1;
    for (int64_t i = 0; i < num_rest; ++i) {
      if (!std::isfinite(rest[i]) || (then_rest != nullptr && !std::isfinite(then_rest[i]))) {
        bad = s.rest_begin + i;
        break;
      }
    }
    out[count] = static_cast<int32_t>(bad);
    if (bad >= 0) {
      std::iota(out, out + count, 0);
      return;
    }
    // R's top entries land ascending after the sinks; their indices are
    // R's, shifted to the candidates' after.
    int32_t* top = out + s.rest_begin;
    // (Each thread's pooled votes and second pick kept from call to call,
    // as the pruner's per-head scratch is.)
    thread_local std::vector<float> pooled;
    thread_local std::vector<int32_t> first, second;
    if (s.pick > 0) {
      pooled.resize(num_rest);
      // (Their checks cannot fail here: CheckHeadSelection made them.)
      SNAPFILL_CHECK(HostPool1d(rest, pooled.data(), num_rest, s.pool_kernel, s.pool).ok());
      SNAPFILL_CHECK(HostTopSpans(pooled.data(), num_rest, s.pick, s.span, top).ok());
    }
    if (s.then_pick > 0) {
      // The second votes' highest among what the first pick left (the
      // SnapKV pruner's rule: what the question took scores -inf), then
      // both lists merged.
      pooled.resize(num_rest);
      SNAPFILL_CHECK(HostPool1d(then_rest, pooled.data(), num_rest, s.pool_kernel, s.pool).ok());
      first.assign(top, top + s.pick);
      second.resize(s.then_pick);
      for (int32_t i : first) pooled[i] = -std::numeric_limits<float>::infinity();
      SNAPFILL_CHECK(HostTopK(pooled.data(), num_rest, s.then_pick, second.data()).ok());
      std::merge(first.begin(), first.end(), second.begin(), second.end(), top);
    }
    std::iota(out, out + s.rest_begin, 0);
    for (int64_t t = 0; t < picked; ++t) top[t] += static_cast<int32_t>(s.rest_begin);
    std::iota(top + picked, out + count, static_cast<int32_t>(s.window_begin));
  };
  // (As SnapKV's host selection: below 256 candidates a parallel region
  // costs more than the heads.)
  if (s.num_heads > 1 && s.num_candidates >= 256) {
    backend.ParallelFor(s.num_heads, head);
  } else {
    for (int64_t h = 0; h < s.num_heads; ++h) head(h);
  }
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
