# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""bench.py: the timed calls of flash3 (through its C ABI) and of the official FlashAttention-3:
the forward / backward setup the timing modes share, and the KV-cache decode step."""
import ctypes

from _abi import FLASH3_BF16, FLASH3_FP16, FLASH3_FP32, FLASH3_OK, f3_tensor


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


def paged_pool(torch, k, v, page_size):
    """(page_table, k pool, v pool): (b, sk, h, d) k / v as pools of pages of page_size rows,
    sequence b's pages in a random order (page_table (b, sk // page_size) torch.int32)."""
    b, sk = k.shape[0], k.shape[1]
    n = sk // page_size
    perm = torch.randperm(b * n, device=k.device)
    page_table = perm.to(torch.int32).view(b, n)

    def pool(x):
        p = torch.empty((b * n, page_size) + tuple(x.shape[2:]), device=x.device, dtype=x.dtype)
        p[perm] = x.reshape(b * n, page_size, *x.shape[2:])
        return p
    return page_table, pool(k), pool(v)


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
            self.page_table, k_pool, v_pool = paged_pool(torch, k, v, page_size)
            keep.update(k_cache=k_pool, v_cache=v_pool)
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
            page_table, k_cache, v_cache = paged_pool(torch, k, v, page_size)
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


def load_fa3(torch, path):
    """The official FlashAttention-3's operators (torch.ops.flash_attn_3) from its built
    extension (../shared/anchors/build_fa3.sh); timed only, never linked into flash3."""
    torch.ops.load_library(path)
    return torch.ops.flash_attn_3


def fa3_forward(fa3, q, k, v, scale, causal):
    """(out, softmax_lse) of FlashAttention-3's forward, as its flash_attn_func calls it."""
    out, lse, *_ = fa3.fwd(q, k, v, softmax_scale=scale, is_causal=causal, num_splits=1)
    return out, lse
