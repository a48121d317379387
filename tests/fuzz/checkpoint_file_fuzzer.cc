// libFuzzer main of the checkpoint_file target (see fuzz_targets.h; run by tools/fuzz.sh).
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return snapfill::fuzz::FuzzCheckpointFile(data, size);
}
