// SmartKV's gates: prediction, fitting and the gate file (gate.h).
#include "src/compress/gate.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>

#include "Eigen/Core"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "snapfill/backend.h"
#include "snapfill/status.h"
#include "src/base/file_util.h"

namespace snapfill {
namespace {

constexpr char kMagic[12] = {'S', 'N', 'A', 'P', 'F', 'I', 'L', 'L', '-', 'G', 'T', '\0'};
constexpr uint64_t kMaxDim = 65536;
constexpr uint64_t kMaxFingerprint = 1024;

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vector = Eigen::VectorXf;
using RowVector = Eigen::RowVectorXf;

int64_t ParamsPerGate(int64_t d, int64_t hidden) { return 2 * d + hidden * d + 2 * hidden + 1; }

// x̂ for rows of keys: (k - mean) ⊙ inv_std.
RowMatrix Normalize(const GateParams& p, const float* keys, int64_t key_stride, int64_t n, int64_t d) {
  Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>> x(keys, n, d, Eigen::OuterStride<>(key_stride));
  const Eigen::Map<const RowVector> mean(p.mean.data(), d), inv(p.inv_std.data(), d);
  return ((x.rowwise() - mean).array().rowwise() * inv.array()).matrix();
}

// y[i] = the gate `p` on keys[i * key_stride, + d) for i < n.
void PredictGate(const GateParams& p, int64_t d, const float* keys, int64_t key_stride, int64_t n, float* y) {
  if (n <= 0) return;
  const int64_t h = static_cast<int64_t>(p.b1.size());
  const RowMatrix xn = Normalize(p, keys, key_stride, n, d);
  const Eigen::Map<const RowMatrix> w1(p.w1.data(), h, d);
  const Eigen::Map<const RowVector> b1(p.b1.data(), h);
  const Eigen::Map<const Vector> w2(p.w2.data(), h);
  const RowMatrix a = ((xn * w1.transpose()).rowwise() + b1).cwiseMax(0.0f);
  Eigen::Map<Vector> out(y, n);
  out = (a * w2).array() + p.b2;
}

// Ranks 0..n-1 of v (ties in index order).
std::vector<double> Ranks(const std::vector<double>& v) {
  std::vector<int64_t> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return v[a] < v[b]; });
  std::vector<double> r(v.size());
  for (size_t i = 0; i < order.size(); ++i) r[order[i]] = static_cast<double>(i);
  return r;
}

double Pearson(const std::vector<double>& a, const std::vector<double>& b) {
  const double n = static_cast<double>(a.size());
  if (n < 2) return 0;
  const double ma = std::accumulate(a.begin(), a.end(), 0.0) / n, mb = std::accumulate(b.begin(), b.end(), 0.0) / n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0.0;
}

// A bounds-checked little-endian reader over the file's bytes.
class Reader {
 public:
  Reader(std::string_view bytes, std::string name) : bytes_(bytes), name_(std::move(name)) {}
  template <typename T>
  absl::StatusOr<T> Get(std::string_view what) {
    T v{};
    SNAPFILL_RETURN_IF_ERROR(Read(&v, sizeof(T), what));
    return v;
  }
  absl::Status Read(void* dst, uint64_t n, std::string_view what) {
    if (n > bytes_.size() - offset_) {
      return absl::DataLossError(absl::StrCat("gate file ", name_, " is truncated: ", std::string(what), " needs ", n,
                                              " bytes at offset ", offset_, ", the file has ", bytes_.size()));
    }
    std::memcpy(dst, bytes_.data() + offset_, n);
    offset_ += n;
    return absl::OkStatus();
  }
  uint64_t offset() const { return offset_; }

 private:
  std::string_view bytes_;
  std::string name_;
  uint64_t offset_ = 0;
};

}  // namespace

absl::StatusOr<GateModel> GateModel::Create(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim,
                                            int64_t hidden) {
  for (int64_t v : {num_layers, num_kv_heads, head_dim, hidden}) {
    if (v < 1 || static_cast<uint64_t>(v) > kMaxDim) {
      return absl::InvalidArgumentError(absl::StrCat("gate shape ", num_layers, " x ", num_kv_heads, " x ",
                                                     head_dim, " (hidden ", hidden, ") is outside [1, ",
                                                     kMaxDim, "]"));
    }
  }
  GateModel g;
  g.num_layers_ = num_layers;
  g.num_kv_heads_ = num_kv_heads;
  g.head_dim_ = head_dim;
  g.hidden_ = hidden;
  g.gates_.resize(num_layers * num_kv_heads);
  for (GateParams& p : g.gates_) {
    p.mean.assign(head_dim, 0.0f);
    p.inv_std.assign(head_dim, 1.0f);
    p.w1.assign(hidden * head_dim, 0.0f);
    p.b1.assign(hidden, 0.0f);
    p.w2.assign(hidden, 0.0f);
  }
  return g;
}

int64_t GateModel::num_parameters() const {
  return num_layers_ * num_kv_heads_ * ParamsPerGate(head_dim_, hidden_);
}

uint64_t GateModel::file_bytes() const {
  return sizeof(kMagic) + 4 + 8 + fingerprint_.size() + 4 * 8 + 4 + num_parameters() * sizeof(float) + 8;
}

void GateModel::Predict(int64_t layer, int64_t head, const float* keys, int64_t key_stride, int64_t n,
                        float* y) const {
  PredictGate(params(layer, head), head_dim_, keys, key_stride, n, y);
}

std::vector<float> GateModel::Packed() const {
  std::vector<float> packed;
  packed.reserve(gates_.size() * Backend::GateParamFloats(head_dim_, hidden_));
  for (const GateParams& p : gates_) {
    for (const std::vector<float>* part : {&p.mean, &p.inv_std, &p.w1, &p.b1, &p.w2}) {
      packed.insert(packed.end(), part->begin(), part->end());
    }
    packed.push_back(p.b2);
  }
  SNAPFILL_CHECK(packed.size() == gates_.size() * Backend::GateParamFloats(head_dim_, hidden_));
  return packed;
}

std::string GateModel::Serialize() const {
  std::string bytes(kMagic, sizeof(kMagic));
  auto put = [&bytes](const void* p, size_t n) { bytes.append(static_cast<const char*>(p), n); };
  auto put_u64 = [&put](uint64_t v) { put(&v, 8); };
  const uint32_t version = kGateFileVersion;
  put(&version, 4);
  put_u64(fingerprint_.size());
  bytes += fingerprint_;
  for (int64_t v : {num_layers_, num_kv_heads_, head_dim_, hidden_}) put_u64(static_cast<uint64_t>(v));
  put(&tau_, 4);
  for (const GateParams& p : gates_) {
    for (const std::vector<float>* v : {&p.mean, &p.inv_std, &p.w1, &p.b1, &p.w2}) {
      put(v->data(), v->size() * sizeof(float));
    }
    put(&p.b2, 4);
  }
  const uint64_t digest = XXH3_64bits(bytes.data(), bytes.size());
  put(&digest, 8);
  SNAPFILL_CHECK(bytes.size() == file_bytes()) << bytes.size() << " vs " << file_bytes();
  return bytes;
}

uint64_t GateModel::Digest() const {
  const std::string bytes = Serialize();
  uint64_t digest;
  std::memcpy(&digest, bytes.data() + bytes.size() - 8, 8);
  return digest;
}

absl::Status GateModel::Save(const std::string& path, bool overwrite) const {
  return WriteFileAtomically(path, Serialize(), overwrite);
}

absl::StatusOr<GateModel> GateModel::Parse(std::string_view bytes, std::string_view name_view,
                                           std::string_view expected_view) {
  const std::string name(name_view), expected_fingerprint(expected_view);
  auto damaged = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("gate file ", name, " is damaged: ", why));
  };
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(
        absl::StrCat(name, " is not a snapfill gate file (bad magic: expected \"SNAPFILL-GT\")"));
  }
  Reader in(bytes, name);
  char magic[sizeof(kMagic)];
  SNAPFILL_RETURN_IF_ERROR(in.Read(magic, sizeof(magic), "magic"));
  SNAPFILL_ASSIGN_OR_RETURN(const uint32_t version, in.Get<uint32_t>("version"));
  if (version > kGateFileVersion) {
    return absl::UnimplementedError(absl::StrCat("gate file ", name, " is version ", version,
                                                 ", newer than this snapfill (", kGateFileVersion, ")"));
  }
  if (version < kGateFileVersion) {
    return absl::FailedPreconditionError(absl::StrCat("gate file ", name, " is version ", version,
                                                      "; this snapfill reads version ", kGateFileVersion,
                                                      ": train the gates again (snapfill train-gate)"));
  }
  SNAPFILL_ASSIGN_OR_RETURN(const uint64_t flen, in.Get<uint64_t>("fingerprint length"));
  if (flen > kMaxFingerprint) return damaged(absl::StrCat("fingerprint length ", flen));
  std::string fingerprint(flen, '\0');
  SNAPFILL_RETURN_IF_ERROR(in.Read(fingerprint.data(), flen, "fingerprint"));
  uint64_t shape[4] = {0, 0, 0, 0};  // (a message may name those not read yet)
  for (uint64_t& v : shape) {
    SNAPFILL_ASSIGN_OR_RETURN(v, in.Get<uint64_t>("shape"));
    if (v < 1 || v > kMaxDim) {
      return damaged(absl::StrCat("shape ", shape[0], " x ", shape[1], " x ", shape[2], " x ", shape[3],
                                  " is outside [1, ", kMaxDim, "]"));
    }
  }
  SNAPFILL_ASSIGN_OR_RETURN(const float tau, in.Get<float>("tau"));
  const unsigned __int128 params = static_cast<unsigned __int128>(shape[0]) * shape[1] *
                                   ParamsPerGate(static_cast<int64_t>(shape[2]), static_cast<int64_t>(shape[3]));
  const unsigned __int128 expected = in.offset() + params * sizeof(float) + 8;
  if (expected > bytes.size()) {
    return absl::DataLossError(absl::StrCat("gate file ", name, " is truncated: its header describes ",
                                            static_cast<double>(expected), " bytes but the file has ",
                                            bytes.size()));
  }
  if (expected < bytes.size()) {
    return damaged(absl::StrCat(bytes.size() - static_cast<uint64_t>(expected), " bytes after the end"));
  }
  uint64_t stored;
  std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
  const uint64_t digest = XXH3_64bits(bytes.data(), bytes.size() - 8);
  if (stored != digest) {
    return damaged(absl::StrFormat("checksum mismatch (stored %016x, computed %016x)", stored, digest));
  }
  if (!expected_fingerprint.empty() && fingerprint != expected_fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat("gate file ", name, " was trained for model ", fingerprint,
                                                      ", not for the loaded model ", expected_fingerprint));
  }
  SNAPFILL_ASSIGN_OR_RETURN(GateModel g, Create(static_cast<int64_t>(shape[0]), static_cast<int64_t>(shape[1]),
                                                static_cast<int64_t>(shape[2]), static_cast<int64_t>(shape[3])));
  g.tau_ = tau;
  g.fingerprint_ = std::move(fingerprint);
  for (GateParams& p : g.gates_) {
    for (std::vector<float>* v : {&p.mean, &p.inv_std, &p.w1, &p.b1, &p.w2}) {
      SNAPFILL_RETURN_IF_ERROR(in.Read(v->data(), v->size() * sizeof(float), "parameters"));
      for (float x : *v) {
        if (!std::isfinite(x)) return damaged("a parameter is not finite");
      }
    }
    SNAPFILL_ASSIGN_OR_RETURN(p.b2, in.Get<float>("parameters"));
    if (!std::isfinite(p.b2)) return damaged("a parameter is not finite");
  }
  return g;
}

absl::StatusOr<GateModel> GateModel::Load(const std::string& path, std::string_view expected_fingerprint) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open gate file ", path));
  std::ostringstream s;
  s << f.rdbuf();
  const std::string bytes = s.str();
  if (bytes.empty()) return absl::DataLossError(absl::StrCat("gate file ", path, " is empty"));
  return Parse(bytes, path, expected_fingerprint);
}

GateFitReport EvaluateGate(const GateParams& params, int64_t head_dim, const GateSamples& samples,
                           double baseline) {
  GateFitReport r;
  r.validation = samples.size();
  if (samples.size() == 0) return r;
  std::vector<float> y(samples.size());
  PredictGate(params, head_dim, samples.keys.data(), head_dim, samples.size(), y.data());
  double err = 0, base = 0;
  int64_t count = 0;
  std::vector<double> pred, label;
  for (int64_t i = 0; i < samples.size(); ++i) {
    const double l = samples.label[i];
    if (samples.censored[i]) {
      // Only an underestimate of a censored lifespan is known to be wrong.
      err += std::max(0.0, l - y[i]);
      base += std::max(0.0, l - baseline);
    } else {
      err += std::fabs(y[i] - l);
      base += std::fabs(baseline - l);
      pred.push_back(y[i]);
      label.push_back(l);
    }
    ++count;
  }
  r.mae = err / count;
  r.baseline_mae = base / count;
  r.rank_correlation = Pearson(Ranks(pred), Ranks(label));
  return r;
}

absl::StatusOr<GateFitReport> FitGate(const GateSamples& train, const GateSamples& validation,
                                      const GateFitOptions& options, GateParams& params) {
  const int64_t d = train.head_dim, n = train.size();
  const int64_t h = static_cast<int64_t>(params.b1.size());
  if (d < 1 || n < 2 || static_cast<int64_t>(train.keys.size()) != n * d ||
      static_cast<int64_t>(train.censored.size()) != n || h < 1 ||
      static_cast<int64_t>(params.w1.size()) != h * d || validation.head_dim != d ||
      static_cast<int64_t>(validation.keys.size()) != validation.size() * d) {
    return absl::InvalidArgumentError(absl::StrCat("gate fit: ", n, " samples of ", d, " dims, hidden ", h,
                                                   ": nothing to fit or shapes that disagree"));
  }
  if (options.epochs < 1 || options.batch < 1 || !(options.learning_rate > 0)) {
    return absl::InvalidArgumentError("gate fit: epochs, batch and learning rate must be positive");
  }
  // The inputs' scale from the training keys.
  const Eigen::Map<const RowMatrix> keys(train.keys.data(), n, d);
  const RowVector mean = keys.colwise().mean();
  const RowVector var = (keys.rowwise() - mean).array().square().colwise().mean();
  params.mean.assign(mean.data(), mean.data() + d);
  params.inv_std.resize(d);
  for (int64_t j = 0; j < d; ++j) params.inv_std[j] = 1.0f / std::sqrt(std::max(var[j], 1e-12f));
  const RowMatrix xn = Normalize(params, train.keys.data(), d, n, d);
  const Eigen::Map<const Vector> labels(train.label.data(), n);
  const double label_mean = labels.mean();

  // He initialization; the output starts at the labels' mean.
  std::mt19937_64 rng(options.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  RowMatrix w1(h, d);
  for (int64_t i = 0; i < w1.size(); ++i) w1.data()[i] = normal(rng) * std::sqrt(2.0f / d);
  RowVector b1 = RowVector::Zero(h);
  Vector w2(h);
  for (int64_t i = 0; i < h; ++i) w2[i] = normal(rng) * std::sqrt(1.0f / h);
  float b2 = static_cast<float>(label_mean);

  // Adam.
  constexpr float kBeta1 = 0.9f, kBeta2 = 0.999f, kEps = 1e-8f;
  RowMatrix m_w1 = RowMatrix::Zero(h, d), v_w1 = RowMatrix::Zero(h, d);
  RowVector m_b1 = RowVector::Zero(h), v_b1 = RowVector::Zero(h);
  Vector m_w2 = Vector::Zero(h), v_w2 = Vector::Zero(h);
  float m_b2 = 0, v_b2 = 0;
  int64_t step = 0;
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  RowMatrix xb;
  Vector yb;
  std::vector<uint8_t> cb;
  for (int64_t epoch = 0; epoch < options.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t b0 = 0; b0 < n; b0 += options.batch) {
      const int64_t bn = std::min(options.batch, n - b0);
      xb.resize(bn, d);
      yb.resize(bn);
      cb.resize(bn);
      for (int64_t i = 0; i < bn; ++i) {
        xb.row(i) = xn.row(order[b0 + i]);
        yb[i] = labels[order[b0 + i]];
        cb[i] = train.censored[order[b0 + i]];
      }
      const RowMatrix z = (xb * w1.transpose()).rowwise() + b1;
      const RowMatrix a = z.cwiseMax(0.0f);
      Vector r = ((a * w2).array() + b2).matrix() - yb;
      for (int64_t i = 0; i < bn; ++i) {
        if (cb[i] && r[i] > 0) r[i] = 0;  // a censored life may be longer than seen
      }
      const Vector dy = r * (2.0f / bn);
      const Vector g_w2 = a.transpose() * dy;
      const float g_b2 = dy.sum();
      const RowMatrix dz = ((dy * w2.transpose()).array() * (z.array() > 0.0f).cast<float>()).matrix();
      const RowMatrix g_w1 = dz.transpose() * xb;
      const RowVector g_b1 = dz.colwise().sum();
      ++step;
      const float c1 = 1.0f - std::pow(kBeta1, static_cast<float>(step));
      const float c2 = 1.0f - std::pow(kBeta2, static_cast<float>(step));
      const float lr = options.learning_rate;
      auto adam = [&](auto& w, auto& m, auto& v, const auto& g) {
        m = kBeta1 * m + (1 - kBeta1) * g;
        v = kBeta2 * v + (1 - kBeta2) * g.cwiseProduct(g);
        w.array() -= lr * (m.array() / c1) / ((v.array() / c2).sqrt() + kEps);
      };
      adam(w1, m_w1, v_w1, g_w1);
      adam(b1, m_b1, v_b1, g_b1);
      adam(w2, m_w2, v_w2, g_w2);
      m_b2 = kBeta1 * m_b2 + (1 - kBeta1) * g_b2;
      v_b2 = kBeta2 * v_b2 + (1 - kBeta2) * g_b2 * g_b2;
      b2 -= lr * (m_b2 / c1) / (std::sqrt(v_b2 / c2) + kEps);
    }
  }
  params.w1.assign(w1.data(), w1.data() + w1.size());
  params.b1.assign(b1.data(), b1.data() + h);
  params.w2.assign(w2.data(), w2.data() + h);
  params.b2 = b2;
  GateFitReport report = EvaluateGate(params, d, validation, label_mean);
  report.train = n;
  return report;
}

}  // namespace snapfill
