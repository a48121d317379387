// The CPU kernels' process-wide choices: the x86-64 level whose copies run
// (cpu_variants.h), whether the products and the attention use AMX, and how
// the kernels' thread team waits between regions (spin_team.h). The kernels
// decide once per process, when the first of them asks; ConfigureKernels
// sets the choices before that. Nothing in the kernels reads the
// environment: the snapfill command and the test harness read SNAPFILL_CPU,
// SNAPFILL_AMX and OMP_WAIT_POLICY and pass them down as BackendOptions.
#ifndef SNAPFILL_KERNELS_CPU_KERNEL_CONFIG_H_
#define SNAPFILL_KERNELS_CPU_KERNEL_CONFIG_H_

#include <optional>
#include <string>

#include "kernels/cpu/cpu_variants.h"

namespace snapfill::cpu {

enum class AmxMode {
  kAll,       // AMX-BF16 and AMX-INT8 where the CPU and OS have them
  kInt8Only,  // AMX-INT8 products, no AMX-BF16 (products or attention)
  kOff,       // no AMX at all
};

struct KernelConfig {
  // The highest level to run; nullopt: the CPU's highest (MaxCpuLevel()).
  std::optional<CpuLevel> level;
  AmxMode amx = AmxMode::kAll;
  // The team's threads sleep at once when a region ends, instead of
  // spinning a while first (for machines shared with other jobs).
  bool passive_waits = false;
  bool operator==(const KernelConfig&) const = default;
};

// Choices to make: unset fields leave what is in force.
struct KernelChoices {
  std::optional<CpuLevel> level;
  std::optional<AmxMode> amx;
  std::optional<bool> passive_waits;
};

// Makes the choices, if the kernels have not decided yet or decided the
// same. Otherwise returns false, changes nothing, and says why in *why.
// A level the CPU cannot run is refused (CpuSupports()).
bool ConfigureKernels(const KernelChoices& choices, std::string* why);

// The choices in force. From its first call on (a kernel's first run, a
// backend's description), they are fixed for the process.
const KernelConfig& ActiveKernelConfig();

}  // namespace snapfill::cpu

#endif  // SNAPFILL_KERNELS_CPU_KERNEL_CONFIG_H_
