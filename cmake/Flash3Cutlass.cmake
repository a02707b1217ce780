# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
#
# Locates the CUTLASS/CuTe headers:
#   1. -DCUTLASS_DIR=<checkout>              (include/, tools/util/include/)
#   2. <source>/.deps/cutlass                 (pip --target install made by scripts/bootstrap.sh)
#   3. an importable cutlass_library package  (pip install nvidia-cutlass==4.2.0.0)
#   4. FLASH3_FETCH_CUTLASS: pip-installs 4.2.0.0 into <source>/.deps/cutlass now.
# Sets FLASH3_CUTLASS_INCLUDE_DIRS. Needs Python3_EXECUTABLE (find_package(Python3) first).
# `pip install --target` works with a distribution's Python too: PEP 668's
# "externally-managed-environment" refusal does not apply to --target installs.
set(FLASH3_CUTLASS_PIP_VERSION 4.2.0.0)

function(_flash3_cutlass_from_root root out_var)
  if(EXISTS "${root}/include/cute/tensor.hpp")
    set(${out_var} "${root}/include;${root}/tools/util/include" PARENT_SCOPE)
  else()
    set(${out_var} "" PARENT_SCOPE)
  endif()
endfunction()

function(flash3_find_cutlass)
  if(NOT Python3_EXECUTABLE)
    message(FATAL_ERROR "flash3_find_cutlass: call find_package(Python3 COMPONENTS Interpreter) first")
  endif()
  set(dirs "")
  if(CUTLASS_DIR)
    _flash3_cutlass_from_root("${CUTLASS_DIR}" dirs)
    if(NOT dirs)
      message(FATAL_ERROR "CUTLASS_DIR=${CUTLASS_DIR} has no include/cute/tensor.hpp")
    endif()
  endif()
  set(deps_root "${PROJECT_SOURCE_DIR}/.deps/cutlass/cutlass_library/source")
  if(NOT dirs)
    _flash3_cutlass_from_root("${deps_root}" dirs)
  endif()
  if(NOT dirs)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))"
      OUTPUT_VARIABLE py_root OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0)
      _flash3_cutlass_from_root("${py_root}" dirs)
    endif()
  endif()
  set(why "")
  if(NOT dirs AND FLASH3_FETCH_CUTLASS)
    execute_process(COMMAND ${Python3_EXECUTABLE} -m pip --version
                    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
    if(NOT rc EQUAL 0)
      # Debian's python3 comes without pip (package python3-pip).
      set(why "${Python3_EXECUTABLE} has no pip (Debian: apt-get install python3-pip). ")
    else()
      message(STATUS "flash3: installing nvidia-cutlass==${FLASH3_CUTLASS_PIP_VERSION} into .deps/cutlass")
      # --upgrade: without it pip skips packages whose folders a failed attempt left behind.
      execute_process(
        COMMAND ${CMAKE_COMMAND} -E env PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
                ${Python3_EXECUTABLE} -m pip install --quiet --upgrade --no-deps
                --target "${PROJECT_SOURCE_DIR}/.deps/cutlass" nvidia-cutlass==${FLASH3_CUTLASS_PIP_VERSION}
        RESULT_VARIABLE rc)
      if(rc EQUAL 0)
        _flash3_cutlass_from_root("${deps_root}" dirs)
      else()
        set(why "pip install --target .deps/cutlass failed (${rc}). ")
      endif()
    endif()
  endif()
  if(NOT dirs)
    message(FATAL_ERROR "flash3: CUTLASS headers not found. ${why}Run scripts/bootstrap.sh, pass "
                        "-DCUTLASS_DIR=<checkout> or pip install nvidia-cutlass==${FLASH3_CUTLASS_PIP_VERSION}")
  endif()
  message(STATUS "flash3: CUTLASS headers: ${dirs}")
  set(FLASH3_CUTLASS_INCLUDE_DIRS "${dirs}" PARENT_SCOPE)
endfunction()
