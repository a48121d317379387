#include "tests/testing/gather_data.h"

#include <iterator>
#include <random>

namespace snapfill::testing {

GatherShapes MakeGatherShapes(int num_copies, int64_t src_rows, uint32_t seed) {
  const size_t row_sizes[] = {512, 256, 4, 24, 6, 7, 510, 16};
  std::mt19937 rng(seed);
  GatherShapes out;
  for (int i = 0; i < num_copies; ++i) {
    GatherShape g;
    g.row_bytes = row_sizes[i % std::size(row_sizes)];
    g.src_stride = g.row_bytes + (i % 3 == 0 ? 0 : 8 * (i % 5));
    g.dst_stride = g.row_bytes + (i % 4 == 0 ? 0 : 16);
    g.count = i % 17 == 5 ? 0 : static_cast<int64_t>(rng() % 90) + 1;
    if (i % 2 == 1 || i % 7 == 3) {
      g.rows.resize(g.count);
      for (int32_t& r : g.rows) r = static_cast<int32_t>(rng() % src_rows);
    }
    g.src_offset = out.src_bytes;
    g.dst_offset = out.dst_bytes;
    out.src_bytes += (src_rows * g.src_stride + 63) / 64 * 64;
    out.dst_bytes += (g.count * g.dst_stride + 63) / 64 * 64;
    out.copies.push_back(std::move(g));
  }
  return out;
}

}  // namespace snapfill::testing
