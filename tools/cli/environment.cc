#include "tools/cli/environment.h"

#include <omp.h>
#include <sched.h>
#include <strings.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "snapfill/status.h"

namespace snapfill::cli {
namespace {

// The variable's value, or null where it is unset or empty.
const char* Get(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' ? v : nullptr;
}

}  // namespace

absl::Status KernelChoicesFromEnvironment(BackendOptions* options) {
  if (const char* level = Get("SNAPFILL_CPU")) {
    if (const absl::StatusOr<int> known = KernelLevelIndex(level); !known.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("SNAPFILL_CPU=", level, ": ", known.status().message()));
    }
    options->kernel_level = level;
  }
  if (const char* amx = Get("SNAPFILL_AMX")) {
    const std::string a = amx;
    if (a == "0") {
      options->amx = BackendOptions::Amx::kOff;
    } else if (a == "int8") {
      options->amx = BackendOptions::Amx::kInt8Only;
    } else if (a == "1") {
      options->amx = BackendOptions::Amx::kAll;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "SNAPFILL_AMX=", a, ": expected 0 (no AMX), int8 (AMX-INT8 only) or 1 (all AMX, the default)"));
    }
  }
  if (const char* policy = Get("OMP_WAIT_POLICY")) {
    // OpenMP's own values, in any case; libgomp reads the variable too.
    if (strcasecmp(policy, "passive") == 0) {
      options->thread_waits = BackendOptions::Waits::kPassive;
    } else if (strcasecmp(policy, "active") == 0) {
      options->thread_waits = BackendOptions::Waits::kSpin;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("OMP_WAIT_POLICY=", policy, ": expected passive or active"));
    }
  }
  return absl::OkStatus();
}

absl::Status ConfigureKernelsFromEnvironment() {
  BackendOptions options;
  SNAPFILL_RETURN_IF_ERROR(KernelChoicesFromEnvironment(&options));
  return ConfigureCpuKernels(options);
}

std::string ResolveModelPath(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* env = Get("SNAPFILL_MODEL")) return env;
  namespace fs = std::filesystem;
  const std::string rel = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  // The default location is the repository's models/ folder; look upwards
  // from the current directory so that build/ and bin/ work too.
  std::error_code ec;
  fs::path dir = fs::current_path(ec);
  for (int i = 0; i < 4 && !dir.empty(); ++i) {
    if (fs::exists(dir / rel, ec)) return (dir / rel).string();
    if (dir == dir.parent_path()) break;
    dir = dir.parent_path();
  }
#ifdef SNAPFILL_SOURCE_DIR_FOR_MODELS
  return std::string(SNAPFILL_SOURCE_DIR_FOR_MODELS) + "/" + rel;
#else
  return rel;
#endif
}

std::string DefaultSpoolDir() {
  if (const char* env = Get("TMPDIR"); env != nullptr && *env != '\0') return env;
  return "/tmp";
}

absl::StatusOr<int> DefaultThreads() {
  if (const char* n = Get("OMP_NUM_THREADS")) {
    // OpenMP's list form "4,2" gives the outermost level first.
    int threads = 0;
    const std::string first = std::string(n).substr(0, std::string(n).find(','));
    if (!absl::SimpleAtoi(first, &threads) || threads < 1) {
      return absl::InvalidArgumentError(absl::StrCat("OMP_NUM_THREADS=", n, ": expected a positive number"));
    }
    return threads;
  }
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int p = 0; p < omp_get_num_places(); ++p) {
    std::vector<int> ids(std::max(omp_get_place_num_procs(p), 0));
    omp_get_place_proc_ids(p, ids.data());
    for (int id : ids) {
      if (id >= 0 && id < CPU_SETSIZE) CPU_SET(id, &cpus);
    }
  }
  return CPU_COUNT(&cpus);
}

const char* EnvironmentHelp() {
  return "environment:\n"
         "  SNAPFILL_MODEL         the model when --model is not given\n"
         "  SNAPFILL_CPU           generic|avx2|avxvnni|avx512: a lower kernel level than the CPU's highest\n"
         "  SNAPFILL_AMX           0: no AMX; int8: AMX-INT8 products only, no AMX-BF16\n"
         "  SNAPFILL_KERNELS       --kernels when it is not given (the test suite sets flags: no timing)\n"
         "  TMPDIR                 --spool_dir when it is not given (else /tmp)\n"
         "  SLURM_ARRAY_TASK_ID, _COUNT, _MIN, _MAX  batch: the share of a Slurm array task (--shard)\n"
         "  OMPI_COMM_WORLD_SIZE, PMI_SIZE  batch: the ranks an MPI launcher started (docs/BATCH.md)\n"
         "  OMP_WAIT_POLICY        passive: the kernels' threads sleep at once between regions\n"
         "  OMP_NUM_THREADS        threads when --threads is 0 (else every CPU, or of OMP_PLACES)\n"
         "  OMP_PLACES, OMP_PROC_BIND  where the kernels' threads run, as OpenMP's would\n";
}

}  // namespace snapfill::cli
