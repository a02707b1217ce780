# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""One version: the repository's VERSION file, include/flash3/version.h, the shim's pyproject,
flash3.__version__ (the loaded libflash3's) and the installed package's own version agree."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _file_version():
    with open(os.path.join(ROOT, "VERSION")) as f:
        return f.readline().strip()


def test_version_file_header_and_shim_agree():
    v = _file_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", v), v
    with open(os.path.join(ROOT, "include", "flash3", "version.h")) as f:
        header = f.read()
    major, minor, patch = v.split(".")
    for name, value in (("MAJOR", major), ("MINOR", minor), ("PATCH", patch), ("STRING", f'"{v}"')):
        assert re.search(rf"#define FLASH3_VERSION_{name} {re.escape(value)}\n", header), name
    with open(os.path.join(ROOT, "python", "shim", "pyproject.toml")) as f:
        assert re.search(rf'^version = "{re.escape(v)}"$', f.read(), re.M)
    with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
        assert f"## {v}" in f.read(), "CHANGELOG.md has no entry for VERSION"


def test_package_and_library_report_it():
    pytest.importorskip("torch")
    import flash3

    v = _file_version()
    assert flash3.__version__ == v  # the loaded libflash3 (flash3::version())
    assert flash3._package_version == v  # setup.py's _version.py, from VERSION
