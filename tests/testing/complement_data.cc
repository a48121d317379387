#include "tests/testing/complement_data.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "kernels/ref/ops_ref.h"

namespace snapfill::testing {

ComplementData MakeComplementData(int64_t heads, int64_t num, int64_t kept, uint32_t seed) {
  ComplementData c;
  c.heads = heads;
  c.num = num;
  c.kept = kept;
  c.keep_stride = kept + 2;
  c.out_stride = num - kept + 3;
  c.keep.assign(heads * c.keep_stride, -7);
  std::mt19937 rng(seed);
  std::vector<int32_t> all(num);
  for (int64_t h = 0; h < heads; ++h) {
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::sort(all.begin(), all.begin() + kept);
    std::copy(all.begin(), all.begin() + kept, c.keep.begin() + h * c.keep_stride);
  }
  c.want.assign(heads * c.out_stride, -5);
  ref::Complement(c.keep.data(), c.keep_stride, kept, heads, num, c.want.data(), c.out_stride);
  return c;
}

}  // namespace snapfill::testing
