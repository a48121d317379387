// Scalar twin of the peak loops of kernels/cpu/peak.h: the same 12 chains,
// one lane each, as plain arithmetic. The loops exist to be fast, not to
// compute anything; the twin checks that every step of every chain really
// runs the instruction it names on the operands it names.
#ifndef SNAPFILL_KERNELS_REF_PEAK_REF_H_
#define SNAPFILL_KERNELS_REF_PEAK_REF_H_

#include <cstdint>

#include "kernels/peak_instruction.h"

namespace snapfill::ref {

// cpu::PeakChains: lane0[c] = the first 32 bits of chain c after `steps`
// steps (every lane of a chain holds the same value).
void PeakChains(PeakInstruction instruction, int64_t steps, uint32_t lane0[12]);

}  // namespace snapfill::ref

#endif  // SNAPFILL_KERNELS_REF_PEAK_REF_H_
