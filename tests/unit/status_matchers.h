// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// gtest assertions on flash3::Status, shared by the CPU validation tests:
// IsError checks the code and that the message contains every given piece
// (the argument's name, the value seen, ...); IsOk prints the message when not.
#pragma once
#include <initializer_list>
#include <string>

#include <gtest/gtest.h>

#include "flash3/flash3.h"

namespace flash3::unittest {

inline const char* code_name(StatusCode c) {
  switch (c) {
    case StatusCode::kOk: return "Ok";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotSupported: return "NotSupported";
    case StatusCode::kCudaError: return "CudaError";
    case StatusCode::kInternal: return "Internal";
  }
  return "?";
}

inline ::testing::AssertionResult IsError(const Status& s, StatusCode code, std::initializer_list<std::string> subs) {
  if (s.code != code)
    return ::testing::AssertionFailure() << "status is " << code_name(s.code) << " (expected " << code_name(code)
                                         << "), message: \"" << s.message << "\"";
  for (const std::string& sub : subs)
    if (s.message.find(sub) == std::string::npos)
      return ::testing::AssertionFailure() << "message \"" << s.message << "\" does not contain \"" << sub << "\"";
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult IsOk(const Status& s) {
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "status is " << code_name(s.code) << ": \"" << s.message << "\"";
}

}  // namespace flash3::unittest
