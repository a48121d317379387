// The work a run did against what this machine's instructions allow: the
// ops of the profile (BackendProfile::Ops) over the peak rates of the
// instructions the kernels run on (Backend::MeasurePeaks). The floor is the
// time the work would take if every product and every attention ran at its
// instruction's peak on all threads, with nothing else to do; a run's time
// over its floor says how far from the silicon it ran
// (docs/history/BENCHMARKS-log.md). Used by --profile and `snapfill bench`.
#ifndef SNAPFILL_TOOLS_CLI_ROOFLINE_H_
#define SNAPFILL_TOOLS_CLI_ROOFLINE_H_

#include <string>
#include <utility>
#include <vector>

#include "snapfill/backend.h"

namespace snapfill::cli {

// What a profile counted: ops (a multiply-add counts 2) and seconds.
struct Work {
  double matmul_ops = 0, int8_matmul_ops = 0, attention_ops = 0, window_ops = 0;
  double matmul_seconds = 0, attention_seconds = 0, window_seconds = 0;
};

// From the (op name, value) pairs of BackendProfile::Seconds and
// BackendProfile::Ops, and Int8MatMulOps.
Work WorkFromProfile(const std::vector<std::pair<std::string, double>>& seconds,
                     const std::vector<std::pair<std::string, double>>& ops, double int8_matmul_ops);
// The same from a backend's profile (a Work of zeros where it has none).
Work WorkFromProfile(const BackendProfile* profile);

// The floor of `work` at `peaks` (seconds): the int8 products at the int8
// peak, the other products and the votes at the f32 peak, the attention at
// the prefill attention's peak (prefill) or the f32 peak (decode only).
// 0 where work needs a peak that was not measured (AMX tiles, the portable
// kernels).
double FloorSeconds(const Work& work, const BackendProfile::Peaks& peaks, bool prefill = true);

// The peak the products compare with: the int8 peak where (nearly) all
// their ops ran on int8 dots, the f32 one where (nearly) none did; null
// for a mix of both.
const BackendProfile::Peak* MatMulPeak(const Work& work, const BackendProfile::Peaks& peaks);

// "peaks here (2 threads): int8 products vpmaddubsw ymm 452.3 GOP/s, f32
// vfmadd231ps ymm 185.2 GFLOP/s, prefill attention on the f32 FMA"; "" if
// nothing was measured.
std::string PeaksLine(const BackendProfile::Peaks& peaks);

// For --profile: the peaks line, then the rate of the products, the
// attention and the votes against the peak of the instruction each runs
// on, and the floor of the whole against the time the ops took.
std::string WorkAgainstPeaks(const Work& work, const BackendProfile::Peaks& peaks, bool prefill);

// Backend::ProfileReport (the table of --profile), then, with profiling,
// WorkAgainstPeaks at peaks measured now (about 0.3 s). "" without
// profiling. prefill: the run was a chunked prefill (its attention is the
// prefill attention's), not decoding alone.
std::string ProfileReportWithPeaks(Backend& backend, bool prefill);

// Whether a generate run's attention was mostly the prompt's (the prefill
// kernel's peak applies) rather than the decoding's: a prompt of `prompt`
// tokens after `before` cached positions, then `generated` tokens one at a
// time; by the query-key pairs each sees (a 562-token prompt and one token:
// prefill; a 4-token prompt and 32 tokens: decode).
bool AttentionMostlyPrefill(int64_t before, int64_t prompt, int64_t generated);

}  // namespace snapfill::cli

#endif  // SNAPFILL_TOOLS_CLI_ROOFLINE_H_
