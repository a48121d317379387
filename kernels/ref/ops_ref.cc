#include "kernels/ref/ops_ref.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/quant_blocks.h"

namespace snapfill::ref {

void RmsNorm(const float* x, int64_t x_stride, const float* weight, float* y, int64_t y_stride,
             int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_stride;
    float* yr = y + r * y_stride;
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const double scale = 1.0 / std::sqrt(sum / static_cast<double>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = static_cast<float>(xr[i] * scale * weight[i]);
  }
}

void Rope(float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim, int64_t token_stride,
          const int32_t* pos, int64_t rot_dim, float freq_base, float freq_scale, bool neox,
          const float* freq_factors) {
  assert(rot_dim % 2 == 0 && rot_dim <= head_dim);
  const int64_t half = rot_dim / 2;
  const float theta_scale = std::pow(freq_base, -2.0f / static_cast<float>(rot_dim));
  std::vector<double> cos_t(half), sin_t(half);
  for (int64_t t = 0; t < num_tokens; ++t) {
    // ggml_rope_cache_init: the f32 angle recurrence defines the angles.
    float theta = static_cast<float>(pos[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float turned = freq_factors != nullptr ? theta / freq_factors[i] : theta;
      const double angle = static_cast<double>(freq_scale * turned);
      cos_t[i] = std::cos(angle);
      sin_t[i] = std::sin(angle);
      theta *= theta_scale;
    }
    for (int64_t h = 0; h < num_heads; ++h) {
      float* xh = x + t * token_stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = neox ? i : 2 * i;
        const int64_t b = neox ? i + half : 2 * i + 1;
        const double x0 = xh[a], x1 = xh[b];
        xh[a] = static_cast<float>(x0 * cos_t[i] - x1 * sin_t[i]);
        xh[b] = static_cast<float>(x0 * sin_t[i] + x1 * cos_t[i]);
      }
    }
  }
}

void GeluGlu(const float* gate, const float* up, float* out, int64_t n) {
  const double c = std::sqrt(2.0 / 3.14159265358979323846);
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(0.5 * g * (1.0 + std::tanh(c * (g + 0.044715 * g * g * g))) * up[i]);
  }
}

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

namespace {

// Scores s_j = scale · q·k_j for the keys j < num_visible, in double.
void Scores(const float* qh, const float* kh, int64_t kv_key_stride, int64_t num_visible,
            int64_t head_dim, float scale, std::vector<double>& s) {
  s.resize(num_visible);
  for (int64_t j = 0; j < num_visible; ++j) {
    double dot = 0.0;
    for (int64_t d = 0; d < head_dim; ++d) {
      dot += static_cast<double>(qh[d]) * kh[j * kv_key_stride + d];
    }
    s[j] = dot * scale;
  }
}

// p = softmax(s) in place, in double.
void SoftmaxDouble(std::vector<double>& s) {
  const double m = *std::max_element(s.begin(), s.end());
  double sum = 0.0;
  for (double& v : s) {
    v = std::exp(v - m);
    sum += v;
  }
  for (double& v : s) v /= sum;
}

}  // namespace

void Attention(const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_head_stride,
               int64_t kv_key_stride, float* out, int64_t out_stride, int64_t num_q, int64_t num_keys,
               int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale, int64_t window, float* lse) {
  assert(num_heads % num_kv_heads == 0 && num_keys >= num_q && window >= 0);
  const int64_t group = num_heads / num_kv_heads;
  std::vector<double> p;
  std::vector<double> acc(head_dim);
  for (int64_t i = 0; i < num_q; ++i) {
    const int64_t end = num_keys - num_q + i + 1;  // past the last visible key
    const int64_t first = window > 0 ? std::max<int64_t>(0, end - window) : 0;
    const int64_t num_visible = end - first;
    for (int64_t h = 0; h < num_heads; ++h) {
      const int64_t kvh = h / group;
      const float* kh = k + kvh * kv_head_stride + first * kv_key_stride;
      const float* vh = v + kvh * kv_head_stride + first * kv_key_stride;
      Scores(q + i * q_stride + h * head_dim, kh, kv_key_stride, num_visible, head_dim, scale, p);
      if (lse != nullptr) {
        const double mx = *std::max_element(p.begin(), p.end());
        double sum = 0.0;
        for (double x : p) sum += std::exp(x - mx);
        lse[h * num_q + i] = static_cast<float>(mx + std::log(sum));
      }
      SoftmaxDouble(p);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < num_visible; ++j) {
        for (int64_t d = 0; d < head_dim; ++d) acc[d] += p[j] * vh[j * kv_key_stride + d];
      }
      float* o = out + i * out_stride + h * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) o[d] = static_cast<float>(acc[d]);
    }
  }
}

void AttentionBf16(const float* q, int64_t q_stride, const float* k, const float* v, int64_t kv_head_stride,
                   int64_t kv_key_stride, float* out, int64_t out_stride, int64_t num_q, int64_t num_keys,
                   int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale, float* abs_out,
                   int64_t window, float* lse) {
  assert(num_heads % num_kv_heads == 0 && num_keys >= num_q && window >= 0);
  const int64_t group = num_heads / num_kv_heads;
  auto bf = [](float x) { return static_cast<double>(Bf16ToFp32(Fp32ToBf16Rne(x))); };
  std::vector<double> s, qh(head_dim), acc(head_dim), acc_abs(head_dim);
  for (int64_t i = 0; i < num_q; ++i) {
    const int64_t end = num_keys - num_q + i + 1;  // past the last visible key
    const int64_t first = window > 0 ? std::max<int64_t>(0, end - window) : 0;
    const int64_t num_visible = end - first;
    for (int64_t h = 0; h < num_heads; ++h) {
      const int64_t kvh = h / group;
      const float* kh = k + kvh * kv_head_stride + first * kv_key_stride;
      const float* vh = v + kvh * kv_head_stride + first * kv_key_stride;
      for (int64_t d = 0; d < head_dim; ++d) qh[d] = bf(q[i * q_stride + h * head_dim + d] * scale);
      s.assign(num_visible, 0.0);
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < num_visible; ++j) {
        for (int64_t d = 0; d < head_dim; ++d) s[j] += qh[d] * bf(kh[j * kv_key_stride + d]);
        mx = std::max(mx, s[j]);
      }
      double sum = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      std::fill(acc_abs.begin(), acc_abs.end(), 0.0);
      for (int64_t j = 0; j < num_visible; ++j) {
        const double p = std::exp(s[j] - mx);
        sum += p;
        const double pb = bf(static_cast<float>(p));
        for (int64_t d = 0; d < head_dim; ++d) {
          const double term = pb * bf(vh[j * kv_key_stride + d]);
          acc[d] += term;
          acc_abs[d] += std::fabs(term);
        }
      }
      if (lse != nullptr) lse[h * num_q + i] = static_cast<float>(mx + std::log(sum));
      for (int64_t d = 0; d < head_dim; ++d) {
        out[i * out_stride + h * head_dim + d] = static_cast<float>(acc[d] / sum);
        if (abs_out != nullptr) abs_out[i * out_stride + h * head_dim + d] = static_cast<float>(acc_abs[d] / sum);
      }
    }
  }
}

void WindowScores(const float* q, int64_t q_stride, const float* k, int64_t kv_head_stride,
                  int64_t kv_key_stride, float* votes, int64_t votes_stride, int64_t num_q,
                  int64_t num_keys, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                  float scale) {
  assert(num_heads % num_kv_heads == 0 && num_keys >= num_q);
  const int64_t group = num_heads / num_kv_heads;
  std::vector<double> p;
  std::vector<double> acc(num_keys);
  for (int64_t kvh = 0; kvh < num_kv_heads; ++kvh) {
    std::fill(acc.begin(), acc.end(), 0.0);
    const float* kh = k + kvh * kv_head_stride;
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      for (int64_t i = 0; i < num_q; ++i) {
        const int64_t num_visible = num_keys - num_q + i + 1;
        Scores(q + i * q_stride + h * head_dim, kh, kv_key_stride, num_visible, head_dim, scale, p);
        SoftmaxDouble(p);
        for (int64_t j = 0; j < num_visible; ++j) acc[j] += p[j];
      }
    }
    for (int64_t j = 0; j < num_keys; ++j) {
      votes[kvh * votes_stride + j] = static_cast<float>(acc[j] / static_cast<double>(group));
    }
  }
}

void QueryLogSumExp(const float* q, int64_t q_stride, const float* k, int64_t kv_head_stride,
                    int64_t kv_key_stride, int64_t num_q, int64_t num_keys, int64_t num_heads,
                    int64_t num_kv_heads, int64_t head_dim, float scale, float* lse) {
  assert(num_heads % num_kv_heads == 0 && num_keys >= num_q);
  const int64_t group = num_heads / num_kv_heads;
  std::vector<double> s;
  for (int64_t h = 0; h < num_heads; ++h) {
    const float* kh = k + (h / group) * kv_head_stride;
    for (int64_t i = 0; i < num_q; ++i) {
      Scores(q + i * q_stride + h * head_dim, kh, kv_key_stride, num_keys - num_q + i + 1, head_dim, scale, s);
      const double m = *std::max_element(s.begin(), s.end());
      double sum = 0.0;
      for (double v : s) sum += std::exp(v - m);
      lse[h * num_q + i] = static_cast<float>(m + std::log(sum));
    }
  }
}

void RecallScores(const float* q, int64_t q_stride, int64_t num_q, const float* lse, const float* k,
                  int64_t kv_head_stride, int64_t kv_key_stride, int64_t num_keys, float* scores,
                  int64_t scores_stride, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                  float scale, bool max_weight) {
  assert(num_heads % num_kv_heads == 0);
  const int64_t group = num_heads / num_kv_heads;
  std::vector<double> s;
  std::vector<double> acc(num_keys);
  for (int64_t kvh = 0; kvh < num_kv_heads; ++kvh) {
    std::fill(acc.begin(), acc.end(), 0.0);
    const float* kh = k + kvh * kv_head_stride;
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      for (int64_t i = 0; i < num_q; ++i) {
        Scores(q + i * q_stride + h * head_dim, kh, kv_key_stride, num_keys, head_dim, scale, s);
        for (int64_t j = 0; j < num_keys; ++j) {
          const double w = std::exp(s[j] - lse[h * num_q + i]);
          acc[j] = max_weight ? std::max(acc[j], w) : acc[j] + w;
        }
      }
    }
    for (int64_t j = 0; j < num_keys; ++j) {
      scores[kvh * scores_stride + j] = static_cast<float>(max_weight ? acc[j] : acc[j] / static_cast<double>(group));
    }
  }
}

void RecallMaxWeightsBf16(const float* q, int64_t q_stride, int64_t num_q, const float* lse, const float* k,
                          int64_t kv_head_stride, int64_t kv_key_stride, int64_t num_keys, float* scores,
                          int64_t scores_stride, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                          float scale) {
  auto bf = [](float x) { return Bf16ToFp32(Fp32ToBf16Rne(x)); };
  // q·scale and k rounded as the kernels round them, then RecallScores' max
  // at scale 1 (dense copies: row stride head_dim · heads, key stride head_dim).
  std::vector<float> qr(num_q * num_heads * head_dim), kr(num_kv_heads * num_keys * head_dim);
  for (int64_t i = 0; i < num_q; ++i) {
    for (int64_t t = 0; t < num_heads * head_dim; ++t)
      qr[i * num_heads * head_dim + t] = bf(q[i * q_stride + t] * scale);
  }
  for (int64_t h = 0; h < num_kv_heads; ++h) {
    for (int64_t j = 0; j < num_keys; ++j) {
      for (int64_t t = 0; t < head_dim; ++t) {
        kr[(h * num_keys + j) * head_dim + t] = bf(k[h * kv_head_stride + j * kv_key_stride + t]);
      }
    }
  }
  RecallScores(qr.data(), num_heads * head_dim, num_q, lse, kr.data(), num_keys * head_dim, head_dim, num_keys, scores,
               scores_stride, num_heads, num_kv_heads, head_dim, 1.0f, /*max_weight=*/true);
}

void AvgPool1d(const float* in, float* out, int64_t n, int64_t kernel) {
  assert(kernel % 2 == 1);
  const int64_t pad = kernel / 2;
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0.0;
    for (int64_t t = i - pad; t <= i + pad; ++t) {
      if (t >= 0 && t < n) sum += in[t];
    }
    out[i] = static_cast<float>(sum / static_cast<double>(kernel));
  }
}

void MaxPool1d(const float* in, float* out, int64_t n, int64_t kernel) {
  assert(kernel % 2 == 1);
  const int64_t pad = kernel / 2;
  for (int64_t i = 0; i < n; ++i) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t t = std::max<int64_t>(0, i - pad); t <= std::min(n - 1, i + pad); ++t) {
      m = std::max(m, in[t]);
    }
    out[i] = m;
  }
}

void TopKIndices(const float* scores, int64_t n, int64_t k, int32_t* out_sorted_positions) {
  k = std::min(k, n);
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [scores](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  });
  std::sort(idx.begin(), idx.begin() + k);
  std::copy(idx.begin(), idx.begin() + k, out_sorted_positions);
}

void TopSpanIndices(const float* scores, int64_t n, int64_t k, int64_t span, int32_t* out_sorted_positions) {
  // (Single entries are the k highest: the search below would take k passes
  // over n, minutes at the tests' 70,000 candidates.)
  if (span <= 1) return TopKIndices(scores, n, k, out_sorted_positions);
  k = std::min(k, n);
  std::vector<bool> taken(std::max<int64_t>(n, 0), false);
  const int64_t half = span / 2;
  for (int64_t left = k; left > 0;) {
    int64_t peak = -1;
    for (int64_t i = 0; i < n; ++i) {
      if (!taken[i] && (peak < 0 || scores[i] > scores[peak])) peak = i;
    }
    taken[peak] = true;
    --left;
    for (int64_t d = 1; d <= half && left > 0; ++d) {
      for (const int64_t j : {peak - d, peak + d}) {
        if (left > 0 && j >= 0 && j < n && !taken[j]) {
          taken[j] = true;
          --left;
        }
      }
    }
  }
  int64_t o = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (taken[i]) out_sorted_positions[o++] = static_cast<int32_t>(i);
  }
}

void Complement(const int32_t* keep, int64_t keep_stride, int64_t kept, int64_t num_heads, int64_t num_candidates,
                int32_t* out, int64_t out_stride) {
  std::vector<bool> kept_mark(num_candidates);
  for (int64_t h = 0; h < num_heads; ++h) {
    std::fill(kept_mark.begin(), kept_mark.end(), false);
    for (int64_t i = 0; i < kept; ++i) kept_mark[keep[h * keep_stride + i]] = true;
    int64_t n = 0;
    for (int64_t j = 0; j < num_candidates; ++j) {
      if (!kept_mark[j]) out[h * out_stride + n++] = static_cast<int32_t>(j);
    }
  }
}

void SelectHeads(const float* votes, int64_t votes_stride, int64_t num_heads, int64_t num_candidates,
                 int64_t rest_begin, int64_t window_begin, int64_t pick, int64_t pool_kernel, bool max_pool,
                 int64_t span, const float* then_votes, int64_t then_votes_stride, int64_t then_pick, int32_t* keep,
                 int64_t keep_stride) {
  const int64_t num_rest = window_begin - rest_begin;
  const int64_t count = rest_begin + pick + then_pick + (num_candidates - window_begin);
  std::vector<float> pooled(num_rest), then_pooled(num_rest);
  std::vector<int32_t> top(pick);
  // (Pooled in f32, in index order, the sum times 1/kernel, as
  // kernels/cpu's AvgPool1d: every backend keeps the same entries.)
  auto pool = [&](const float* rest, std::vector<float>& out) {
    const int64_t pad = pool_kernel / 2;
    const float inv = 1.0f / static_cast<float>(pool_kernel);
    for (int64_t i = 0; i < num_rest; ++i) {
      const int64_t lo = std::max<int64_t>(0, i - pad), hi = std::min(num_rest - 1, i + pad);
      float acc = max_pool ? rest[lo] : 0.0f;
      for (int64_t t = max_pool ? lo + 1 : lo; t <= hi; ++t) acc = max_pool ? std::max(acc, rest[t]) : acc + rest[t];
      out[i] = max_pool ? acc : acc * inv;
    }
  };
  for (int64_t h = 0; h < num_heads; ++h) {
    const float* rest = votes + h * votes_stride + rest_begin;
    const float* then_rest = then_pick > 0 ? then_votes + h * then_votes_stride + rest_begin : nullptr;
    int32_t* out = keep + h * keep_stride;
    int64_t bad = -1;
    for (int64_t i = 0; i < num_rest && bad < 0; ++i) {
      if (!std::isfinite(rest[i]) || (then_rest != nullptr && !std::isfinite(then_rest[i]))) bad = rest_begin + i;
    }
    out[count] = static_cast<int32_t>(bad);
    if (bad >= 0) {
      std::iota(out, out + count, 0);
      continue;
    }
    pool(rest, pooled);
    TopSpanIndices(pooled.data(), num_rest, pick, span, top.data());
    std::vector<bool> kept(num_rest, false);
    for (int32_t i : top) kept[i] = true;
    if (then_pick > 0) {
      // The untaken entries ranked by the second pooled votes, in full.
      pool(then_rest, then_pooled);
      std::vector<int32_t> order;
      for (int64_t i = 0; i < num_rest; ++i) {
        if (!kept[i]) order.push_back(static_cast<int32_t>(i));
      }
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return then_pooled[a] > then_pooled[b]; });
      for (int64_t t = 0; t < then_pick; ++t) kept[order[t]] = true;
    }
    int64_t o = 0;
    for (int64_t j = 0; j < rest_begin; ++j) out[o++] = static_cast<int32_t>(j);
    for (int64_t i = 0; i < num_rest; ++i) {
      if (kept[i]) out[o++] = static_cast<int32_t>(rest_begin + i);
    }
    for (int64_t j = window_begin; j < num_candidates; ++j) out[o++] = static_cast<int32_t>(j);
  }
}

void Softmax(float* x, int64_t n) {
  std::vector<double> s(x, x + n);
  SoftmaxDouble(s);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(s[i]);
}

int64_t Argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

void GateForward(const float* mean, const float* inv_std, const float* w1, const float* b1, const float* w2, float b2,
                 int64_t head_dim, int64_t hidden, const float* keys, int64_t key_stride, int64_t n, float* y) {
  std::vector<double> x(head_dim);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t t = 0; t < head_dim; ++t) x[t] = (double(keys[i * key_stride + t]) - mean[t]) * inv_std[t];
    double out = b2;
    for (int64_t j = 0; j < hidden; ++j) {
      double z = b1[j];
      for (int64_t t = 0; t < head_dim; ++t) z += double(w1[j * head_dim + t]) * x[t];
      out += double(w2[j]) * std::max(z, 0.0);
    }
    y[i] = static_cast<float>(out);
  }
}

}  // namespace snapfill::ref
