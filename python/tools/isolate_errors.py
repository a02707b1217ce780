# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""Runs every bad-argument case of tests/test_errors.py in its own process and
reports how each one ends (exception type and message, or the signal)."""
import subprocess
import sys

CODE = r'''
import sys, importlib.util
spec = importlib.util.spec_from_file_location("te", sys.argv[1])
te = importlib.util.module_from_spec(spec); spec.loader.exec_module(te)
make, kwargs, exc, words = te.CASES[sys.argv[2]]
args = make(); kwargs = kwargs() if callable(kwargs) else kwargs
try:
    te.flash_attn_func(*args, **kwargs)
    print("NO EXCEPTION")
except Exception as e:
    print(type(e).__name__, str(e)[:160].replace("\n", " "))
'''

def main():
    path = sys.argv[1]
    sys.path.insert(0, "/tmp")
    import importlib.util
    spec = importlib.util.spec_from_file_location("te", path)
    te = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(te)
    for case in te.CASES:
        r = subprocess.run([sys.executable, "-c", CODE, path, case], capture_output=True, text=True, cwd="/tmp")
        out = (r.stdout.strip().splitlines() or [""])[-1]
        print(f"{case:36s} rc={r.returncode:4d} {out}", flush=True)

if __name__ == "__main__":
    main()
