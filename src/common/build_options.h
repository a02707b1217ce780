// SPDX-License-Identifier: BSD-3-Clause
// Copyright (c) 2026 the flash3 authors
//
// Compile-time build options (CMake sets them on the library's objects).
#pragma once

// FLASH3_SERVING_WIP (CMake option, OFF by default): the serving work that has
// not run on a GPU yet. 0: the kernels of the last GPU-tested tree, and the
// calls that need the new paths return kNotSupported naming the option.
#ifndef FLASH3_SERVING_WIP
#define FLASH3_SERVING_WIP 0
#endif
