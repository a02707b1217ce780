#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""CPU test of tools/sass_loops.py on a synthetic cuobjdump -sass listing:
a kernel with a clean HGMMA loop, a spilling HGMMA loop, an mbarrier retry stub
(conditional self-loop plus a plain BRA back into the loop, which must not count
as a loop) and a loop without HGMMA."""
import os
import subprocess
import sys
import tempfile
import unittest

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "sass_loops.py")

SASS = """
\t\tFunction : _ZN6flash316flash_fwd_kernelIcleanEEv
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;
        /*0020*/              @!P0 BRA 0x0100 ;
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT ;
        /*0040*/                   MUFU.EX2 R3, R3 ;
        /*0050*/                   ISETP.GT.AND P1, PT, R5, RZ, PT ;
        /*0060*/               @P1 BRA 0x0010 ;
        /*0070*/                   LDL R7, [R1+0x8] ;
        /*0080*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*0090*/                   STL [R1+0x4], R7 ;
        /*00a0*/              @!P1 BRA 0x0070 ;
        /*00b0*/                   IADD3 R9, R9, 0x1, RZ ;
        /*00c0*/               @P2 BRA 0x00b0 ;
        /*00d0*/                   EXIT ;
        /*0100*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;
        /*0110*/              @!P0 BRA 0x0100 ;
        /*0120*/                   BRA 0x0080 ;
\t\tFunction : _ZN6flash320flash_bwd_postprocess_kernelIxEEv
        /*0000*/                   LDL R1, [R1] ;
        /*0010*/               @P0 BRA 0x0000 ;
"""


def run(*args):
    with tempfile.NamedTemporaryFile("w", suffix=".sass", delete=False) as f:
        f.write(SASS)
    try:
        return subprocess.run([sys.executable, TOOL, f.name, *args], capture_output=True, text=True)
    finally:
        os.unlink(f.name)


class SassLoops(unittest.TestCase):
    def test_reports_hgmma_loops_and_local_memory(self):
        r = run()
        self.assertEqual(r.returncode, 0, r.stderr)
        loops = [l for l in r.stdout.splitlines() if l.strip().startswith("loop")]
        # The retry stub's plain BRA (0x120 -> 0x80) and the HGMMA-free loop are not reported.
        self.assertEqual(len(loops), 2, r.stdout)
        self.assertIn("0x00010-0x00060", loops[0])
        self.assertIn("1 HGMMA", loops[0])
        self.assertIn("1 MUFU.EX2", loops[0])
        self.assertIn("LDL 0, STL 0", loops[0])
        self.assertNotIn("local memory", loops[0])
        self.assertIn("0x00070-0x000a0", loops[1])
        self.assertIn("LDL 1, STL 1", loops[1])
        self.assertIn("local memory", loops[1])
        # The default regex keeps the main kernels only.
        self.assertNotIn("postprocess", r.stdout)

    def test_check_fails_on_local_memory(self):
        self.assertEqual(run("--check").returncode, 1)
        self.assertEqual(run("--check", "--kernel", "postprocess").returncode, 0)


if __name__ == "__main__":
    unittest.main()
