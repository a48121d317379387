// The instructions whose peak rates kernels/cpu/peak.h measures, shared by
// kernels/cpu and kernels/ref (pure std, header only).
//
// ops counts a multiply-add as 2 (the convention of GFLOP/s and GOP/s):
// vfmadd231ps ymm is 16 ops, vpmaddubsw ymm 64 (32 u8·s8 products summed
// in pairs), vpdpbusd 64 (ymm) or 128 (zmm), vdpbf16ps zmm 64.
#ifndef SNAPFILL_KERNELS_PEAK_INSTRUCTION_H_
#define SNAPFILL_KERNELS_PEAK_INSTRUCTION_H_

namespace snapfill {

enum class PeakInstruction {
  kNone = 0,
  kFmaYmm,      // vfmadd231ps ymm (AVX2 + FMA): f32
  kFmaZmm,      // vfmadd231ps zmm (AVX-512F): f32
  kMaddubsYmm,  // vpmaddubsw ymm (AVX2): u8 · s8, pairs summed to int16 (saturating)
  kDpbusdYmm,   // vpdpbusd ymm (AVX-VNNI): u8 · s8, fours summed into int32
  kDpbusdZmm,   // vpdpbusd zmm (AVX-512 VNNI)
  kDpbf16Zmm,   // vdpbf16ps zmm (AVX512-BF16): bf16 pairs into f32
};

// "vfmadd231ps ymm" and so on; "" for kNone.
constexpr const char* PeakInstructionName(PeakInstruction instruction) {
  switch (instruction) {
    case PeakInstruction::kFmaYmm: return "vfmadd231ps ymm";
    case PeakInstruction::kFmaZmm: return "vfmadd231ps zmm";
    case PeakInstruction::kMaddubsYmm: return "vpmaddubsw ymm";
    case PeakInstruction::kDpbusdYmm: return "vpdpbusd ymm";
    case PeakInstruction::kDpbusdZmm: return "vpdpbusd zmm";
    case PeakInstruction::kDpbf16Zmm: return "vdpbf16ps zmm";
    case PeakInstruction::kNone: break;
  }
  return "";
}

// The ops one instruction does (multiply-adds counted twice); 0 for kNone.
constexpr double PeakOpsPerInstruction(PeakInstruction instruction) {
  switch (instruction) {
    case PeakInstruction::kFmaYmm: return 16;
    case PeakInstruction::kFmaZmm: return 32;
    case PeakInstruction::kMaddubsYmm: return 64;
    case PeakInstruction::kDpbusdYmm: return 64;
    case PeakInstruction::kDpbusdZmm: return 128;
    case PeakInstruction::kDpbf16Zmm: return 64;
    case PeakInstruction::kNone: break;
  }
  return 0;
}

}  // namespace snapfill

#endif  // SNAPFILL_KERNELS_PEAK_INSTRUCTION_H_
