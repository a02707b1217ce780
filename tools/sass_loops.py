#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""Main-loop report from a kernel library's SASS: for every kernel, the
innermost loops that issue HGMMA (the KV loops of the forward, the query-block
loop of the backward) with their instruction mix, and whether they touch local
memory (LDL/STL: register spills).

  python tools/sass_loops.py build/libflash3.so [--kernel REGEX] [--check]
  python tools/sass_loops.py dump.sass            # output of cuobjdump -sass

A loop is a conditional backward branch (`@P BRA` to a lower address); the
mbarrier retry stubs spin on themselves (no HGMMA) and jump back with a plain
`BRA`, so they drop out. --check exits 1 when any reported
loop has a local-memory access. Needs cuobjdump (CUDA toolkit; $CUOBJDUMP
overrides) unless given a SASS text dump.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

FUNC_RE = re.compile(r"Function : (\S+)")
INSN_RE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
# Conditional back-edges only: loops end in `@P BRA top`, while the retry stubs
# of mbarrier waits (placed after the kernel's code) return with a plain `BRA`.
BRA_RE = re.compile(r"^@!?U?P\w*\s+BRA\b[^;]*?0x([0-9a-f]+)")
COUNTED = ("HGMMA", "MUFU.EX2", "LDL", "STL", "BAR.", "SYNCS")


def sass_text(path):
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"\x7fELF":
        with open(path) as f:
            return f.read()
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not tool:
        sys.exit("sass_loops: cuobjdump not found (set CUOBJDUMP or pass a `cuobjdump -sass` text dump)")
    return subprocess.run([tool, "-sass", path], check=True, capture_output=True, text=True).stdout


def functions(text):
    name, insns = None, []
    for line in text.splitlines():
        m = FUNC_RE.search(line)
        if m:
            if name:
                yield name, insns
            name, insns = m.group(1), []
            continue
        m = INSN_RE.search(line)
        if m and name:
            insns.append((int(m.group(1), 16), m.group(2)))
    if name:
        yield name, insns


def hgmma_loops(insns):
    loops = []
    for addr, text in insns:
        m = BRA_RE.search(text)
        if m and int(m.group(1), 16) < addr:
            start = int(m.group(1), 16)
            body = [t for a, t in insns if start <= a <= addr]
            counts = {k: sum(k in t for t in body) for k in COUNTED}
            if counts["HGMMA"]:
                loops.append((start, addr, len(body), counts))
    # Innermost: no other HGMMA loop strictly inside.
    return [l for l in loops
            if not any(o is not l and l[0] <= o[0] and o[1] <= l[1] and (o[0], o[1]) != (l[0], l[1]) for o in loops)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="libflash3.so (or any cubin/ELF) or a cuobjdump -sass text dump")
    ap.add_argument("--kernel", default=r"flash_(fwd|bwd)_kernel",
                    help="regex on the mangled kernel name (default: the forward and backward main kernels)")
    ap.add_argument("--check", action="store_true", help="exit 1 if a reported loop touches local memory")
    args = ap.parse_args()
    pat = re.compile(args.kernel)
    bad = 0
    for name, insns in functions(sass_text(args.path)):
        if not pat.search(name):
            continue
        print(name)
        loops = hgmma_loops(insns)
        if not loops:
            print("  (no loop with HGMMA)")
        for start, end, n, c in loops:
            local = c["LDL"] + c["STL"]
            bad += local > 0
            print(f"  loop {start:#07x}-{end:#07x}: {n:4d} instructions, {c['HGMMA']:3d} HGMMA, "
                  f"{c['MUFU.EX2']:3d} MUFU.EX2, {c['BAR.'] + c['SYNCS']:2d} barrier ops, "
                  f"LDL {c['LDL']}, STL {c['STL']}{'   <- local memory' if local else ''}")
    if args.check and bad:
        print(f"sass_loops: {bad} main loop(s) touch local memory", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
