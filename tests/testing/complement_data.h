// Test data for Backend::Complement (the CPU and CUDA backends' tests): a
// selection's kept indices per head, random, and the twin's complement.
#ifndef SNAPFILL_TESTS_TESTING_COMPLEMENT_DATA_H_
#define SNAPFILL_TESTS_TESTING_COMPLEMENT_DATA_H_

#include <cstdint>
#include <vector>

namespace snapfill::testing {

// For each of `heads` heads, `kept` distinct indices of [0, num) drawn at
// random, ascending, in rows keep_stride = kept + 2 apart (-7 past them);
// want = ref::Complement's rows, out_stride = num - kept + 3 apart (-5 past
// them): strides wider than the rows, so that a write past one shows.
struct ComplementData {
  int64_t heads = 0, num = 0, kept = 0, keep_stride = 0, out_stride = 0;
  std::vector<int32_t> keep, want;
};
ComplementData MakeComplementData(int64_t heads, int64_t num, int64_t kept, uint32_t seed);

}  // namespace snapfill::testing

#endif  // SNAPFILL_TESTS_TESTING_COMPLEMENT_DATA_H_
