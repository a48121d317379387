#include "kernels/cpu/cpu_variants.h"

#include <initializer_list>
#include <optional>

#include "kernels/cpu/kernel_config.h"

namespace snapfill::cpu {
namespace {

bool Supports(CpuLevel level) {
  if (level == CpuLevel::kGeneric) return true;
#if SNAPFILL_CPU_HAS_VARIANTS
  __builtin_cpu_init();
  // (libgcc's checks include the OS's consent to save the ymm / zmm state.)
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2") &&
                    __builtin_cpu_supports("popcnt");
  if (!avx2 || level == CpuLevel::kAvx2) return avx2;
  if (level == CpuLevel::kAvxVnni) return __builtin_cpu_supports("avxvnni") != 0;
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vnni");
  return avx512;
#else
  return level == CpuLevel::kGeneric;
#endif
}

CpuLevel Detect() {
  for (CpuLevel l : {CpuLevel::kAvx512, CpuLevel::kAvxVnni, CpuLevel::kAvx2}) {
    if (CpuSupports(l)) return l;
  }
  return CpuLevel::kGeneric;
}

CpuLevel Choose() {
  const std::optional<CpuLevel> cap = ActiveKernelConfig().level;
  // (ConfigureKernels refuses a level the CPU cannot run.)
  return cap && CpuSupports(*cap) ? *cap : MaxCpuLevel();
}

}  // namespace

bool CpuSupports(CpuLevel level) {
  static const bool supported[4] = {Supports(CpuLevel::kGeneric), Supports(CpuLevel::kAvx2),
                                    Supports(CpuLevel::kAvxVnni), Supports(CpuLevel::kAvx512)};
  return supported[static_cast<int>(level)];
}

CpuLevel MaxCpuLevel() {
  static const CpuLevel level = Detect();
  return level;
}

CpuLevel ActiveCpuLevel() {
  static const CpuLevel level = Choose();
  return level;
}

const char* CpuLevelName(CpuLevel level) {
  switch (level) {
    case CpuLevel::kAvx512: return "avx512";
    case CpuLevel::kAvxVnni: return "avxvnni";
    case CpuLevel::kAvx2: return "avx2";
    default: return "generic";
  }
}

}  // namespace snapfill::cpu
