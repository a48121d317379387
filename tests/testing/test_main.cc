// The main of every test binary: Google Test's, after the CPU kernels'
// choices are read from the environment as the snapfill command reads them
// (tools/cli/environment.h), so that ctest can run the kernel suites at each
// level (SNAPFILL_CPU) and with passive waits (OMP_WAIT_POLICY).
#include <cstdio>

#include "gtest/gtest.h"
#include "tools/cli/environment.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const absl::Status s = snapfill::cli::ConfigureKernelsFromEnvironment();
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 2;
  }
  return RUN_ALL_TESTS();
}
