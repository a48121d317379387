// SmartKV's learned gates (DESIGN.md §9; shared/seeds, enjeyw/smartkv): per
// layer and KV head, a small MLP reads an entry's key before RoPE and
// predicts log4(1 + the entry's lifespan), the age at which the group's
// query heads last attend to it above a threshold. The gate pruner keeps
// sinks, the recent window and the entries with the longest predicted
// lives (SnapKV's selection over the predictions, which each entry keeps as
// its score while it is kept).
//
// One gate: x̂ = (k - mean) ⊙ inv_std; h = relu(W1 x̂ + b1) [hidden];
// y = w2 · h + b2. One hidden layer: on the same samples 8, 16 and 32 units
// fitted equally well and 128 or 256 worse (docs/RESULTS.md); the seed's
// four layers of 256 would cost 27 MFLOP a token for this model.
//
// The gate file (little-endian, fixed width, no padding):
//   char[12] magic "SNAPFILL-GT\0"
//   u32      version (kGateFileVersion)
//   u64      fingerprint length F (<= 1024), F bytes: the model's
//            ModelFingerprint(); another model's gates are refused
//   u64      num_layers, num_kv_heads, head_dim, hidden (each in [1, 65536])
//   f32      tau: the threshold the labels were taken at (relative to
//            uniform attention), a record
//   per layer, per KV head: f32 mean[head_dim], inv_std[head_dim],
//            w1[hidden][head_dim], b1[hidden], w2[hidden], b2
//   u64      XXH3-64 of every byte before it
// Written atomically (AtomicFileWriter): an existing file only with
// overwrite, never a partial one.
#ifndef SNAPFILL_COMPRESS_GATE_H_
#define SNAPFILL_COMPRESS_GATE_H_

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace snapfill {

inline constexpr uint32_t kGateFileVersion = 1;

// One layer-and-KV-head gate's parameters.
struct GateParams {
  std::vector<float> mean, inv_std;  // [head_dim]
  std::vector<float> w1;             // [hidden][head_dim]
  std::vector<float> b1, w2;         // [hidden]
  float b2 = 0.0f;
};

class GateModel {
 public:
  // Zero gates (every prediction b2 = 0) of the shape; InvalidArgument for
  // a shape outside [1, 65536].
  static absl::StatusOr<GateModel> Create(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim,
                                          int64_t hidden);

  int64_t num_layers() const { return num_layers_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t hidden() const { return hidden_; }
  float tau() const { return tau_; }
  void set_tau(float tau) { tau_ = tau; }
  const std::string& fingerprint() const { return fingerprint_; }
  void set_fingerprint(std::string f) { fingerprint_ = std::move(f); }
  GateParams& params(int64_t layer, int64_t head) { return gates_[layer * num_kv_heads_ + head]; }
  const GateParams& params(int64_t layer, int64_t head) const { return gates_[layer * num_kv_heads_ + head]; }
  // Parameters of every gate, and the file's size in bytes.
  int64_t num_parameters() const;
  uint64_t file_bytes() const;

  // y[i] = the gate of (layer, head) on keys[i * key_stride, + head_dim)
  // for i < n (Eigen products; ref::GateForward is the scalar twin).
  void Predict(int64_t layer, int64_t head, const float* keys, int64_t key_stride, int64_t n, float* y) const;

  // Every gate's parameters as Backend::GateScores reads them: per layer,
  // per KV head, mean, inv_std, w1, b1, w2, b2 (GateParamFloats(head_dim,
  // hidden) floats a gate).
  std::vector<float> Packed() const;

  // The file's bytes, and its checksum (the XXH3-64 trailer): what a
  // checkpoint records of the gates its scores came from.
  std::string Serialize() const;
  uint64_t Digest() const;
  // Saves atomically (AlreadyExists if the file exists and !overwrite).
  absl::Status Save(const std::string& path, bool overwrite) const;
  // Loads and checks a gate file: DataLoss for a file that is not one, is
  // truncated, has trailing bytes, absurd counts, non-finite parameters or
  // a checksum mismatch; Unimplemented for a newer version,
  // FailedPrecondition for an older one or for another model's gates (when
  // expected_fingerprint is given; naming both).
  static absl::StatusOr<GateModel> Load(const std::string& path, std::string_view expected_fingerprint);
  static absl::StatusOr<GateModel> Parse(std::string_view bytes, std::string_view name,
                                         std::string_view expected_fingerprint);

 private:
  int64_t num_layers_ = 0, num_kv_heads_ = 0, head_dim_ = 0, hidden_ = 0;
  float tau_ = 0.0f;
  std::string fingerprint_;
  std::vector<GateParams> gates_;  // [num_layers][num_kv_heads]
};

// Training samples of one gate: keys before RoPE, the log4 lifespan seen,
// and whether the entry was still attended at the end of its sequence (its
// true lifespan is then at least the label: censored).
struct GateSamples {
  int64_t head_dim = 0;
  std::vector<float> keys;    // [n][head_dim]
  std::vector<float> label;   // [n] log4(1 + lifespan)
  std::vector<uint8_t> censored;  // [n]
  int64_t size() const { return static_cast<int64_t>(label.size()); }
};

struct GateFitOptions {
  int64_t epochs = 30;
  int64_t batch = 256;
  float learning_rate = 3e-3f;
  uint64_t seed = 1;
};

// What a fit reached on held-out samples: the mean absolute error of the
// gate on the uncensored ones (a censored one counts only when the gate
// predicts below its bound), the same error of the constant that predicts
// the training labels' mean, and Spearman's rank correlation of predictions
// and labels (uncensored).
struct GateFitReport {
  double mae = 0, baseline_mae = 0, rank_correlation = 0;
  int64_t train = 0, validation = 0;
};

// Fits one gate (Adam on the squared error; a censored sample is penalized
// only where the prediction is below its label) to `train`, reports on
// `validation`. InvalidArgument for an empty or misshapen sample set.
absl::StatusOr<GateFitReport> FitGate(const GateSamples& train, const GateSamples& validation,
                                      const GateFitOptions& options, GateParams& params);

// The report of `params` on `samples` (as FitGate's), with the constant
// `baseline` as the mean to compare with.
GateFitReport EvaluateGate(const GateParams& params, int64_t head_dim, const GateSamples& samples, double baseline);

}  // namespace snapfill

#endif  // SNAPFILL_COMPRESS_GATE_H_
