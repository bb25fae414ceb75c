// The device shim: device settings resolve per local rank, copies keep what is in place.
#include "pipetrain/runtime/device.h"

#include <gtest/gtest.h>

#include "pipetrain/error.h"

namespace pipetrain::runtime {
namespace {

TEST(ResolveDevice, AutoIsTheLocalRanksGpuOrTheCpu) {
  EXPECT_EQ(resolve_device("auto", 3, 0), torch::Device(torch::kCPU));
  EXPECT_EQ(resolve_device("auto", 3, 2), torch::Device(torch::kCUDA, 1));
  EXPECT_EQ(resolve_device("auto", 0, 8), torch::Device(torch::kCUDA, 0));
  EXPECT_EQ(resolve_device("cuda", 5, 4), torch::Device(torch::kCUDA, 1));
  EXPECT_EQ(resolve_device("cuda:3", 0, 4), torch::Device(torch::kCUDA, 3));
  EXPECT_EQ(resolve_device("cpu", 1, 4), torch::Device(torch::kCPU));
  // What this machine has: auto never fails.
  EXPECT_NO_THROW(resolve_device("auto", 0));
}

TEST(ResolveDevice, BadSettingsNameTheFix) {
  try {
    resolve_device("cuda", 0, 0);
    FAIL();
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("use \"auto\" or \"cpu\""), std::string::npos) << e.what();
  }
  try {
    resolve_device("cuda:4", 0, 4);
    FAIL();
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0 to cuda:3"), std::string::npos) << e.what();
  }
  // One cuda:N for every process of a host would stack them all on one GPU.
  try {
    resolve_device("cuda:1", 0, 4, 4);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("all 4 processes of this host on one GPU; use \"cuda\""), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(resolve_device("cuda", 3, 4, 4), torch::Device(torch::kCUDA, 3));
  EXPECT_THROW(resolve_device("cuda:x", 0, 4), ConfigError);
  EXPECT_THROW(resolve_device("cuda:", 0, 4), ConfigError);
  EXPECT_THROW(resolve_device("gpu", 0, 4), ConfigError);
}

TEST(CopyTo, KeepsTensorsAlreadyThere) {
  const auto x = torch::randn({2, 3});
  const Batch b(x);
  EXPECT_TRUE(copy_to(b, torch::kCPU).tensor().is_same(x));
}

}  // namespace
}  // namespace pipetrain::runtime
