// The peak rates of the instructions the kernels run on, measured on this
// machine. Each peak loop runs 12 independent chains of one instruction
// (named registers, so it runs at the execution units' throughput, not at
// the instruction's latency: an FMA of 4 cycles on 2 pipes needs 8), on
// every thread of the kernels' team, as the kernels themselves run. The
// profile and `snapfill bench` set what the products and the attention
// reach beside these (docs/history/BENCHMARKS-log.md); `snapfill info`
// prints them.
// The instructions and the ops each does: kernels/peak_instruction.h.
//
// AMX tile instructions are not measured here (bench/bm_matmul_amx has
// their loops); the AMX levels report no peak for the products or the
// attention that run on tiles.
#ifndef SNAPFILL_KERNELS_CPU_PEAK_H_
#define SNAPFILL_KERNELS_CPU_PEAK_H_

#include <cstdint>

#include "kernels/peak_instruction.h"

namespace snapfill::cpu {

// Whether this CPU and OS run the instruction.
bool PeakSupported(PeakInstruction instruction);

// The chains the peak loop runs: `steps` rounds of the instruction on each
// of 12 chains, on the calling thread. lane0[c] receives the bits of lane 0
// (the first 32 bits) of chain c's final value. Chain c starts from a value
// of its own and each step feeds the chain's value back into the
// instruction with fixed other operands:
//   kFmaYmm/Zmm:     a = a · 0.999f + 0.0001f, a0 = 0.001f · c
//   kMaddubsYmm:     a = vpmaddubsw(a as u8, -2 as s8), every byte of a0 = c + 1
//   kDpbusdYmm/Zmm:  a += 4 · (3 · -2) per int32 lane, a0 = c
//   kDpbf16Zmm:      a += x · y twice (the pair of a lane), x and y 0.001f
//                    and 0.002f rounded to bf16, a0 = 0.001f · c
// Twin: ref::PeakChains. Does nothing where !PeakSupported(instruction).
void PeakChains(PeakInstruction instruction, int64_t steps, uint32_t lane0[12]);

// The rate of the instruction in ops per second on `threads` threads of the
// kernels' team (threads <= 0: the bound team's, else omp_get_max_threads()), each running
// PeakChains: the best of `reps` runs of about `seconds` each. 0 where
// !PeakSupported(instruction).
double MeasurePeak(PeakInstruction instruction, int threads = 0, double seconds = 0.05, int reps = 3);

// The instructions the active level's kernels run on (cpu_variants.h):
// the f32 products and attention (FMA, the widest the level has), the int8
// products of the quantized types (vpmaddubsw on AVX2, vpdpbusd with VNNI),
// and the bf16 dot where the prefill attention runs on it
// (AttentionHasAvx512Bf16()); kNone where that work runs on AMX tiles or on
// the portable copy.
PeakInstruction F32Instruction();
PeakInstruction Int8ProductsInstruction();
PeakInstruction PrefillAttentionInstruction();

}  // namespace snapfill::cpu

#endif  // SNAPFILL_KERNELS_CPU_PEAK_H_
