// Choosing a device: `auto` takes the GPU only where one can be used, and a
// build with CUDA still runs on the CPU where there is no GPU or driver. This
// test runs everywhere (label unit); what it expects depends on what the
// build and the machine have, and each case is checked where it holds.
#include <string>

#include "gtest/gtest.h"
#include "snapfill/backend.h"

namespace snapfill {
namespace {

TEST(DeviceChoice, AutoFollowsWhatTheMachineHas) {
  const absl::StatusOr<std::string> gpu = DescribeCudaDevice();
  const absl::StatusOr<Device> chosen = ResolveDevice("auto");
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  auto cuda = CreateBackend(Device::kCuda);
  if (gpu.ok()) {
    EXPECT_EQ(*chosen, Device::kCuda);
    EXPECT_TRUE(cuda.ok()) << cuda.status();
    std::printf("GPU: %s\n", gpu->c_str());
  } else {
    // Built without CUDA: Unimplemented; built with it but no GPU or driver
    // here: FailedPrecondition that says there is no device.
    EXPECT_TRUE(absl::IsUnimplemented(gpu.status()) || absl::IsFailedPrecondition(gpu.status())) << gpu.status();
    EXPECT_EQ(*chosen, Device::kCpu);
    ASSERT_FALSE(cuda.ok());
    EXPECT_EQ(cuda.status().code(), gpu.status().code()) << cuda.status();
    if (absl::IsFailedPrecondition(gpu.status())) {
      EXPECT_NE(cuda.status().message().find("no CUDA device"), absl::string_view::npos) << cuda.status();
    }
    std::printf("no GPU here: %s\n", std::string(gpu.status().message()).c_str());
  }
  // The CPU backend is there in every build.
  EXPECT_TRUE(CreateBackend(Device::kCpu).ok());
}

TEST(DeviceChoice, NamesAreChecked) {
  EXPECT_EQ(*ResolveDevice("cpu"), Device::kCpu);
  EXPECT_EQ(*ResolveDevice("cuda"), Device::kCuda);
  const absl::StatusOr<Device> bad = ResolveDevice("gpu0");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("gpu0"), absl::string_view::npos);
}

}  // namespace
}  // namespace snapfill
