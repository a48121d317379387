// The environment variables the snapfill command reads, and only it (the
// library takes plain options): the model's default path and the CPU
// kernels' choices. The test harness reads the kernels' the same way.
//
//   SNAPFILL_MODEL   the model when --model is not given
//   SNAPFILL_CPU     generic | avx2 | avxvnni | avx512: a lower kernel level
//                    than the CPU's highest (BackendOptions::kernel_level)
//   SNAPFILL_AMX     0 (no AMX) | int8 (AMX-INT8 products, no AMX-BF16)
//   TMPDIR           where long inputs' token ids are spooled (--spool_dir)
//   SLURM_ARRAY_TASK_ID, _COUNT, _MIN, _MAX
//                    batch's share when --shard is not given
//   OMP_WAIT_POLICY  passive: the kernels' threads sleep at once between
//                    regions (active or unset: they spin a while first)
//   OMP_NUM_THREADS, OMP_PLACES, OMP_PROC_BIND
//                    how many threads, and where (as OpenMP reads them)
#ifndef SNAPFILL_TOOLS_CLI_ENVIRONMENT_H_
#define SNAPFILL_TOOLS_CLI_ENVIRONMENT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "snapfill/backend.h"

namespace snapfill::cli {

// Sets options' kernel choices from SNAPFILL_CPU, SNAPFILL_AMX and
// OMP_WAIT_POLICY where they are set; InvalidArgument naming the variable
// for a value that is not one of its own.
absl::Status KernelChoicesFromEnvironment(BackendOptions* options);
// Those choices put in force for the process (ConfigureCpuKernels): what
// the tests' and the benchmarks' mains do first, so that SNAPFILL_CPU runs
// a lower level's kernels there as it does in the command.
absl::Status ConfigureKernelsFromEnvironment();

// The model: `flag` when given, else $SNAPFILL_MODEL, else
// models/SmolLM2-135M-Instruct.Q4_1.gguf in the current folder or one of
// the three above it, else in the source tree the command was built from.
std::string ResolveModelPath(const std::string& flag);

// Where a long input's token ids are spooled when --spool_dir is not
// given: $TMPDIR, else /tmp.
std::string DefaultSpoolDir();

// Threads for --threads 0: OMP_NUM_THREADS's first number where it is set;
// else, where OMP_PLACES or OMP_PROC_BIND made OpenMP places, every CPU of
// the places (libgomp bound this thread to the first place as it loaded,
// so the CPUs this thread may use are that place's alone); else 0, the
// backend's default: every CPU this process may use. InvalidArgument for an
// OMP_NUM_THREADS that is not a positive number.
absl::StatusOr<int> DefaultThreads();

// The lines of `--help` that name the environment variables.
const char* EnvironmentHelp();

}  // namespace snapfill::cli

#endif  // SNAPFILL_TOOLS_CLI_ENVIRONMENT_H_
