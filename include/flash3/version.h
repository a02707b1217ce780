/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright (c) 2026 the flash3 authors
 *
 * flash3's version, as compiled into the headers a program builds against. The
 * one source is the repository's top-level VERSION file: CMake's project()
 * reads it and refuses to configure while these numbers differ from it; the
 * Python package's version (setup.py) is read from it too. At run time,
 * flash3_version() / flash3::version() and flash3_version_number() return the
 * version of the library actually loaded, so a program can compare the two.
 *
 * The shared library's SONAME is libflash3.so.MAJOR.MINOR: the ABI may change
 * between minor versions while MAJOR is 0, never between patch versions. */
#ifndef FLASH3_VERSION_H_
#define FLASH3_VERSION_H_

#define FLASH3_VERSION_MAJOR 0
#define FLASH3_VERSION_MINOR 2
#define FLASH3_VERSION_PATCH 0
#define FLASH3_VERSION_STRING "0.2.0"
/* MAJOR * 10000 + MINOR * 100 + PATCH: comparable with < and >. */
#define FLASH3_VERSION_NUMBER (FLASH3_VERSION_MAJOR * 10000 + FLASH3_VERSION_MINOR * 100 + FLASH3_VERSION_PATCH)

#endif /* FLASH3_VERSION_H_ */
