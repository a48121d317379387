// Runtime dispatch of the CPU kernels across x86-64 levels.
//
// matmul.cc and ops.cc compile their kernels (matmul_variant.inc,
// ops_variant.inc) once per level (cpu_variants_foreach.inc), each copy in
// its own namespace
// (cpu::generic, cpu::avx2, cpu::avxvnni, cpu::avx512) under its own
// `#pragma GCC target`,
// and the public functions of matmul.h / ops.h forward every call to the
// copy of the level chosen when the process first asks: the highest the CPU
// and OS support, or a lower one the backend's options name (the snapfill
// command's SNAPFILL_CPU). So one binary,
// built without -march=native (SNAPFILL_NATIVE=OFF), runs on any x86-64 and
// uses AVX2 or AVX-512 where they are there. (gcc's `#pragma GCC target`
// gives the functions defined under it the ISA, as Highway does; templates
// of the standard library defined outside it keep the baseline, so no code
// for a higher level leaks into a shared instantiation.)
//
// Levels:
//   kGeneric: portable C++ (whatever the build's baseline allows).
//   kAvx2:    AVX2, FMA, F16C, BMI2 (x86-64-v3).
//   kAvxVnni: kAvx2 plus AVX-VNNI (the VEX-encoded 256-bit vpdpbusd /
//             vpdpwssd of Intel's client cores since Alder Lake, and of Zen 5),
//             for the products only: ops.cc has no integer dots and maps
//             this level to its kAvx2 copy (namespace alias).
//   kAvx512:  kAvx2 plus AVX-512 F/BW/VL/DQ and VNNI. (AVX512-BF16 and AMX
//             are checked separately, where the kernels use them.)
// The levels are not a chain: a CPU with AVX-512 VNNI may lack AVX-VNNI
// (Ice Lake, Zen 4), so the level avxvnni is taken only where
// CpuSupports(kAvxVnni).
#ifndef SNAPFILL_KERNELS_CPU_CPU_VARIANTS_H_
#define SNAPFILL_KERNELS_CPU_CPU_VARIANTS_H_

namespace snapfill::cpu {

enum class CpuLevel { kGeneric = 0, kAvx2 = 1, kAvxVnni = 2, kAvx512 = 3 };

// Returns the highest level this CPU and OS support.
CpuLevel MaxCpuLevel();

// Whether this CPU and OS can run `level`'s copy.
bool CpuSupports(CpuLevel level);

// Returns the level the kernels run at: MaxCpuLevel(), or the level of
// KernelConfig (kernel_config.h) where one is set. Decided once per process.
CpuLevel ActiveCpuLevel();

// "generic", "avx2", "avxvnni" or "avx512".
const char* CpuLevelName(CpuLevel level);

}  // namespace snapfill::cpu

// Forwards a call to the copy of `fn` of the active level.
#if defined(__x86_64__) && defined(__GNUC__)
#define SNAPFILL_CPU_DISPATCH(fn, ...)                                  \
  switch (::snapfill::cpu::ActiveCpuLevel()) {                          \
    case ::snapfill::cpu::CpuLevel::kAvx512: return avx512::fn(__VA_ARGS__); \
    case ::snapfill::cpu::CpuLevel::kAvxVnni: return avxvnni::fn(__VA_ARGS__); \
    case ::snapfill::cpu::CpuLevel::kAvx2: return avx2::fn(__VA_ARGS__);     \
    default: return generic::fn(__VA_ARGS__);                           \
  }
// The ISA of each level's copy (kept in step with CpuSupports()).
#define SNAPFILL_CPU_BEGIN_AVX2 \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt\")")
#define SNAPFILL_CPU_BEGIN_AVXVNNI \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt,avxvnni\")")
#define SNAPFILL_CPU_BEGIN_AVX512                                                                       \
  _Pragma("GCC push_options")                                                                          \
      _Pragma("GCC target(\"avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni\")")
#define SNAPFILL_CPU_END _Pragma("GCC pop_options")
#define SNAPFILL_CPU_HAS_VARIANTS 1
#else
#define SNAPFILL_CPU_DISPATCH(fn, ...) return generic::fn(__VA_ARGS__);
#define SNAPFILL_CPU_HAS_VARIANTS 0
#endif

#endif  // SNAPFILL_KERNELS_CPU_CPU_VARIANTS_H_
