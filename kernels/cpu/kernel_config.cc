#include "kernels/cpu/kernel_config.h"

#include <atomic>
#include <mutex>

namespace snapfill::cpu {
namespace {

std::mutex& Mu() {
  static std::mutex mu;
  return mu;
}
KernelConfig& Config() {
  static KernelConfig config;
  return config;
}
std::atomic<bool> decided{false};

const char* AmxName(AmxMode mode) {
  switch (mode) {
    case AmxMode::kAll: return "all";
    case AmxMode::kInt8Only: return "int8";
    case AmxMode::kOff: return "off";
  }
  return "?";
}

}  // namespace

bool ConfigureKernels(const KernelChoices& choices, std::string* why) {
  std::lock_guard<std::mutex> lock(Mu());
  KernelConfig want = Config();
  if (choices.level) want.level = choices.level;
  if (choices.amx) want.amx = *choices.amx;
  if (choices.passive_waits) want.passive_waits = *choices.passive_waits;
  if (want.level == MaxCpuLevel()) want.level.reset();  // the CPU's own, named
  if (want.level && !CpuSupports(*want.level)) {
    *why = std::string("kernel level ") + CpuLevelName(*want.level) + " is not one this CPU runs (its highest: " +
           CpuLevelName(MaxCpuLevel()) + ")";
    return false;
  }
  if (want == Config()) return true;
  if (decided.load()) {
    const KernelConfig& have = Config();
    *why = std::string("the kernels of this process already run with level ") +
           (have.level ? CpuLevelName(*have.level) : "(the CPU's)") + ", AMX " + AmxName(have.amx) + ", " +
           (have.passive_waits ? "passive" : "spinning") + " waits; they cannot change now";
    return false;
  }
  Config() = want;
  return true;
}

const KernelConfig& ActiveKernelConfig() {
  if (!decided.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(Mu());
    decided.store(true, std::memory_order_release);
  }
  return Config();
}

}  // namespace snapfill::cpu
