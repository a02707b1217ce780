#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""bench.py --power's sample handling (CPU only): nvidia-smi lines become (time,
watts, MHz) relative to the run's origin, other lines are dropped, and a
segment's statistics use only the samples inside its window."""
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import bench  # noqa: E402


class PowerSamples(unittest.TestCase):
    def test_parse_line(self):
        origin = time.mktime(time.strptime("2026/11/30 18:00:00", "%Y/%m/%d %H:%M:%S"))
        t, w, mhz = bench.parse_smi_line("2026/11/30 18:00:02.250, 693.12, 1707", origin)
        self.assertAlmostEqual(t, 2.25, places=3)
        self.assertAlmostEqual(w, 693.12)
        self.assertEqual(mhz, 1707)
        self.assertIsNone(bench.parse_smi_line("timestamp, power.draw [W], clocks.current.sm [MHz]", origin))
        self.assertIsNone(bench.parse_smi_line("2026/11/30 18:00:02.250, [N/A], 1707", origin))
        self.assertIsNone(bench.parse_smi_line("", origin))

    def test_segment_window(self):
        samples = [(0.5, 100.0, 1000.0), (1.0, 600.0, 1700.0), (1.5, 700.0, 1600.0), (2.5, 50.0, 1980.0)]
        watts, mhz, joules = bench.segment_stats(samples, 1.0, 2.0, ms_per_call=2.0)
        self.assertAlmostEqual(watts, 650.0)
        self.assertAlmostEqual(mhz, 1650.0)
        self.assertAlmostEqual(joules, 1.3)  # 650 W x 2 ms
        self.assertIsNone(bench.segment_stats(samples, 3.0, 4.0, ms_per_call=2.0))


if __name__ == "__main__":
    unittest.main()
