// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// One version everywhere: the FLASH3_VERSION_* macros of include/flash3/version.h (checked
// against the top-level VERSION file when CMake configures), the library's flash3::version(),
// flash3_version() and flash3_version_number().
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "flash3/flash3.h"
#include "flash3/flash3_c.h"

namespace {

TEST(Version, MacrosAgree) {
  char expected[32];
  std::snprintf(expected, sizeof expected, "%d.%d.%d", FLASH3_VERSION_MAJOR, FLASH3_VERSION_MINOR,
                FLASH3_VERSION_PATCH);
  EXPECT_STREQ(FLASH3_VERSION_STRING, expected);
  EXPECT_EQ(FLASH3_VERSION_NUMBER, FLASH3_VERSION_MAJOR * 10000 + FLASH3_VERSION_MINOR * 100 + FLASH3_VERSION_PATCH);
}

TEST(Version, LibraryReportsTheHeaderVersion) {
  EXPECT_STREQ(flash3::version(), FLASH3_VERSION_STRING)
      << "flash3::version() (src/api/tensor.cpp) must return FLASH3_VERSION_STRING";
  EXPECT_STREQ(flash3_version(), FLASH3_VERSION_STRING);
  EXPECT_EQ(flash3_version_number(), FLASH3_VERSION_NUMBER);
}

}  // namespace
