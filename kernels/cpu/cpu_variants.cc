#include "kernels/cpu/cpu_variants.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

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
  const CpuLevel max = MaxCpuLevel();
  const char* env = std::getenv("SNAPFILL_CPU");
  if (env == nullptr || *env == '\0') return max;
  for (CpuLevel l : {CpuLevel::kGeneric, CpuLevel::kAvx2, CpuLevel::kAvxVnni, CpuLevel::kAvx512}) {
    if (std::strcmp(env, CpuLevelName(l)) != 0) continue;
    if (CpuSupports(l)) return l;
    std::fprintf(stderr, "snapfill: SNAPFILL_CPU=%s is not supported by this CPU (its level: %s); using %s\n", env,
                 CpuLevelName(max), CpuLevelName(max));
    return max;
  }
  std::fprintf(stderr, "snapfill: SNAPFILL_CPU=%s is not one of generic, avx2, avxvnni, avx512; using %s\n", env,
               CpuLevelName(max));
  return max;
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
