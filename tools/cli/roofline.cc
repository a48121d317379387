#include "tools/cli/roofline.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace snapfill::cli {
namespace {

double Lookup(const std::vector<std::pair<std::string, double>>& pairs, const char* name) {
  for (const auto& [key, value] : pairs) {
    if (key == name) return value;
  }
  return 0;
}

// The products' ops that ran on the float path (all of them in the exact
// arithmetic, which reports no int8 ops).
double FloatMatMulOps(const Work& w) { return std::max(0.0, w.matmul_ops - w.int8_matmul_ops); }

// Seconds of `ops` at `peak`; -1 if there are ops and no peak.
double At(double ops, const BackendProfile::Peak& peak) {
  if (ops <= 0) return 0;
  return peak.ops_per_second > 0 ? ops / peak.ops_per_second : -1;
}

const BackendProfile::Peak& AttentionPeak(const BackendProfile::Peaks& p, bool prefill) {
  return prefill ? p.prefill_attention : p.f32;
}

std::string Rate(double ops, double seconds) {
  return seconds > 0 ? absl::StrFormat("%.1f GOP/s", ops * 1e-9 / seconds) : std::string("-");
}

}  // namespace

Work WorkFromProfile(const std::vector<std::pair<std::string, double>>& seconds,
                     const std::vector<std::pair<std::string, double>>& ops, double int8_matmul_ops) {
  Work w;
  w.matmul_ops = Lookup(ops, "matmul");
  w.int8_matmul_ops = std::min(int8_matmul_ops, w.matmul_ops);
  w.attention_ops = Lookup(ops, "attention");
  w.window_ops = Lookup(ops, "window_scores");
  w.matmul_seconds = Lookup(seconds, "matmul");
  w.attention_seconds = Lookup(seconds, "attention");
  w.window_seconds = Lookup(seconds, "window_scores");
  return w;
}

const BackendProfile::Peak* MatMulPeak(const Work& work, const BackendProfile::Peaks& peaks) {
  const double int8 = work.matmul_ops > 0 ? work.int8_matmul_ops / work.matmul_ops : 0;
  return int8 >= 0.99 ? &peaks.int8_products : int8 <= 0.01 ? &peaks.f32 : nullptr;
}

double FloorSeconds(const Work& work, const BackendProfile::Peaks& peaks, bool prefill) {
  const double parts[] = {At(work.int8_matmul_ops, peaks.int8_products), At(FloatMatMulOps(work), peaks.f32),
                          At(work.attention_ops, AttentionPeak(peaks, prefill)), At(work.window_ops, peaks.f32)};
  double total = 0;
  for (double s : parts) {
    if (s < 0) return 0;
    total += s;
  }
  return total;
}

std::string PeaksLine(const BackendProfile::Peaks& p) {
  auto one = [](const char* what, const BackendProfile::Peak& peak) {
    return peak.ops_per_second > 0
               ? absl::StrFormat("%s %s %.1f GOP/s", what, peak.instruction, peak.ops_per_second * 1e-9)
               : absl::StrFormat("%s not measured", what);
  };
  if (p.int8_products.ops_per_second <= 0 && p.f32.ops_per_second <= 0 && p.prefill_attention.ops_per_second <= 0) {
    return "";
  }
  std::string attention =
      p.prefill_attention.instruction == p.f32.instruction && p.f32.ops_per_second > 0
          ? std::string("prefill attention on the f32 FMA")
          : one("prefill attention", p.prefill_attention);
  // (A GPU's peaks are the device's, not its host threads'.)
  const std::string threads = p.threads > 0 ? absl::StrFormat(" (%d threads)", p.threads) : "";
  return absl::StrFormat("peaks here%s: %s, %s, %s", threads, one("int8 products", p.int8_products),
                         one("f32", p.f32), attention);
}

std::string WorkAgainstPeaks(const Work& w, const BackendProfile::Peaks& p, bool prefill) {
  const std::string peaks = PeaksLine(p);
  if (peaks.empty()) return "";
  std::string out = peaks + "\n";
  // Each op's rate, and its share of the peak of its instruction where all
  // of its work ran on one (the products: int8 or float types, not both).
  auto share = [](double ops, double seconds, const BackendProfile::Peak& peak) {
    if (seconds <= 0 || peak.ops_per_second <= 0) return std::string();
    return absl::StrFormat(" = %.0f%% of %s", 100.0 * ops / seconds / peak.ops_per_second, peak.instruction);
  };
  if (w.matmul_ops > 0) {
    const BackendProfile::Peak* peak = MatMulPeak(w, p);
    absl::StrAppendFormat(&out, "matmul %s%s", Rate(w.matmul_ops, w.matmul_seconds),
                          peak != nullptr ? share(w.matmul_ops, w.matmul_seconds, *peak)
                                          : absl::StrFormat(" (%.0f%% of its ops on int8 types)",
                                                            100 * w.int8_matmul_ops / w.matmul_ops));
  }
  if (w.attention_ops > 0) {
    absl::StrAppendFormat(&out, "%sattention %s%s", w.matmul_ops > 0 ? "; " : "", Rate(w.attention_ops, w.attention_seconds),
                          share(w.attention_ops, w.attention_seconds, AttentionPeak(p, prefill)));
  }
  if (w.window_ops > 0) {
    absl::StrAppendFormat(&out, "; window_scores %s%s", Rate(w.window_ops, w.window_seconds),
                          share(w.window_ops, w.window_seconds, p.f32));
  }
  const double floor = FloorSeconds(w, p, prefill);
  const double took = w.matmul_seconds + w.attention_seconds + w.window_seconds;
  if (floor > 0 && took > 0) {
    absl::StrAppendFormat(&out, "\nthese ops took %.3f s; at the peaks above they need %.3f s (%.0f%% of the time)",
                          took, floor, 100 * floor / took);
  }
  return out + "\n";
}

Work WorkFromProfile(const BackendProfile* profile) {
  if (profile == nullptr) return Work{};
  return WorkFromProfile(profile->Seconds(), profile->Ops(), profile->Int8MatMulOps());
}

bool AttentionMostlyPrefill(int64_t before, int64_t prompt, int64_t generated) {
  const double b = static_cast<double>(before), p = static_cast<double>(prompt), g = static_cast<double>(generated);
  return p * (b + p / 2) >= g * (b + p + g / 2);
}

std::string ProfileReportWithPeaks(Backend& backend, bool prefill) {
  BackendProfile* profile = backend.profile();
  const std::string out = profile != nullptr ? profile->Report() : "";
  if (out.empty()) return out;
  return out + WorkAgainstPeaks(WorkFromProfile(profile), profile->MeasurePeaks(), prefill);
}

}  // namespace snapfill::cli
