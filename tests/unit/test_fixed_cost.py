#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""bench.py's pure logic (CPU only): the --fixed-cost line fit (its intercept /
slope is the per-tile fixed cost, so the fit must recover a known line, report
the residual of a point off it, and refuse a single seqlen), the modes' option
presets, the flash3_options layouts of the C ABI mirror, and the CSV round trip
that --from-csv relies on."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import bench  # noqa: E402


class FitLine(unittest.TestCase):
    def test_recovers_exact_line(self):
        pts = [(sq, 0.6e-3 * sq + 0.15) for sq in (2048, 4096, 8192, 16384)]
        slope, icept, resid = bench.fit_line(pts)
        self.assertAlmostEqual(slope, 0.6e-3, places=12)
        self.assertAlmostEqual(icept, 0.15, places=9)
        self.assertLess(resid, 1e-9)
        self.assertAlmostEqual(icept / slope, 250.0, places=6)  # X in query rows

    def test_reports_residual(self):
        pts = [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.4)]
        _, _, resid = bench.fit_line(pts)
        self.assertGreater(resid, 0.1)

    def test_needs_two_seqlens(self):
        with self.assertRaises(ValueError):
            bench.fit_line([(4096, 1.0), (4096, 1.1)])


class Modes(unittest.TestCase):
    """bench.py's option presets: one mode at a time, each with its defaults."""

    def test_table_defaults(self):
        _, a = bench.parse_args([])
        self.assertEqual((a.mode, a.rounds, a.iters, a.warmup_ms, a.passes), ("table", 1, 30, 0.0, "fwd,bwd"))
        self.assertEqual(len(bench.shape_pairs(a)), 18)

    def test_ab_headline(self):
        _, a = bench.parse_args(["--ab", "base=/x/libflash3.so", "--headline", "--warmup-ms", "300"])
        self.assertEqual((a.mode, a.rounds, a.iters, a.warmup_ms, a.gap_s), ("interleaved", 5, 50, 300.0, 0.0))
        self.assertEqual(bench.shape_pairs(a), bench.HEADLINE_ROWS)
        self.assertEqual(bench.parse_ab("base=/x/libflash3.so", 1), ("base", "/x/libflash3.so"))
        self.assertEqual(bench.parse_ab("/x/libflash3.so", 1), ("ab1", "/x/libflash3.so"))

    def test_steady_presets(self):
        _, a = bench.parse_args(["--steady"])
        self.assertEqual((a.mode, a.rounds, a.iters, a.warmup_ms, a.gap_s), ("interleaved", 2, 100, 300.0, 1.0))
        self.assertEqual(bench.shape_pairs(a), bench.HEADLINE_ROWS)
        _, a = bench.parse_args(["--steady", "--hdims", "128", "--seqlens", "8k"])
        self.assertEqual(bench.shape_pairs(a), [(128, 8192)])

    def test_power_and_fixed_cost(self):
        _, a = bench.parse_args(["--power"])
        self.assertEqual((a.mode, a.passes), ("power", "bwd"))
        self.assertEqual(bench.shape_pairs(a), bench.HEADLINE_ROWS)
        _, a = bench.parse_args(["--fixed-cost"])
        self.assertEqual((a.mode, a.hdims, a.seqlens, a.iters, a.warmup_ms), ("fixed_cost", "128", "1k,2k,4k,8k", 20, 300.0))

    def test_pack_gqa_presets(self):
        _, a = bench.parse_args(["--pack-gqa"])
        self.assertEqual((a.mode, a.rounds, a.iters, a.warmup_ms, a.gap_s), ("pack_gqa", 2, 100, 300.0, 1.0))
        self.assertEqual((a.hdims, a.seqlens, a.causal), ("128", bench.PACK_GQA_SEQLENS_Q, "off"))
        _, a = bench.parse_args(["--pack-gqa", "--seqlens", "1,8", "--causal", "both"])
        self.assertEqual((a.seqlens, a.causal), ("1,8", "both"))
        _, a = bench.parse_args(["--split-kv"])
        self.assertEqual((a.mode, a.hdims, a.seqlens, a.causal), ("split_kv", "128", "1", "off"))
        _, a = bench.parse_args(["--kvcache"])
        self.assertEqual((a.mode, a.hdims, a.seqlens, a.causal, a.rounds), ("kvcache", "128", "1", "off", 2))
        _, a = bench.parse_args([])
        self.assertEqual(a.causal, "both")

    def test_options_layouts(self):
        # flash3_options grows at the end only: each older layout is a prefix of
        # the newest; num_splits and reserved0 (which keeps the size apart from the
        # pack_gqa layout's, whose padding num_splits took) are its last fields.
        import ctypes
        new, v3, v2, v1 = bench.F3Options, bench.F3OptionsV3, bench.F3OptionsV2, bench.F3OptionsV1
        self.assertEqual(new._fields_[:len(v3._fields_)], v3._fields_)
        self.assertEqual(v3._fields_[:len(v2._fields_)], v2._fields_)
        self.assertEqual(v2._fields_[:len(v1._fields_)], v1._fields_)
        self.assertEqual([f for f, _ in new._fields_[-2:]], ["num_splits", "reserved0"])
        self.assertEqual(v3._fields_[-1][0], "pack_gqa")
        self.assertEqual(v3.pack_gqa.offset, ctypes.sizeof(v2))  # right after seqused_k, as in flash3_c.h
        self.assertEqual(new.num_splits.offset, v3.pack_gqa.offset + 4)
        self.assertEqual(len({ctypes.sizeof(c) for c in (new, v3, v2, v1)}), 4)

    def test_one_mode_at_a_time(self):
        with self.assertRaises(SystemExit):
            bench.parse_args(["--power", "--fixed-cost"])
        with self.assertRaises(SystemExit):
            bench.parse_args(["--pack-gqa", "--varlen"])
        with self.assertRaises(SystemExit):
            bench.parse_args(["--pack-gqa", "--split-kv"])
        with self.assertRaises(SystemExit):
            bench.parse_args(["--kvcache", "--split-kv"])

    def test_kvcache_args_layout(self):
        # flash3_kvcache_args (flash3_c.h): struct_size, rotary_interleaved, nine tensor
        # pointers, four int32 array pointers, then the paged-KV fields (page_table pointer,
        # int64 page_table_batch_stride, int32 page_table_max_pages). The mirror must have this
        # header's size: flash3_default_kvcache_args() returns the struct by value and sets
        # struct_size to sizeof(flash3_kvcache_args), so a shorter mirror would be overrun.
        import ctypes
        ptr = ctypes.sizeof(ctypes.c_void_p)
        f = [n for n, _ in bench.F3KVCacheArgs._fields_]
        self.assertEqual(f[:2], ["struct_size", "rotary_interleaved"])
        self.assertEqual(f[2:11], ["q", "k_cache", "v_cache", "k_new", "v_new", "rotary_cos", "rotary_sin", "out",
                                   "lse"])
        self.assertEqual(f[11:15], ["cache_seqlens", "cache_batch_idx", "cache_leftpad", "rotary_seqlens"])
        self.assertEqual(f[15:], ["page_table", "page_table_batch_stride", "page_table_max_pages"])
        types = dict(bench.F3KVCacheArgs._fields_)
        self.assertEqual(ctypes.sizeof(types["page_table_batch_stride"]), 8)
        self.assertEqual(ctypes.sizeof(types["page_table_max_pages"]), 4)
        # page_table right after rotary_seqlens: its offset is the sizeof of the layout before the
        # paged fields (8 + 13 pointers), the other struct_size the library accepts.
        self.assertEqual(bench.F3KVCacheArgs.page_table.offset, 8 + 13 * ptr)
        self.assertEqual(bench.F3KVCacheArgs.page_table_batch_stride.offset, 8 + 14 * ptr)
        end = 8 + 14 * ptr + 8 + 4
        align = max(ptr, ctypes.alignment(ctypes.c_int64))
        self.assertEqual(ctypes.sizeof(bench.F3KVCacheArgs), (end + align - 1) // align * align)


class CsvRoundTrip(unittest.TestCase):
    def test_write_then_read(self):
        r = bench.RowResult(128, 8192, True, "bwd", 2, 16)
        r.flops = 1.5e13
        r.ms.update({"flash3": 20.0, "cudnn": 25.0, "fa3": 19.0})
        r.note["fa2"] = "n/a"
        r.check, r.err, r.bound = "PASS", 1e-3, 2e-3
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.csv")
            bench.write_csv(path, [r])
            (back,) = bench.read_csv(path)
        self.assertEqual((back.hdim, back.seqlen, back.causal, back.pss, back.batch, back.heads),
                         (128, 8192, True, "bwd", 2, 16))
        self.assertAlmostEqual(back.ratio("flash3", "cudnn"), 1.25)
        self.assertAlmostEqual(back.ratio("flash3", "fa3"), 0.95)
        self.assertIsNone(back.ms["fa2"])
        self.assertEqual((back.note["fa2"], back.check), ("n/a", "PASS"))
        self.assertAlmostEqual(back.err, 1e-3)


if __name__ == "__main__":
    unittest.main()
