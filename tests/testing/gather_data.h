// Test data for Backend::Gather's batched copies (the CUDA gather's host
// run and the CUDA backend's test): a mix of copies as the chunk loop makes
// them, laid out in a source and a destination arena.
#ifndef SNAPFILL_TESTS_TESTING_GATHER_DATA_H_
#define SNAPFILL_TESTS_TESTING_GATHER_DATA_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace snapfill::testing {

// Copy i: rows of row_sizes[i % 8] bytes (512, 256, 4, 24, 6, 7, 510, 16:
// every word size), strided sources and destinations, 1-90 rows (none for
// every 17th), rows by indices for odd i and every seventh (rows: indices
// into src_rows rows; empty: a run). Offsets are multiples of 64 into
// arenas of src_bytes and dst_bytes, so that the arenas' alignment sets
// the copies'.
struct GatherShape {
  size_t row_bytes = 0, src_stride = 0, dst_stride = 0, src_offset = 0, dst_offset = 0;
  int64_t count = 0;
  std::vector<int32_t> rows;
};
struct GatherShapes {
  std::vector<GatherShape> copies;
  size_t src_bytes = 0, dst_bytes = 0;
};
GatherShapes MakeGatherShapes(int num_copies, int64_t src_rows, uint32_t seed);

}  // namespace snapfill::testing

#endif  // SNAPFILL_TESTS_TESTING_GATHER_DATA_H_
