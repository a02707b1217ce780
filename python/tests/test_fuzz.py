# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""Seeded random bad calls over the public Python API (issue 39, "no input crashes the process").

flash_attn_func (16-bit and FP8), flash_attn_qkvpacked_func, flash_attn_varlen_func,
flash_attn_with_kvcache (contiguous and paged caches), flash_attn_combine, get_scheduler_metadata
and quantize_fp8 get wrong dtypes, CPU tensors, wrong ranks and shapes, non-contiguous last
dimensions, views 1..15 bytes off alignment inside a larger allocation (``x.view(-1)[1:]``),
aliasing (new rows that are a view of the cache, k_cache is v_cache with an append, out= over an
input), NaN / inf / negative / subnormal scales and softcaps, bad window_size (NaN, strings,
None, floats), bad num_splits / pack_gqa / scheduler_metadata, and the FlashAttention-3 arguments
flash3 does not implement. Every call must:

* raise ValueError, TypeError or NotImplementedError naming the argument (never a RuntimeError
  from inside torch, never be accepted, never crash);
* leave every tensor it was given (caches, out=, inputs, and the allocations they are views of)
  bit-identical;
* and the valid calls, repeated every few bad calls, must reproduce their first results bit for
  bit.

The batch runs in a subprocess that writes the index and description of each case to a file
before calling it, so a crash (SIGSEGV, a CUDA error that poisons the context) is reported as a
failure naming the case instead of taking pytest down. The three SIGSEGV repros of issue 39 also
run on their own (test_issue_39_sigsegv_repros). Skips without torch, the flash3 package or a
Hopper GPU.
"""
import json
import os
import random
import signal
import subprocess
import sys

import pytest

SEED = 39
N_BAD_CALLS = 2400   # the batch (issue 39 asks for at least 2,000 across the entry points)
VALID_EVERY = 40     # the valid calls run again after every VALID_EVERY bad calls
WORKER_TIMEOUT_S = 900
ACCEPTED = (ValueError, TypeError, NotImplementedError)


# ---------------------------------------------------------------------------
# pytest side: run the worker, report.
# ---------------------------------------------------------------------------
def _require_gpu_and_package():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("flash3 needs a Hopper (sm_90) GPU")
    pytest.importorskip("flash3")


def _run_worker(mode, tmp_path, count):
    progress = tmp_path / "progress.txt"
    result = tmp_path / "result.json"
    env = dict(os.environ)
    # The worker must import the flash3 this process imported.
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", mode, str(progress),
                               str(result), str(count)], env=env, capture_output=True, text=True,
                              timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        last = progress.read_text() if progress.exists() else "(none started)"
        pytest.fail(f"the fuzz worker hung for {WORKER_TIMEOUT_S} s; last case started: {last}\n"
                    f"stderr tail:\n{str(e.stderr or '')[-3000:]}")
    if proc.returncode != 0 or not result.exists():
        last = progress.read_text() if progress.exists() else "(none started)"
        how = f"exit code {proc.returncode}"
        if proc.returncode < 0:
            try:
                how = f"killed by {signal.Signals(-proc.returncode).name}"
            except ValueError:
                pass
        pytest.fail(f"the fuzz worker died ({how}) in the case: {last}\nstdout tail:\n{proc.stdout[-2000:]}\n"
                    f"stderr tail:\n{proc.stderr[-4000:]}")
    return json.loads(result.read_text())


def _report(res):
    lines = [f"[fuzz python] {res['calls']} bad calls, {res['valid_calls']} valid calls, "
             f"{len(res['failures'])} failures"]
    lines += [f"  {entry}: {n}" for entry, n in sorted(res["per_entry"].items())]
    kinds = {}
    for f in res["failures"]:
        kinds.setdefault(f["kind"], []).append(f)
    lines += [f"FAIL {kind} ({len(fs)} case{'s' if len(fs) > 1 else ''}), e.g. case {fs[0]['case']}: "
              f"{fs[0]['detail']}" for kind, fs in sorted(kinds.items())]
    return "\n".join(lines)


def test_bad_calls_raise(tmp_path):
    _require_gpu_and_package()
    res = _run_worker("batch", tmp_path, N_BAD_CALLS)
    text = _report(res)
    print(text)
    assert res["calls"] >= 2000, text
    assert not res["failures"], text


def test_issue_39_sigsegv_repros(tmp_path):
    """The three calls of issue 39 that killed the process: q 2 bytes off alignment, new rows that
    are a view of the cache, k_cache is v_cache with an append. Each raises, and a valid call
    afterwards reproduces its earlier bits."""
    _require_gpu_and_package()
    res = _run_worker("repros", tmp_path, 0)
    text = _report(res)
    print(text)
    assert res["calls"] == 3, text
    assert not res["failures"], text


# ---------------------------------------------------------------------------
# Worker side: the tensors, the valid calls, the bad cases.
# ---------------------------------------------------------------------------
def _is_word(msg, name):
    """name occurs in msg as a whole word ("q" in "q.dtype", not in "seqused_q")."""
    start = 0
    while True:
        i = msg.find(name, start)
        if i < 0:
            return False
        j = i + len(name)
        if (i == 0 or not (msg[i - 1].isalnum() or msg[i - 1] == "_")) and \
                (j >= len(msg) or not (msg[j].isalnum() or msg[j] == "_")):
            return True
        start = i + 1


class Case:
    """One call: fn(*args, **kwargs) must raise an ACCEPTED exception whose message names one of
    `names`; every tensor in `watch` (and in args / kwargs, and their bases) must keep its bits."""

    def __init__(self, entry, kind, detail, fn, args=(), kwargs=None, names=(), watch=()):
        self.entry, self.kind, self.detail = entry, kind, detail
        self.fn, self.args, self.kwargs = fn, tuple(args), dict(kwargs or {})
        self.names, self.watch = tuple(names), list(watch)


class World:
    """The valid tensors and calls; helpers that build bad variants of them."""

    def __init__(self):
        import torch
        import flash3
        from flash3 import flash_attn_interface as fi
        self.torch, self.flash3, self.fi = torch, flash3, fi
        torch.manual_seed(SEED)
        dev, bf16 = "cuda", torch.bfloat16
        self.dev, self.bf16 = dev, bf16
        self.d = next((d for d in (128, 64, 256, 96, 192) if flash3.forward_is_built(bf16, d, d)), None)
        if self.d is None:
            raise SystemExit("no bf16 forward kernel in this build")
        d = self.d
        self.b, self.sq, self.sk, self.hq, self.hkv = 2, 64, 96, 4, 2
        b, sq, sk, hq, hkv = self.b, self.sq, self.sk, self.hq, self.hkv
        rn = lambda *s, dtype=bf16: torch.randn(*s, device=dev, dtype=dtype)  # noqa: E731
        self.q, self.k, self.v = rn(b, sq, hq, d), rn(b, sk, hkv, d), rn(b, sk, hkv, d)
        self.qkv = rn(b, sq, 3, hq, d)
        # varlen: two sequences, 100 query and 150 key rows
        self.q3, self.k3, self.v3 = rn(100, hq, d), rn(150, hkv, d), rn(150, hkv, d)
        self.cu_q = torch.tensor([0, 30, 100], dtype=torch.int32, device=dev)
        self.cu_k = torch.tensor([0, 70, 150], dtype=torch.int32, device=dev)
        # KV cache: 256 rows per entry, one new row appended at 20 / 100
        self.s_cache = 256
        self.q1 = rn(b, 1, hq, d)
        self.kc, self.vc = rn(b, self.s_cache, hkv, d), rn(b, self.s_cache, hkv, d)
        self.kn, self.vn = rn(b, 1, hkv, d), rn(b, 1, hkv, d)
        self.cs = torch.tensor([20, 100], dtype=torch.int32, device=dev)
        self.cos, self.sin = rn(self.s_cache, 16), rn(self.s_cache, 16)
        # paged: 8 pages of 64 rows, 2 per sequence (capacity 128)
        self.kp, self.vp = rn(8, 64, hkv, d), rn(8, 64, hkv, d)
        self.page_table = torch.tensor([[0, 3], [5, 1]], dtype=torch.int32, device=dev)
        self.cs_p = torch.tensor([10, 70], dtype=torch.int32, device=dev)
        self.paged = self._probe(lambda: flash3.flash_attn_with_kvcache(self.q1, self.kp.clone(), self.vp.clone(),
                                                                        page_table=self.page_table,
                                                                        cache_seqlens=self.cs_p))
        # combine: 3 splits of (2, 8, 4, 64)
        self.op = rn(3, b, 8, 4, 64, dtype=torch.float32)
        self.lp = rn(3, b, 8, 4, dtype=torch.float32)
        # quantize_fp8
        self.x = rn(b, 100, 4, 64)
        # FP8 forward
        e4m3 = getattr(torch, "float8_e4m3fn", None)
        self.fp8 = e4m3 is not None and flash3.forward_is_built(e4m3, d, d)
        if self.fp8:
            self.q8, self.k8, self.v8 = ((t * 0.5).to(e4m3) for t in (self.q, self.k, self.v))
            self.qd = torch.ones(b, hkv, device=dev, dtype=torch.float32)
        self.refs = {}

    def _probe(self, fn):
        try:
            fn()
            return True
        except NotImplementedError:
            return False

    # -- the valid calls (their first results are the reference bits) --------------------------
    def valid_calls(self):
        fa = self.flash3
        calls = {
            "flash_attn_func": lambda: fa.flash_attn_func(self.q, self.k, self.v, causal=True, return_lse=True),
            "flash_attn_qkvpacked_func": lambda: fa.flash_attn_qkvpacked_func(self.qkv),
            "flash_attn_varlen_func": lambda: fa.flash_attn_varlen_func(self.q3, self.k3, self.v3, self.cu_q,
                                                                        self.cu_k, 70, 80, causal=True),
            "flash_attn_with_kvcache": lambda: (fa.flash_attn_with_kvcache(
                self.q1, self.kc, self.vc, k=self.kn, v=self.vn, cache_seqlens=self.cs, return_softmax_lse=True),
                self.kc, self.vc),
            "flash_attn_combine": lambda: fa.flash_attn_combine(self.op, self.lp),
            "get_scheduler_metadata": lambda: fa.get_scheduler_metadata(self.b, 1, self.s_cache, self.hq, self.hkv,
                                                                        self.d, max_seqlen_k_new=1),
            "quantize_fp8": lambda: fa.quantize_fp8(self.x, heads_per_scale=2),
        }
        if self.paged:
            calls["flash_attn_with_kvcache paged"] = lambda: (fa.flash_attn_with_kvcache(
                self.q1, self.kp, self.vp, k=self.kn, v=self.vn, cache_seqlens=self.cs_p,
                page_table=self.page_table), self.kp, self.vp)
        if self.fp8:
            calls["flash_attn_func fp8"] = lambda: fa.flash_attn_func(self.q8, self.k8, self.v8, q_descale=self.qd,
                                                                      k_descale=self.qd, v_descale=self.qd)
        return calls

    def check_valid(self, failures, tag):
        """Runs every valid call; the first run records the bits, later runs must match them."""
        n = 0
        for name, fn in self.valid_calls().items():
            out = [_bits(t) for t in _tensors(fn())]
            self.torch.cuda.synchronize()
            n += 1
            if name not in self.refs:
                self.refs[name] = out
            elif len(out) != len(self.refs[name]) or any(not self.torch.equal(a, b)
                                                          for a, b in zip(out, self.refs[name])):
                failures.append({"case": tag, "kind": f"valid {name} differs from its first run",
                                 "detail": f"after {tag}"})
        return n

    # -- helpers for bad tensors --------------------------------------------------------------
    def misaligned(self, t, off):
        """t's values in a view `off` elements into a larger allocation (x.view(-1)[off:].view(...))."""
        big = self.torch.empty(t.numel() + 32, dtype=t.dtype, device=t.device)
        view = big.view(-1)[off:off + t.numel()].view(t.shape)
        view.copy_(t)
        return view

    def noncontig_last(self, t):
        big = self.torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
        view = big[..., ::2]
        view.copy_(t)
        return view


def _tensors(x):
    """The tensors of a (nested) result."""
    import torch
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for y in x for t in _tensors(y)]
    return []


def _bits(t):
    return t.detach().contiguous().reshape(-1).view(__import__("torch").uint8).clone()


BAD_SCALES = [-1.0, -1e-30, float("inf"), float("-inf"), float("nan"), 1e-40, 1e-39, 1e39]
BAD_SOFTCAPS = [-1.0, float("nan"), float("inf"), 1e-40, 1e-39, 1e39, 1e38]
BAD_WINDOWS = [(float("nan"), 0), ("a", 0), None, (1.5, 0), (0,), (0, 0, 0), "ab", (None, 0), (0, float("inf")),
               (True, 0)]
BAD_NUM_SPLITS = [-1, 257, 10 ** 6, "2", 1.5, None, True]
BAD_PACK_GQA = ["yes", 2, 1.5, -1]


# ---------------------------------------------------------------------------
# The bad cases, one family per function; each draws its values from rng.
# ---------------------------------------------------------------------------
def _option_cases(w, rng, entry, call, *, window=True, splits=True, pack=True):
    """Bad softmax_scale / softcap / window_size / num_splits / pack_gqa for call(**kwargs)."""
    kinds = ["softmax_scale", "softcap"] + (["window_size"] if window else []) + \
        (["num_splits"] if splits else []) + (["pack_gqa"] if pack else [])
    kind = rng.choice(kinds)
    if kind == "softmax_scale":
        val = rng.choice(BAD_SCALES + ["a"])
    elif kind == "softcap":
        val = rng.choice(BAD_SOFTCAPS + ["a"])
    elif kind == "window_size":
        val = rng.choice(BAD_WINDOWS)
    elif kind == "num_splits":
        val = rng.choice(BAD_NUM_SPLITS)
    else:
        val = rng.choice(BAD_PACK_GQA)
    return Case(entry, f"{kind} bad", f"{kind}={val!r}", lambda **kw: call(**kw), kwargs={kind: val}, names=(kind,))


def fa_cases(w):
    torch, fa = w.torch, w.flash3
    f = fa.flash_attn_func
    E = "flash_attn_func"
    q, k, v, d = w.q, w.k, w.v, w.d
    qkv = (("q", q), ("k", k), ("v", v))

    def with_(i, t):
        args = [q, k, v]
        args[i] = t
        return args

    def dtype(rng):
        i = rng.randrange(3)
        dt = rng.choice([torch.float32, torch.float64, torch.float16, torch.int32])
        t = qkv[i][1].to(dt)
        return Case(E, f"{qkv[i][0]} dtype", f"{qkv[i][0]}.dtype={dt}", f, with_(i, t), names=(qkv[i][0], "q"))

    def cpu(rng):
        i = rng.randrange(3)
        return Case(E, f"{qkv[i][0]} on CPU", f"{qkv[i][0]}.cpu()", f, with_(i, qkv[i][1].cpu()), names=(qkv[i][0],))

    def rank(rng):
        i = rng.randrange(3)
        t = rng.choice([qkv[i][1][0], qkv[i][1].unsqueeze(0)])
        return Case(E, f"{qkv[i][0]} rank", f"{qkv[i][0]}.dim()={t.dim()}", f, with_(i, t), names=(qkv[i][0],))

    def shapes(rng):
        c = rng.randrange(5)
        if c == 0:
            return Case(E, "batch mismatch", "k[:1]", f, [q, k[:1], v], names=("k",))
        if c == 1:
            return Case(E, "seqlen mismatch", "v[:, :10]", f, [q, k, v[:, :10]], names=("v",))
        if c == 2:
            k3 = torch.randn(w.b, w.sk, 3, d, device=w.dev, dtype=w.bf16)
            return Case(E, "heads not a multiple", "3 kv heads for 4 q heads", f, [q, k3, k3.clone()],
                        names=("q", "k"))
        if c == 3:
            dd = rng.choice([80, 512, 7, 1000])
            t = [torch.randn(*x.shape[:-1], dd, device=w.dev, dtype=w.bf16) for x in (q, k, v)]
            return Case(E, "head dim unsupported", f"head_dim={dd}", f, t, names=("head_dim", "q"))
        z = torch.empty(w.b, w.sk, 0, d, device=w.dev, dtype=w.bf16)
        return Case(E, "zero kv heads", "k / v with 0 heads", f, [q, z, z], names=("k", "q"))

    def noncontig(rng):
        i = rng.randrange(3)
        return Case(E, f"{qkv[i][0]} last dim not contiguous", f"{qkv[i][0]}[..., ::2]", f,
                    with_(i, w.noncontig_last(qkv[i][1])), names=(qkv[i][0],))

    def misaligned(rng):
        i, off = rng.randrange(3), rng.randrange(1, 8)
        return Case(E, f"{qkv[i][0]} misaligned", f"{qkv[i][0]} {2 * off} bytes off", f,
                    with_(i, w.misaligned(qkv[i][1], off)), names=(qkv[i][0],))

    def options(rng):
        return _option_cases(w, rng, E, lambda **kw: f(q, k, v, **kw))

    def not_implemented(rng):
        c = rng.randrange(3)
        kw = [{"qv": torch.zeros(1, device=w.dev)}, {"attention_chunk": 128},
              {"q_descale": torch.ones(w.b, w.hkv, device=w.dev)}][c]
        name = ["qv", "attention_chunk", "descale"][c]
        return Case(E, f"{name} not implemented", repr(list(kw)), f, [q, k, v], kw, names=(name, "q_descale"))

    return [dtype, cpu, rank, shapes, noncontig, misaligned, options, not_implemented]


def fp8_cases(w):
    if not w.fp8:
        return []
    torch, f = w.torch, w.flash3.flash_attn_func
    E = "flash_attn_func fp8"
    q8, k8, v8, qd = w.q8, w.k8, w.v8, w.qd
    base = dict(q_descale=qd, k_descale=qd, v_descale=qd)

    def options(rng):
        c = _option_cases(w, rng, E, lambda **kw: f(q8, k8, v8, **{**base, **kw}))
        c.detail += " (FP8)"
        return c

    def softcap_on(rng):
        return Case(E, "softcap with FP8", "softcap=5.0", f, [q8, k8, v8], {**base, "softcap": 5.0},
                    names=("softcap",))

    def descale(rng):
        c = rng.randrange(3)
        name = rng.choice(["q_descale", "k_descale", "v_descale"])
        if c == 0:
            t = qd.half()
            kind = "dtype"
        elif c == 1:
            t = torch.ones(w.b, w.hkv + 1, device=w.dev)
            kind = "shape"
        else:
            t = qd.cpu()
            kind = "on CPU"
        return Case(E, f"descale {kind}", f"{name} {kind}", f, [q8, k8, v8], {**base, name: t}, names=(name,))

    def misaligned(rng):
        i, off = rng.randrange(3), rng.randrange(1, 16)
        args = [q8, k8, v8]
        args[i] = w.misaligned(args[i], off)
        name = "qkv"[i]
        return Case(E, f"{name} misaligned (FP8)", f"{name} {off} bytes off", f, args, base, names=(name,))

    def other(rng):
        c = rng.randrange(3)
        if c == 0:
            return Case(E, "deterministic not a bool (FP8)", "deterministic='yes'", f, [q8, k8, v8],
                        {**base, "deterministic": "yes"}, names=("deterministic",))
        if c == 1:
            return Case(E, "sm_margin negative (FP8)", "sm_margin=-1", f, [q8, k8, v8], {**base, "sm_margin": -1},
                        names=("sm_margin",))
        e5m2 = getattr(torch, "float8_e5m2")
        return Case(E, "k e5m2 with e4m3 q", "k.dtype=float8_e5m2", f, [q8, k8.view(torch.uint8).view(e5m2), v8],
                    base, names=("k", "q"))

    return [options, softcap_on, descale, misaligned, other]


def qkvpacked_cases(w):
    torch, f = w.torch, w.flash3.flash_attn_qkvpacked_func
    E = "flash_attn_qkvpacked_func"
    qkv = w.qkv

    def layout(rng):
        c = rng.randrange(6)
        if c == 0:
            return Case(E, "qkv not a tensor", "qkv=[...]", f, [[qkv]], names=("qkv",))
        if c == 1:
            return Case(E, "qkv rank 3", "qkv[0, 0]", f, [qkv[0, 0]], names=("qkv",))
        if c == 2:
            return Case(E, "5-d qkv without 3", "qkv[:, :, :2]", f, [qkv[:, :, :2]], names=("qkv",))
        four = qkv.flatten(2, 3)
        if c == 3:
            return Case(E, "4-d qkv without num_heads_q", "num_heads_q=None", f, [four], names=("num_heads_q", "qkv"))
        if c == 4:
            val = rng.choice(["4", 1.5])
            return Case(E, "num_heads_q not an int", f"num_heads_q={val!r}", f, [four], {"num_heads_q": val},
                        names=("num_heads_q",))
        val = rng.choice([0, 3 * w.hq, 3 * w.hq - 1, -2])
        return Case(E, "num_heads_q inconsistent", f"num_heads_q={val}", f, [four], {"num_heads_q": val},
                    names=("num_heads_q", "qkv"))

    def tensor(rng):
        c = rng.randrange(3)
        if c == 0:
            return Case(E, "qkv float32", "qkv.float()", f, [qkv.float()], names=("q", "qkv"))
        if c == 1:
            return Case(E, "qkv on CPU", "qkv.cpu()", f, [qkv.cpu()], names=("q", "qkv"))
        off = rng.randrange(1, 8)
        return Case(E, "qkv misaligned", f"qkv {2 * off} bytes off", f, [w.misaligned(qkv, off)],
                    names=("q", "k", "v", "qkv"))

    def options(rng):
        return _option_cases(w, rng, E, lambda **kw: f(qkv, **kw), splits=False, pack=False)

    return [layout, tensor, options]


def varlen_cases(w):
    torch, f = w.torch, w.flash3.flash_attn_varlen_func
    E = "flash_attn_varlen_func"
    q3, k3, v3, cu_q, cu_k = w.q3, w.k3, w.v3, w.cu_q, w.cu_k

    def call(**kw):
        a = dict(q=q3, k=k3, v=v3, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=70, max_seqlen_k=80)
        a.update(kw)
        return f(**a)

    def cu(rng):
        name = rng.choice(["cu_seqlens_q", "cu_seqlens_k"])
        t = cu_q if name == "cu_seqlens_q" else cu_k
        c = rng.randrange(5)
        bad, what = [(t.long(), "int64"), (t.cpu(), "on CPU"), (t.view(1, -1), "2-d"),
                     (torch.stack([t, t], 1).reshape(-1)[::2], "non-contiguous"),
                     (t[:2], "wrong length")][c]
        return Case(E, f"{name} {what}", f"{name} {what}", call, kwargs={name: bad},
                    names=(name, "cu_seqlens_q", "cu_seqlens_k"))

    def max_seqlen(rng):
        name = rng.choice(["max_seqlen_q", "max_seqlen_k"])
        val = rng.choice([-1, 2 ** 31, "a", 1.5, None])
        return Case(E, f"{name} bad", f"{name}={val!r}", call, kwargs={name: val}, names=(name,))

    def seqused(rng):
        c = rng.randrange(3)
        t = [torch.tensor([5], dtype=torch.int32, device=w.dev), torch.tensor([5, 5], device=w.dev),
             torch.tensor([5, 5], dtype=torch.int32)][c]
        name = rng.choice(["seqused_q", "seqused_k"])
        return Case(E, f"{name} bad", f"{name} {['wrong length', 'int64', 'on CPU'][c]}", call,
                    kwargs={name: t}, names=(name,))

    def tensors(rng):
        i = rng.randrange(3)
        name, t = (("q", q3), ("k", k3), ("v", v3))[i]
        c = rng.randrange(3)
        if c == 0:
            return Case(E, f"{name} rank 4", f"{name}.unsqueeze(0)", call, kwargs={name: t.unsqueeze(0)},
                        names=(name,))
        if c == 1:
            off = rng.randrange(1, 8)
            return Case(E, f"{name} misaligned", f"{name} {2 * off} bytes off", call,
                        kwargs={name: w.misaligned(t, off)}, names=(name,))
        return Case(E, f"{name} last dim not contiguous", f"{name}[..., ::2]", call,
                    kwargs={name: w.noncontig_last(t)}, names=(name,))

    def options(rng):
        return _option_cases(w, rng, E, call)

    return [cu, max_seqlen, seqused, tensors, options]


def kvcache_cases(w):
    torch, f = w.torch, w.flash3.flash_attn_with_kvcache
    E = "flash_attn_with_kvcache"
    q1, kc, vc, kn, vn, cs = w.q1, w.kc, w.vc, w.kn, w.vn, w.cs
    watch = [kc, vc]

    def call(**kw):
        a = dict(q=q1, k_cache=kc, v_cache=vc, k=kn, v=vn, cache_seqlens=cs)
        a.update(kw)
        return f(**a)

    def aliasing(rng):
        c = rng.randrange(4)
        if c == 0:  # issue 39: the new rows are a view of the cache they are appended to
            row = rng.randrange(w.s_cache)
            return Case(E, "k a view of k_cache", f"k=k_cache[:, {row}:{row + 1}]", call,
                        kwargs={"k": kc[:, row:row + 1]}, names=("k", "k_cache"), watch=watch)
        if c == 1:
            row = rng.randrange(w.s_cache)
            return Case(E, "v a view of v_cache", f"v=v_cache[:, {row}:{row + 1}]", call,
                        kwargs={"v": vc[:, row:row + 1]}, names=("v", "v_cache"), watch=watch)
        if c == 2:  # issue 39: k_cache is v_cache with an append
            return Case(E, "k_cache is v_cache with an append", "v_cache=k_cache", call, kwargs={"v_cache": kc},
                        names=("k_cache", "v_cache"), watch=watch)
        return Case(E, "k a view of v_cache", "k=v_cache[:, 3:4]", call, kwargs={"k": vc[:, 3:4]},
                    names=("k", "v_cache"), watch=watch)

    def misaligned(rng):
        name = rng.choice(["q", "k_cache", "v_cache", "k", "v"])
        t = {"q": q1, "k_cache": kc, "v_cache": vc, "k": kn, "v": vn}[name]
        off = rng.randrange(1, 8)
        return Case(E, f"{name} misaligned", f"{name} {2 * off} bytes off", call, kwargs={name: w.misaligned(t, off)},
                    names=(name,), watch=watch)

    def cache_seqlens(rng):
        c = rng.randrange(8)
        if c == 0:  # an int the host can check: past the capacity, the appended row would be dropped
            val = rng.choice([w.s_cache, w.s_cache + 5, 2 ** 31 - 1])
            return Case(E, "int cache_seqlens past the capacity", f"cache_seqlens={val} (capacity {w.s_cache})",
                        call, kwargs={"cache_seqlens": val}, names=("cache_seqlens",), watch=watch)
        val, what = [(-1, "negative int"), (3.0, "float"), ("3", "str"), (True, "bool"),
                     (cs.long(), "int64 tensor"), (cs.cpu(), "CPU tensor"), (cs[:1], "wrong length")][c - 1]
        return Case(E, f"cache_seqlens {what}", f"cache_seqlens={what}", call, kwargs={"cache_seqlens": val},
                    names=("cache_seqlens",), watch=watch)

    def int_arrays(rng):
        name = rng.choice(["cache_batch_idx", "cache_leftpad", "rotary_seqlens"])
        good = torch.tensor([0, 1], dtype=torch.int32, device=w.dev)
        val, what = rng.choice([(good.long(), "int64"), (good.cpu(), "on CPU"), (good[:1], "wrong length"),
                                (good.view(1, 2), "2-d")])
        kw = {name: val}
        if name == "rotary_seqlens":
            kw.update(rotary_cos=w.cos, rotary_sin=w.sin)
        return Case(E, f"{name} {what}", f"{name} {what}", call, kwargs=kw, names=(name,), watch=watch)

    def rotary(rng):
        c = rng.randrange(5)
        kw, what, names = [
            ({"rotary_cos": w.cos}, "cos without sin", ("rotary_sin", "rotary_cos")),
            ({"rotary_cos": w.cos.float(), "rotary_sin": w.sin.float()}, "float32 tables", ("rotary_cos",)),
            ({"rotary_cos": w.cos[:, :1].repeat(1, w.d), "rotary_sin": w.sin[:, :1].repeat(1, w.d)},
             "rotary_dim past head_dim", ("rotary_cos",)),
            ({"rotary_cos": w.cos[:100], "rotary_sin": w.sin[:100]}, "tables shorter than the cache",
             ("rotary_cos",)),
            ({"rotary_cos": w.cos, "rotary_sin": w.sin, "k": None, "v": None}, "rotary without k / v",
             ("rotary_cos", "k")),
        ][c]
        return Case(E, f"rotary: {what}", what, call, kwargs=kw, names=names, watch=watch)

    def new_rows(rng):
        c = rng.randrange(5)
        kw, what, names = [
            ({"v": None}, "k without v", ("k", "v")),
            ({"k": None}, "v without k", ("k", "v")),
            ({"cache_seqlens": None}, "k without cache_seqlens", ("cache_seqlens",)),
            ({"k": torch.cat([kn, kn], 2), "v": torch.cat([vn, vn], 2)}, "k / v heads mismatch", ("k", "v")),
            ({"k": torch.randn(w.b, w.s_cache + 1, w.hkv, w.d, device=w.dev, dtype=w.bf16),
              "v": torch.randn(w.b, w.s_cache + 1, w.hkv, w.d, device=w.dev, dtype=w.bf16)},
             "more new rows than the cache holds", ("k",)),
        ][c]
        return Case(E, what, what, call, kwargs=kw, names=names, watch=watch)

    def tensors(rng):
        c = rng.randrange(5)
        kw, what, names = [
            ({"q": q1.float()}, "q float32", ("q",)),
            ({"k_cache": kc.half()}, "k_cache float16", ("k_cache",)),
            ({"q": q1.cpu()}, "q on CPU", ("q",)),
            ({"v_cache": vc.cpu()}, "v_cache on CPU", ("v_cache",)),
            ({"k_cache": w.noncontig_last(kc)}, "k_cache last dim not contiguous", ("k_cache",)),
        ][c]
        return Case(E, what, what, call, kwargs=kw, names=names, watch=watch)

    def metadata(rng):
        c = rng.randrange(6)
        val, what = [
            (torch.tensor([1, 0], dtype=torch.int32, device=w.dev), "on the GPU"),
            (torch.tensor([1, 0]), "int64"),
            (torch.tensor([1, 0, 0], dtype=torch.int32), "shape (3,)"),
            ((0, 0), "num_splits 0"),
            ((300, 1), "num_splits 300"),
            ("x", "a str"),
        ][c]
        return Case(E, f"scheduler_metadata {what}", f"scheduler_metadata {what}", call,
                    kwargs={"scheduler_metadata": val}, names=("scheduler_metadata",), watch=watch)

    def not_implemented(rng):
        c = rng.randrange(6)
        kw, name = [
            ({"sm_margin": 1}, "sm_margin"),
            ({"cu_seqlens_q": w.cu_q}, "cu_seqlens_q"),
            ({"max_seqlen_q": 5}, "max_seqlen_q"),
            ({"qv": torch.zeros(1, device=w.dev)}, "qv"),
            ({"attention_chunk": 64}, "attention_chunk"),
            ({"q_descale": torch.ones(1, device=w.dev)}, "descale"),
        ][c]
        return Case(E, f"{name} not implemented", name, call, kwargs=kw, names=(name, "q_descale"), watch=watch)

    def options(rng):
        c = _option_cases(w, rng, E, call)
        c.watch = watch
        return c

    fams = [aliasing, misaligned, cache_seqlens, int_arrays, rotary, new_rows, tensors, metadata, not_implemented,
            options]
    if w.paged:
        fams += paged_cases(w)
    return fams


def paged_cases(w):
    torch, f = w.torch, w.flash3.flash_attn_with_kvcache
    E = "flash_attn_with_kvcache paged"
    kp, vp, pt = w.kp, w.vp, w.page_table
    watch = [kp, vp]

    def call(**kw):
        a = dict(q=w.q1, k_cache=kp, v_cache=vp, k=w.kn, v=w.vn, cache_seqlens=w.cs_p, page_table=pt)
        a.update(kw)
        return f(**a)

    def table(rng):
        c = rng.randrange(5)
        val, what = [(pt.long(), "int64"), (pt.cpu(), "on CPU"), (pt[0], "1-d"),
                     (torch.stack([pt, pt], 2).reshape(w.b, -1)[:, ::2], "stride(1) 2"), (pt[:1], "one row")][c]
        return Case(E, f"page_table {what}", f"page_table {what}", call, kwargs={"page_table": val},
                    names=("page_table",), watch=watch)

    def aliasing(rng):
        c = rng.randrange(3)
        if c == 0:
            return Case(E, "k a view of the page pool", "k=k_cache[:2, 7:8]", call, kwargs={"k": kp[:2, 7:8]},
                        names=("k", "k_cache"), watch=watch)
        if c == 1:
            return Case(E, "k_cache is v_cache with an append (paged)", "v_cache=k_cache", call,
                        kwargs={"v_cache": kp}, names=("k_cache", "v_cache"), watch=watch)
        off = rng.randrange(1, 8)
        return Case(E, "page pool misaligned", f"k_cache {2 * off} bytes off", call,
                    kwargs={"k_cache": w.misaligned(kp, off)}, names=("k_cache",), watch=watch)

    def other(rng):
        c = rng.randrange(3)
        if c == 0:
            return Case(E, "softcap with a page table", "softcap=5.0", call, kwargs={"softcap": 5.0},
                        names=("page_table", "softcap"), watch=watch)
        if c == 1:
            val = rng.choice([128, 200])
            return Case(E, "int cache_seqlens past the paged capacity", f"cache_seqlens={val} (capacity 128)", call,
                        kwargs={"cache_seqlens": val}, names=("cache_seqlens",), watch=watch)
        cc = _option_cases(w, rng, E, call)
        cc.watch = watch
        return cc

    return [table, aliasing, other]


def combine_cases(w):
    torch, f = w.torch, w.flash3.flash_attn_combine
    E = "flash_attn_combine"
    op, lp = w.op, w.lp
    b, s, h, d = op.shape[1:]

    def inputs(rng):
        c = rng.randrange(7)
        args, what, names = [
            ([op[0], lp], "out_partial 4-d", ("out_partial",)),
            ([op.half(), lp], "out_partial float16", ("out_partial",)),
            ([op.cpu(), lp.cpu()], "on CPU", ("out_partial",)),
            ([op, lp[:, :1]], "lse_partial shape", ("lse_partial",)),
            ([op[:0], lp[:0]], "num_splits 0", ("out_partial", "num_splits")),
            ([torch.zeros(3, b, s, h, 1024, device=w.dev), lp], "head_dim 1024", ("out_partial", "head_dim")),
            (["abc", lp], "out_partial not a tensor", ("out_partial",)),
        ][c]
        return Case(E, what, what, f, args, names=names)

    def outs(rng):
        c = rng.randrange(5)
        if c == 0:  # out= is a view of out_partial
            return Case(E, "out aliasing out_partial", "out=out_partial[1]", f, [op, lp], {"out": op[1]},
                        names=("out",), watch=[op])
        if c == 1:  # out= overlaps lse_partial (both views of one allocation)
            big = torch.randn(lp.numel() + op[0].numel(), device=w.dev)
            lp2 = big[:lp.numel()].view(lp.shape)
            out = big[64:64 + op[0].numel()].view(op[0].shape)
            return Case(E, "out overlapping lse_partial", "out and lse_partial views of one buffer", f, [op, lp2],
                        {"out": out}, names=("out",), watch=[big])
        if c == 2:
            out = torch.empty(b, s, h, d, device=w.dev, dtype=torch.float16)
            return Case(E, "out dtype not out_dtype", "out float16, out_dtype float32", f, [op, lp], {"out": out},
                        names=("out",), watch=[out])
        if c == 3:
            out = torch.empty(b, s, h + 1, d, device=w.dev)
            return Case(E, "out shape", "out with one head too many", f, [op, lp], {"out": out}, names=("out",),
                        watch=[out])
        return Case(E, "out_dtype int32", "out_dtype=torch.int32", f, [op, lp], {"out_dtype": torch.int32},
                    names=("out_dtype",))

    return [inputs, outs]


def scheduler_cases(w):
    f = w.flash3.get_scheduler_metadata
    E = "get_scheduler_metadata"
    torch = w.torch
    good = dict(batch_size=w.b, max_seqlen_q=1, max_seqlen_k=w.s_cache, num_heads_q=w.hq, num_heads_kv=w.hkv,
                headdim=w.d)

    def call(**kw):
        a = dict(good)
        a.update(kw)
        return f(**a)

    def sizes(rng):
        name = rng.choice(["batch_size", "max_seqlen_q", "num_heads_q", "num_heads_kv", "headdim", "headdim_v",
                           "max_seqlen_k_new"])
        # 0: an empty batch or query (FlashAttention-3 accepts those) is not bad; 0 heads or head dim is.
        val = rng.choice([-1, 2 ** 31, "2", 1.5, True] + ([0] if name.startswith(("num_heads", "headdim")) else []))
        return Case(E, f"{name} bad", f"{name}={val!r}", call, kwargs={name: val}, names=(name,))

    def shapes(rng):
        c = rng.randrange(4)
        kw, what, names = [
            ({"num_heads_q": 6, "num_heads_kv": 4}, "heads not a multiple", ("num_heads_q", "heads_q")),
            ({"headdim": rng.choice([7, 12, 1000])}, "headdim unsupported", ("headdim", "head_dim")),
            ({"qkv_dtype": rng.choice([torch.float32, torch.int8])}, "qkv_dtype", ("qkv_dtype", "dtype")),
            ({"page_size": rng.choice([0, -16, "16", 1.5])}, "page_size", ("page_size",)),
        ][c]
        return Case(E, what, repr(kw), call, kwargs=kw, names=names)

    def options(rng):
        c = rng.randrange(6)
        if c < 3:
            name, values = [("window_size", BAD_WINDOWS), ("num_splits", BAD_NUM_SPLITS), ("pack_gqa", BAD_PACK_GQA)][c]
            val = rng.choice(values)
            return Case(E, f"{name} bad", f"{name}={val!r}", call, kwargs={name: val}, names=(name,))
        kw, name = [({"cu_seqlens_q": w.cu_q}, "cu_seqlens_q"), ({"attention_chunk": 64}, "attention_chunk"),
                    ({"sm_margin": 2}, "sm_margin")][c - 3]
        return Case(E, f"{name} not implemented", name, call, kwargs=kw, names=(name,))

    return [sizes, shapes, options]


def quantize_cases(w):
    torch, f = w.torch, w.flash3.quantize_fp8
    E = "quantize_fp8"
    x = w.x

    def tensors(rng):
        c = rng.randrange(6)
        if c == 3:
            off = rng.randrange(1, 8)
            return Case(E, "x misaligned", f"x {2 * off} bytes off", f, [w.misaligned(x, off)], names=("x",))
        args, what = [
            ([x.float()], "x float32"),
            ([x.cpu()], "x on CPU"),
            ([x[0]], "x 3-d"),
            (None, None),
            ([w.noncontig_last(x)], "x last dim not contiguous"),
            ([torch.randn(2, 100, 4, 100, device=w.dev, dtype=w.bf16)], "head_dim 100"),
        ][c]
        return Case(E, what, what, f, args, names=("x",))

    def scales(rng):
        c = rng.randrange(3)
        if c == 0:
            val = rng.choice([3, 0, -1, "2", 1.5])
            return Case(E, "heads_per_scale bad", f"heads_per_scale={val!r}", f, [x], {"heads_per_scale": val},
                        names=("heads_per_scale",))
        if c == 1:
            return Case(E, "block_scales with heads_per_scale 2", "block_scales=True, heads_per_scale=2", f, [x],
                        {"block_scales": True, "heads_per_scale": 2}, names=("heads_per_scale",))
        x96 = torch.randn(2, 100, 4, 96, device=w.dev, dtype=w.bf16)
        return Case(E, "hadamard with head_dim 96", "hadamard=True, head_dim 96", f, [x96], {"hadamard": True},
                    names=("x", "head_dim"))

    def rotary(rng):
        cos = torch.randn(100, 32, device=w.dev, dtype=w.bf16)
        c = rng.randrange(4)
        kw, what = [
            ({"rotary_cos": cos}, "cos without sin"),
            ({"rotary_cos": cos[:, :12], "rotary_sin": cos[:, :12]}, "rotary_dim 24"),
            ({"rotary_cos": cos.float(), "rotary_sin": cos.float()}, "float32 tables"),
            ({"rotary_cos": cos[:50], "rotary_sin": cos[:50]}, "tables shorter than seqlen"),
        ][c]
        return Case(E, f"rotary: {what}", what, f, [x], kw, names=("rotary_cos", "rotary_sin", "rotary_dim"))

    return [tensors, scales, rotary]


def repro_cases(w):
    """The three SIGSEGV repros of issue 39."""
    torch, fa = w.torch, w.flash3
    d = w.d
    q = torch.randn(w.b, w.sq, w.hq, d + 8, device=w.dev, dtype=w.bf16)[..., 1:d + 1]
    return [
        Case("flash_attn_func", "issue 39 repro: q 2 bytes off 16-byte alignment",
             f"q = randn(..., {d + 8})[..., 1:{d + 1}]", fa.flash_attn_func, [q, w.k, w.v], names=("q",)),
        Case("flash_attn_with_kvcache", "issue 39 repro: the new rows a view of the cache",
             "k = k_cache[:, 20:21]", fa.flash_attn_with_kvcache, [w.q1, w.kc, w.vc],
             {"k": w.kc[:, 20:21], "v": w.vn, "cache_seqlens": w.cs}, names=("k", "k_cache"), watch=[w.kc, w.vc]),
        Case("flash_attn_with_kvcache", "issue 39 repro: k_cache is v_cache with an append",
             "v_cache = k_cache", fa.flash_attn_with_kvcache, [w.q1, w.kc, w.kc],
             {"k": w.kn, "v": w.vn, "cache_seqlens": w.cs}, names=("k_cache", "v_cache"), watch=[w.kc, w.vc]),
    ]


def batch_cases(w, count, rng):
    """count cases, round robin over the families of every entry point (values drawn from rng)."""
    fams = (fa_cases(w) + fp8_cases(w) + qkvpacked_cases(w) + varlen_cases(w) + kvcache_cases(w) +
            combine_cases(w) + scheduler_cases(w) + quantize_cases(w))
    for i in range(count):
        yield fams[i % len(fams)](rng)


# ---------------------------------------------------------------------------
# The worker.
# ---------------------------------------------------------------------------
def _watched(case):
    """Every tensor the call sees, and the allocations they view."""
    import torch
    seen, out = set(), []
    for t in list(case.args) + list(case.kwargs.values()) + case.watch:
        for x in (t, getattr(t, "_base", None)) if isinstance(t, torch.Tensor) else ():
            if isinstance(x, torch.Tensor) and id(x) not in seen:
                seen.add(id(x))
                out.append(x)
    return out


def _run_case(w, i, case, progress, failures):
    torch = w.torch
    with open(progress, "w") as fh:  # before the call: a crash leaves this behind
        fh.write(f"#{i} [{case.entry}] {case.kind}: {case.detail}\n")
    watched = _watched(case)
    before = [_bits(t) for t in watched]

    def fail(kind, detail):
        failures.append({"case": i, "kind": f"{case.entry}: {case.kind}: {kind}", "detail": f"{case.detail}: {detail}"})

    try:
        case.fn(*case.args, **case.kwargs)
    except ACCEPTED as e:
        msg = str(e)
        if not msg:
            fail("empty message", type(e).__name__)
        elif case.names and not any(_is_word(msg, n) for n in case.names):
            fail(f"message does not name {' / '.join(case.names)}", f"{type(e).__name__}: {msg[:300]}")
    except Exception as e:  # noqa: BLE001 - any other exception is a failure
        fail(f"raised {type(e).__name__}", str(e)[:300])
    else:
        fail("accepted", "no exception")
    try:
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - a CUDA error: the context is gone, stop here
        fail("CUDA error after the call", str(e)[:300])
        return False
    for t, b in zip(watched, before):
        if not torch.equal(_bits(t), b):
            fail("modified a tensor it was given", f"shape {tuple(t.shape)} {t.dtype}")
    return True


def worker_main(argv):
    mode, progress, result, count = argv[0], argv[1], argv[2], int(argv[3])
    w = World()
    failures, per_entry = [], {}
    valid = w.check_valid(failures, "start")
    rng = random.Random(SEED)
    cases = repro_cases(w)
    if mode == "batch":
        cases = cases + list(batch_cases(w, count, rng))
    calls = 0
    for i, case in enumerate(cases):
        if not _run_case(w, i, case, progress, failures):
            break
        calls += 1
        per_entry[case.entry] = per_entry.get(case.entry, 0) + 1
        if calls % VALID_EVERY == 0 or i == len(cases) - 1:
            with open(progress, "w") as fh:
                fh.write(f"valid calls after case #{i}\n")
            valid += w.check_valid(failures, f"case #{i}")
    with open(result, "w") as fh:
        json.dump({"calls": calls, "valid_calls": valid, "per_entry": per_entry, "failures": failures}, fh)


if __name__ == "__main__":
    if len(sys.argv) >= 6 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2:])
    else:
        sys.exit(pytest.main([__file__, "-v"]))
