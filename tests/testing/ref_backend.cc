#include "tests/testing/ref_backend.h"

#include <algorithm>

#include "kernels/cpu/matmul.h"
#include "kernels/ref/ops_ref.h"
#include "kernels/ref/quant_ref.h"
#include "snapfill/status.h"
#include "src/backend/backend_common.h"

namespace snapfill::testing {
namespace {

class RefBackend final : public Backend {
 public:
  RefBackend(bool quantized, bool bf16, bool keeps_lse) : quantized_(quantized), bf16_(bf16), keeps_lse_(keeps_lse) {}
  Device device() const override { return Device::kCpu; }
  int num_threads() const override { return 1; }

  absl::Status MatMul(const float* x, int64_t m, int64_t x_stride, const WeightView& w, float* y,
                      int64_t y_stride) override {
    if (bf16_ && cpu::MatMulFuses(w.type, m, w.cols, w.row_bytes)) {
      return ref::MatMulBf16(x, m, w.cols, x_stride, w.data, w.type, w.rows, w.row_bytes, y, y_stride)
                 ? absl::OkStatus()
                 : absl::UnimplementedError("ref bf16 matmul: unsupported type");
    }
    const bool ok = quantized_ ? ref::MatMulQuantizedActivations(x, m, w.cols, x_stride, w.data,
                                                                 w.type, w.rows, w.row_bytes, y,
                                                                 y_stride)
                               : ref::MatMul(x, m, w.cols, x_stride, w.data, w.type, w.rows,
                                             w.row_bytes, y, y_stride);
    return ok ? absl::OkStatus() : absl::UnimplementedError("ref matmul: unsupported type");
  }
  absl::Status GetRows(const WeightView& table, const int32_t* ids, int64_t n, float* out,
                       int64_t out_stride) override {
    for (int64_t i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= table.rows) return absl::OutOfRangeError("token id");
      ref::DequantizeRow(table.type, static_cast<const uint8_t*>(table.data) + ids[i] * table.row_bytes,
                         out + i * out_stride, table.cols);
    }
    return absl::OkStatus();
  }
  absl::Status RmsNorm(const float* x, int64_t x_stride, const float* weight, float* y,
                       int64_t y_stride, int64_t rows, int64_t dim, float eps) override {
    ref::RmsNorm(x, x_stride, weight, y, y_stride, rows, dim, eps);
    return absl::OkStatus();
  }
  absl::Status Rope(float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim,
                    int64_t token_stride, const int32_t* pos, const RopeSpec& r) override {
    ref::Rope(x, num_tokens, num_heads, head_dim, token_stride, pos, r.rot_dim, r.freq_base,
              r.freq_scale, r.neox, r.freq_factors);
    return absl::OkStatus();
  }
  absl::Status GeluGlu(const float* gate, const float* up, float* out, int64_t n) override {
    ref::GeluGlu(gate, up, out, n);
    return absl::OkStatus();
  }
  absl::Status SwiGlu(const float* gate, const float* up, float* out, int64_t n) override {
    ref::SwiGlu(gate, up, out, n);
    return absl::OkStatus();
  }
  absl::Status Attention(const Queries& q, const KvView& kv, float* out, int64_t out_stride) override {
    ref::Attention(q.q, q.stride, kv.k, kv.v, kv.head_stride, kv.key_stride, out, out_stride, q.count, kv.num_keys,
                   q.num_heads, q.num_kv_heads, q.head_dim, q.scale, q.window);
    return absl::OkStatus();
  }
  absl::Status AttentionWithLse(const Queries& q, const KvView& kv, float* out, int64_t out_stride,
                                float* lse) override {
    ref::Attention(q.q, q.stride, kv.k, kv.v, kv.head_stride, kv.key_stride, out, out_stride, q.count, kv.num_keys,
                   q.num_heads, q.num_kv_heads, q.head_dim, q.scale, q.window, lse);
    return absl::OkStatus();
  }
  bool AttentionKeepsLse() const override { return keeps_lse_; }
  absl::Status QueryLogSumExp(const Queries& q, const KvView& kv, float* lse) override {
    ref::QueryLogSumExp(q.q, q.stride, kv.k, kv.head_stride, kv.key_stride, q.count, kv.num_keys, q.num_heads,
                        q.num_kv_heads, q.head_dim, q.scale, lse);
    return absl::OkStatus();
  }
  absl::Status RecallScores(const Queries& q, const float* lse, const KvView& keys, float* scores,
                            int64_t scores_stride, bool max_weight) override {
    ref::RecallScores(q.q, q.stride, q.count, lse, keys.k, keys.head_stride, keys.key_stride, keys.num_keys, scores,
                      scores_stride, q.num_heads, q.num_kv_heads, q.head_dim, q.scale, max_weight);
    return absl::OkStatus();
  }
  absl::Status WindowScores(const Queries& q, const KvView& kv, float* votes, int64_t votes_stride) override {
    ref::WindowScores(q.q, q.stride, kv.k, kv.head_stride, kv.key_stride, votes, votes_stride, q.count,
                      kv.num_keys, q.num_heads, q.num_kv_heads, q.head_dim, q.scale);
    return absl::OkStatus();
  }
  absl::Status Pool1d(const float* in, float* out, int64_t n, int64_t kernel, PoolOp op) override {
    if (kernel <= 1) {
      std::copy(in, in + n, out);
    } else if (op == PoolOp::kAvg) {
      ref::AvgPool1d(in, out, n, kernel);
    } else {
      ref::MaxPool1d(in, out, n, kernel);
    }
    return absl::OkStatus();
  }
  absl::Status TopK(const float* scores, int64_t n, int64_t k, int32_t* positions) override {
    ref::TopKIndices(scores, n, k, positions);
    return absl::OkStatus();
  }
  absl::Status TopSpans(const float* scores, int64_t n, int64_t k, int64_t span, int32_t* positions) override {
    ref::TopSpanIndices(scores, n, k, span, positions);
    return absl::OkStatus();
  }
  absl::Status SelectHeads(const HeadSelection& s) override {
    SNAPFILL_RETURN_IF_ERROR(CheckHeadSelection(s));
    ref::SelectHeads(s.votes, s.votes_stride, s.num_heads, s.num_candidates, s.rest_begin, s.window_begin, s.pick,
                     s.pool_kernel, s.pool == PoolOp::kMax, s.span, s.then_votes, s.then_votes_stride, s.then_pick,
                     s.keep, s.keep_stride);
    return absl::OkStatus();
  }
  absl::Status Complement(const int32_t* keep, int64_t keep_stride, int64_t kept, int64_t num_heads,
                          int64_t num_candidates, int32_t* out, int64_t out_stride) override {
    SNAPFILL_RETURN_IF_ERROR(CheckComplement(keep, keep_stride, kept, num_heads, num_candidates, out, out_stride));
    ref::Complement(keep, keep_stride, kept, num_heads, num_candidates, out, out_stride);
    return absl::OkStatus();
  }
  absl::Status GateScores(const GateScoring& g) override {
    SNAPFILL_RETURN_IF_ERROR(CheckGateScoring(g));
    for (int64_t h = 0; h < g.num_heads && g.n > 0; ++h) {
      const float* p = g.params + h * g.params_stride;
      const int64_t d = g.head_dim, u = g.hidden;
      ref::GateForward(p, p + d, p + 2 * d, p + 2 * d + u * d, p + 2 * d + u * d + u, p[2 * d + u * d + 2 * u], d, u,
                       g.keys + h * g.keys_head_stride, g.key_stride, g.n, g.y + h * g.y_stride);
    }
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  bool quantized_;
  bool bf16_;
  bool keeps_lse_;
};

}  // namespace

std::unique_ptr<Backend> CreateRefBackend(bool quantized_activations, bool bf16_products, bool attention_keeps_lse) {
  return std::make_unique<RefBackend>(quantized_activations, bf16_products, attention_keeps_lse);
}

Backend& SharedCpuBackend() {
  static Backend* const backend = [] {
    auto b = CreateBackend(Device::kCpu);
    SNAPFILL_CHECK(b.ok()) << b.status();
    return std::move(b).value().release();
  }();
  return *backend;
}

}  // namespace snapfill::testing
