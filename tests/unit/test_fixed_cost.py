#!/usr/bin/env python3
"""bench/fixed_cost.py's line fit (CPU only): the intercept / slope it reports is
the per-tile fixed cost, so the fit must recover a known line, report the
residual of a point off it, and refuse a single seqlen."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import fixed_cost  # noqa: E402


class FitLine(unittest.TestCase):
    def test_recovers_exact_line(self):
        pts = [(sq, 0.6e-3 * sq + 0.15) for sq in (2048, 4096, 8192, 16384)]
        slope, icept, resid = fixed_cost.fit_line(pts)
        self.assertAlmostEqual(slope, 0.6e-3, places=12)
        self.assertAlmostEqual(icept, 0.15, places=9)
        self.assertLess(resid, 1e-9)
        self.assertAlmostEqual(icept / slope, 250.0, places=6)  # X in query rows

    def test_reports_residual(self):
        pts = [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.4)]
        _, _, resid = fixed_cost.fit_line(pts)
        self.assertGreater(resid, 0.1)

    def test_needs_two_seqlens(self):
        with self.assertRaises(ValueError):
            fixed_cost.fit_line([(4096, 1.0), (4096, 1.1)])


if __name__ == "__main__":
    unittest.main()
