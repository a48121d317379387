// The main of the CPU kernels' benchmarks: Google Benchmark's, after the
// kernels' choices are read from the environment as the snapfill command
// and the tests read them (tools/cli/environment.h), so that SNAPFILL_CPU
// times a lower level's copy of the kernels (avxvnni's on an AVX-512 CPU
// that has AVX-VNNI), SNAPFILL_AMX the kernels without AMX, and
// OMP_WAIT_POLICY the team's passive waits.
#include <cstdio>

#include "benchmark/benchmark.h"
#include "tools/cli/environment.h"

int main(int argc, char** argv) {
  const absl::Status s = snapfill::cli::ConfigureKernelsFromEnvironment();
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 2;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
