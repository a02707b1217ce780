#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""flash3 benchmark: TFLOP/s of flash3 beside torch SDPA (cuDNN and FlashAttention-2).

Shapes follow the FlashAttention-3 paper: 16k tokens per batch (batch = 16384 // seqlen),
hidden 2048 (heads = 2048 // hdim), hdim in {64, 128, 256}, seqlen 512 .. 16k, causal
off/on, forward and backward (backward FLOPs = 2.5 x forward; forward FLOPs =
4 * b * h * sq * sk * d, halved for causal). The 14 headline rows (--headline) are
hdim 128 at 4k / 8k / 16k and hdims 64 and 256 at 8k / 16k, causal and not.

flash3 is loaded through its C ABI (include/flash3/flash3_c.h) with ctypes.

Modes:
  table (default)  every row checked against torch math SDPA in fp32 (tolerance rule
                   err <= 2 * err(plain bf16 math SDPA) + 1e-5, no NaN), then flash3, cuDNN
                   and FA2 timed; a markdown table, geomeans, optional CSV and plot.
  --ab [NAME=]PATH another flash3 build (repeatable), timed in the same process as --lib
                   (named by --name) and cuDNN, interleaved: --rounds rounds, each timing
                   every contender once, the first contender rotating; per contender the
                   median over rounds and the spread (max - min) / median. Run-to-run drift
                   between processes (clocks, L2 state) is as large as most kernel changes.
                   Libraries of either flash3_options layout (with or without struct_size)
                   can be compared. No correctness check.
  --steady         the interleaved mode against cuDNN under sustained load: each timing
                   after --warmup-ms (300) of back-to-back calls, --rounds 2 (both orders),
                   --gap-s 1 of idle before each round, headline rows unless --hdims /
                   --seqlens are given. Under the H200's power cap the clocks drop within
                   tens of milliseconds of continuous work, and not equally for every
                   kernel, so a short burst after an idle gap measures boost clocks a
                   training job does not see.
  --power          each contender back to back for --seconds while nvidia-smi samples power
                   and SM clock: mean power, clock, time and energy per call (headline rows
                   of the backward by default). The H200 holds its power cap under these
                   loads, so energy per call sets the sustained speed.
  --fixed-cost     flash3's backward at one --seqlen-k and several --seqlens (seqlen_q),
                   sustained, fitted as T = slope * sq + intercept: intercept / slope is what
                   a KV-block tile costs besides its query-block iterations (launch, first
                   loads, epilogue), in query rows (in iterations with --tile-m).
  --varlen         variable-length forward and backward (--passes), sustained and interleaved
                   like --steady:
                   (a) every headline row as a varlen batch of equal lengths next to the
                   fixed-length call on the same tensors (varlen / fixed); (b) a document mix
                   (--tokens in lengths drawn log-uniformly from 64..8192, causal, d = 128):
                   one varlen call next to one fixed-length call per document (flash3 and
                   cuDNN), in TFLOP/s of useful (causal) work.
  --pack-gqa       PackGQA on decode-like GQA rows: d = 128 (--hdims), 64 query heads on 8 KV
                   heads, batch 4 x 8k keys and batch 1 x 32k keys, seqlen_q 1 .. 64 (--seqlens),
                   non-causal (--causal): the forward with pack_gqa = 1 and 0 from the same
                   library, and cuDNN (SDPA, enable_gqa), sustained and interleaved like --steady;
                   time (us), effective K+V read bandwidth (bytes of K and V / time) and the
                   packed / unpacked speedup per row, both flash3 results checked against fp32
                   math SDPA under the tolerance rule (--no-check: not).
  --split-kv       split-KV on the decode rows (seqlen_q 1 (--seqlens), d = 128, 64 query heads on 8
                   KV heads, batch x seqlen_k 1 x 4k .. 128 x 16k): num_splits 0 (heuristic) and 1
                   from the same library, and cuDNN, each replayed from a CUDA graph of 10 calls,
                   sustained and interleaved like --steady; time per call (us), effective K+V read
                   bandwidth and cuDNN time / split time; both flash3 results checked on batch
                   element 0 (--no-check: not).
  --kvcache        the KV-cache decode step on the --split-kv rows: flash3_forward_kvcache on a full
                   cache (cache), with its last row appended by the call (append), and with rotary
                   on that row and q (rope), the append on paged copies of the cache (paged256,
                   paged64: page_table, pages in a random order), next to flash3_forward (split)
                   and cuDNN, num_splits 0, CUDA-graph replay; cuDNN time / append time.
  --from-csv CSV   no GPU: re-print the table of a CSV written by --csv (and --plot it).

Usage:
  python3 bench/bench.py                       # full table (about 10 minutes on an H200)
  python3 bench/bench.py --quick               # a small subset
  python3 bench/bench.py --hdims 128 --seqlens 4k,8k --passes fwd --causal on --csv out.csv
  python3 bench/bench.py --headline --rounds 2 --warmup-ms 300   # headline rows, sustained
  python3 bench/bench.py --lib old/libflash3.so --name old --ab new=build/libflash3.so \\
      --headline --passes fwd,bwd --warmup-ms 300               # new / old, one process
  python3 bench/bench.py --steady --passes fwd,bwd
  python3 bench/bench.py --power --passes bwd --hdims 128 --seqlens 4k --causal on
  python3 bench/bench.py --fixed-cost --hdims 128 --seqlen-k 4k --seqlens 2k,4k,8k,16k --tile-m 80
  python3 bench/bench.py --pack-gqa
  python3 bench/bench.py --split-kv
  python3 bench/bench.py --kvcache
  python3 bench/bench.py --from-csv out.csv --plot out.png
Profiling one kernel: ncu --kernel-name regex:flash_bwd_kernel --launch-count 1 python3
bench/bench.py --iters 1 --warmup 0 --no-check --passes bwd --hdims 128 --seqlens 8k --causal off;
its main loops' SASS: tools/sass_loops.py.
Exit status: 0 ok, 1 a check failed (or the library could not be loaded), 2 no Hopper GPU.
"""
import argparse
import contextlib
import csv
import ctypes
import math
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------------------
# C ABI mirror (include/flash3/flash3_c.h). Keep in sync with the header.
# ---------------------------------------------------------------------------
FLASH3_OK, FLASH3_INVALID_ARGUMENT, FLASH3_NOT_SUPPORTED, FLASH3_CUDA_ERROR, FLASH3_INTERNAL = 0, 1, 2, 3, 4
FLASH3_FP16, FLASH3_BF16, FLASH3_FP32, FLASH3_FP8_E4M3 = 0, 1, 2, 3
STATUS_NAMES = {0: "ok", 1: "invalid argument", 2: "not supported yet", 3: "cuda error", 4: "internal error"}


class F3Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * 4),
        ("stride", ctypes.c_int64 * 4),
    ]


_OPTION_FIELDS = [
    ("softmax_scale", ctypes.c_float),
    ("causal", ctypes.c_int32),
    ("window_left", ctypes.c_int32),
    ("window_right", ctypes.c_int32),
    ("softcap", ctypes.c_float),
    ("deterministic", ctypes.c_int32),
    ("cu_seqlens_q", ctypes.POINTER(ctypes.c_int32)),
    ("cu_seqlens_k", ctypes.POINTER(ctypes.c_int32)),
    ("max_seqlen_q", ctypes.c_int32),
    ("max_seqlen_k", ctypes.c_int32),
]


_VARLEN_FIELDS = [
    ("num_sequences", ctypes.c_int32),
    ("seqused_q", ctypes.POINTER(ctypes.c_int32)),
    ("seqused_k", ctypes.POINTER(ctypes.c_int32)),
]


_PACK_FIELDS = [
    ("pack_gqa", ctypes.c_int32),
]


_SPLIT_FIELDS = [
    ("num_splits", ctypes.c_int32),
    ("reserved0", ctypes.c_int32),  # keeps sizeof apart from the pack_gqa layout's (padding)
]


class F3Options(ctypes.Structure):
    """flash3_options: struct_size first (set by flash3_default_options)."""
    _fields_ = [("struct_size", ctypes.c_uint32)] + _OPTION_FIELDS + _VARLEN_FIELDS + _PACK_FIELDS + _SPLIT_FIELDS


class F3OptionsV3(ctypes.Structure):
    """flash3_options before num_splits: --ab / --pack-gqa against such builds (not --split-kv)."""
    _fields_ = [("struct_size", ctypes.c_uint32)] + _OPTION_FIELDS + _VARLEN_FIELDS + _PACK_FIELDS


class F3OptionsV2(ctypes.Structure):
    """flash3_options before pack_gqa: --ab against such builds (not --pack-gqa)."""
    _fields_ = [("struct_size", ctypes.c_uint32)] + _OPTION_FIELDS + _VARLEN_FIELDS


class F3OptionsV1(ctypes.Structure):
    """flash3_options before the varlen fields (num_sequences, seqused_*): --ab against such builds."""
    _fields_ = [("struct_size", ctypes.c_uint32)] + _OPTION_FIELDS


class F3OptionsNoSize(ctypes.Structure):
    """The flash3_options layout without struct_size (softmax_scale first, <= 0 meaning
    1/sqrt(d)): --ab against libraries built with that header."""
    _fields_ = _OPTION_FIELDS


class F3KVCacheArgs(ctypes.Structure):
    """flash3_kvcache_args (flash3_c.h)."""
    _fields_ = [("struct_size", ctypes.c_uint32), ("rotary_interleaved", ctypes.c_int32)] + [
        (n, ctypes.POINTER(F3Tensor)) for n in ("q", "k_cache", "v_cache", "k_new", "v_new", "rotary_cos",
                                                "rotary_sin", "out", "lse")] + [
        (n, ctypes.c_void_p) for n in ("cache_seqlens", "cache_batch_idx", "cache_leftpad", "rotary_seqlens")] + [
        ("page_table", ctypes.c_void_p), ("page_table_batch_stride", ctypes.c_int64),
        ("page_table_max_pages", ctypes.c_int32)]


class Flash3Lib:
    def __init__(self, path):
        self.path = path
        self.lib = lib = ctypes.CDLL(path)  # RTLD_LOCAL: several builds can be loaded side by side
        # The options layout: flash3_default_options() of the struct_size layout
        # returns sizeof(flash3_options) in its first field; the other layout
        # has softmax_scale there (0.0f, or a NaN: never that integer's bits).
        # F3Options is the larger struct, so either library's return fits.
        lib.flash3_default_options.restype = F3Options
        lib.flash3_default_options.argtypes = []
        probe = lib.flash3_default_options()
        sized = {ctypes.sizeof(c): c for c in (F3Options, F3OptionsV3, F3OptionsV2, F3OptionsV1)}
        self.Options = sized.get(probe.struct_size, F3OptionsNoSize)
        self.has_pack_gqa = any(name == "pack_gqa" for name, _ in self.Options._fields_)
        self.has_num_splits = any(name == "num_splits" for name, _ in self.Options._fields_)
        # The forward with caller scratch (builds with a forward workspace).
        self.has_fwd_workspace = hasattr(lib, "flash3_forward_workspace_size")
        lib.flash3_default_options.restype = self.Options
        T = ctypes.POINTER(F3Tensor)
        O = ctypes.POINTER(self.Options)
        lib.flash3_forward.restype = ctypes.c_int
        lib.flash3_forward.argtypes = [T, T, T, T, T, O, ctypes.c_void_p]
        lib.flash3_backward.restype = ctypes.c_int
        lib.flash3_backward.argtypes = [T, T, T, T, T, T, T, T, T, T, O, ctypes.c_void_p, ctypes.c_size_t,
                                        ctypes.c_void_p]
        lib.flash3_backward_workspace_size.restype = ctypes.c_size_t
        lib.flash3_backward_workspace_size.argtypes = [T, T, T, O]
        if self.has_fwd_workspace:
            lib.flash3_forward_workspace_size.restype = ctypes.c_size_t
            lib.flash3_forward_workspace_size.argtypes = [T, T, T, O]
            lib.flash3_forward_with_workspace.restype = ctypes.c_int
            lib.flash3_forward_with_workspace.argtypes = [T, T, T, T, T, O, ctypes.c_void_p, ctypes.c_size_t,
                                                          ctypes.c_void_p]
        self.has_kvcache = hasattr(lib, "flash3_forward_kvcache")
        if self.has_kvcache:
            K = ctypes.POINTER(F3KVCacheArgs)
            lib.flash3_default_kvcache_args.restype = F3KVCacheArgs
            lib.flash3_default_kvcache_args.argtypes = []
            lib.flash3_forward_kvcache.restype = ctypes.c_int
            lib.flash3_forward_kvcache.argtypes = [K, O, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            lib.flash3_kvcache_workspace_size.restype = ctypes.c_size_t
            lib.flash3_kvcache_workspace_size.argtypes = [K, O]
        lib.flash3_validate_forward.restype = ctypes.c_int
        lib.flash3_validate_forward.argtypes = [T, T, T, T, T, O]
        for fn in (lib.flash3_forward_is_built, lib.flash3_backward_is_built):
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]
        lib.flash3_device_is_supported.restype = ctypes.c_int
        lib.flash3_device_is_supported.argtypes = []
        lib.flash3_last_error.restype = ctypes.c_char_p
        lib.flash3_last_error.argtypes = []
        lib.flash3_version.restype = ctypes.c_char_p
        lib.flash3_version.argtypes = []

    def options(self, scale, causal=False, deterministic=False, softcap=0.0, pack_gqa=None, num_splits=None):
        """flash3_default_options() with the softmax scale, causal, deterministic and softcap set;
        pack_gqa None keeps the library's default (the heuristic), True / False set 1 / 0;
        num_splits None keeps the default (1), else sets it (0: the heuristic)."""
        opts = self.lib.flash3_default_options()
        opts.softmax_scale = scale
        opts.causal = 1 if causal else 0
        opts.deterministic = 1 if deterministic else 0
        opts.softcap = softcap
        if pack_gqa is not None:
            if not self.has_pack_gqa:
                raise RuntimeError(f"{self.path}: its flash3_options has no pack_gqa (a build before PackGQA)")
            opts.pack_gqa = 1 if pack_gqa else 0
        if num_splits is not None:
            if not self.has_num_splits:
                raise RuntimeError(f"{self.path}: its flash3_options has no num_splits (a build before split-KV)")
            opts.num_splits = num_splits
        return opts

    def last_error(self):
        m = self.lib.flash3_last_error()
        return m.decode(errors="replace") if m else ""

    def version(self):
        v = self.lib.flash3_version()
        return v.decode() if v else "?"


def f3_tensor(t, f3_dtype):
    """A flash3_tensor view of a torch CUDA tensor (strides in elements)."""
    ft = F3Tensor()
    ft.data = t.data_ptr()
    ft.dtype = f3_dtype
    ft.ndim = t.dim()
    for i in range(t.dim()):
        ft.shape[i] = t.shape[i]
        ft.stride[i] = t.stride(i)
    return ft


class Flash3Call:
    """flash3 forward and backward on (b, s, h, d) bf16 / fp16 CUDA tensors q, k,
    v, dout, the setup the timing modes share: owns O, LSE, dQ / dK / dV and the
    backward workspace (sized for `opts`). The constructor runs the forward once
    (its status in .status), so that bwd() differentiates a real O and LSE;
    fwd() / bwd() make one call each and return its status."""

    def __init__(self, torch, lib, q, k, v, dout, opts, stream):
        P = ctypes.byref
        dt = FLASH3_BF16 if q.dtype == torch.bfloat16 else FLASH3_FP16
        b, sq, h, _ = q.shape
        self.lib = lib
        self.out = torch.empty_like(q)
        self.lse = torch.empty((b, h, sq), device=q.device, dtype=torch.float32)
        self.dq, self.dk, self.dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        t = {n: f3_tensor(x, dt) for n, x in
             dict(q=q, k=k, v=v, o=self.out, do=dout, dq=self.dq, dk=self.dk, dv=self.dv).items()}
        tl = f3_tensor(self.lse, FLASH3_FP32)
        self._structs = (t, tl, opts)  # what the byref pointers below point into
        st = stream if isinstance(stream, ctypes.c_void_p) else ctypes.c_void_p(stream)
        self._fwd = (P(t["q"]), P(t["k"]), P(t["v"]), P(t["o"]), P(tl), P(opts), st)
        self._fwd_ws = None
        if lib.has_fwd_workspace:  # the forward's scratch allocated once, not per call
            fws = int(lib.lib.flash3_forward_workspace_size(P(t["q"]), P(t["k"]), P(t["v"]), P(opts)))
            if fws > 0:
                self.fws = torch.empty(fws, device=q.device, dtype=torch.uint8)
                self._fwd_ws = self._fwd[:6] + (ctypes.c_void_p(self.fws.data_ptr()), ctypes.c_size_t(fws), st)
        ws_bytes = lib.lib.flash3_backward_workspace_size(P(t["q"]), P(t["k"]), P(t["v"]), P(opts))
        self.ws = torch.empty(max(int(ws_bytes), 1), device=q.device, dtype=torch.uint8)
        self._bwd = (P(t["q"]), P(t["k"]), P(t["v"]), P(t["o"]), P(t["do"]), P(tl), None, P(t["dq"]), P(t["dk"]),
                     P(t["dv"]), P(opts), ctypes.c_void_p(self.ws.data_ptr()), ctypes.c_size_t(ws_bytes), st)
        self.status = self.fwd()

    def fwd(self):
        if self._fwd_ws is not None:
            return self.lib.lib.flash3_forward_with_workspace(*self._fwd_ws)
        return self.lib.lib.flash3_forward(*self._fwd)

    def bwd(self):
        return self.lib.lib.flash3_backward(*self._bwd)


class KVCacheCall:
    """flash3_forward_kvcache on a contiguous cache holding k / v (b, sk, hkv, d), every
    sequence full (cache_seqlens = sk). append: the last cache row comes in as k_new / v_new
    (one row per sequence, cache_seqlens = sk - 1; the same values, so the result is plain
    attention over k / v); rope: that row and q also rotated (the result then differs: not
    checked; it writes into a copy of k / v); page_size > 0: the cache as a pool of pages of
    that many rows (a copy of k / v; -1: one page of seqlen_k rows), sequence b's pages in a random order
    (page_table). The
    workspace is allocated once; .status is the first call's, .out the output."""

    def __init__(self, torch, lib, q, k, v, opts, stream, append=False, rope=False, page_size=0):
        P = ctypes.byref
        dt = FLASH3_BF16 if q.dtype == torch.bfloat16 else FLASH3_FP16
        b, sq, hq, d = q.shape
        sk = k.shape[1]
        self.lib, self.check = lib, not rope
        self.out = torch.empty_like(q)
        self.lse_buf = torch.empty((hq, b, sq), device=q.device, dtype=torch.float32)
        self.seqlens = torch.full((b,), sk - 1 if append else sk, device=q.device, dtype=torch.int32)
        if rope:  # its own cache: the rotated row it writes must not change the others' keys
            k, v = k.clone(), v.clone()
        keep = dict(q=q, k_cache=k, v_cache=v, out=self.out)
        if append:
            keep.update(k_new=k[:, sk - 1:].clone(), v_new=v[:, sk - 1:].clone())
        self.page_table = None
        page_size = sk if page_size < 0 else page_size
        if page_size:
            assert sk % page_size == 0, "bench: seqlen_k must be a multiple of the page size"
            n = sk // page_size
            perm = torch.randperm(b * n, device=q.device)
            self.page_table = perm.to(torch.int32).view(b, n)

            def pool(x):
                p = torch.empty((b * n, page_size) + tuple(x.shape[2:]), device=x.device, dtype=x.dtype)
                p[perm] = x.reshape(b * n, page_size, *x.shape[2:])
                return p
            keep.update(k_cache=pool(k), v_cache=pool(v))
        if rope:
            pos = torch.arange(sk, device=q.device, dtype=torch.float32)[:, None]
            inv = 10000.0 ** (-torch.arange(0, d, 2, device=q.device, dtype=torch.float32) / d)
            keep.update(rotary_cos=torch.cos(pos * inv).to(q.dtype), rotary_sin=torch.sin(pos * inv).to(q.dtype))
        self._keep = keep
        self._t = {n: f3_tensor(x, dt) for n, x in keep.items()}
        self._tl = f3_tensor(self.lse_buf.permute(1, 0, 2), FLASH3_FP32)
        a = lib.lib.flash3_default_kvcache_args()
        for n, t in self._t.items():
            setattr(a, n, ctypes.pointer(t))
        a.lse = ctypes.pointer(self._tl)
        a.cache_seqlens = self.seqlens.data_ptr()
        if self.page_table is not None:
            a.page_table = self.page_table.data_ptr()
            a.page_table_batch_stride = self.page_table.stride(0)
            a.page_table_max_pages = self.page_table.shape[1]
        self.args, self.opts = a, opts
        st = stream if isinstance(stream, ctypes.c_void_p) else ctypes.c_void_p(stream)
        ws = int(lib.lib.flash3_kvcache_workspace_size(P(a), P(opts)))
        self.ws = torch.empty(max(ws, 1), device=q.device, dtype=torch.uint8)
        self._call = (P(a), P(opts), ctypes.c_void_p(self.ws.data_ptr()), ctypes.c_size_t(ws), st)
        # The tensors above were written on the current stream; the call may run on another.
        torch.cuda.synchronize()
        self.status = self.fwd()

    def fwd(self):
        return self.lib.lib.flash3_forward_kvcache(*self._call)


class FA3KVCacheCall:
    """The official FlashAttention-3's KV-cache step (torch.ops.flash_attn_3.fwd of its decode
    build, ../shared/anchors/fa3_decode.so) on the same cache layouts as KVCacheCall: append
    (the last row comes in as k_new / v_new) and, with page_size > 0, a paged copy of the cache
    (pages in a random order). Timed and checked only; never linked into flash3."""

    def __init__(self, torch, fa3, q, k, v, scale, causal, append=True, page_size=0, num_splits=0):
        b, sq, hq, d = q.shape
        sk = k.shape[1]
        self.check = True
        self.seqlens = torch.full((b,), sk - 1 if append else sk, device=q.device, dtype=torch.int32)
        k_cache, v_cache = k, v  # the appended row holds the same values: the cache is shared
        k_new = v_new = None
        if append:
            k_new, v_new = k[:, sk - 1:].clone(), v[:, sk - 1:].clone()
        page_table = None
        if page_size:
            n = sk // page_size
            perm = torch.randperm(b * n, device=q.device)
            page_table = perm.to(torch.int32).view(b, n)

            def pool(x):
                p = torch.empty((b * n, page_size) + tuple(x.shape[2:]), device=x.device, dtype=x.dtype)
                p[perm] = x.reshape(b * n, page_size, *x.shape[2:])
                return p
            k_cache, v_cache = pool(k), pool(v)
        self.out = torch.empty_like(q)
        args = (q, k_cache, v_cache, k_new, v_new, None, self.out, None, None, None, None, self.seqlens, sq, None,
                page_table, None, None, None, None, None, None, None, None, scale, causal, -1, -1, 0, 0.0, True,
                None, num_splits, None, 0)
        self._keep = (k_cache, v_cache, k_new, v_new, page_table)
        self.fwd = lambda: fa3.fwd(*args)
        self.status = FLASH3_OK
        try:
            self.fwd()
            torch.cuda.synchronize()
        except RuntimeError as e:
            print(f"  fa3: {str(e).splitlines()[0][:160]}")
            self.status = -1


# ---------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------
def parse_len(s):
    s = s.strip().lower()
    if s.endswith("k"):
        return int(float(s[:-1]) * 1024)
    return int(s)


def parse_list(s, conv):
    return [conv(x) for x in s.replace(";", ",").split(",") if x.strip()]


def parse_causal(s):
    s = s.strip().lower()
    if s in ("both", "all"):
        return [False, True]
    out = []
    for x in parse_list(s, str):
        x = x.strip().lower()
        if x in ("on", "1", "true", "yes", "causal"):
            out.append(True)
        elif x in ("off", "0", "false", "no", "noncausal"):
            out.append(False)
        else:
            raise argparse.ArgumentTypeError(f"--causal: unknown value '{x}' (on, off, both)")
    return out


def fmt_len(n):
    return f"{n // 1024}k" if n % 1024 == 0 and n >= 1024 else str(n)


def fwd_flops(b, h, sq, sk, d, causal):
    f = 4.0 * b * h * sq * sk * d
    return f / 2 if causal else f


def geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    if not xs:
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


# The (hdim, seqlen) pairs of the headline rows (each causal and not: 14 rows).
HEADLINE_ROWS = [(128, 4096), (128, 8192), (128, 16384), (64, 8192), (64, 16384), (256, 8192), (256, 16384)]


def fit_line(points):
    """Least-squares y = slope * x + intercept over (x, y) points (at least two
    distinct x); returns (slope, intercept, largest absolute residual)."""
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if n < 2 or sxx == 0:
        raise ValueError("fit_line needs at least two distinct x values")
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx
    icept = my - slope * mx
    resid = max(abs(p[1] - (slope * p[0] + icept)) for p in points)
    return slope, icept, resid


def parse_smi_line(line, t_origin):
    """(seconds since t_origin, watts, MHz) from one `nvidia-smi --query-gpu=
    timestamp,power.draw,clocks.sm --format=csv,noheader,nounits` line; None
    for anything else (headers, [N/A] fields)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 3:
        return None
    try:
        stamp, frac = (parts[0].split(".") + ["0"])[:2]
        ts = time.mktime(time.strptime(stamp, "%Y/%m/%d %H:%M:%S")) + float("0." + frac)
        return ts - t_origin, float(parts[1]), float(parts[2])
    except ValueError:
        return None


def segment_stats(samples, start, end, ms_per_call):
    """Mean power (W) and SM clock (MHz) of the samples in [start, end], and
    the energy of one call (J) at that power; None without samples."""
    sel = [(p, c) for (t, p, c) in samples if start <= t <= end]
    if not sel:
        return None
    watts = sum(p for p, _ in sel) / len(sel)
    mhz = sum(c for _, c in sel) / len(sel)
    return watts, mhz, watts * ms_per_call / 1e3


# ---------------------------------------------------------------------------
# Timing.
# ---------------------------------------------------------------------------
def run_for(torch, fn, ms):
    """Calls fn() back to back for about `ms` milliseconds of wall time."""
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < ms:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()


def time_cuda(torch, fn, iters, warmup, budget_s=3.0, warmup_ms=0.0):
    """Median milliseconds of fn() over up to `iters` runs, each bracketed by CUDA events
    (warmup_ms > 0: after that long of back-to-back calls, i.e. under sustained load)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    run_for(torch, fn, warmup_ms)
    # One probe run decides how many iterations fit the time budget (big shapes get fewer).
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    probe_ms = max(s.elapsed_time(e), 1e-3)
    return events_median(torch, fn, int(max(5, min(iters, budget_s * 1000.0 / probe_ms))))


def events_median(torch, fn, n):
    """Median milliseconds of n back-to-back runs of fn(), each bracketed by CUDA events."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(st.elapsed_time(en) for st, en in zip(starts, ends))


def sustained_median(torch, fn, warmup_ms, iters):
    """Median milliseconds of `iters` timed runs of fn(), after running it back to
    back for `warmup_ms` (so that, under the power cap, the clocks have settled
    to what sustained use of this kernel gets)."""
    run_for(torch, fn, warmup_ms)
    return events_median(torch, fn, iters)


def cudnn_sdpa_fn(torch, F, qt, kt, vt, causal, scale, pss):
    """cuDNN (torch SDPA) forward, or backward only (the graph of one forward is
    kept), on (b, h, s, d) views; for the interleaved and power modes."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    if pss == "fwd":
        def fwd():
            with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale)
        return fwd
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (qt, kt, vt))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, scale=scale)
    dog = torch.randn_like(og)

    def bwd():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.autograd.grad(og, (qg, kg, vg), dog, retain_graph=True)
    return bwd


# Table-mode contenders: flash3, cuDNN and FlashAttention-2 through torch SDPA, and the
# official FlashAttention-3 when --fa3 names its torch extension.
CONTENDERS = ("flash3", "cudnn", "fa2", "fa3")


class RowResult:
    def __init__(self, hdim, seqlen, causal, pss, batch, heads):
        self.hdim, self.seqlen, self.causal, self.pss = hdim, seqlen, causal, pss
        self.batch, self.heads = batch, heads
        self.flops = 0.0
        self.ms = {w: None for w in CONTENDERS}
        self.note = {w: "" for w in CONTENDERS}
        self.check = "-"
        self.err = self.bound = None

    def tflops(self, who):
        ms = self.ms[who]
        return self.flops / (ms * 1e-3) / 1e12 if ms else None

    def ratio(self, a, b):
        ta, tb = self.tflops(a), self.tflops(b)
        return ta / tb if ta and tb else None




def shape_pairs(args):
    """(hdim, seqlen) pairs of the run: the headline pairs, or --hdims x --seqlens."""
    if args.headline:
        return list(HEADLINE_ROWS)
    return [(d, s) for d in parse_list(args.hdims, int) for s in parse_list(args.seqlens, parse_len)]


def each_row(torch, args, causals, passes, dtype, n=4):
    """(hdim, seqlen, causal, pass, softmax scale, FLOPs, inputs) for every row of the run;
    inputs: n paper-shape tensors (q, k, v[, dout]) of (b, s, h, d) with batch = tokens //
    seqlen and heads = hidden // hdim, shared by the rows of one (hdim, seqlen) pair."""
    for hdim, seqlen in shape_pairs(args):
        batch, heads = max(1, args.tokens // seqlen), max(1, args.hidden // hdim)
        torch.manual_seed(1234 + hdim + seqlen)
        x = [torch.randn((batch, seqlen, heads, hdim), device="cuda", dtype=dtype) for _ in range(n)]
        for causal in causals:
            for pss in passes:
                f = fwd_flops(batch, heads, seqlen, seqlen, hdim, causal) * (1.0 if pss == "fwd" else 2.5)
                yield hdim, seqlen, causal, pss, 1.0 / math.sqrt(hdim), f, x
        del x
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------
# Table mode.
# ---------------------------------------------------------------------------
def run_table(args, torch, F, sdpa_ctx, passes, causals, dtype, f3_dtype):
    iters, warmup = args.iters, args.warmup
    if args.quick:
        args.headline, args.hdims, args.seqlens = False, "128", "1k,8k"
        iters, warmup = min(iters, 10), min(warmup, 3)
    lib, lib_error = None, ""
    try:
        lib = Flash3Lib(args.lib)
    except OSError as e:
        lib_error = f"cannot load {args.lib}: {e}"
        print(f"flash3: {lib_error}; timing the baselines only")
    if lib is not None and not lib.lib.flash3_device_is_supported():
        print("flash3: the library says this device is not supported; timing the baselines only")
        lib_error = "device not supported by flash3"
        lib = None

    fa3 = load_fa3(torch, args.fa3) if args.fa3 else None
    print(f"device: {torch.cuda.get_device_name()} | torch {torch.__version__} | cuDNN {torch.backends.cudnn.version()}"
          f" | flash3 {lib.version() if lib else '(not loaded)'} | dtype {args.dtype}"
          f"{f' | FA3 {args.fa3}' if fa3 else ''}")
    sys.stdout.flush()

    stream = torch.cuda.current_stream().cuda_stream
    results = []
    any_fail = False
    for hdim, seqlen, causal, pss, scale, flops, (q, k, v) in each_row(torch, args, causals, passes, dtype, 3):
        r = RowResult(hdim, seqlen, causal, pss, q.shape[0], q.shape[2])
        r.flops = flops
        try:
            run_row(torch, F, lib, lib_error, sdpa_ctx, r, q, k, v, scale, f3_dtype, stream, iters, warmup,
                    not args.no_check, args.rounds, args.warmup_ms, fa3)
        except torch.cuda.OutOfMemoryError as e:  # keep going with the next row
            r.check = "OOM"
            print(f"  out of memory: {e}")
            torch.cuda.empty_cache()
        any_fail |= r.check.startswith("FAIL")
        results.append(r)
        print_row_line(r)
        sys.stdout.flush()

    finish_table(args, results, passes)
    if lib is None:
        return 1
    return 1 if any_fail else 0


def finish_table(args, results, passes):
    print()
    print_table(results)
    print_summary(results, passes)
    if args.csv:
        write_csv(args.csv, results)
        print(f"\nwrote {args.csv}")
    if args.plot:
        plot(args.plot, results)


def load_fa3(torch, path):
    """The official FlashAttention-3's operators (torch.ops.flash_attn_3) from its built
    extension (../shared/anchors/build_fa3.sh); timed only, never linked into flash3."""
    torch.ops.load_library(path)
    return torch.ops.flash_attn_3


def fa3_forward(fa3, q, k, v, scale, causal):
    """(out, softmax_lse) of FlashAttention-3's forward, as its flash_attn_func calls it."""
    out, lse, *_ = fa3.fwd(q, k, v, softmax_scale=scale, is_causal=causal, num_splits=1)
    return out, lse


def run_row(torch, F, lib, lib_error, sdpa_ctx, r, q, k, v, scale, f3_dtype, stream, iters, warmup, do_check,
            rounds=1, warmup_ms=0.0, fa3=None):
    causal, pss = r.causal, r.pss
    # rounds == 1: each contender is timed right after its probe / check.
    # rounds > 1: the contenders that ran are collected (who -> (fn, context
    # factory)) and timed round-robin at the end (time_rounds), so their
    # buffers stay alive: `keep`.
    timers, keep = {}, []

    def measure(who, fn, ctx=None):
        if rounds <= 1:
            r.ms[who] = time_cuda(torch, fn, iters, warmup, warmup_ms=warmup_ms)
        else:
            timers[who] = (fn, ctx)
    b, s, h, d = q.shape
    # SDPA layout (b, h, s, d): transposed views of the same (b, s, h, d) tensors.
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    # ---------------- flash3 ----------------
    if lib is None:
        r.note["flash3"] = "no library" if lib_error else "n/a"
    else:
        out = torch.empty_like(q)
        lse = torch.empty((b, h, s), device=q.device, dtype=torch.float32)
        tq, tk, tv = f3_tensor(q, f3_dtype), f3_tensor(k, f3_dtype), f3_tensor(v, f3_dtype)
        to, tl = f3_tensor(out, f3_dtype), f3_tensor(lse, FLASH3_FP32)
        opts = lib.options(scale, causal)
        P = ctypes.byref
        fwd_args = (P(tq), P(tk), P(tv), P(to), P(tl), P(opts), ctypes.c_void_p(stream))

        if not lib.lib.flash3_forward_is_built(f3_dtype, d, d):
            r.note["flash3"] = "not built"
        else:
            st = lib.lib.flash3_forward(*fwd_args)
            torch.cuda.synchronize()
            if st != FLASH3_OK:
                msg = lib.last_error()
                r.note["flash3"] = "not supported yet" if st == FLASH3_NOT_SUPPORTED else f"error ({STATUS_NAMES.get(st, st)})"
                print(f"  flash3 forward d={d} s={s} causal={causal}: {msg}")
            elif pss == "fwd":
                if do_check:
                    check_fwd(torch, F, sdpa_ctx, r, q, k, v, out, scale, causal)
                measure("flash3", lambda: lib.lib.flash3_forward(*fwd_args))
            else:  # bwd
                if not lib.lib.flash3_backward_is_built(f3_dtype, d, d):
                    r.note["flash3"] = "not built"
                else:
                    dout = torch.randn_like(q)
                    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                    tdo = f3_tensor(dout, f3_dtype)
                    tdq, tdk, tdv = f3_tensor(dq, f3_dtype), f3_tensor(dk, f3_dtype), f3_tensor(dv, f3_dtype)
                    ws_bytes = lib.lib.flash3_backward_workspace_size(P(tq), P(tk), P(tv), P(opts))
                    ws = torch.empty(max(int(ws_bytes), 1), device=q.device, dtype=torch.uint8)
                    bwd_args = (P(tq), P(tk), P(tv), P(to), P(tdo), P(tl), None, P(tdq), P(tdk), P(tdv), P(opts),
                                ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(ws_bytes), ctypes.c_void_p(stream))
                    st = lib.lib.flash3_backward(*bwd_args)
                    torch.cuda.synchronize()
                    if st != FLASH3_OK:
                        msg = lib.last_error()
                        r.note["flash3"] = ("not supported yet" if st == FLASH3_NOT_SUPPORTED
                                            else f"error ({STATUS_NAMES.get(st, st)})")
                        print(f"  flash3 backward d={d} s={s} causal={causal}: {msg}")
                    else:
                        if do_check:
                            check_bwd(torch, F, sdpa_ctx, r, q, k, v, dout, (dq, dk, dv), scale, causal)
                        measure("flash3", lambda: lib.lib.flash3_backward(*bwd_args))
                    keep += [dout, dq, dk, dv, ws, tdo, tdq, tdk, tdv]
        keep += [out, lse, tq, tk, tv, to, tl]

    # ---------------- torch SDPA baselines ----------------
    for who, backend in (("cudnn", "CUDNN_ATTENTION"), ("fa2", "FLASH_ATTENTION")):
        try:
            if pss == "fwd":
                def fn():
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale)
                with torch.no_grad(), sdpa_ctx(backend):
                    fn()  # raises here when the backend cannot run this shape
                    measure(who, fn, lambda backend=backend: _nograd_ctx(torch, sdpa_ctx, backend))
            else:
                qg = q.detach().requires_grad_(True)
                kg = k.detach().requires_grad_(True)
                vg = v.detach().requires_grad_(True)
                with sdpa_ctx(backend):
                    o = F.scaled_dot_product_attention(qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2),
                                                       is_causal=causal, scale=scale)
                do = torch.randn_like(o)

                def fn(o=o, do=do, g=(qg, kg, vg)):  # backward only: the graph of the precomputed output is kept
                    return torch.autograd.grad(o, g, do, retain_graph=True)
                with sdpa_ctx(backend):
                    fn()
                    measure(who, fn, lambda backend=backend: sdpa_ctx(backend))
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001  (backend cannot run this shape)
            r.note[who] = "n/a"
            msg = str(e).strip().splitlines()
            print(f"  {who} d={d} s={s} causal={causal} {pss}: not available ({msg[0][:160] if msg else type(e).__name__})")

    # ---------------- the official FlashAttention-3 ----------------
    if fa3 is None:
        r.note["fa3"] = "-"
    else:
        try:
            with torch.no_grad():
                out3, lse3 = fa3_forward(fa3, q, k, v, scale, causal)
                if pss == "fwd":
                    measure("fa3", lambda: fa3_forward(fa3, q, k, v, scale, causal), lambda: torch.no_grad())
                else:
                    do3 = torch.randn_like(out3)
                    g3 = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))

                    def fn3(o=out3, lse=lse3, do=do3, g=g3):
                        return fa3.bwd(do, q, k, v, o, lse, *g, softmax_scale=scale, is_causal=causal)
                    fn3()
                    measure("fa3", fn3, lambda: torch.no_grad())
                    keep += [do3, *g3]
            keep += [out3, lse3]
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001  (not built for this shape)
            r.note["fa3"] = "n/a"
            msg = str(e).strip().splitlines()
            print(f"  fa3 d={d} s={s} causal={causal} {pss}: not available ({msg[0][:160] if msg else type(e).__name__})")

    if timers:
        time_rounds(torch, r, timers, iters, warmup, rounds, warmup_ms)


def _nograd_ctx(torch, sdpa_ctx, backend):
    stack = contextlib.ExitStack()
    stack.enter_context(torch.no_grad())
    stack.enter_context(sdpa_ctx(backend))
    return stack


def time_rounds(torch, r, timers, iters, warmup, rounds, warmup_ms=0.0):
    """r.ms[who] = median over `rounds` rounds of time_cuda(fn); each round times every
    contender once, the first contender rotating from round to round."""
    names = list(timers)
    times = {n: [] for n in names}
    for rnd in range(rounds):
        k = rnd % len(names)
        for who in names[k:] + names[:k]:
            fn, ctx = timers[who]
            with (ctx() if ctx else contextlib.nullcontext()):
                times[who].append(time_cuda(torch, fn, iters, warmup, warmup_ms=warmup_ms))
    for who in names:
        r.ms[who] = statistics.median(times[who])


# ---------------------------------------------------------------------------
# Correctness (tolerance rule), on a subset of batches and heads for big shapes.
# ---------------------------------------------------------------------------
CHECK_BUDGET = 1 << 28  # score elements (b_sub * h_sub * sq * sk) per check


def check_subset(b, h, s):
    per = s * s
    bh = max(1, CHECK_BUDGET // per)
    h_sub = min(h, bh)
    b_sub = min(b, max(1, bh // h_sub))
    return b_sub, h_sub


class _PlainMath:
    """torch's math SDPA backend computing in the input dtype (no upcast to fp32)."""

    def __init__(self, torch):
        self.cuda = torch.backends.cuda
        self.prev = None

    def __enter__(self):
        if hasattr(self.cuda, "allow_fp16_bf16_reduction_math_sdp"):
            self.prev = self.cuda.fp16_bf16_reduction_math_sdp_allowed()
            self.cuda.allow_fp16_bf16_reduction_math_sdp(True)
        return self

    def __exit__(self, *exc):
        if self.prev is not None:
            self.cuda.allow_fp16_bf16_reduction_math_sdp(self.prev)
        return False


def _math_sdpa(torch, F, sdpa_ctx, q, k, v, scale, causal):
    # (b, s, h, d) in, (b, s, h, d) out
    with sdpa_ctx("MATH"):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                                           scale=scale)
    return o.transpose(1, 2)


def _judge(torch, ours, ref, base):
    ours, ref, base = ours.float(), ref.float(), base.float()
    nan = int(torch.isnan(ours).sum().item())
    err = (ours - ref).abs().nan_to_num(nan=0.0).max().item() if ours.numel() else 0.0
    berr = (base - ref).abs().nan_to_num(nan=0.0).max().item() if ours.numel() else 0.0
    bound = 2.0 * berr + 1e-5
    return nan == 0 and err <= bound, err, berr, bound, nan


def check_fwd(torch, F, sdpa_ctx, r, q, k, v, out, scale, causal):
    b, s, h, _ = q.shape
    bs, hs = check_subset(b, h, s)
    qs, ks, vs = (x[:bs, :, :hs] for x in (q, k, v))
    with torch.no_grad():
        ref = _math_sdpa(torch, F, sdpa_ctx, qs.float(), ks.float(), vs.float(), scale, causal)
        with _PlainMath(torch):
            base = _math_sdpa(torch, F, sdpa_ctx, qs, ks, vs, scale, causal)
        ok, err, berr, bound, nan = _judge(torch, out[:bs, :, :hs], ref, base)
    r.err, r.bound = err, bound
    r.check = "PASS" if ok else "FAIL"
    sub = "" if (bs, hs) == (b, h) else f" (b<{bs},h<{hs})"
    if not ok:
        print(f"  CHECK FAIL fwd d={q.shape[3]} s={s} causal={causal}{sub}: err={err:.3g} baseline={berr:.3g} "
              f"bound={bound:.3g} nan={nan}")
    del ref, base
    torch.cuda.empty_cache()


def check_bwd(torch, F, sdpa_ctx, r, q, k, v, dout, grads, scale, causal):
    b, s, h, _ = q.shape
    bs, hs = check_subset(b, h, s)
    bs, hs = max(1, bs // 2), max(1, hs // 2) if hs > 1 else 1  # the backward keeps more alive
    sl = (slice(0, bs), slice(None), slice(0, hs))
    do = dout[sl]

    def grads_of(dt_q, dt_k, dt_v, plain):
        qg = q[sl].detach().to(dt_q).requires_grad_(True)
        kg = k[sl].detach().to(dt_k).requires_grad_(True)
        vg = v[sl].detach().to(dt_v).requires_grad_(True)
        if plain:
            with _PlainMath(torch):
                o = _math_sdpa(torch, F, sdpa_ctx, qg, kg, vg, scale, causal)
                g = torch.autograd.grad(o, (qg, kg, vg), do.to(o.dtype))
        else:
            o = _math_sdpa(torch, F, sdpa_ctx, qg, kg, vg, scale, causal)
            g = torch.autograd.grad(o, (qg, kg, vg), do.to(o.dtype))
        return [x.detach() for x in g]

    ref = grads_of(torch.float32, torch.float32, torch.float32, False)
    base = grads_of(q.dtype, k.dtype, v.dtype, True)
    worst_ok, worst = True, None
    for name, ours, rf, bs_ in zip(("dq", "dk", "dv"), grads, ref, base):
        ok, err, berr, bound, nan = _judge(torch, ours[sl], rf, bs_)
        if worst is None or err / bound > worst[1] / worst[3]:
            worst = (name, err, berr, bound, nan)
        if not ok:
            worst_ok = False
            print(f"  CHECK FAIL bwd {name} d={q.shape[3]} s={s} causal={causal}: err={err:.3g} baseline={berr:.3g} "
                  f"bound={bound:.3g} nan={nan}")
    r.err, r.bound = worst[1], worst[3]
    r.check = "PASS" if worst_ok else "FAIL"
    del ref, base
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------
# Output.
# ---------------------------------------------------------------------------
def cell_tflops(r, who):
    t = r.tflops(who)
    return f"{t:.1f}" if t else (r.note[who] or "-")


def cell_ratio(x):
    return f"{x:.3f}" if x else "-"


def has_fa3(results):
    return any(r.ms["fa3"] or r.note["fa3"] not in ("", "-") for r in results)


def print_row_line(r):
    fa3 = f" | FA3 {cell_tflops(r, 'fa3'):>6}" if has_fa3([r]) else ""
    print(f"hdim {r.hdim:3d} seqlen {fmt_len(r.seqlen):>4} causal {str(r.causal):5} {r.pss}: "
          f"flash3 {cell_tflops(r, 'flash3'):>17} | cuDNN {cell_tflops(r, 'cudnn'):>6} | FA2 {cell_tflops(r, 'fa2'):>6}"
          f"{fa3} TFLOP/s | check {r.check}")


def print_table(results):
    fa3 = has_fa3(results)
    hdr = ["hdim", "seqlen", "causal", "pass", "flash3 TFLOP/s", "cuDNN TFLOP/s", "FA2 TFLOP/s"]
    hdr += ["FA3 TFLOP/s"] if fa3 else []
    hdr += ["flash3/cuDNN", "flash3/FA2"] + (["flash3/FA3"] if fa3 else []) + ["check"]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "|".join("---" if h in ("causal", "pass", "check") else "---:" for h in hdr) + "|")
    for r in results:
        row = [str(r.hdim), fmt_len(r.seqlen), "yes" if r.causal else "no", r.pss, cell_tflops(r, "flash3"),
               cell_tflops(r, "cudnn"), cell_tflops(r, "fa2")]
        row += [cell_tflops(r, "fa3")] if fa3 else []
        row += [cell_ratio(r.ratio("flash3", "cudnn")), cell_ratio(r.ratio("flash3", "fa2"))]
        row += [cell_ratio(r.ratio("flash3", "fa3"))] if fa3 else []
        print("| " + " | ".join(row + [r.check]) + " |")


def print_summary(results, passes):
    print()
    baselines = (("cudnn", "cuDNN"), ("fa2", "FA2")) + ((("fa3", "FA3"),) if has_fa3(results) else ())
    for pss in passes:
        rows = [r for r in results if r.pss == pss]
        ran = [r for r in rows if r.ms["flash3"]]
        parts = []
        for who, name in baselines:
            ratios = [r.ratio("flash3", who) for r in ran if r.ratio("flash3", who)]
            g = geomean(ratios)
            low = min(ratios) if ratios else None
            parts.append(f"geomean flash3/{name} = {f'{g:.3f}' if g else '-'} over {len(ratios)} rows"
                         f"{f' (lowest {low:.3f})' if low else ''}")
        print(f"{pss}: flash3 ran on {len(ran)}/{len(rows)} rows; " + "; ".join(parts))
        headline = [r for r in rows if (r.hdim, r.seqlen) in HEADLINE_ROWS]
        for who, name in baselines[:1] + baselines[2:]:
            iv = [r.ratio("flash3", who) for r in headline if r.ms["flash3"] and r.ratio("flash3", who)]
            gi = geomean(iv)
            print(f"{pss}: headline rows (hdim128 4k/8k/16k, hdim64+256 8k/16k, causal+noncausal: 14): "
                  f"geomean flash3/{name} = {f'{gi:.3f}' if gi else '-'} over {len(iv)}/14 rows"
                  f"{f' (lowest {min(iv):.3f})' if iv else ''}"
                  f"{'' if len(headline) == 14 else f' ({len(headline)} of them benchmarked)'}")


def write_csv(path, results):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["hdim", "seqlen", "causal", "pass", "batch", "heads", "flops"] +
                   [f"{who}_ms" for who in CONTENDERS] + [f"{who}_tflops" for who in CONTENDERS] +
                   [f"flash3_over_{who}" for who in CONTENDERS[1:]] + [f"{who}_note" for who in CONTENDERS] +
                   ["check", "err", "bound"])

        def num(x, fmt="{:.6g}"):
            return fmt.format(x) if x is not None else ""

        for r in results:
            w.writerow([r.hdim, r.seqlen, int(r.causal), r.pss, r.batch, r.heads, f"{r.flops:.6g}"] +
                       [num(r.ms[who]) for who in CONTENDERS] + [num(r.tflops(who)) for who in CONTENDERS] +
                       [num(r.ratio("flash3", who)) for who in CONTENDERS[1:]] + [r.note[who] for who in CONTENDERS] +
                       [r.check, num(r.err), num(r.bound)])


def read_csv(path):
    """RowResults from a CSV written by write_csv (CSVs without FA3 columns too)."""
    results = []
    with open(path) as f:
        for row in csv.DictReader(f):
            r = RowResult(int(row["hdim"]), int(row["seqlen"]), row["causal"] == "1", row["pass"], int(row["batch"]),
                          int(row["heads"]))
            r.flops = float(row["flops"])
            for who in CONTENDERS:
                r.ms[who] = float(row[f"{who}_ms"]) if row.get(f"{who}_ms") else None
                r.note[who] = row.get(f"{who}_note") or ""
            r.check = row["check"]
            r.err = float(row["err"]) if row["err"] else None
            r.bound = float(row["bound"]) if row["bound"] else None
            results.append(r)
    return results


def plot(path, results):
    """Bar chart PNG of flash3 / cuDNN / FA2 TFLOP/s, one panel per pass."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        print(f"--plot: matplotlib is not available ({e}); no plot written")
        return
    passes = [p for p in ("fwd", "bwd") if any(r.pss == p for r in results)]
    if not passes:
        print("--plot: no rows; no plot written")
        return
    n = max(sum(r.pss == p for r in results) for p in passes)
    fig, axes = plt.subplots(len(passes), 1, figsize=(max(8, 0.35 * n), 4.2 * len(passes)), squeeze=False)
    for ax, pss in zip(axes[:, 0], passes):
        sel = [r for r in results if r.pss == pss]
        width = 0.27
        for i, (who, name) in enumerate((("flash3", "flash3"), ("cudnn", "cuDNN"), ("fa2", "FA2"))):
            ys = [r.tflops(who) or 0.0 for r in sel]
            ax.bar([x + (i - 1) * width for x in range(len(sel))], ys, width, label=name)
        ax.set_xticks(range(len(sel)))
        ax.set_xticklabels([f"d{r.hdim} {fmt_len(r.seqlen)}{' c' if r.causal else ''}" for r in sel], rotation=70,
                           ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{'forward' if pss == 'fwd' else 'backward'} (16k tokens, hidden 2048; c = causal)")
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


# ---------------------------------------------------------------------------
# Interleaved mode (--ab, --steady).
# ---------------------------------------------------------------------------
def interleave(torch, fns, rounds, iters, warmup_ms, gap_s):
    """{name: [ms per round]}: each round times every contender once (after
    warmup_ms of back-to-back calls when > 0), the first one rotating from
    round to round; gap_s of idle before each round."""
    names = list(fns)
    times = {n: [] for n in names}
    for rnd in range(rounds):
        if gap_s > 0:
            torch.cuda.synchronize()
            time.sleep(gap_s)
        for n in names[rnd % len(names):] + names[:rnd % len(names)]:
            if warmup_ms > 0:
                times[n].append(sustained_median(torch, fns[n], warmup_ms, iters))
            else:
                times[n].append(time_cuda(torch, fns[n], iters, 10, budget_s=2.0))
    return times


def parse_ab(spec, i):
    name, sep, path = spec.partition("=")
    return (name, path) if sep else (f"ab{i}", spec)


def run_interleaved(args, torch, F, passes, causals, dtype):
    builds = [(args.name, args.lib)] + [parse_ab(s, i + 1) for i, s in enumerate(args.ab or [])]
    libs = []  # (contender name, Flash3Lib, deterministic, softcap)
    for name, path in builds:
        lib = Flash3Lib(path)
        libs.append((name, lib, False, 0.0))
        if args.deterministic_too:
            libs.append((name + "-det", lib, True, 0.0))
        if args.softcap_too > 0:
            libs.append((name + "-softcap", lib, False, args.softcap_too))
    names = [n for n, *_ in libs] + ([] if args.no_cudnn else ["cuDNN"])
    if len(names) < 2:
        print("bench.py: the interleaved mode needs two contenders (--ab, or cuDNN without --no-cudnn)")
        return 1
    print(f"device: {torch.cuda.get_device_name()} | torch {torch.__version__} | cuDNN {torch.backends.cudnn.version()}"
          f" | dtype {args.dtype} | rounds {args.rounds} | iters {args.iters} | warmup {args.warmup_ms:g} ms"
          f" | gap {args.gap_s:g} s")
    for name, lib, det, cap in libs:
        if not det and cap == 0:
            print(f"  {name}: {lib.path} (flash3 {lib.version()})")
    print("| hdim | seqlen | causal | pass | " + " | ".join(f"{n} TFLOP/s (spread)" for n in names) +
          " | " + " | ".join(f"{n}/{names[0]}" for n in names[1:]) + " |")
    print("|" + "---:|" * (4 + 2 * len(names) - 1))
    sys.stdout.flush()
    stream = torch.cuda.current_stream().cuda_stream
    ratios = {(pss, n): [] for pss in passes for n in names[1:]}  # (ratio, row label)
    failed = False
    for hdim, seqlen, causal, pss, scale, flops, (q, k, v, dout) in each_row(torch, args, causals, passes, dtype):
        fns, calls = {}, []
        for name, lib, det, cap in libs:
            call = Flash3Call(torch, lib, q, k, v, dout, lib.options(scale, causal, det, cap), stream)
            fn = call.fwd if pss == "fwd" else call.bwd
            if call.status != FLASH3_OK or fn() != FLASH3_OK:
                print(f"  {name} d={hdim} s={seqlen} causal={causal} {pss}: {lib.last_error()}")
                failed = True
                continue
            fns[name] = fn
            calls.append(call)
        if not args.no_cudnn:
            try:
                qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
                fns["cuDNN"] = cudnn_sdpa_fn(torch, F, qt, kt, vt, causal, scale, pss)
                fns["cuDNN"]()
            except RuntimeError as e:  # cuDNN cannot run this shape
                fns.pop("cuDNN", None)
                print(f"  cuDNN d={hdim} s={seqlen} causal={causal} {pss}: {str(e).strip()[:160]}")
        times = interleave(torch, fns, args.rounds, args.iters, args.warmup_ms, args.gap_s)
        tf = {n: flops / (statistics.median(times[n]) * 1e-3) / 1e12 for n in times}
        spread = {n: (max(times[n]) - min(times[n])) / statistics.median(times[n]) for n in times}
        label = f"d={hdim} {fmt_len(seqlen)}{' causal' if causal else ''}"
        cells = [f"{tf[n]:.1f} ({100 * spread[n]:.0f}%)" if n in tf else "n/a" for n in names]
        rcells = []
        for n in names[1:]:
            if n in tf and names[0] in tf:
                ratios[(pss, n)].append((tf[n] / tf[names[0]], label))
                rcells.append(f"{tf[n] / tf[names[0]]:.3f}")
            else:
                rcells.append("-")
        print(f"| {hdim} | {fmt_len(seqlen)} | {'yes' if causal else 'no'} | {pss} | " + " | ".join(cells) +
              " | " + " | ".join(rcells) + " |")
        sys.stdout.flush()
        del fns, calls
    print()
    for (pss, n), rs in ratios.items():
        if rs:
            g = geomean([x for x, _ in rs])
            lo = min(rs)
            print(f"{pss}: geomean {n}/{names[0]} = {g:.3f} over {len(rs)} rows; lowest {lo[0]:.3f} ({lo[1]})")
    return 1 if failed else 0


# ---------------------------------------------------------------------------
# Varlen mode.
# ---------------------------------------------------------------------------
def f3_varlen_fwd(torch, lib, q, k, v, lens_q, lens_k, scale, causal, stream, pss="fwd"):
    """flash3's varlen forward (pss "fwd") or backward ("bwd": after one
    forward, with a random dout and the scratch from
    flash3_backward_workspace_size) on (total, h, d) tensors with sequence
    lengths lens_q / lens_k: a zero-argument callable returning the status
    (the buffers it needs are kept alive by the closure)."""
    P = ctypes.byref
    dt = FLASH3_BF16 if q.dtype == torch.bfloat16 else FLASH3_FP16
    cu = [torch.tensor([0] + list(itertools_accumulate(x)), device=q.device, dtype=torch.int32)
          for x in (lens_q, lens_k)]
    out = torch.empty((q.shape[0], q.shape[1], v.shape[2]), device=q.device, dtype=q.dtype)
    lse = torch.empty((q.shape[1], q.shape[0]), device=q.device, dtype=torch.float32)
    opts = lib.options(scale, causal)
    opts.cu_seqlens_q = ctypes.cast(cu[0].data_ptr(), ctypes.POINTER(ctypes.c_int32))
    opts.cu_seqlens_k = ctypes.cast(cu[1].data_ptr(), ctypes.POINTER(ctypes.c_int32))
    opts.max_seqlen_q, opts.max_seqlen_k = max(lens_q), max(lens_k)
    opts.num_sequences = len(lens_q)
    t = [f3_tensor(x, dt) for x in (q, k, v, out)]
    tl = f3_tensor(lse, FLASH3_FP32)
    keep = [cu, out, lse, opts, t, tl]
    st = ctypes.c_void_p(stream)

    def fn():
        _ = keep
        return lib.lib.flash3_forward(P(t[0]), P(t[1]), P(t[2]), P(t[3]), P(tl), P(opts), st)
    if pss == "fwd":
        return fn
    status = fn()
    dout = torch.randn_like(out)
    grads = [torch.empty_like(x) for x in (q, k, v)]
    tg = [f3_tensor(x, dt) for x in [dout] + grads]
    ws_bytes = lib.lib.flash3_backward_workspace_size(P(t[0]), P(t[1]), P(t[2]), P(opts))
    ws = torch.empty(max(int(ws_bytes), 1), device=q.device, dtype=torch.uint8)
    keep += [dout, grads, tg, ws]

    def bwd():
        _ = keep
        if status != FLASH3_OK:
            return status
        return lib.lib.flash3_backward(P(t[0]), P(t[1]), P(t[2]), P(t[3]), P(tg[0]), P(tl), None, P(tg[1]), P(tg[2]),
                                       P(tg[3]), P(opts), ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(ws_bytes),
                                       st)
    return bwd


def itertools_accumulate(xs):
    total = 0
    for x in xs:
        total += x
        yield total


def doc_mix_lengths(tokens, lo=64, hi=8192, seed=0):
    """Lengths drawn log-uniformly from [lo, hi] until `tokens` are used (the last one cut)."""
    import random
    rng = random.Random(seed)
    lens, left = [], tokens
    while left > 0:
        n = min(left, int(round(math.exp(rng.uniform(math.log(lo), math.log(hi))))))
        lens.append(n)
        left -= n
    return lens


def run_varlen(args, torch, F, dtype):
    lib = Flash3Lib(args.lib)
    stream = torch.cuda.current_stream().cuda_stream
    print(f"device: {torch.cuda.get_device_name()} | torch {torch.__version__} | cuDNN {torch.backends.cudnn.version()}"
          f" | dtype {args.dtype} | rounds {args.rounds} | iters {args.iters} | warmup {args.warmup_ms:g} ms"
          f" | flash3 {lib.version()} ({lib.path})")
    failed = False

    def timed(fns):
        times = interleave(torch, fns, args.rounds, args.iters, args.warmup_ms, args.gap_s)
        return {n: statistics.median(t) for n, t in times.items()}, \
            {n: (max(t) - min(t)) / statistics.median(t) for n, t in times.items()}

    passes = parse_list(args.passes, lambda x: x.strip().lower())
    print("\n(a) equal lengths: varlen against fixed length")
    print("| hdim | seqlen | causal | pass | fixed TFLOP/s | varlen TFLOP/s | varlen/fixed |")
    print("|---:|---:|---:|---|---:|---:|---:|")
    ratios = {p: [] for p in passes}
    for hdim, seqlen, causal, pss, scale, flops, (q, k, v, dout) in each_row(torch, args, parse_causal(args.causal),
                                                                             passes, dtype):
        b, sq, h, d = q.shape
        call = Flash3Call(torch, lib, q, k, v, dout, lib.options(scale, causal), stream)
        vfn = f3_varlen_fwd(torch, lib, q.reshape(b * sq, h, d), k.reshape(b * sq, -1, d), v.reshape(b * sq, -1, d),
                            [sq] * b, [sq] * b, scale, causal, stream, pss)
        ffn = call.fwd if pss == "fwd" else call.bwd
        if call.status != FLASH3_OK or ffn() != FLASH3_OK or vfn() != FLASH3_OK:
            print(f"  d={hdim} s={seqlen} {pss}: {lib.last_error()}")
            failed = True
            continue
        ms, spread = timed({"fixed": ffn, "varlen": vfn})
        tf = {n: flops / (ms[n] * 1e-3) / 1e12 for n in ms}
        ratios[pss].append(tf["varlen"] / tf["fixed"])
        print(f"| {hdim} | {fmt_len(seqlen)} | {'yes' if causal else 'no'} | {pss} | {tf['fixed']:.1f} "
              f"({100 * spread['fixed']:.0f}%) | {tf['varlen']:.1f} ({100 * spread['varlen']:.0f}%) | "
              f"{ratios[pss][-1]:.3f} |")
        sys.stdout.flush()
        del call, vfn
    for p, rs in ratios.items():
        if rs:
            print(f"{p}: geomean varlen/fixed = {geomean(rs):.3f} over {len(rs)} rows; lowest {min(rs):.3f}")

    lens = doc_mix_lengths(args.tokens)
    hdim, heads = 128, max(1, args.hidden // 128)
    scale = 1.0 / math.sqrt(hdim)
    useful = sum(fwd_flops(1, heads, n, n, hdim, True) for n in lens)
    print(f"\n(b) document mix: {len(lens)} causal documents, {sum(lens)} tokens (lengths {min(lens)}..{max(lens)}), "
          f"d = {hdim}, {heads} heads; TFLOP/s of useful (causal) forward work")
    torch.manual_seed(7)
    total = sum(lens)
    q, k, v = (torch.randn((total, heads, hdim), device="cuda", dtype=dtype) for _ in range(3))
    print("| pass | contender | ms | TFLOP/s | spread |")
    print("|---|---|---:|---:|---:|")
    for pss in passes:
        mult = 1.0 if pss == "fwd" else 2.5
        fns = {"flash3 varlen": f3_varlen_fwd(torch, lib, q, k, v, lens, lens, scale, True, stream, pss)}
        per_doc, per_doc_cudnn, starts = [], [], [0] + list(itertools_accumulate(lens))
        for i, n in enumerate(lens):
            qs, ks, vs = (x[starts[i]:starts[i + 1]].unsqueeze(0) for x in (q, k, v))
            per_doc.append(Flash3Call(torch, lib, qs, ks, vs, torch.randn_like(qs), lib.options(scale, True), stream))
            if not args.no_cudnn:
                per_doc_cudnn.append(cudnn_sdpa_fn(torch, F, qs.transpose(1, 2), ks.transpose(1, 2),
                                                   vs.transpose(1, 2), True, scale, pss))
        fns["flash3 per document"] = (lambda: [c.fwd() for c in per_doc]) if pss == "fwd" else \
            (lambda: [c.bwd() for c in per_doc])
        if per_doc_cudnn:
            fns["cuDNN per document"] = lambda: [f() for f in per_doc_cudnn]
        if fns["flash3 varlen"]() != FLASH3_OK:
            print(f"  varlen {pss}: {lib.last_error()}")
            failed = True
            continue
        ms, spread = timed(fns)
        for n in fns:
            print(f"| {pss} | {n} | {ms[n]:.3f} | {mult * useful / (ms[n] * 1e-3) / 1e12:.1f} | "
                  f"{100 * spread[n]:.0f}% |")
        sys.stdout.flush()
    return 1 if failed else 0


# ---------------------------------------------------------------------------
# PackGQA mode.
# ---------------------------------------------------------------------------
# Decode-like GQA rows: (query heads, KV heads), the (batch, seqlen_k) shapes
# and the default seqlen_q list. A decode step's time is K and V streaming
# from memory: unpacked, the tile of each query head reads its group's K / V
# again (from L2 at best); packed, one tile per KV head reads them once.
PACK_GQA_HEADS = (64, 8)
PACK_GQA_SHAPES = ((4, 8192), (1, 32768))
PACK_GQA_SEQLENS_Q = "1,2,4,8,16,32,64"


def bottom_right_causal(torch, sq, sk, device):
    """(sq, sk) boolean mask of flash3's causal mask (aligned bottom-right: query i
    sees keys j <= i + sk - sq); torch SDPA's is_causal aligns top-left."""
    i = torch.arange(sq, device=device).unsqueeze(1)
    j = torch.arange(sk, device=device).unsqueeze(0)
    return j <= i + (sk - sq)


def check_gqa_outputs(torch, F, sdpa_ctx, q, k, v, outs, scale, causal):
    """Each of `outs` ((b, sq, hq, d) results of one forward) against torch's math
    SDPA in fp32 under the tolerance rule (baseline: math SDPA in the input dtype),
    K / V repeated to q's heads. Returns (all pass, worst err / bound)."""
    g = q.shape[2] // k.shape[2]
    mask = bottom_right_causal(torch, q.shape[1], k.shape[1], q.device) if causal else None

    def sdpa(qx, kx, vx):
        kx, vx = kx.repeat_interleave(g, 2), vx.repeat_interleave(g, 2)
        with sdpa_ctx("MATH"):
            o = F.scaled_dot_product_attention(qx.transpose(1, 2), kx.transpose(1, 2), vx.transpose(1, 2),
                                               attn_mask=mask, scale=scale)
        return o.transpose(1, 2)
    with torch.no_grad():
        ref = sdpa(q.float(), k.float(), v.float())
        with _PlainMath(torch):
            base = sdpa(q, k, v)
        verdicts = [_judge(torch, o, ref, base) for o in outs]
    del ref, base
    torch.cuda.empty_cache()
    return all(x[0] for x in verdicts), max(x[1] / x[3] for x in verdicts)


def cudnn_gqa_fwd(torch, F, q, k, v, causal, scale):
    """cuDNN (torch SDPA) forward of (b, s, h, d) q on K / V with fewer heads:
    (fn, note). enable_gqa where this torch takes it (cuDNN reads the shared
    heads); else K / V repeated to q's heads once, outside the timing (the note
    says so). Raises when cuDNN cannot run the shape at all."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    # is_causal aligns top-left: flash3's bottom-right mask goes in as attn_mask when sq != sk.
    mask = None
    if causal and q.shape[1] != k.shape[1]:
        mask = bottom_right_causal(torch, q.shape[1], k.shape[1], q.device)
    is_causal = causal and mask is None

    def make(kx, vx, **kw):
        def fwd():
            with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kx, vx, attn_mask=mask, is_causal=is_causal, scale=scale,
                                                      **kw)
        return fwd
    fn = make(kt, vt, enable_gqa=True)
    try:
        fn()
        return fn, ""
    except (TypeError, RuntimeError) as e:
        g = q.shape[2] // k.shape[2]
        fn = make(kt.repeat_interleave(g, 1), vt.repeat_interleave(g, 1))
        fn()
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:100]
        return fn, f"K/V repeated to {q.shape[2]} heads (enable_gqa: {why})"


def run_pack_gqa(args, torch, F, sdpa_ctx, dtype):
    lib = Flash3Lib(args.lib)
    if not lib.has_pack_gqa:
        print(f"bench.py --pack-gqa: {lib.path} has no pack_gqa option (a build before PackGQA)")
        return 1
    return run_decode_rows(
        args, torch, F, sdpa_ctx, dtype, lib, PACK_GQA_HEADS, PACK_GQA_SHAPES,
        {"packed": dict(pack_gqa=True), "unpacked": dict(pack_gqa=False)},
        "TB/s = bytes of K and V / time; speedup = unpacked time / packed time; check: both flash3 results, "
        "worst err / bound",
        ("speedup", lambda ms: ms["unpacked"] / ms["packed"], "packed/unpacked speedup"), graph=False)


SPLIT_KV_HEADS = (64, 8)
# Issue rows (batch, seqlen_k): decode at seqlen_q = 1.
SPLIT_KV_SHAPES = ((1, 4096), (1, 16384), (1, 131072), (8, 16384), (8, 131072), (32, 131072), (128, 16384))
SPLIT_KV_GRAPH_CALLS = 10  # calls per captured graph; times are per call


def graphed(torch, launch, stream, calls=SPLIT_KV_GRAPH_CALLS):
    """A CUDA graph of `calls` back-to-back launch() calls captured on `stream`
    (launch issues its work there); returns its replay function."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        launch()  # warm up outside the capture (first-launch attributes, allocator)
    torch.cuda.synchronize()
    with torch.cuda.graph(g, stream=stream):
        for _ in range(calls):
            launch()
    return g.replay


def run_split_kv(args, torch, F, sdpa_ctx, dtype):
    lib = Flash3Lib(args.lib)
    if not lib.has_num_splits:
        print(f"bench.py --split-kv: {lib.path} has no num_splits option (a build before split-KV)")
        return 1

    def ratio(ms):
        return ms["cuDNN"] / ms["split"] if "cuDNN" in ms else float("nan")
    return run_decode_rows(
        args, torch, F, sdpa_ctx, dtype, lib, SPLIT_KV_HEADS, SPLIT_KV_SHAPES,
        {"split": dict(num_splits=0), "unsplit": dict(num_splits=1)},
        f"every contender replayed from a CUDA graph of {SPLIT_KV_GRAPH_CALLS} calls (us per call); TB/s = bytes "
        "of K and V / time; split = num_splits 0 (heuristic), unsplit = num_splits 1 (pack_gqa: heuristic for "
        "both); check: both flash3 results on batch element 0, worst err / bound",
        ("split / cuDNN", ratio, "split bandwidth / cuDNN's"), graph=True)


def decode_call(torch, lib, q, k, v, scale, causal, contender, stream):
    """A contender of run_decode_rows: its options, and "kvcache" (absent: flash3_forward;
    else KVCacheCall's mode: cache / append / rope); "lib" another build (--ab), "fa3" the
    official FlashAttention-3's operators instead of flash3."""
    o = dict(contender)
    kv = o.pop("kvcache", None)
    page_size = o.pop("page_size", 0)
    lib = o.pop("lib", lib)
    fa3 = o.pop("fa3", None)
    if fa3 is not None:
        return FA3KVCacheCall(torch, fa3, q, k, v, scale, causal, append=kv != "cache", page_size=page_size,
                              num_splits=o.get("num_splits", 0))
    opts = lib.options(scale, causal, **o)
    if kv is None:
        return Flash3Call(torch, lib, q, k, v, q, opts, stream)  # dout = q: the backward is never called
    return KVCacheCall(torch, lib, q, k, v, opts, stream, append=kv != "cache", rope=kv == "rope",
                       page_size=page_size)


def run_kvcache(args, torch, F, sdpa_ctx, dtype):
    lib = Flash3Lib(args.lib)
    if not lib.has_kvcache:
        print(f"bench.py --kvcache: {lib.path} has no flash3_forward_kvcache (a build before the KV cache)")
        return 1

    def ratio(ms):
        return ms["cuDNN"] / ms["append"] if "cuDNN" in ms else float("nan")
    contenders = {"split": dict(num_splits=0), "cache": dict(num_splits=0, kvcache="cache"),
                  "append": dict(num_splits=0, kvcache="append"), "rope": dict(num_splits=0, kvcache="rope"),
                  "paged256": dict(num_splits=0, kvcache="append", page_size=256),
                  "paged64": dict(num_splits=0, kvcache="append", page_size=64),
                  "paged1p": dict(num_splits=0, kvcache="append", page_size=-1)}
    if args.kvcache_only:
        contenders = {n: c for n, c in contenders.items() if n in args.kvcache_only.split(",")}
    # Other builds (--ab NAME=PATH): their append and paged contenders, suffixed @NAME.
    for i, spec in enumerate(args.ab or []):
        name, path = parse_ab(spec, i + 1)
        other = Flash3Lib(path)
        for n in ("append", "paged256", "paged64"):
            if n in contenders:
                contenders[f"{n}@{name}"] = dict(contenders[n], lib=other)
    if args.fa3:
        fa3 = load_fa3(torch, args.fa3)
        contenders.update({"fa3": dict(num_splits=0, kvcache="append", fa3=fa3),
                           "fa3paged256": dict(num_splits=0, kvcache="append", page_size=256, fa3=fa3),
                           "fa3paged64": dict(num_splits=0, kvcache="append", page_size=64, fa3=fa3)})
    return run_decode_rows(
        args, torch, F, sdpa_ctx, dtype, lib, SPLIT_KV_HEADS, SPLIT_KV_SHAPES, contenders,
        f"every contender replayed from a CUDA graph of {SPLIT_KV_GRAPH_CALLS} calls (us per call); TB/s = bytes "
        "of K and V / time; num_splits 0 for all: split = flash3_forward on k / v; cache = "
        "flash3_forward_kvcache on the same tensors as a full cache; append = the last row appended by the "
        "call (k_new / v_new, one row); rope = append with rotary on that row and q; paged256 / paged64 = "
        "append on a paged copy of the cache (page_table, pages of 256 / 64 rows in a random order), paged1p with "
        "one page per sequence; check: "
        "split, cache, append and paged on batch element 0, worst err / bound",
        ("cuDNN / append", ratio, "KV-cache decode step (append) bandwidth / cuDNN's"), graph=True)


def run_decode_rows(args, torch, F, sdpa_ctx, dtype, lib, heads, shapes, contenders, legend, ratio, graph):
    """The decode-like GQA table of --pack-gqa and --split-kv: per (batch, seqlen_k) of `shapes`
    and seqlen_q of --seqlens, the flash3 `contenders` ({name: options}) and cuDNN, sustained
    and interleaved; ratio = (column name, fn(ms by name), summary label). graph: each contender
    replayed from a CUDA graph of SPLIT_KV_GRAPH_CALLS calls, and only batch element 0 checked
    (the reference repeats K / V to every query head)."""
    stream = torch.cuda.Stream() if graph else None
    raw_stream = stream.cuda_stream if graph else torch.cuda.current_stream().cuda_stream
    per_call = SPLIT_KV_GRAPH_CALLS if graph else 1
    hq, hkv = heads
    d = parse_list(args.hdims, int)[0]
    print(f"device: {torch.cuda.get_device_name()} | torch {torch.__version__} | cuDNN {torch.backends.cudnn.version()}"
          f" | dtype {args.dtype} | rounds {args.rounds} | iters {args.iters} | warmup {args.warmup_ms:g} ms"
          f" | gap {args.gap_s:g} s | flash3 {lib.version()} ({lib.path})")
    print(f"d = {d}, {hq} query heads on {hkv} KV heads; {legend}")
    names = list(contenders) + ([] if args.no_cudnn else ["cuDNN"])
    print("| batch | seqlen_k | seqlen_q | causal | " + " | ".join(f"{n} us (spread)" for n in names) + " | " +
          " | ".join(f"{n} TB/s" for n in names) + f" | {ratio[0]} | check |")
    print("|" + "---:|" * (4 + 2 * len(names) + 1) + "---|")
    sys.stdout.flush()
    ratios, failed, notes = [], False, set()
    for batch, sk in shapes:
        gen = torch.Generator(device="cuda").manual_seed(batch * 100003 + sk)
        k, v = (torch.randn((batch, sk, hkv, d), device="cuda", dtype=dtype, generator=gen) for _ in range(2))
        kv_bytes = 2 * k.numel() * k.element_size()
        for sq in parse_list(args.seqlens, parse_len):
            q = torch.randn((batch, sq, hq, d), device="cuda", dtype=dtype, generator=gen)
            for causal in parse_causal(args.causal):
                scale = 1.0 / math.sqrt(d)
                label = f"b={batch} sk={fmt_len(sk)} sq={sq}{' causal' if causal else ''}"
                # The calls may run on another stream: q / k / v, written on the current one, must be ready.
                torch.cuda.synchronize()
                calls = {n: decode_call(torch, lib, q, k, v, scale, causal, o, raw_stream)
                         for n, o in contenders.items()}
                torch.cuda.synchronize()
                bad = [n for n, c in calls.items() if c.status != FLASH3_OK]
                if bad:
                    print(f"  {label} {'/'.join(bad)}: {lib.last_error()}")
                    failed = True
                    continue
                check = "-"
                if not args.no_check:
                    n_check = 1 if graph else batch
                    ok, worst = check_gqa_outputs(torch, F, sdpa_ctx, q[:n_check], k[:n_check], v[:n_check],
                                                  [c.out[:n_check] for c in calls.values()
                                                   if getattr(c, "check", True)], scale, causal)
                    check = f"{'PASS' if ok else 'FAIL'} ({worst:.2f})"
                    failed |= not ok
                fns = {n: graphed(torch, c.fwd, stream) if graph else c.fwd for n, c in calls.items()}
                if not args.no_cudnn:
                    try:
                        fn, note = cudnn_gqa_fwd(torch, F, q, k, v, causal, scale)
                        fns["cuDNN"] = graphed(torch, fn, stream) if graph else fn
                        if note:
                            notes.add(note)
                    except (RuntimeError, TypeError, ImportError) as e:  # cuDNN cannot run this shape
                        print(f"  cuDNN {label}: {(str(e).strip().splitlines() or [type(e).__name__])[0][:160]}")
                times = interleave(torch, fns, args.rounds, args.iters, args.warmup_ms, args.gap_s)
                ms = {n: statistics.median(t) / per_call for n, t in times.items()}
                spread = {n: (max(t) - min(t)) / statistics.median(t) for n, t in times.items()}
                us = [f"{1e3 * ms[n]:.1f} ({100 * spread[n]:.0f}%)" if n in ms else "n/a" for n in names]
                tbs = [f"{kv_bytes / (ms[n] * 1e-3) / 1e12:.2f}" if n in ms else "n/a" for n in names]
                r = ratio[1](ms)
                ratios.append((r, label))
                print(f"| {batch} | {fmt_len(sk)} | {sq} | {'yes' if causal else 'no'} | " + " | ".join(us) + " | " +
                      " | ".join(tbs) + f" | {r:.3f} | {check} |")
                sys.stdout.flush()
                del calls, fns
            del q
        del k, v
        torch.cuda.empty_cache()
    for note in sorted(notes):
        print(f"cuDNN: {note}")
    if ratios and all(math.isfinite(x) for x, _ in ratios):
        lo = min(ratios)
        print(f"\n{ratio[2]}: geomean {geomean([x for x, _ in ratios]):.3f} over {len(ratios)} rows; "
              f"lowest {lo[0]:.3f} ({lo[1]})")
    return 1 if failed else 0


# ---------------------------------------------------------------------------
# Power mode.
# ---------------------------------------------------------------------------
def run_batch(torch, fn, n=4):
    """n calls, then wait for them; returns n."""
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return n


def run_power(args, torch, F, passes, causals, dtype):
    lib = Flash3Lib(args.lib)
    stream = torch.cuda.current_stream().cuda_stream
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,power.draw,clocks.sm", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    t_origin = time.time()
    segments = []
    for hdim, seqlen, causal, pss, scale, flops, (q, k, v, dout) in each_row(torch, args, causals, passes, dtype):
        f3 = Flash3Call(torch, lib, q, k, v, dout, lib.options(scale, causal), stream)
        f3fn = f3.fwd if pss == "fwd" else f3.bwd
        if f3.status != FLASH3_OK or f3fn() != FLASH3_OK:
            smi.terminate()
            print(f"flash3 d={hdim} s={seqlen} causal={causal} {pss}: {lib.last_error()}")
            return 1
        cud = cudnn_sdpa_fn(torch, F, *(t.transpose(1, 2) for t in (q, k, v)), causal, scale, pss)
        for name, fn in (("flash3", f3fn), ("cuDNN", cud)):
            fn()  # the first call (plan building) stays outside the segment
            torch.cuda.synchronize()
            t0 = time.time()
            while time.time() - t0 < args.seconds / 2:  # reach the sustained clock
                run_batch(torch, fn)
            half = time.time()
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev0.record()
            calls = run_batch(torch, fn)
            while time.time() - t0 < args.seconds:
                calls += run_batch(torch, fn)
            ev1.record()
            torch.cuda.synchronize()
            shape = f"{pss} d={hdim} {fmt_len(seqlen)} {'causal' if causal else 'none'}"
            segments.append((shape, name, half - t_origin, time.time() - t_origin, ev0.elapsed_time(ev1) / calls,
                             flops))
        del f3, f3fn, cud
    time.sleep(0.2)
    smi.terminate()
    samples = [x for x in (parse_smi_line(ln, t_origin) for ln in smi.stdout.read().splitlines()) if x]
    print("| shape | who | ms / call | TFLOP/s | power W | SM MHz | J / call | TFLOP / J |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for shape, who, a, z, ms, flops in segments:
        st = segment_stats(samples, a, z, ms)
        if st is None:
            print(f"| {shape} | {who} | {ms:.3f} | {flops / ms / 1e9:.0f} | - | - | - | - |")
            continue
        pw, mhz, joules = st
        print(f"| {shape} | {who} | {ms:.3f} | {flops / ms / 1e9:.0f} | {pw:.0f} | {mhz:.0f} | {joules:.3f} | "
              f"{flops / joules / 1e12:.2f} |")
    return 0


# ---------------------------------------------------------------------------
# Fixed-cost mode.
# ---------------------------------------------------------------------------
def run_fixed_cost(args, torch, dtype):
    """The backward runs one CTA per KV block (tile), which visits every query
    block, so with seqlen_k, batch and heads fixed (a fixed number of tiles and
    waves) T(sq) = waves * (a * sq + X) + pre/postprocess (also ~linear in sq)."""
    lib = Flash3Lib(args.lib)
    d = parse_list(args.hdims, int)[0]
    h, b = max(1, args.hidden // d), args.batch
    sk = parse_len(args.seqlen_k)
    stream = torch.cuda.current_stream().cuda_stream
    points = []
    for sq in parse_list(args.seqlens, parse_len):
        g = torch.Generator(device="cuda").manual_seed(sq)
        q = torch.randn((b, sq, h, d), device="cuda", dtype=dtype, generator=g)
        k = torch.randn((b, sk, h, d), device="cuda", dtype=dtype, generator=g)
        v = torch.randn((b, sk, h, d), device="cuda", dtype=dtype, generator=g)
        dout = torch.randn_like(q)
        f3 = Flash3Call(torch, lib, q, k, v, dout, lib.options(d ** -0.5), stream)
        if f3.status != FLASH3_OK or f3.bwd() != FLASH3_OK:
            print(f"sq={sq}: flash3 error: {lib.last_error()}")
            return 1
        ms = sustained_median(torch, f3.bwd, args.warmup_ms, args.iters)
        flops = 2.5 * fwd_flops(b, h, sq, sk, d, False)
        points.append((sq, ms))
        print(f"d={d} b={b} h={h} sq={sq:6d} sk={sk}: {ms:8.3f} ms  {flops / ms / 1e9:6.1f} TFLOP/s")
        del f3, q, k, v, dout
    slope, icept, resid = fit_line(points)
    x_rows = icept / slope
    line = f"fit: T = {slope * 1e3:.4f} us/query row * sq + {icept * 1e3:.1f} us (max residual {resid * 1e3:.1f} us)"
    line += f"; X = {x_rows:.0f} query rows per tile"
    if args.tile_m:
        line += f" = {x_rows / args.tile_m:.1f} iterations of {args.tile_m} rows"
    print(line)
    return 0


# ---------------------------------------------------------------------------
# Main.
# ---------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.path.join(REPO, "build", "libflash3.so"), help="flash3 shared library")
    ap.add_argument("--fa3", default=None, metavar="SO",
                    help="table mode: also time the official FlashAttention-3 from its built torch extension "
                         "(../shared/anchors/build_fa3.sh DIR train prints the path)")
    ap.add_argument("--hdims", default=None, help="head dims (default 64,128,256; --fixed-cost: its first)")
    ap.add_argument("--seqlens", default=None,
                    help="sequence lengths (default 512,1k,2k,4k,8k,16k; --fixed-cost: seqlen_q, default 1k,2k,4k,8k)")
    ap.add_argument("--headline", action="store_true",
                    help="the 14 headline rows (hdim 128 at 4k/8k/16k, hdims 64 and 256 at 8k/16k) instead of "
                         "--hdims x --seqlens")
    ap.add_argument("--passes", default=None, help="fwd, bwd or fwd,bwd (default fwd,bwd; --power: bwd)")
    ap.add_argument("--causal", default=None, help="on, off or both (default both; --pack-gqa: off)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--iters", type=int, default=None,
                    help="timed runs per measurement (default 30, fewer for big shapes; interleaved 50, --steady "
                         "100; --fixed-cost 20)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=None,
                    help="table: time flash3 / cuDNN / FA2 round-robin this many times per row (order rotating) and "
                         "report the median over rounds (default 1); interleaved: rounds per row (default 5, "
                         "--steady 2). A short burst without --warmup-ms favours the kernel that keeps its boost "
                         "clock longer under the power cap")
    ap.add_argument("--warmup-ms", type=float, default=None,
                    help="> 0: before each timing, run the contender back to back for this long, so it is timed at "
                         "the clocks sustained load gets under the power cap (default 0; --steady and --fixed-cost "
                         "300; the README tables use 300 with --rounds 2)")
    ap.add_argument("--tokens", type=int, default=16384, help="tokens per batch (batch = tokens // seqlen)")
    ap.add_argument("--hidden", type=int, default=2048, help="hidden size (heads = hidden // hdim)")
    g = ap.add_argument_group("table mode")
    g.add_argument("--csv", default=None, help="write every row to this CSV file")
    g.add_argument("--plot", default=None, help="bar chart PNG of TFLOP/s per row (needs matplotlib)")
    g.add_argument("--quick", action="store_true", help="small subset: hdim 128, seqlens 1k and 8k, 10 iterations")
    g.add_argument("--no-check", action="store_true", help="skip the correctness check")
    g.add_argument("--from-csv", default=None, metavar="CSV", help="no GPU: the table (and --plot) of a --csv file")
    g = ap.add_argument_group("interleaved mode")
    g.add_argument("--ab", action="append", metavar="[NAME=]PATH",
                   help="another flash3 library to time against --lib in the same process (repeatable)")
    g.add_argument("--name", default="flash3", help="the contender name of --lib (default flash3)")
    g.add_argument("--steady", action="store_true", help="sustained-load comparison with cuDNN (presets above)")
    g.add_argument("--no-cudnn", action="store_true", help="leave cuDNN out")
    g.add_argument("--gap-s", type=float, default=None, help="idle seconds before each round (default 0; --steady 1)")
    g.add_argument("--softcap-too", type=float, default=0.0, metavar="CAP",
                   help="also time each flash3 build with softcap = CAP (contender NAME-softcap)")
    g.add_argument("--deterministic-too", action="store_true",
                   help="also time every library with opts.deterministic = 1 (contender NAME-det)")
    g = ap.add_argument_group("varlen mode")
    g.add_argument("--varlen", action="store_true", help="varlen against fixed length, and a document mix")
    g = ap.add_argument_group("PackGQA mode")
    g.add_argument("--pack-gqa", action="store_true",
                   help="pack_gqa on and off (and cuDNN) on decode-like GQA rows (presets above)")
    g = ap.add_argument_group("split-KV mode")
    g.add_argument("--split-kv", action="store_true",
                   help="num_splits 0 (heuristic) and 1 (and cuDNN) on decode rows, CUDA-graph replay (presets above)")
    g = ap.add_argument_group("KV-cache mode")
    g.add_argument("--kvcache-only", default="", metavar="NAMES",
                   help="--kvcache: only these flash3 contenders (comma-separated, e.g. append,paged256)")
    g.add_argument("--kvcache", action="store_true",
                   help="flash3_forward_kvcache (plain, append, append + rotary) on the split-KV decode rows")
    g = ap.add_argument_group("power mode")
    g.add_argument("--power", action="store_true", help="power, clock and energy per call under sustained load")
    g.add_argument("--seconds", type=float, default=4.0,
                   help="seconds per contender and row (nvidia-smi averages power over about 1 s: keep >= 4)")
    g = ap.add_argument_group("fixed-cost mode")
    g.add_argument("--fixed-cost", action="store_true", help="fit the backward's time against seqlen_q")
    g.add_argument("--seqlen-k", default="4k")
    g.add_argument("--batch", type=int, default=4)
    g.add_argument("--tile-m", type=int, default=0, help="query rows per iteration, to express X in iterations")
    args = ap.parse_args(argv)

    modes = [m for m in ("ab", "steady", "power", "fixed_cost", "from_csv", "varlen", "pack_gqa", "split_kv",
                         "kvcache")
             if getattr(args, m)]
    if "steady" in modes and "ab" in modes:
        modes.remove("steady")
    if len(modes) > 1:
        ap.error("choose one mode: --ab / --steady, --power, --fixed-cost, --varlen, --pack-gqa, --split-kv, "
                 "--kvcache or --from-csv")
    args.mode = {"ab": "interleaved", "steady": "interleaved"}.get(modes[0], modes[0]) if modes else "table"
    if args.varlen:
        args.mode = "varlen"
    if args.mode == "table" and (args.softcap_too > 0 or args.deterministic_too):
        args.mode = "interleaved"  # the extra contenders only exist there
    interleaved = args.mode == "interleaved"
    if args.varlen or args.pack_gqa or args.split_kv or args.kvcache:  # sustained and interleaved, as --steady
        args.steady = True
    if args.pack_gqa:
        args.seqlens = args.seqlens or PACK_GQA_SEQLENS_Q
        args.hdims = args.hdims or "128"
    if args.split_kv or args.kvcache:
        args.seqlens = args.seqlens or "1"
        args.hdims = args.hdims or "128"
    args.causal = args.causal or ("off" if args.pack_gqa or args.split_kv or args.kvcache else "both")
    if args.steady or (args.power and args.hdims is None and args.seqlens is None):
        args.headline = args.headline or (args.hdims is None and args.seqlens is None)
    if args.fixed_cost:
        args.seqlens = args.seqlens or "1k,2k,4k,8k"
        args.hdims = args.hdims or "128"
    args.hdims = args.hdims or "64,128,256"
    args.seqlens = args.seqlens or "512,1k,2k,4k,8k,16k"
    args.passes = args.passes or ("bwd" if args.power else "fwd,bwd")
    default_iters = 100 if args.steady else 50 if interleaved else 20 if args.fixed_cost else 30
    args.iters = args.iters if args.iters is not None else default_iters
    args.rounds = args.rounds if args.rounds is not None else (2 if args.steady else 5 if interleaved else 1)
    args.warmup_ms = args.warmup_ms if args.warmup_ms is not None else (
        300.0 if args.steady or args.fixed_cost else 0.0)
    args.gap_s = args.gap_s if args.gap_s is not None else (1.0 if args.steady else 0.0)
    return ap, args


def main(argv=None):
    ap, args = parse_args(argv)
    passes = parse_list(args.passes, lambda x: x.strip().lower())
    for p in passes:
        if p not in ("fwd", "bwd"):
            ap.error(f"--passes: unknown pass '{p}' (fwd, bwd)")
    if args.mode == "from_csv":
        results = read_csv(args.from_csv)
        finish_table(argparse.Namespace(csv=None, plot=args.plot), results,
                     [p for p in ("fwd", "bwd") if any(r.pss == p for r in results)])
        return 0
    causals = parse_causal(args.causal)

    # First thing: a Hopper GPU.
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print(f"flash3: no Hopper GPU found (torch is not importable: {e})")
        return 2
    if not torch.cuda.is_available():
        print("flash3: no Hopper GPU found (torch.cuda.is_available() is False)")
        return 2
    cap = torch.cuda.get_device_capability()
    if tuple(cap) != (9, 0):
        print(f"flash3: no Hopper GPU found (device 0 is {torch.cuda.get_device_name()}, sm_{cap[0]}{cap[1]})")
        return 2

    import torch.nn.functional as F
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        SDPBackend = sdpa_kernel = None

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    f3_dtype = FLASH3_BF16 if args.dtype == "bf16" else FLASH3_FP16
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    def sdpa_ctx(backend):
        if sdpa_kernel is not None:
            return sdpa_kernel(getattr(SDPBackend, backend))
        # Old torch: the boolean context manager.
        flags = dict(enable_flash=backend == "FLASH_ATTENTION", enable_math=backend == "MATH",
                     enable_mem_efficient=False)
        if backend == "CUDNN_ATTENTION":
            raise RuntimeError("this torch has no cuDNN SDPA backend")
        return torch.backends.cuda.sdp_kernel(**flags)

    if args.mode == "interleaved":
        return run_interleaved(args, torch, F, passes, causals, dtype)
    if args.mode == "power":
        return run_power(args, torch, F, passes, causals, dtype)
    if args.mode == "varlen":
        return run_varlen(args, torch, F, dtype)
    if args.mode == "fixed_cost":
        return run_fixed_cost(args, torch, dtype)
    if args.mode == "pack_gqa":
        return run_pack_gqa(args, torch, F, sdpa_ctx, dtype)
    if args.mode == "split_kv":
        return run_split_kv(args, torch, F, sdpa_ctx, dtype)
    if args.mode == "kvcache":
        return run_kvcache(args, torch, F, sdpa_ctx, dtype)
    return run_table(args, torch, F, sdpa_ctx, passes, causals, dtype, f3_dtype)


if __name__ == "__main__":
    sys.exit(main())
