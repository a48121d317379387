// snapfill train-gate: SmartKV's gates for --pruner=gate (DESIGN.md §9).
// The texts are cut into sequences of --seq_len tokens; each runs through
// the model with full causal attention (CollectGateSamples records every
// entry's key before RoPE and how long it was attended); one sequence in
// ten is held out; a gate per layer and KV head is fitted (FitGate) and
// its held-out error printed per layer, beside a constant's.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "snapfill/status.h"
#include "src/base/sys_stats.h"
#include "src/compress/gate.h"
#include "src/engine/gate_labels.h"
#include "src/gguf/fingerprint.h"
#include "tools/cli/commands.h"
#include "tools/cli/common.h"
#include "tools/cli/flags.h"

namespace snapfill::cli {

absl::Status RunTrainGate() {
  const std::string inputs = absl::GetFlag(FLAGS_input);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (inputs.empty()) return absl::InvalidArgumentError("give the training texts: --input FILE[,FILE...]");
  if (out.empty()) return absl::InvalidArgumentError("give the gate file to write: --out FILE");
  if (!absl::GetFlag(FLAGS_force) && access(out.c_str(), F_OK) == 0) {
    return absl::AlreadyExistsError(absl::StrCat("--out ", out, " exists: add --force to replace it"));
  }
  const int64_t seq_len = absl::GetFlag(FLAGS_seq_len);
  const int64_t max_sequences = absl::GetFlag(FLAGS_max_sequences);
  const int64_t hidden = absl::GetFlag(FLAGS_hidden);
  GateLabelOptions label_options;
  label_options.tau = static_cast<float>(absl::GetFlag(FLAGS_tau));
  GateFitOptions fit;
  fit.epochs = absl::GetFlag(FLAGS_epochs);
  fit.seed = absl::GetFlag(FLAGS_seed) + 1;
  if (seq_len < 64) return absl::InvalidArgumentError(absl::StrCat("--seq_len=", seq_len, " must be >= 64"));
  if (max_sequences < 2) {
    return absl::InvalidArgumentError(absl::StrCat("--max_sequences=", max_sequences, " must be >= 2"));
  }
  if (!(label_options.tau > 0)) return absl::InvalidArgumentError("--tau must be > 0");
  if (fit.epochs < 1) return absl::InvalidArgumentError("--epochs must be >= 1");

  // The texts, read before the model (a missing file fails at once).
  std::vector<std::string> texts;
  for (absl::string_view path : absl::StrSplit(inputs, ',', absl::SkipEmpty())) {
    SNAPFILL_ASSIGN_OR_RETURN(texts.emplace_back(), ReadInput(std::string(path), "--input"));
  }
  SNAPFILL_ASSIGN_OR_RETURN(LoadedModel m, LoadModelFromFlags());
  SNAPFILL_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, BackendFromFlags(m.model.get()));
  const LlamaConfig& mc = m.model->config();
  if (seq_len > mc.context_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seq_len=", seq_len, " is beyond the model's context of ", mc.context_length));
  }
  // Sequences: every text cut into --seq_len pieces, then --max_sequences
  // of them spread evenly over all.
  std::vector<std::vector<int32_t>> pieces;
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = m.tokenizer->Encode(text, /*add_special=*/false, /*parse_special=*/false);
    for (size_t i = 0; i + seq_len <= ids.size(); i += seq_len) {
      pieces.emplace_back(ids.begin() + i, ids.begin() + i + seq_len);
    }
  }
  if (static_cast<int64_t>(pieces.size()) < 2) {
    return absl::InvalidArgumentError(absl::StrCat("the inputs hold ", pieces.size(), " sequences of ", seq_len,
                                                   " tokens; at least 2 are needed (one is held out)"));
  }
  const int64_t count = std::min<int64_t>(max_sequences, pieces.size());
  std::vector<GateSamples> train, held;
  int64_t num_train = 0, num_held = 0;
  Stopwatch watch;
  for (int64_t s = 0; s < count; ++s) {
    const std::vector<int32_t>& seq = pieces[s * pieces.size() / count];
    // One in ten held out (at least one).
    const bool validation = s % 10 == 9 || (count < 10 && s == count - 1);
    ++(validation ? num_held : num_train);
    SNAPFILL_RETURN_IF_ERROR(
        CollectGateSamples(*m.model, backend.get(), seq.data(), seq.size(), label_options, validation ? &held : &train));
    std::fprintf(stderr, "\r[train-gate] labels: sequence %lld/%lld (%lld tokens each) | %s", (long long)(s + 1),
                 (long long)count, (long long)seq_len, HumanSeconds(watch.Seconds()).c_str());
  }
  std::fputc('\n', stderr);

  SNAPFILL_ASSIGN_OR_RETURN(GateModel gates, GateModel::Create(mc.num_layers, mc.num_kv_heads, mc.head_dim, hidden));
  gates.set_tau(label_options.tau);
  gates.set_fingerprint(ModelFingerprint(m.model->gguf()));
  std::printf("train-gate: %lld training and %lld held-out sequences of %lld tokens, tau %g, %lld hidden units, "
              "%lld epochs\n",
              (long long)num_train, (long long)num_held,
              (long long)seq_len, label_options.tau, (long long)hidden, (long long)fit.epochs);
  std::printf("%5s %12s %12s %12s %10s\n", "layer", "held-out MAE", "constant MAE", "rank corr.", "censored");
  double all_mae = 0, all_base = 0, all_rank = 0;
  int64_t fitted = 0;
  for (int64_t l = 0; l < mc.num_layers; ++l) {
    // A sliding-window layer keeps its window, whatever a gate would say:
    // no samples, and its gates stay untrained.
    if (mc.IsLocal(l)) {
      std::printf("%5lld %12s\n", (long long)l, "(window)");
      continue;
    }
    ++fitted;
    double mae = 0, base = 0, rank = 0, censored = 0;
    for (int64_t h = 0; h < mc.num_kv_heads; ++h) {
      const GateSamples& t = train[l * mc.num_kv_heads + h];
      const GateSamples& v = held[l * mc.num_kv_heads + h];
      SNAPFILL_ASSIGN_OR_RETURN(const GateFitReport r, FitGate(t, v, fit, gates.params(l, h)));
      mae += r.mae;
      base += r.baseline_mae;
      rank += r.rank_correlation;
      int64_t alive = 0;
      for (uint8_t c : t.censored) alive += c;
      censored += static_cast<double>(alive) / std::max<int64_t>(1, t.size());
    }
    const double k = static_cast<double>(mc.num_kv_heads);
    std::printf("%5lld %12.3f %12.3f %12.3f %9.1f%%\n", (long long)l, mae / k, base / k, rank / k,
                100.0 * censored / k);
    std::fprintf(stderr, "\r[train-gate] fit: layer %lld/%lld | %s", (long long)(l + 1), (long long)mc.num_layers,
                 HumanSeconds(watch.Seconds()).c_str());
    all_mae += mae / k;
    all_base += base / k;
    all_rank += rank / k;
  }
  std::fputc('\n', stderr);
  const double layers = static_cast<double>(std::max<int64_t>(1, fitted));
  std::printf("all layers: held-out MAE %.3f (log4 lifespan), constant %.3f, rank correlation %.3f\n",
              all_mae / layers, all_base / layers, all_rank / layers);
  // Other sizes on the same samples, for choosing --hidden.
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_compare_hidden), ',', absl::SkipEmpty())) {
    int64_t size = 0;
    if (!absl::SimpleAtoi(text, &size) || size < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--compare_hidden: \"", std::string(text), "\" is not a size"));
    }
    SNAPFILL_ASSIGN_OR_RETURN(GateModel other, GateModel::Create(mc.num_layers, mc.num_kv_heads, mc.head_dim, size));
    double mae = 0, rank = 0;
    for (int64_t g = 0; g < mc.num_layers * mc.num_kv_heads; ++g) {
      if (mc.IsLocal(g / mc.num_kv_heads)) continue;
      SNAPFILL_ASSIGN_OR_RETURN(const GateFitReport r, FitGate(train[g], held[g], fit,
                                                               other.params(g / mc.num_kv_heads, g % mc.num_kv_heads)));
      mae += r.mae;
      rank += r.rank_correlation;
    }
    const double gates_count = static_cast<double>(std::max<int64_t>(1, fitted) * mc.num_kv_heads);
    std::printf("hidden %lld: held-out MAE %.3f, rank correlation %.3f, %lld parameters (%s)\n", (long long)size,
                mae / gates_count, rank / gates_count, (long long)other.num_parameters(),
                HumanBytes(other.file_bytes()).c_str());
  }
  SNAPFILL_RETURN_IF_ERROR(gates.Save(out, absl::GetFlag(FLAGS_force)));
  std::printf("gates: %lld gates, %lld parameters, %s in %s (%s)\n", (long long)(mc.num_layers * mc.num_kv_heads),
              (long long)gates.num_parameters(), HumanBytes(gates.file_bytes()).c_str(), out.c_str(),
              HumanSeconds(watch.Seconds()).c_str());
  return absl::OkStatus();
}

}  // namespace snapfill::cli
