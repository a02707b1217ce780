// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// CPU tests that call the entry points past validation turn the library's
// device checks off (set_device_checks_for_testing: the pointers are host
// memory, no GPU is needed) and restore the previous state afterwards.
#pragma once
#include <gtest/gtest.h>

#include "api/checks.h"
#include "api/validate.h"

namespace flash3::testutil {

// Device checks on or off for this object's lifetime; set() switches within it.
class DeviceChecks {
 public:
  explicit DeviceChecks(bool on) : was_on_(!device_check_skipped()) { set(on); }
  ~DeviceChecks() { set_device_checks_for_testing(was_on_); }
  DeviceChecks(const DeviceChecks&) = delete;
  DeviceChecks& operator=(const DeviceChecks&) = delete;
  void set(bool on) { set_device_checks_for_testing(on); }

 private:
  bool was_on_;
};

class SkipDeviceCheckTest : public ::testing::Test {
 protected:
  DeviceChecks device_checks_{false};
};

}  // namespace flash3::testutil
