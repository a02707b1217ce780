// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// A fixture for CPU tests that call the entry points past validation: sets
// FLASH3_SKIP_DEVICE_CHECK=1 (the pointers are host memory, no GPU is
// needed) for the test and restores the caller's value afterwards.
#pragma once
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

namespace flash3::testutil {

constexpr const char* kSkipDeviceCheckEnv = "FLASH3_SKIP_DEVICE_CHECK";

class SkipDeviceCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* v = std::getenv(kSkipDeviceCheckEnv);
    had_ = v != nullptr;
    if (had_) old_ = v;
    setenv(kSkipDeviceCheckEnv, "1", 1);
  }
  void TearDown() override {
    if (had_) setenv(kSkipDeviceCheckEnv, old_.c_str(), 1);
    else unsetenv(kSkipDeviceCheckEnv);
  }

 private:
  bool had_ = false;
  std::string old_;
};

}  // namespace flash3::testutil
