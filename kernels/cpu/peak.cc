// The peak loops of peak.h: one function per instruction, each compiled
// for its own instruction set (`target` attribute) and called only where
// the CPU has it.
#include "kernels/cpu/peak.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include "kernels/cpu/cpu_variants.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/spin_team.h"

#if SNAPFILL_CPU_HAS_VARIANTS
#include <immintrin.h>
#endif

namespace snapfill::cpu {
namespace {

#if SNAPFILL_CPU_HAS_VARIANTS
// Each instruction as (vector type, chain c's first value, one step).
#define SNAPFILL_PEAK_OP(ISA) __attribute__((target(ISA), always_inline)) static inline
struct FmaYmm {
  using T = __m256;
  SNAPFILL_PEAK_OP("avx2,fma") T Init(int c) { return _mm256_set1_ps(0.001f * c); }
  SNAPFILL_PEAK_OP("avx2,fma") T Step(T a) { return _mm256_fmadd_ps(a, _mm256_set1_ps(0.999f), _mm256_set1_ps(0.0001f)); }
};
struct MaddubsYmm {  // the chain feeds each result back as the u8 operand
  using T = __m256i;
  SNAPFILL_PEAK_OP("avx2,fma") T Init(int c) { return _mm256_set1_epi8(static_cast<char>(c + 1)); }
  SNAPFILL_PEAK_OP("avx2,fma") T Step(T a) { return _mm256_maddubs_epi16(a, _mm256_set1_epi8(-2)); }
};
struct DpbusdYmm {
  using T = __m256i;
  SNAPFILL_PEAK_OP("avx2,avxvnni") T Init(int c) { return _mm256_set1_epi32(c); }
  SNAPFILL_PEAK_OP("avx2,avxvnni") T Step(T a) {
    return _mm256_dpbusd_avx_epi32(a, _mm256_set1_epi8(3), _mm256_set1_epi8(-2));
  }
};
struct FmaZmm {
  using T = __m512;
  SNAPFILL_PEAK_OP("avx512f") T Init(int c) { return _mm512_set1_ps(0.001f * c); }
  SNAPFILL_PEAK_OP("avx512f") T Step(T a) { return _mm512_fmadd_ps(a, _mm512_set1_ps(0.999f), _mm512_set1_ps(0.0001f)); }
};
struct DpbusdZmm {
  using T = __m512i;
  SNAPFILL_PEAK_OP("avx512f,avx512vnni") T Init(int c) { return _mm512_set1_epi32(c); }
  SNAPFILL_PEAK_OP("avx512f,avx512vnni") T Step(T a) {
    return _mm512_dpbusd_epi32(a, _mm512_set1_epi8(3), _mm512_set1_epi8(-2));
  }
};
struct Dpbf16Zmm {
  using T = __m512;
  SNAPFILL_PEAK_OP("avx512f,avx512bf16") T Init(int c) { return _mm512_set1_ps(0.001f * c); }
  SNAPFILL_PEAK_OP("avx512f,avx512bf16") T Step(T a) {
    const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.001f), _mm512_set1_ps(0.001f));
    const __m512bh y = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.002f), _mm512_set1_ps(0.002f));
    return _mm512_dpbf16_ps(a, x, y);
  }
};
#undef SNAPFILL_PEAK_OP

// 12 chains in named registers (an array was kept on the stack); without
// fast-math the compiler can neither fold nor reorder them.
#define SNAPFILL_PEAK_LOOP(NAME, OP, ISA)                                                                   \
  __attribute__((target(ISA), noinline)) void NAME(int64_t steps, uint32_t lane0[12]) {                    \
    using T = OP::T;                                                                                      \
    T a0 = OP::Init(0), a1 = OP::Init(1), a2 = OP::Init(2), a3 = OP::Init(3), a4 = OP::Init(4),           \
      a5 = OP::Init(5), a6 = OP::Init(6), a7 = OP::Init(7), a8 = OP::Init(8), a9 = OP::Init(9),           \
      a10 = OP::Init(10), a11 = OP::Init(11);                                                             \
    for (int64_t s = 0; s < steps; ++s) {                                                                 \
      a0 = OP::Step(a0), a1 = OP::Step(a1), a2 = OP::Step(a2), a3 = OP::Step(a3);                         \
      a4 = OP::Step(a4), a5 = OP::Step(a5), a6 = OP::Step(a6), a7 = OP::Step(a7);                         \
      a8 = OP::Step(a8), a9 = OP::Step(a9), a10 = OP::Step(a10), a11 = OP::Step(a11);                     \
    }                                                                                                     \
    const T all[12] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11};                                 \
    for (int c = 0; c < 12; ++c) std::memcpy(&lane0[c], &all[c], sizeof(uint32_t));                       \
  }
SNAPFILL_PEAK_LOOP(LoopFmaYmm, FmaYmm, "avx2,fma")
SNAPFILL_PEAK_LOOP(LoopMaddubsYmm, MaddubsYmm, "avx2,fma")
SNAPFILL_PEAK_LOOP(LoopDpbusdYmm, DpbusdYmm, "avx2,avxvnni")
SNAPFILL_PEAK_LOOP(LoopFmaZmm, FmaZmm, "avx512f")
SNAPFILL_PEAK_LOOP(LoopDpbusdZmm, DpbusdZmm, "avx512f,avx512vnni")
SNAPFILL_PEAK_LOOP(LoopDpbf16Zmm, Dpbf16Zmm, "avx512f,avx512bf16")
#undef SNAPFILL_PEAK_LOOP
#endif  // SNAPFILL_CPU_HAS_VARIANTS

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

bool PeakSupported(PeakInstruction instruction) {
#if SNAPFILL_CPU_HAS_VARIANTS
  // (CpuSupports checks what the OS saves too: the YMM state for the AVX2
  // level, the ZMM state for AVX-512.)
  const bool avx2 = CpuSupports(CpuLevel::kAvx2);
  const bool avx512 = CpuSupports(CpuLevel::kAvx512);
  switch (instruction) {
    case PeakInstruction::kFmaYmm:
    case PeakInstruction::kMaddubsYmm: return avx2;
    case PeakInstruction::kDpbusdYmm: return CpuSupports(CpuLevel::kAvxVnni);
    case PeakInstruction::kFmaZmm:
    case PeakInstruction::kDpbusdZmm: return avx512;
    case PeakInstruction::kDpbf16Zmm: return avx512 && __builtin_cpu_supports("avx512bf16");
    case PeakInstruction::kNone: break;
  }
#else
  (void)instruction;
#endif
  return false;
}

void PeakChains(PeakInstruction instruction, int64_t steps, uint32_t lane0[12]) {
  if (!PeakSupported(instruction)) return;
#if SNAPFILL_CPU_HAS_VARIANTS
  switch (instruction) {
    case PeakInstruction::kFmaYmm: return LoopFmaYmm(steps, lane0);
    case PeakInstruction::kMaddubsYmm: return LoopMaddubsYmm(steps, lane0);
    case PeakInstruction::kDpbusdYmm: return LoopDpbusdYmm(steps, lane0);
    case PeakInstruction::kFmaZmm: return LoopFmaZmm(steps, lane0);
    case PeakInstruction::kDpbusdZmm: return LoopDpbusdZmm(steps, lane0);
    case PeakInstruction::kDpbf16Zmm: return LoopDpbf16Zmm(steps, lane0);
    case PeakInstruction::kNone: break;
  }
#else
  (void)steps;
  (void)lane0;
#endif
}

double MeasurePeak(PeakInstruction instruction, int threads, double seconds, int reps) {
  if (!PeakSupported(instruction)) return 0;
  internal::SpinTeam& team = internal::SpinTeam::Current();
  const int nt = team.Threads(threads > 0 ? threads : internal::SpinTeam::CurrentThreads());
  // One run of `steps` on every thread; its wall time.
  auto run = [&](int64_t steps) {
    std::atomic<uint32_t> sink{0};
    const auto start = std::chrono::steady_clock::now();
    team.Run(nt, [&](int, int) {
      uint32_t lane0[12];
      PeakChains(instruction, steps, lane0);
      sink.fetch_add(lane0[0] ^ lane0[11], std::memory_order_relaxed);  // (keeps the chains)
    });
    return Seconds(start);
  };
  // Steps for about `seconds`, from a short run (12 chains × 64 Ki steps is
  // 0.1-1 ms on the machines here).
  int64_t steps = int64_t{1} << 16;
  const double probe = std::max(run(steps), 1e-6);
  steps = std::max<int64_t>(steps, static_cast<int64_t>(steps * seconds / probe));
  double best = 0;
  for (int r = 0; r < std::max(reps, 1); ++r) {
    const double s = run(steps);
    if (s > 0) best = std::max(best, 12.0 * static_cast<double>(steps) * nt * PeakOpsPerInstruction(instruction) / s);
  }
  return best;
}

PeakInstruction F32Instruction() {
  switch (ActiveCpuLevel()) {
    case CpuLevel::kAvx512: return PeakInstruction::kFmaZmm;
    case CpuLevel::kAvxVnni:
    case CpuLevel::kAvx2: return PeakInstruction::kFmaYmm;
    case CpuLevel::kGeneric: break;
  }
  return PeakInstruction::kNone;
}

PeakInstruction Int8ProductsInstruction() {
  // The order of CpuBackend::kernels(): AMX tiles, AVX-512 VNNI, AVX-VNNI, AVX2.
  if (MatMulHasAmx()) return PeakInstruction::kNone;
  if (MatMulHasSimd()) return PeakInstruction::kDpbusdZmm;
  if (MatMulHasAvxVnni()) return PeakInstruction::kDpbusdYmm;
  if (MatMulHasAvx2()) return PeakInstruction::kMaddubsYmm;
  return PeakInstruction::kNone;
}

PeakInstruction PrefillAttentionInstruction() {
  if (AttentionHasAmx()) return PeakInstruction::kNone;
  if (AttentionHasAvx512Bf16()) return PeakInstruction::kDpbf16Zmm;
  return F32Instruction();
}

}  // namespace snapfill::cpu
