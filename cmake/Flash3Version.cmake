# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
#
# flash3's version has one source, the top-level VERSION file (one line, MAJOR.MINOR.PATCH).
# Included before project(): sets FLASH3_VERSION for project(VERSION ...). After project(),
# flash3_check_version_header() refuses to configure while include/flash3/version.h (checked in,
# so that the headers work without a build tree: the Python extension and CI compile against
# include/ directly) says another version.
file(STRINGS "${CMAKE_CURRENT_LIST_DIR}/../VERSION" FLASH3_VERSION LIMIT_COUNT 1)
string(STRIP "${FLASH3_VERSION}" FLASH3_VERSION)
if(NOT FLASH3_VERSION MATCHES "^([0-9]+)\\.([0-9]+)\\.([0-9]+)$")
  message(FATAL_ERROR "VERSION holds '${FLASH3_VERSION}'; expected MAJOR.MINOR.PATCH, e.g. 0.2.0")
endif()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             "${CMAKE_CURRENT_LIST_DIR}/../VERSION" "${CMAKE_CURRENT_LIST_DIR}/../include/flash3/version.h")

function(flash3_check_version_header)
  set(header "${PROJECT_SOURCE_DIR}/include/flash3/version.h")
  file(STRINGS "${header}" defines REGEX "^#define FLASH3_VERSION_(MAJOR|MINOR|PATCH|STRING) ")
  set(expected MAJOR ${PROJECT_VERSION_MAJOR} MINOR ${PROJECT_VERSION_MINOR} PATCH ${PROJECT_VERSION_PATCH}
               STRING "\"${PROJECT_VERSION}\"")
  set(bad "")
  while(expected)
    list(POP_FRONT expected part value)
    set(want "#define FLASH3_VERSION_${part} ${value}")
    if(NOT want IN_LIST defines)
      string(APPEND bad "\n  ${want}")
    endif()
  endwhile()
  if(bad)
    message(FATAL_ERROR "VERSION says ${PROJECT_VERSION} but ${header} lacks:${bad}\n"
                        "Set the same version in both (the SONAME follows MAJOR.MINOR; CHANGELOG.md too).")
  endif()
endfunction()
