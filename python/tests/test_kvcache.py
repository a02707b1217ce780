# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""flash3.flash_attn_with_kvcache (FlashAttention-3's KV-cache attention, forward only) and
flash3.get_scheduler_metadata against the torch reference of ref.kvcache_ref.

Checked per case:
  * the caches after the call, bit for bit against the reference: the appended rows (rotated keys
    included: ref.apply_rotary_ref emulates the kernels' fp32 fma formula exactly, see its
    docstring), every other row and every other cache entry untouched; q, k, v not modified;
  * out: FlashAttention's rule, max|flash3 - ref| <= 2 * max|plain low-precision torch - ref| +
    the dtype's rounding error at the reference's magnitude (ref: fp32 math on the rotated q and
    the updated cache, per sequence over rows [cache_leftpad, cache_seqlens + seqlen_new),
    bottom-right masks, GQA by head repetition);
  * softmax_lse (always requested): the C++ tests' rule (ref.check_close), and its layout (a
    (batch, heads, seqlen_q) view of a contiguous (heads, batch, seqlen_q) tensor);
  * each case runs with num_splits 1, 0 (heuristic), 3 and 17 and with the plan of
    get_scheduler_metadata; the split results are also within the tolerance of the unsplit one.

The matrix (dtype bf16 / fp16; head dim 64 / 128 / 256; seqlen_q 1 / 4 / 128; seqlen_new 0 (no k /
v) / 1 / 17; rotary none / interleaved / GPT-NeoX with rotary_dim = head_dim or head_dim / 2; no
mask / causal / window (32, 0); MHA / GQA 16:2 / MQA 8:1; cache_batch_idx on / off; cache_leftpad
on / off; cache fill 0 / 1 / 1023 / random per sequence in a 1056-row cache; pack_gqa None / True /
False) is too large to run in full: a seeded random subset of 200 cases, completed so that every
value of every dimension appears, plus targeted tests (int / None cache_seqlens, rotary_seqlens,
strided inputs, rows dropped past the cache's end, softcap, scheduler metadata, CUDA graphs,
torch.compile, opcheck, no autograd) and the error tests (raised before anything is launched or
written, naming the argument). Head dims this build lacks are skipped (builds.py).

Paged caches (page_table): a logical (batch, capacity, hkv, d) cache is scattered into a pool of
pages through a random permutation (more pages than the table uses; the unused ones NaN, so a
read of a wrong page shows in out), and the call is checked against the reference on the logical
cache by the rules above (out, softmax_lse; the pools read back in logical order bit for bit, the
unused pages still NaN bit for bit, page_table not modified). The matrix (dtype; head dim 64 / 128
/ 256; page size 1 / 16 / 64 / 256; seqlen_q 1 / 4 / 128; seqlen_new 0 / 1 / 17; the rotary
variants; no mask / causal / window; MHA / GQA / MQA; fill 0 / 1 / random / up to the capacity;
pack_gqa None / True / False; a contiguous table or a slice of a wider one), each case with
num_splits 1, 0 and 3: a seeded random subset of 150 cases, completed so that every value
appears. Targeted paged tests: cache_seqlens None / int, rows past the capacity dropped, a pool
sliced along the heads, shared prefix pages, empty batch, version counters, scheduler metadata
with page_size, CUDA graphs with a new table per replay, torch.compile, opcheck, and the
page_table errors. They skip where the build has no packgqa unit for the case (builds.py).
"""
import itertools
import math
import random

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("flash3 needs a Hopper (sm_90) GPU", allow_module_level=True)

import flash3  # noqa: E402
from flash3 import flash_attn_with_kvcache, get_scheduler_metadata  # noqa: E402
from builds import skip_unless_built, skip_unless_paged_built, skip_unless_softcap_built  # noqa: E402
from ref import check_close, kvcache_ref, max_err, rounding_atol, tol_factor  # noqa: E402

DEV = "cuda"
EPS_LSE = 1e-5  # kEpsLse of tests/gpu/test_fwd_gpu.cpp
BATCH = 3
BATCH_CACHE = 5  # with cache_batch_idx: a permutation's first BATCH entries
SEQLEN_CACHE = 1024 + 32  # room for fill 1023 + 17 new rows
SEQLEN_RO = SEQLEN_CACHE + 128  # rotary table rows: every query position (fill + seqlen_q) stays inside
NUM_SPLITS = (1, 0, 3, 17)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
HDIMS = [64, 128, 256]
SEQLEN_Q = [1, 4, 128]
SEQLEN_NEW = [0, 1, 17]
# name: (interleaved, rotary_dim as a fraction of head_dim); "none": no rotary tables
ROTARY = {"none": None, "inter": (True, 1.0), "inter_half": (True, 0.5), "neox": (False, 1.0),
          "neox_half": (False, 0.5)}
MASKS = {"none": (False, (-1, -1)), "causal": (True, (-1, -1)), "window32x0": (False, (32, 0))}
HEADS = {"mha": (4, 4), "gqa": (16, 2), "mqa": (8, 1)}
FILLS = ["0", "1", "1023", "random"]
PACKS = [None, True, False]

DIMS = {
    "dtype": list(DTYPES), "d": HDIMS, "sq": SEQLEN_Q, "s_new": SEQLEN_NEW, "rotary": list(ROTARY),
    "mask": list(MASKS), "heads": list(HEADS), "batch_idx": [False, True], "leftpad": [False, True],
    "fill": FILLS, "pack": PACKS,
}


def _valid(case):
    return case["s_new"] > 0 or case["rotary"] == "none"  # rotary tables need k / v


def _case_id(c):
    return (f"{c['dtype']}-d{c['d']}-sq{c['sq']}-new{c['s_new']}-rot_{c['rotary']}-{c['mask']}-{c['heads']}-"
            f"{'bidx' if c['batch_idx'] else 'nobidx'}-{'lpad' if c['leftpad'] else 'nolpad'}-fill{c['fill']}-"
            f"pack{c['pack']}")


def _matrix(n=200, seed=20240607):
    """A seeded random subset of the valid cases, completed so that every value of every dimension
    appears at least once."""
    names = list(DIMS)
    r = random.Random(seed)
    cases = [dict(zip(names, values)) for values in itertools.product(*DIMS.values())]
    cases = [c for c in cases if _valid(c)]
    chosen = r.sample(cases, n)
    for name, values in DIMS.items():
        for value in values:
            if not any(c[name] == value for c in chosen):
                chosen.append(r.choice([c for c in cases if c[name] == value and c not in chosen]))
    return chosen


CASES = _matrix()


class Problem:
    """The inputs of one flash_attn_with_kvcache call (tensors on the GPU, drawn from a seed)."""

    def __init__(self, dtype, d, sq, s_new, rotary, causal, window, hq, hkv, batch_idx, leftpad, fill, seed,
                 b=BATCH, seqlen_cache=SEQLEN_CACHE, seqlen_ro=SEQLEN_RO, dv=None):
        dv = d if dv is None else dv
        g = torch.Generator(device=DEV).manual_seed(seed)
        gc = torch.Generator().manual_seed(seed)  # host draws (lengths, indices)
        bc = BATCH_CACHE if batch_idx else b
        self.dtype, self.causal, self.window = dtype, causal, window
        self.q = torch.randn(b, sq, hq, d, device=DEV, dtype=dtype, generator=g)
        self.k_cache = torch.randn(bc, seqlen_cache, hkv, d, device=DEV, dtype=dtype, generator=g)
        self.v_cache = torch.randn(bc, seqlen_cache, hkv, dv, device=DEV, dtype=dtype, generator=g)
        self.k = self.v = None
        if s_new > 0:
            self.k = torch.randn(b, s_new, hkv, d, device=DEV, dtype=dtype, generator=g)
            self.v = torch.randn(b, s_new, hkv, dv, device=DEV, dtype=dtype, generator=g)
        if fill == "random":
            lens = torch.randint(0, 1024, (b,), generator=gc)
        else:
            lens = torch.full((b,), int(fill))
        self.cache_seqlens = lens.to(torch.int32).to(DEV)
        self.cache_leftpad = None
        if leftpad:
            self.cache_leftpad = torch.stack([torch.randint(0, int(n) + 1, (1,), generator=gc)[0] for n in lens])
            self.cache_leftpad = self.cache_leftpad.to(torch.int32).to(DEV)
        self.cache_batch_idx = None
        if batch_idx:
            self.cache_batch_idx = torch.randperm(bc, generator=gc)[:b].to(torch.int32).to(DEV)
        self.rotary_cos = self.rotary_sin = None
        self.rotary_interleaved = True
        if rotary is not None:
            self.rotary_interleaved, frac = rotary
            rd = int(d * frac)
            angle = torch.rand(seqlen_ro, rd // 2, device=DEV, generator=g) * 2 * math.pi
            self.rotary_cos, self.rotary_sin = torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)
        self.rotary_seqlens = None

    def kwargs(self):
        return dict(rotary_cos=self.rotary_cos, rotary_sin=self.rotary_sin, cache_seqlens=self.cache_seqlens,
                    cache_batch_idx=self.cache_batch_idx, cache_leftpad=self.cache_leftpad,
                    rotary_seqlens=self.rotary_seqlens, causal=self.causal, window_size=self.window,
                    rotary_interleaved=self.rotary_interleaved)

    def reference(self, softmax_scale=None, softcap=0.0):
        return kvcache_ref(self.q, self.k_cache, self.v_cache, self.k, self.v, self.rotary_cos, self.rotary_sin,
                           self.cache_seqlens, self.cache_batch_idx, self.cache_leftpad, self.rotary_seqlens,
                           softmax_scale, self.causal, self.window, self.rotary_interleaved, softcap)

    def run(self, **kw):
        """flash_attn_with_kvcache on clones of the caches: (out, lse, k_cache, v_cache)."""
        kc, vc = self.k_cache.clone(), self.v_cache.clone()
        args = self.kwargs()
        args.update(kw)
        out, lse = flash_attn_with_kvcache(self.q, kc, vc, self.k, self.v, return_softmax_lse=True, **args)
        return out, lse, kc, vc


def _bits(t):
    """The raw bits of t (contiguous copy), for bit-exact comparisons (-0.0 != 0.0, NaN == NaN)."""
    t = t.contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _assert_bitwise(name, got, want):
    if not torch.equal(_bits(got), _bits(want)):
        diff = (_bits(got) != _bits(want))
        where = diff.nonzero()[:5].tolist()
        raise AssertionError(f"{name}: {int(diff.sum())} elements differ from the reference, first at {where}")


def _check_result(p, ref, out, lse, kc, vc, what, softcap=0.0):
    b, sq, hq, _ = p.q.shape
    dv = p.v_cache.shape[3]
    assert out.shape == (b, sq, hq, dv) and out.dtype == p.dtype and out.is_contiguous(), what
    assert lse.shape == (b, hq, sq) and lse.dtype == torch.float32, what
    assert lse.permute(1, 0, 2).is_contiguous(), f"{what}: softmax_lse is not a view of a (heads, batch, seqlen_q) tensor"
    _assert_bitwise(f"{what}: k_cache", kc, ref["k_cache"])
    _assert_bitwise(f"{what}: v_cache", vc, ref["v_cache"])
    assert not torch.isnan(out).any(), f"{what}: NaN in out"
    factor = tol_factor(softcap)
    e_ours, e_base = max_err(out, ref["out"]), max_err(ref["out_lowp"], ref["out"])
    atol = rounding_atol(ref["out"], p.dtype)
    assert e_ours <= factor * e_base + atol, (
        f"{what}: out: max|flash3 - ref| = {e_ours:.3e} > {factor} * max|torch {p.dtype} - ref| ({e_base:.3e}) + "
        f"{atol:.1e}")
    ok, err, base, bound, nans = check_close(lse, ref["lse"], ref["lse_lowp"], EPS_LSE, factor)
    assert ok, f"{what}: softmax_lse: err {err:.3e} > bound {bound:.3e} (baseline {base:.3e}, {nans} NaN)"
    return e_base, atol


def _problem(c, seed):
    hq, hkv = HEADS[c["heads"]]
    causal, window = MASKS[c["mask"]]
    return Problem(DTYPES[c["dtype"]], c["d"], c["sq"], c["s_new"], ROTARY[c["rotary"]], causal, window, hq, hkv,
                   c["batch_idx"], c["leftpad"], c["fill"], seed)


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_matches_reference(case):
    dtype, d = DTYPES[case["dtype"]], case["d"]
    skip_unless_built(dtype, d, d)
    seed = CASES.index(case)  # distinct cases: r.sample draws without replacement
    p = _problem(case, seed)
    saved = [t.clone() for t in (p.q, p.k, p.v) if t is not None]
    ref = p.reference()
    outs = {}
    for ns in NUM_SPLITS:
        out, lse, kc, vc = p.run(num_splits=ns, pack_gqa=case["pack"])
        base, atol = _check_result(p, ref, out, lse, kc, vc, f"num_splits={ns}")
        outs[ns] = out
    # The plan of get_scheduler_metadata (for the cache size plus the new rows).
    b, sq, hq, _ = p.q.shape
    hkv = p.k_cache.shape[2]
    md = get_scheduler_metadata(b, sq, SEQLEN_CACHE, hq, hkv, d, p.cache_seqlens, dtype,
                                max_seqlen_k_new=0 if p.k is None else p.k.shape[1], causal=p.causal,
                                window_size=p.window, pack_gqa=case["pack"])
    out, lse, kc, vc = p.run(scheduler_metadata=md)
    _check_result(p, ref, out, lse, kc, vc, f"scheduler_metadata={md.tolist()}")
    # Split results within the tolerance of the unsplit one.
    for ns in (0, 3, 17):
        e = max_err(outs[ns], outs[1])
        assert e <= 2 * base + atol, f"num_splits={ns} vs 1: max diff {e:.3e} > {2 * base + atol:.3e}"
    for t, s in zip([t for t in (p.q, p.k, p.v) if t is not None], saved):
        assert torch.equal(_bits(t), _bits(s)), "an input (q, k or v) was modified"


# ---------------------------------------------------------------------------
# Targeted cases.
# ---------------------------------------------------------------------------
def _simple(dtype=torch.bfloat16, d=128, sq=4, s_new=5, rotary=(True, 1.0), causal=True, window=(-1, -1), hq=16,
            hkv=2, batch_idx=True, leftpad=True, fill="random", seed=1, **kw):
    skip_unless_built(dtype, d, kw.get("dv", d))
    return Problem(dtype, d, sq, s_new, rotary, causal, window, hq, hkv, batch_idx, leftpad, fill, seed, **kw)


def test_int_cache_seqlens():
    """An int cache_seqlens is every sequence's length (FlashAttention-3 makes the tensor the same
    way): the same results as the tensor, bit for bit."""
    p = _simple(fill="1023", leftpad=False)
    want = p.run()
    got = p.run(cache_seqlens=1023)
    for w, g in zip(want, got):
        assert torch.equal(_bits(w), _bits(g))
    ref = p.reference()
    _check_result(p, ref, *got, "int cache_seqlens")


@pytest.mark.parametrize("leftpad", [False, True])
def test_cache_seqlens_none(leftpad):
    """No cache_seqlens (and no k / v): every entry holds seqlen_cache rows."""
    p = _simple(s_new=0, rotary=None, leftpad=leftpad, fill="1023", seqlen_cache=700)
    p.cache_seqlens = None
    if leftpad:
        p.cache_leftpad = torch.tensor([0, 350, 699], dtype=torch.int32, device=DEV)
    ref = p.reference()
    for ns in NUM_SPLITS:
        _check_result(p, ref, *p.run(num_splits=ns), f"cache_seqlens=None num_splits={ns}")


@pytest.mark.parametrize("interleaved", [True, False])
def test_rotary_seqlens(interleaved):
    """rotary_seqlens: the new rows (and q) are rotated from rotary_seqlens[b] instead of
    cache_seqlens[b]; the append position stays cache_seqlens[b]."""
    for causal in (False, True):
        p = _simple(rotary=(interleaved, 0.5), causal=causal, sq=7, s_new=3)
        p.rotary_seqlens = (p.cache_seqlens // 2 + torch.tensor([0, 5, 100], device=DEV, dtype=torch.int32))
        p.rotary_seqlens = p.rotary_seqlens.to(torch.int32)
        ref = p.reference()
        for ns in (1, 0):
            _check_result(p, ref, *p.run(num_splits=ns), f"rotary_seqlens causal={causal} num_splits={ns}")


def test_strided_inputs():
    """q sliced along seqlen (its rows are not one stride apart: copied), new rows and caches sliced
    along the heads (used in place: the other heads of the cache storage are not touched)."""
    p = _simple(hq=8, hkv=2, sq=5, s_new=6)
    b, sq, hq, d = p.q.shape
    q_store = torch.randn(b, sq + 3, hq, d, device=DEV, dtype=p.dtype)
    q_store[:, :sq] = p.q
    k_store = torch.randn(b, 6, 4, d, device=DEV, dtype=p.dtype)
    v_store = torch.randn(b, 6, 4, d, device=DEV, dtype=p.dtype)
    k_store[:, :, ::2], v_store[:, :, ::2] = p.k, p.v
    ref = p.reference()
    for ns in (1, 0, 3):
        kc_store = torch.randn(*p.k_cache.shape[:2], 4, d, device=DEV, dtype=p.dtype)
        vc_store = torch.randn(*p.v_cache.shape[:2], 4, d, device=DEV, dtype=p.dtype)
        kc_store[:, :, 1::2], vc_store[:, :, 1::2] = p.k_cache, p.v_cache
        other_k, other_v = kc_store[:, :, 0::2].clone(), vc_store[:, :, 0::2].clone()
        kc, vc = kc_store[:, :, 1::2], vc_store[:, :, 1::2]
        out, lse = flash_attn_with_kvcache(q_store[:, :sq], kc, vc, k_store[:, :, ::2], v_store[:, :, ::2],
                                           return_softmax_lse=True, num_splits=ns, **p.kwargs())
        _check_result(p, ref, out, lse, kc, vc, f"strided num_splits={ns}")
        assert torch.equal(_bits(kc_store[:, :, 0::2]), _bits(other_k))
        assert torch.equal(_bits(vc_store[:, :, 0::2]), _bits(other_v))


def test_rows_past_the_cache_are_dropped():
    """New rows at or past seqlen_cache are not written (nothing outside the cache is touched); the
    rows that fit are. Only the caches are checked (the attention over such a sequence is the
    caller's contract)."""
    p = _simple(rotary=None, leftpad=False, batch_idx=True, s_new=17, fill="1023", seqlen_cache=1030)
    p.cache_seqlens = torch.tensor([1020, 1029, 1013], dtype=torch.int32, device=DEV)  # 10, 1, 17 rows fit
    want_k, want_v = p.k_cache.clone(), p.v_cache.clone()
    for i in range(BATCH):
        e, n = int(p.cache_batch_idx[i]), int(p.cache_seqlens[i])
        fit = min(17, 1030 - n)
        want_k[e, n:n + fit] = p.k[i, :fit]
        want_v[e, n:n + fit] = p.v[i, :fit]
    _, _, kc, vc = p.run(num_splits=0)
    _assert_bitwise("k_cache", kc, want_k)
    _assert_bitwise("v_cache", vc, want_v)


def test_softcap():
    """softcap > 0 (no split kernel: the unsplit one runs whatever num_splits asks), FlashAttention-3's
    factor 3 in the tolerance rule."""
    skip_unless_softcap_built(torch.bfloat16, 128, 128)
    p = _simple(sq=4, s_new=3)
    ref = p.reference(softcap=5.0)
    for ns in (1, 0, 3):
        _check_result(p, ref, *p.run(num_splits=ns, softcap=5.0), f"softcap num_splits={ns}", softcap=5.0)


def test_softmax_scale():
    p = _simple(rotary=None)
    for scale in (0.0, 0.05, 1.0):
        ref = p.reference(softmax_scale=scale)
        _check_result(p, ref, *p.run(softmax_scale=scale), f"softmax_scale={scale}")


def test_return_value_and_no_autograd():
    """out alone without return_softmax_lse; no autograd: outputs never require grad; the caches'
    version counters are bumped only when k / v are written."""
    p = _simple()
    q = p.q.clone().requires_grad_(True)
    kc, vc = p.k_cache.clone(), p.v_cache.clone()
    v0k, v0v = kc._version, vc._version
    out = flash_attn_with_kvcache(q, kc, vc, p.k, p.v, **p.kwargs())
    assert isinstance(out, torch.Tensor) and not out.requires_grad and out.grad_fn is None
    assert kc._version > v0k and vc._version > v0v
    v1k = kc._version
    out, lse = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=p.cache_seqlens, return_softmax_lse=True)
    assert not out.requires_grad and not lse.requires_grad
    assert kc._version == v1k, "k_cache's version bumped by a call without k / v"


def test_scheduler_metadata():
    """get_scheduler_metadata: a CPU int32 [num_splits, pack_gqa] plan; passing it (tensor or tuple)
    gives the same bits as passing its values as num_splits / pack_gqa; explicit requests are
    honoured (num_splits=1: no split; pack_gqa=False: not packed)."""
    p = _simple(sq=1, s_new=1, fill="1023", hq=16, hkv=2)
    md = get_scheduler_metadata(BATCH, 1, SEQLEN_CACHE, 16, 2, 128, p.cache_seqlens, torch.bfloat16,
                                max_seqlen_k_new=1, causal=True)
    assert md.device.type == "cpu" and md.dtype == torch.int32 and md.shape == (2,)
    ns, pack = md.tolist()
    assert 1 <= ns <= 256 and pack in (0, 1)
    a = p.run(scheduler_metadata=md)
    b = p.run(scheduler_metadata=tuple(md.tolist()))
    c = p.run(num_splits=ns, pack_gqa=bool(pack))
    for x, y, z in zip(a, b, c):
        assert torch.equal(_bits(x), _bits(y)) and torch.equal(_bits(x), _bits(z))
    md1 = get_scheduler_metadata(BATCH, 1, SEQLEN_CACHE, 16, 2, 128, p.cache_seqlens, num_splits=1, pack_gqa=False)
    assert md1.tolist() == [1, 0]
    md3 = get_scheduler_metadata(BATCH, 1, SEQLEN_CACHE, 16, 2, 128, p.cache_seqlens, num_splits=3)
    assert 1 <= md3.tolist()[0] <= 3
    # Without a CUDA cache_seqlens: the current device decides.
    md_none = get_scheduler_metadata(BATCH, 1, SEQLEN_CACHE, 16, 2, 128, None, torch.bfloat16, max_seqlen_k_new=1,
                                     causal=True)
    assert md_none.tolist() == md.tolist()


def _graph_capture(fn, warmup=3):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        result = fn()
    return g, result


@pytest.mark.parametrize("with_metadata", [False, True])
def test_cuda_graph(with_metadata):
    """A decode step captured once and replayed with new q / k / v and new cache_seqlens /
    cache_batch_idx / cache_leftpad values: the int32 arrays are read on the device, so every replay
    appends at the new positions and attends to the new lengths."""
    p = _simple(sq=1, s_new=1, hq=16, hkv=2, causal=True)
    md = None
    if with_metadata:
        md = get_scheduler_metadata(BATCH, 1, SEQLEN_CACHE, 16, 2, 128, p.cache_seqlens, torch.bfloat16,
                                    max_seqlen_k_new=1, causal=True)
    kc, vc = p.k_cache.clone(), p.v_cache.clone()
    q, k, v = p.q.clone(), p.k.clone(), p.v.clone()
    seqlens, bidx, lpad = p.cache_seqlens.clone(), p.cache_batch_idx.clone(), p.cache_leftpad.clone()

    def step():
        return flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=p.rotary_cos, rotary_sin=p.rotary_sin,
                                       cache_seqlens=seqlens, cache_batch_idx=bidx, cache_leftpad=lpad, causal=True,
                                       scheduler_metadata=md, return_softmax_lse=True)
    g, (out, lse) = _graph_capture(step)
    for it in range(3):
        n = _simple(sq=1, s_new=1, hq=16, hkv=2, causal=True, seed=100 + it)
        n.rotary_cos, n.rotary_sin = p.rotary_cos, p.rotary_sin
        n.k_cache, n.v_cache = kc.clone(), vc.clone()  # the cache as the earlier replays left it
        for dst, src in ((q, n.q), (k, n.k), (v, n.v), (seqlens, n.cache_seqlens), (bidx, n.cache_batch_idx),
                         (lpad, n.cache_leftpad)):
            dst.copy_(src)
        ref = n.reference()
        g.replay()
        torch.cuda.synchronize()
        _check_result(n, ref, out, lse, kc, vc, f"replay {it}")


def test_compile():
    """torch.compile(fullgraph=True) (the fake implementation; the caches mutated in place through
    the traced graph) computes what eager does, bit for bit; the plan as a tuple traces too."""
    p = _simple(sq=4, s_new=2)
    md = get_scheduler_metadata(BATCH, 4, SEQLEN_CACHE, 16, 2, 128, p.cache_seqlens, torch.bfloat16,
                                max_seqlen_k_new=2, causal=True)
    plan = tuple(md.tolist())

    def f(q, kc, vc, k, v, seqlens, bidx, lpad, cos, sin):
        return flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
                                       cache_batch_idx=bidx, cache_leftpad=lpad, causal=True,
                                       scheduler_metadata=plan, return_softmax_lse=True)
    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, dynamic=False)
    args = (p.q, p.cache_seqlens, p.cache_batch_idx, p.cache_leftpad, p.rotary_cos, p.rotary_sin)
    kc1, vc1, kc2, vc2 = p.k_cache.clone(), p.v_cache.clone(), p.k_cache.clone(), p.v_cache.clone()
    want = f(p.q, kc1, vc1, p.k, p.v, *args[1:])
    got = cf(p.q, kc2, vc2, p.k, p.v, *args[1:])
    assert torch.equal(_bits(got[0]), _bits(want[0])) and torch.equal(_bits(got[1]), _bits(want[1]))
    assert got[1].stride() == want[1].stride(), "softmax_lse's layout differs under torch.compile"
    _assert_bitwise("k_cache (compiled)", kc2, kc1)
    _assert_bitwise("v_cache (compiled)", vc2, vc1)


@pytest.mark.parametrize("new_rows", [False, True])
def test_opcheck(new_rows):
    """Schema (k_cache / v_cache mutated in place, declared (a!) / (b!)), fake implementation vs
    the real kernel (shapes, strides: softmax_lse's permuted layout), autograd registration, AOT
    dispatch."""
    p = _simple(sq=4, s_new=3 if new_rows else 0, rotary=(False, 0.5) if new_rows else None)
    args = (p.q, p.k_cache.clone(), p.v_cache.clone(), p.k, p.v, p.rotary_cos, p.rotary_sin, p.cache_seqlens,
            p.cache_batch_idx, p.cache_leftpad, None, None, None, True, -1, -1, 0.0, p.rotary_interleaved, 0, -1)
    torch.library.opcheck(torch.ops.flash3.fwd_kvcache.default, args)
    out = torch.empty(p.q.shape[:-1] + (p.v_cache.shape[-1],), dtype=p.q.dtype, device=DEV)
    torch.library.opcheck(torch.ops.flash3.fwd_kvcache_out.default, args, {"out": out})


def test_out_argument():
    """out= receives the result in place (bit-identical to a call without it); a wrong out is a
    ValueError / TypeError naming out, raised before anything is written."""
    p = _simple(sq=4, s_new=3)
    kc, vc = p.k_cache.clone(), p.v_cache.clone()
    want, want_lse = flash_attn_with_kvcache(p.q, kc, vc, p.k, p.v, return_softmax_lse=True, **p.kwargs())
    kc, vc = p.k_cache.clone(), p.v_cache.clone()
    out = torch.full_like(want, float("nan"))
    got, lse = flash_attn_with_kvcache(p.q, kc, vc, p.k, p.v, out=out, return_softmax_lse=True, **p.kwargs())
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(_bits(out), _bits(want)) and torch.equal(_bits(lse), _bits(want_lse))
    for bad, exc in ((out.float(), TypeError), (out[:, :1], ValueError), (out.transpose(1, 2), ValueError),
                     (out.cpu(), ValueError)):
        kc, vc = p.k_cache.clone(), p.v_cache.clone()
        saved = bad.clone()
        with pytest.raises(exc, match="out"):
            flash_attn_with_kvcache(p.q, kc, vc, p.k, p.v, out=bad, **p.kwargs())
        torch.cuda.synchronize()
        assert torch.equal(_bits(kc), _bits(p.k_cache)), "cache written"
        assert torch.equal(_bits(bad.cpu()), _bits(saved.cpu())), "out written"


def test_forward_plan_op():
    """The forward_plan operator (no tensor arguments) returns [num_splits, pack_gqa]."""
    plan = torch.ops.flash3.forward_plan(torch.bfloat16, 2, 1, 4096, 32, 8, 128, 128)
    assert isinstance(plan, list) and len(plan) == 2 and plan[0] >= 1 and plan[1] in (0, 1)
    assert torch.ops.flash3.forward_plan(torch.float16, 2, 1, 4096, 32, 8, 128, 128, num_splits=1,
                                         pack_gqa=0) == [1, 0]


# ---------------------------------------------------------------------------
# Errors: raised before anything is launched or written, naming the argument.
# ---------------------------------------------------------------------------
def _err_problem():
    return _simple(d=128, sq=2, s_new=3, hq=8, hkv=2, fill="random")


def _set(**changes):
    """A case: the good call with some arguments replaced (values may be functions of the problem)."""
    def make(p):
        kw = dict(p.kwargs(), k=p.k, v=p.v)
        for name, val in changes.items():
            kw[name] = val(p) if callable(val) else val
        return kw
    return make


I32 = torch.int32
ERRORS = {
    # name: (make kwargs, exception, substrings of the message)
    "cache_seqlens_int64": (_set(cache_seqlens=lambda p: p.cache_seqlens.long()), TypeError,
                            ["cache_seqlens.dtype", "torch.int64", "torch.int32"]),
    "cache_seqlens_cpu": (_set(cache_seqlens=lambda p: p.cache_seqlens.cpu()), ValueError, ["cache_seqlens", "CUDA"]),
    "cache_seqlens_shape": (_set(cache_seqlens=lambda p: torch.zeros(BATCH + 1, dtype=I32, device=DEV)), ValueError,
                            ["cache_seqlens", "4 entries", "expected 3"]),
    "cache_seqlens_2d": (_set(cache_seqlens=lambda p: p.cache_seqlens.view(-1, 1)), ValueError,
                         ["cache_seqlens", "1-d"]),
    "cache_seqlens_strided": (_set(cache_seqlens=lambda p: torch.zeros(2 * BATCH, dtype=I32, device=DEV)[::2]),
                              ValueError, ["cache_seqlens", "contiguous"]),
    "cache_seqlens_negative_int": (_set(cache_seqlens=-1), ValueError, ["cache_seqlens", "-1"]),
    "cache_seqlens_float": (_set(cache_seqlens=3.0), TypeError, ["cache_seqlens", "float"]),
    "cache_seqlens_missing_with_k": (_set(cache_seqlens=None), ValueError, ["cache_seqlens", "k / v"]),
    "cache_batch_idx_int64": (_set(cache_batch_idx=lambda p: p.cache_batch_idx.long()), TypeError,
                              ["cache_batch_idx.dtype"]),
    "cache_leftpad_cpu": (_set(cache_leftpad=lambda p: p.cache_leftpad.cpu()), ValueError, ["cache_leftpad", "CUDA"]),
    "rotary_seqlens_shape": (_set(rotary_seqlens=lambda p: torch.zeros(1, dtype=I32, device=DEV)), ValueError,
                             ["rotary_seqlens", "entries"]),
    "page_table_with_softcap": (_set(page_table=lambda p: torch.zeros(BATCH, 4, dtype=I32, device=DEV),
                                     cache_batch_idx=None, cache_leftpad=None, rotary_cos=None, rotary_sin=None,
                                     softcap=5.0),
                                NotImplementedError, ["page_table", "softcap"]),
    "qv": (_set(qv=lambda p: torch.zeros_like(p.q)), NotImplementedError, ["qv"]),
    "q_descale": (_set(q_descale=lambda p: torch.ones(1, device=DEV)), NotImplementedError, ["descale"]),
    "attention_chunk": (_set(attention_chunk=64), NotImplementedError, ["attention_chunk"]),
    "sm_margin_negative": (_set(sm_margin=-1), ValueError, ["sm_margin", "-1"]),
    "sm_margin_float": (_set(sm_margin=1.5), TypeError, ["sm_margin"]),
    "k_without_v": (_set(v=None), ValueError, ["k and v", "v is None"]),
    "v_without_k": (_set(k=None, rotary_cos=None, rotary_sin=None), ValueError, ["k and v", "k is None"]),
    "rotary_without_k": (_set(k=None, v=None), ValueError, ["rotary_cos", "need k and v"]),
    "rotary_cos_without_sin": (_set(rotary_sin=None), ValueError, ["rotary_sin is None"]),
    "rotary_dim_too_large": (_set(rotary_cos=lambda p: torch.ones(SEQLEN_RO, 128, dtype=p.dtype, device=DEV),
                                  rotary_sin=lambda p: torch.zeros(SEQLEN_RO, 128, dtype=p.dtype, device=DEV)),
                             ValueError, ["rotary_cos.shape[1]", "128"]),
    "rotary_sin_shape": (_set(rotary_sin=lambda p: p.rotary_sin[:, :8]), ValueError, ["rotary_sin", "shape"]),
    "rotary_table_short": (_set(rotary_cos=lambda p: p.rotary_cos[:100], rotary_sin=lambda p: p.rotary_sin[:100]),
                           ValueError, ["seqlen_ro", "100", str(SEQLEN_CACHE)]),
    "rotary_table_1d": (_set(rotary_cos=lambda p: p.rotary_cos[0], rotary_sin=lambda p: p.rotary_sin[0]),
                        ValueError, ["rotary_cos", "2-d"]),
    "rotary_dtype": (_set(rotary_cos=lambda p: p.rotary_cos.float(), rotary_sin=lambda p: p.rotary_sin.float()),
                     TypeError, ["rotary_cos.dtype"]),
    "k_dtype": (_set(k=lambda p: p.k.half()), TypeError, ["k.dtype"]),
    "k_heads": (_set(k=lambda p: p.k[:, :, :1], v=lambda p: p.v[:, :, :1]), ValueError, ["k.shape[2]", "num_heads_kv"]),
    "k_head_dim": (_set(k=lambda p: p.k[..., :64].contiguous()), ValueError, ["k.shape[3]", "head_dim"]),
    "k_batch": (_set(k=lambda p: p.k[:1], v=lambda p: p.v[:1]), ValueError, ["k.shape[0]", "batch"]),
    "v_seqlen_new": (_set(v=lambda p: p.v[:, :1]), ValueError, ["v.shape[1]", "seqlen_new"]),
    "k_on_cpu": (_set(k=lambda p: p.k.cpu()), ValueError, ["k", "CUDA"]),
    "num_splits_negative": (_set(num_splits=-1), ValueError, ["num_splits is -1"]),
    "num_splits_float": (_set(num_splits=2.0), TypeError, ["num_splits"]),
    "pack_gqa_int": (_set(pack_gqa=2), TypeError, ["pack_gqa"]),
    "softcap_negative": (_set(softcap=-1.0), ValueError, ["softcap"]),
    "softmax_scale_negative": (_set(softmax_scale=-1.0), ValueError, ["softmax_scale"]),
    "md_int64": (_set(scheduler_metadata=torch.tensor([1, 0])), TypeError, ["scheduler_metadata.dtype", "int32"]),
    "md_cuda": (_set(scheduler_metadata=lambda p: torch.tensor([1, 0], dtype=I32, device=DEV)), ValueError,
                ["scheduler_metadata", "CPU"]),
    "md_shape": (_set(scheduler_metadata=torch.tensor([1, 0, 0], dtype=I32)), ValueError,
                 ["scheduler_metadata", "shape", "(2,)"]),
    "md_values": (_set(scheduler_metadata=torch.tensor([0, 0], dtype=I32)), ValueError,
                  ["scheduler_metadata", "num_splits"]),
    "md_pack_value": (_set(scheduler_metadata=(2, 5)), ValueError, ["scheduler_metadata", "pack_gqa"]),
    "md_type": (_set(scheduler_metadata="auto"), TypeError, ["scheduler_metadata"]),
}

# Paths whose kernels exist only in a build with FLASH3_SERVING_WIP (not yet run on a GPU):
# without it they are refused before anything is launched, naming the argument.
if not flash3._C.serving_wip():
    ERRORS.update({
        "page_table_with_cache_batch_idx": (_set(page_table=lambda p: torch.zeros(BATCH, 4, dtype=I32, device=DEV)),
                                            NotImplementedError, ["page_table", "cache_batch_idx"]),
        "cu_seqlens_q": (_set(cu_seqlens_q=lambda p: torch.zeros(BATCH + 1, dtype=I32, device=DEV)),
                         NotImplementedError, ["cu_seqlens_q", "FLASH3_SERVING_WIP"]),
        "cu_seqlens_k_new": (_set(cu_seqlens_k_new=lambda p: torch.zeros(BATCH + 1, dtype=I32, device=DEV)),
                             NotImplementedError, ["cu_seqlens_k_new", "FLASH3_SERVING_WIP"]),
    })

CACHE_ERRORS = {
    # name: (change the caches (k_cache, v_cache) -> (k_cache, v_cache), exception, substrings)
    "k_cache_cpu": (lambda kc, vc: (kc.cpu(), vc), ValueError, ["k_cache", "CUDA"]),
    "v_cache_dtype": (lambda kc, vc: (kc, vc.half()), TypeError, ["v_cache.dtype"]),
    "k_cache_3d": (lambda kc, vc: (kc[0], vc), ValueError, ["k_cache", "4-d"]),
    "v_cache_seqlen": (lambda kc, vc: (kc, vc[:, :100]), ValueError, ["v_cache.shape[1]", "seqlen_cache"]),
    "k_cache_head_dim": (lambda kc, vc: (kc[..., :64].contiguous(), vc), ValueError, ["k_cache.shape[3]", "head_dim"]),
    "k_cache_heads_not_divisor": (lambda kc, vc: (torch.cat([kc, kc[:, :, :1]], 2), torch.cat([vc, vc[:, :, :1]], 2)),
                                  ValueError, ["num_heads_q", "multiple"]),
    "k_cache_last_dim_strided": (lambda kc, vc: (torch.cat([kc, kc], -1)[..., ::2], vc), ValueError,
                                 ["k_cache.stride(-1)"]),
    "k_cache_sliced_along_seqlen": (lambda kc, vc: (torch.cat([kc, kc], 1)[:, :kc.shape[1]], vc), ValueError,
                                    ["k_cache.stride(0)", "one stride apart"]),
}


def _assert_message(e, words):
    msg = str(e)
    for w in words:
        assert w in msg, f"message lacks {w!r}: {msg}"


@pytest.mark.parametrize("case", list(ERRORS), ids=list(ERRORS))
def test_bad_argument_raises(case):
    make, exc, words = ERRORS[case]
    p = _err_problem()
    kw = make(p)
    kc, vc = p.k_cache.clone(), p.v_cache.clone()
    with pytest.raises(exc) as ei:
        flash_attn_with_kvcache(p.q, kc, vc, **kw)
    _assert_message(ei.value, words)
    torch.cuda.synchronize()
    assert torch.equal(_bits(kc), _bits(p.k_cache)) and torch.equal(_bits(vc), _bits(p.v_cache)), "cache written"


@pytest.mark.parametrize("case", list(CACHE_ERRORS), ids=list(CACHE_ERRORS))
def test_bad_cache_raises(case):
    change, exc, words = CACHE_ERRORS[case]
    p = _err_problem()
    kc, vc = change(p.k_cache.clone(), p.v_cache.clone())
    saved = (kc.clone(), vc.clone())
    with pytest.raises(exc) as ei:
        flash_attn_with_kvcache(p.q, kc, vc, p.k, p.v, **p.kwargs())
    _assert_message(ei.value, words)
    assert torch.equal(kc.cpu(), saved[0].cpu()) and torch.equal(vc.cpu(), saved[1].cpu()), "cache written"


def test_cache_size_errors():
    """Without cache_batch_idx sequence b uses cache entry b: batch_cache < batch is an error; a
    cache shorter than the new rows is one too. Both name the argument and write nothing."""
    p = _err_problem()
    kc, vc = p.k_cache[:2].clone(), p.v_cache[:2].clone()
    kw = dict(p.kwargs(), cache_batch_idx=None)
    with pytest.raises(ValueError, match=r"k_cache.shape\[0\] \(batch_cache\) is 2, less than q.shape\[0\]"):
        flash_attn_with_kvcache(p.q, kc, vc, p.k, p.v, **kw)
    # With an index a smaller cache is fine (entries may repeat when nothing is appended).
    out = flash_attn_with_kvcache(p.q, kc, vc, cache_seqlens=torch.tensor([5, 0, 9], dtype=I32, device=DEV),
                                  cache_batch_idx=torch.tensor([1, 0, 1], dtype=I32, device=DEV))
    assert out.shape == (BATCH, 2, 8, 128) and not torch.isnan(out).any()
    small_k, small_v = torch.zeros(BATCH, 2, 2, 128, device=DEV, dtype=p.dtype), torch.zeros(
        BATCH, 2, 2, 128, device=DEV, dtype=p.dtype)
    kw = dict(p.kwargs(), rotary_cos=None, rotary_sin=None)
    with pytest.raises(ValueError, match=r"k.shape\[1\] \(seqlen_new\) is 3; expected at most k_cache.shape\[1\]"):
        flash_attn_with_kvcache(p.q, small_k, small_v, p.k, p.v, **kw)
    assert not small_k.any() and not small_v.any()


def test_rotary_seqlens_ignored_without_rotary():
    """rotary_seqlens without rotary tables changes nothing (FlashAttention-3 ignores it too)."""
    p = _simple(rotary=None)
    want = p.run()
    got = p.run(rotary_seqlens=p.cache_seqlens + 7)
    for w, g in zip(want, got):
        assert torch.equal(_bits(w), _bits(g))


def test_no_kernel_launched_on_error():
    """Invalid calls (checked in Python, in the operator and by the library) queue no GPU work."""
    from torch.profiler import ProfilerActivity, profile

    p = _err_problem()
    kc, vc = p.k_cache.clone(), p.v_cache.clone()
    bad_seqlens = p.cache_seqlens.long()
    page_table = torch.zeros(BATCH, 4, dtype=I32, device=DEV)  # (made outside the profiled region: a fill kernel)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with pytest.raises(NotImplementedError):  # page_table with softcap (the operator's check)
            kw = dict(p.kwargs(), cache_batch_idx=None, cache_leftpad=None, rotary_cos=None, rotary_sin=None,
                      softcap=5.0)
            flash_attn_with_kvcache(p.q, kc, vc, p.k, p.v, page_table=page_table, **kw)
        kw = dict(p.kwargs(), cache_seqlens=bad_seqlens)
        with pytest.raises(TypeError):
            flash_attn_with_kvcache(p.q, kc, vc, p.k, p.v, **kw)
        with pytest.raises(ValueError):
            torch.ops.flash3.fwd_kvcache(p.q, kc, vc, p.k, p.v, None, None, p.cache_seqlens, None, None, None, None,
                                         None, False, -1, -1, 0.0, True, 0, 5)  # pack_gqa 5
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert not kernels, f"kernels launched by an invalid call: {kernels}"


@pytest.mark.parametrize("case", ["cache_seqlens_int64", "k_without_v", "rotary_dim_too_large", "k_heads"])
def test_bad_argument_raises_under_compile(case):
    """A compiled call raises what the eager call raises (the fake implementation checks the scalar
    options while tracing; the operator checks the rest when the graph runs, before it launches or
    writes anything)."""
    make, exc, words = ERRORS[case]
    p = _err_problem()
    kw = make(p)
    torch._dynamo.reset()
    f = torch.compile(lambda q, kc, vc: flash_attn_with_kvcache(q, kc, vc, **kw), fullgraph=True, dynamic=False)
    with pytest.raises(Exception) as ei:
        f(p.q, p.k_cache.clone(), p.v_cache.clone())
    e = ei.value
    chain = [e]
    while len(chain) < 10 and (chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    assert any(isinstance(x, exc) for x in chain) or f"{exc.__name__}(" in str(e), f"{type(e).__name__}: {e}"
    for w in words:
        assert w in str(e), f"message lacks {w!r}: {e}"


GSM_ERRORS = {
    "page_size_zero": (dict(page_size=0), ValueError, ["page_size is 0"]),
    "page_size_float": (dict(page_size=16.0), TypeError, ["page_size"]),
    "attention_chunk": (dict(attention_chunk=64), NotImplementedError, ["attention_chunk"]),
    "sm_margin_negative": (dict(sm_margin=-1), ValueError, ["sm_margin", "-1"]),
    "dtype_fp32": (dict(qkv_dtype=torch.float32), TypeError, ["dtype", "float32"]),
    "batch_zero": (dict(batch_size=0), ValueError, ["batch_size", "0"]),
    "headdim_float": (dict(headdim=128.0), TypeError, ["headdim"]),
    "num_splits_bad": (dict(num_splits=300), ValueError, ["num_splits is 300"]),
    "pack_gqa_bad": (dict(pack_gqa="yes"), TypeError, ["pack_gqa"]),
}


@pytest.mark.parametrize("case", list(GSM_ERRORS), ids=list(GSM_ERRORS))
def test_get_scheduler_metadata_errors(case):
    changes, exc, words = GSM_ERRORS[case]
    kw = dict(batch_size=2, max_seqlen_q=1, max_seqlen_k=1024, num_heads_q=8, num_heads_kv=2, headdim=128,
              cache_seqlens=torch.zeros(2, dtype=I32, device=DEV))
    kw.update(changes)
    with pytest.raises(exc) as ei:
        get_scheduler_metadata(**kw)
    _assert_message(ei.value, words)


# ---------------------------------------------------------------------------
# Variable-length queries and new rows (FLASH3_SERVING_WIP builds): the call vLLM and SGLang make,
# a batch mixing prefill chunks and decode tokens, each sequence's new rows its own queries' keys.
# ---------------------------------------------------------------------------
def _prefix(lens):
    return torch.tensor([0] + list(itertools.accumulate(lens)), dtype=I32, device=DEV)


VARLEN_LAYOUTS = {
    # name: (query rows per sequence, new rows per sequence, cache entries)
    "mixed": ([1, 7, 0, 130, 1], [1, 7, 0, 130, 1], 7),
    "decode": ([1] * 6, [1] * 6, 8),
    "prefix_only": ([3, 0, 64], [0, 0, 0], 4),
    "append_only": ([0, 0, 0], [2, 0, 5], 4),
}


@pytest.mark.skipif(not flash3._C.serving_wip(), reason="built without FLASH3_SERVING_WIP")
@pytest.mark.parametrize("page_size", [0, 1, 16, 256])
@pytest.mark.parametrize("layout", list(VARLEN_LAYOUTS))
def test_varlen_queries(layout, page_size):
    """cu_seqlens_q / max_seqlen_q and cu_seqlens_k_new with cache_batch_idx, cache_leftpad, rotary,
    causal and the split heuristic, on a contiguous cache and on page pools (unused pages NaN):
    per sequence against kvcache_ref (FlashAttention's rule on out and softmax_lse, the caches bit
    for bit); out= written in place; q rows no sequence covers left untouched."""
    dtype, hq, hkv, d, cap = torch.bfloat16, 16, 2, 128, 512
    skip_unless_paged_built(dtype, d, d) if page_size else skip_unless_built(dtype, d, d)
    qlens, newlens, entries = VARLEN_LAYOUTS[layout]
    b = len(qlens)
    g = torch.Generator(device=DEV).manual_seed(list(VARLEN_LAYOUTS).index(layout) * 1000 + page_size)
    rnd = lambda *shape: torch.randn(*shape, device=DEV, dtype=dtype, generator=g)  # noqa: E731
    total_q, total_new = sum(qlens), sum(newlens)
    q = rnd(total_q + 3, hq, d)  # 3 rows past cu_seqlens_q[-1]
    kn, vn = rnd(max(total_new, 1), hkv, d)[:total_new], rnd(max(total_new, 1), hkv, d)[:total_new]
    idx = torch.randperm(entries, device=DEV, generator=g)[:b].to(I32)
    lpad = torch.randint(0, 20, (b,), device=DEV, dtype=I32, generator=g)
    room = torch.tensor([cap - n for n in newlens], device=DEV, dtype=I32) - lpad
    seqlens = lpad + (torch.rand(b, device=DEV, generator=g) * (room + 1).float()).floor().to(I32).clamp(max=room)
    angle = torch.rand(cap, d // 2, device=DEV, generator=g) * 2 * math.pi
    cos, sin = torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)
    k_log, v_log = rnd(entries, cap, hkv, d), rnd(entries, cap, hkv, d)
    if page_size:
        pages = cap // page_size
        perm = torch.randperm(entries * pages + 3, device=DEV, generator=g)
        table = perm[:entries * pages].view(entries, pages).to(I32)
        pool_k = torch.full((entries * pages + 3, page_size, hkv, d), float("nan"), device=DEV, dtype=dtype)
        pool_v = pool_k.clone()
        pool_k[perm[:entries * pages]] = k_log.reshape(-1, page_size, hkv, d)
        pool_v[perm[:entries * pages]] = v_log.reshape(-1, page_size, hkv, d)
        kc, vc = pool_k.clone(), pool_v.clone()
    else:
        table, kc, vc = None, k_log.clone(), v_log.clone()
    out = torch.full((q.shape[0], hq, d), 3.0, device=DEV, dtype=dtype)  # a sentinel no result takes exactly
    res, lse = flash_attn_with_kvcache(q, kc, vc, kn if total_new else None, vn if total_new else None,
                                       rotary_cos=cos if total_new else None, rotary_sin=sin if total_new else None,
                                       cache_seqlens=seqlens, cache_batch_idx=idx, cache_leftpad=lpad,
                                       page_table=table, cu_seqlens_q=_prefix(qlens),
                                       cu_seqlens_k_new=_prefix(newlens) if total_new else None,
                                       max_seqlen_q=max(qlens), causal=True, num_splits=0, out=out,
                                       return_softmax_lse=True)
    torch.cuda.synchronize()
    assert res.data_ptr() == out.data_ptr() and lse.shape == (hq, q.shape[0]) and lse.dtype == torch.float32
    assert bool((out[total_q:] == 3.0).all()), "out rows past cu_seqlens_q[-1] written"
    want_k, want_v = k_log.clone(), v_log.clone()
    cu_q, cu_n = _prefix(qlens).tolist(), _prefix(newlens).tolist()
    for i in range(b):
        e, n = int(idx[i]), newlens[i]
        new = (kn[cu_n[i]:cu_n[i] + n][None], vn[cu_n[i]:cu_n[i] + n][None]) if n else (None, None)
        ref = kvcache_ref(q[cu_q[i]:cu_q[i + 1]][None], k_log[e:e + 1], v_log[e:e + 1], *new,
                          rotary_cos=cos if total_new else None, rotary_sin=sin if total_new else None,
                          cache_seqlens=seqlens[i:i + 1], cache_leftpad=lpad[i:i + 1], causal=True,
                          rotary_interleaved=True)
        want_k[e], want_v[e] = ref["k_cache"][0], ref["v_cache"][0]
        if qlens[i] == 0:
            continue
        what = f"{layout} page_size {page_size} sequence {i}"
        o, l = out[cu_q[i]:cu_q[i + 1]], lse[:, cu_q[i]:cu_q[i + 1]]
        assert not torch.isnan(o).any(), f"{what}: NaN in out"
        e_ours, e_base = max_err(o, ref["out"][0]), max_err(ref["out_lowp"][0], ref["out"][0])
        atol = rounding_atol(ref["out"], dtype)
        assert e_ours <= 2 * e_base + atol, f"{what}: out: {e_ours:.3e} > 2 * {e_base:.3e} + {atol:.1e}"
        ok, err, base, bound, nans = check_close(l, ref["lse"][0], ref["lse_lowp"][0], EPS_LSE)
        assert ok, f"{what}: softmax_lse: err {err:.3e} > bound {bound:.3e} ({nans} NaN)"
    if page_size:  # the pools read back through the table; unused pages still NaN
        got_k = kc[table.long()].reshape(entries, cap, hkv, d)
        got_v = vc[table.long()].reshape(entries, cap, hkv, d)
        unused = perm[entries * pages:]
        assert torch.isnan(kc[unused]).all() and torch.isnan(vc[unused]).all(), "unused pages written"
    else:
        got_k, got_v = kc, vc
    _assert_bitwise("k_cache", got_k, want_k)
    _assert_bitwise("v_cache", got_v, want_v)


def test_public_names():
    assert "flash_attn_with_kvcache" in flash3.__all__ and "get_scheduler_metadata" in flash3.__all__
    assert flash3.flash_attn_with_kvcache is flash_attn_with_kvcache


# ---------------------------------------------------------------------------
# Paged KV caches (page_table): k_cache / v_cache are pools of pages, sequence b's row r at row
# r % page_size of page page_table[b, r // page_size].
# ---------------------------------------------------------------------------
PAGE_SIZES = [1, 16, 64, 256]
PAGED_ROWS = 640  # rows each sequence needs at most (fill + new rows); the capacity rounds it up to whole pages
PAGED_FILLS = ["0", "1", "max", "random"]  # max: the new rows end at the capacity (last page full)
PAGED_TABLES = ["contiguous", "strided"]  # strided: a slice of a wider table (stride(0) > max_num_pages)
PAGED_SPLITS = (1, 0, 3)

PAGED_DIMS = {
    "dtype": list(DTYPES), "d": HDIMS, "page_size": PAGE_SIZES, "sq": SEQLEN_Q, "s_new": SEQLEN_NEW,
    "rotary": list(ROTARY), "mask": list(MASKS), "heads": list(HEADS), "fill": PAGED_FILLS, "pack": PACKS,
    "table": PAGED_TABLES,
}


def _paged_case_id(c):
    return (f"{c['dtype']}-d{c['d']}-page{c['page_size']}-sq{c['sq']}-new{c['s_new']}-rot_{c['rotary']}-{c['mask']}-"
            f"{c['heads']}-fill{c['fill']}-pack{c['pack']}-{c['table']}")


def _paged_matrix(n=150, seed=20250611):
    """As _matrix, a seeded random subset of the valid paged cases (distinct), completed so that
    every value of every dimension appears at least once; drawn dimension by dimension (the full
    product, some 230k cases, is not built)."""
    r = random.Random(seed)
    chosen, seen = [], set()

    def draw(**fixed):
        c = {name: r.choice(values) for name, values in PAGED_DIMS.items()}
        c.update(fixed)
        key = tuple(c.values())
        if _valid(c) and key not in seen:
            seen.add(key)
            chosen.append(c)

    while len(chosen) < n:
        draw()
    for name, values in PAGED_DIMS.items():
        for value in values:
            while not any(c[name] == value for c in chosen):
                draw(**{name: value})
    return chosen


PAGED_CASES = _paged_matrix()


class PagedProblem:
    """A paged flash_attn_with_kvcache call and its contiguous twin: `logical` (a Problem) holds the
    caches as (batch, capacity, hkv, d) tensors, the reference's input; k_pool / v_pool hold the
    same rows scattered into pages through a random permutation of a larger pool, whose pages
    outside page_table are NaN (a kernel reading a wrong page shows as NaN in out)."""

    def __init__(self, dtype, d, page_size, sq, s_new, rotary, causal, window, hq, hkv, fill, seed, table="contiguous",
                 b=BATCH, rows=PAGED_ROWS, dv=None):
        self.max_pages = -(-rows // page_size)
        self.capacity = self.max_pages * page_size
        self.page_size = page_size
        self.logical = Problem(dtype, d, sq, s_new, rotary, causal, window, hq, hkv, False, False, "0", seed, b=b,
                               seqlen_cache=self.capacity, seqlen_ro=self.capacity + 128, dv=dv)
        lg = self.logical
        gc = torch.Generator().manual_seed(seed + 7919)  # host draws: lengths, the page permutation
        if fill == "random":
            lens = torch.randint(0, self.capacity - s_new + 1, (b,), generator=gc)
        elif fill == "max":
            lens = torch.full((b,), self.capacity - s_new)
        else:
            lens = torch.full((b,), int(fill))
        lg.cache_seqlens = lens.to(torch.int32).to(DEV)
        used = b * self.max_pages
        self.num_pages = used + max(3, used // 2)
        perm = torch.randperm(self.num_pages, generator=gc)
        pt = perm[:used].view(b, self.max_pages).to(torch.int32).to(DEV)
        if table == "strided":
            store = torch.full((b, self.max_pages + 5), -1, dtype=torch.int32, device=DEV)
            store[:, :self.max_pages] = pt
            pt = store[:, :self.max_pages]
            assert pt.stride(0) == self.max_pages + 5 and pt.stride(1) == 1
        self.page_table = pt
        self.unused = perm[used:].to(DEV)
        self.k_pool = self.to_pool(lg.k_cache)
        self.v_pool = self.to_pool(lg.v_cache)

    def to_pool(self, logical):
        b, _, h, d = logical.shape
        pool = torch.full((self.num_pages, self.page_size, h, d), float("nan"), dtype=logical.dtype, device=DEV)
        pool[self.page_table.reshape(-1).long()] = logical.reshape(b * self.max_pages, self.page_size, h, d)
        return pool

    def to_logical(self, pool):
        """The pool's rows in each sequence's logical order: (batch, capacity, hkv, d)."""
        b = self.page_table.shape[0]
        return pool[self.page_table.long()].reshape(b, self.capacity, *pool.shape[2:])

    def kwargs(self):
        kw = self.logical.kwargs()
        kw.update(page_table=self.page_table, cache_batch_idx=None, cache_leftpad=None)
        return kw

    def reference(self, softmax_scale=None):
        return self.logical.reference(softmax_scale=softmax_scale)

    def run(self, **kw):
        """flash_attn_with_kvcache on clones of the pools: (out, lse, k_pool, v_pool)."""
        kc, vc = self.k_pool.clone(), self.v_pool.clone()
        args = self.kwargs()
        args.update(kw)
        out, lse = flash_attn_with_kvcache(self.logical.q, kc, vc, self.logical.k, self.logical.v,
                                           return_softmax_lse=True, **args)
        return out, lse, kc, vc

    def check(self, ref, out, lse, kc, vc, what):
        """_check_result on the pools read back in logical order (the appended rows bit for bit, every
        other row untouched), and the pages outside page_table untouched (still NaN, bit for bit)."""
        result = _check_result(self.logical, ref, out, lse, self.to_logical(kc), self.to_logical(vc), what)
        for name, got, orig in (("k", kc, self.k_pool), ("v", vc, self.v_pool)):
            assert torch.equal(_bits(got[self.unused]), _bits(orig[self.unused])), \
                f"{what}: {name} pool: a page outside page_table was written"
        return result


def _paged_problem(c, seed):
    hq, hkv = HEADS[c["heads"]]
    causal, window = MASKS[c["mask"]]
    return PagedProblem(DTYPES[c["dtype"]], c["d"], c["page_size"], c["sq"], c["s_new"], ROTARY[c["rotary"]], causal,
                        window, hq, hkv, c["fill"], seed, table=c["table"])


@pytest.mark.parametrize("case", PAGED_CASES, ids=[_paged_case_id(c) for c in PAGED_CASES])
def test_paged_matches_reference(case):
    """out / softmax_lse against the reference on the logical (contiguous) cache, the appended rows
    bit for bit in their pages, no other page written; num_splits 1, 0 (heuristic) and 3, the split
    results within the tolerance of the unsplit one."""
    dtype, d = DTYPES[case["dtype"]], case["d"]
    skip_unless_paged_built(dtype, d, d)
    p = _paged_problem(case, 1000 + PAGED_CASES.index(case))
    lg = p.logical
    saved = [t.clone() for t in (lg.q, lg.k, lg.v, p.page_table) if t is not None]
    ref = p.reference()
    outs = {}
    for ns in PAGED_SPLITS:
        out, lse, kc, vc = p.run(num_splits=ns, pack_gqa=case["pack"])
        base, atol = p.check(ref, out, lse, kc, vc, f"num_splits={ns}")
        outs[ns] = out
    for ns in PAGED_SPLITS[1:]:
        e = max_err(outs[ns], outs[1])
        assert e <= 2 * base + atol, f"num_splits={ns} vs 1: max diff {e:.3e} > {2 * base + atol:.3e}"
    for t, s in zip([t for t in (lg.q, lg.k, lg.v, p.page_table) if t is not None], saved):
        assert torch.equal(_bits(t), _bits(s)), "an input (q, k, v or page_table) was modified"


def _paged_simple(dtype=torch.bfloat16, d=128, page_size=16, sq=4, s_new=5, rotary=(True, 1.0), causal=True,
                  window=(-1, -1), hq=16, hkv=2, fill="random", seed=1, **kw):
    skip_unless_paged_built(dtype, d, kw.get("dv", d))
    return PagedProblem(dtype, d, page_size, sq, s_new, rotary, causal, window, hq, hkv, fill, seed, **kw)


@pytest.mark.parametrize("page_size", [1, 64])
def test_paged_cache_seqlens_none(page_size):
    """No cache_seqlens (and no k / v): every sequence holds the capacity, max_num_pages * page_size
    rows; an int cache_seqlens gives the same bits as the tensor."""
    p = _paged_simple(page_size=page_size, s_new=0, rotary=None, rows=300)
    p.logical.cache_seqlens = None
    ref = p.reference()
    for ns in PAGED_SPLITS:
        p.check(ref, *p.run(num_splits=ns), f"cache_seqlens=None num_splits={ns}")
    q = _paged_simple(page_size=page_size, s_new=3, fill="max", rows=300)
    want = q.run()
    got = q.run(cache_seqlens=q.capacity - 3)
    for w, g in zip(want, got):
        assert torch.equal(_bits(w), _bits(g))


def test_paged_rows_past_the_capacity_are_dropped():
    """New rows at or past the capacity are not written (no page outside the table, no entry past
    the table's row is used); the rows that fit are."""
    p = _paged_simple(rotary=None, s_new=17, page_size=16, rows=64)
    lg = p.logical
    lg.cache_seqlens = torch.tensor([54, 63, 47], dtype=torch.int32, device=DEV)  # 10, 1, 17 rows fit
    want_k, want_v = lg.k_cache.clone(), lg.v_cache.clone()
    for i in range(BATCH):
        n = int(lg.cache_seqlens[i])
        fit = min(17, p.capacity - n)
        want_k[i, n:n + fit] = lg.k[i, :fit]
        want_v[i, n:n + fit] = lg.v[i, :fit]
    for ns in (1, 0):
        _, _, kc, vc = p.run(num_splits=ns)
        _assert_bitwise("k pool", p.to_logical(kc), want_k)
        _assert_bitwise("v pool", p.to_logical(vc), want_v)
        assert torch.equal(_bits(kc[p.unused]), _bits(p.k_pool[p.unused])), "a page outside page_table was written"
        assert torch.equal(_bits(vc[p.unused]), _bits(p.v_pool[p.unused])), "a page outside page_table was written"


def test_paged_strided_pool():
    """Pools sliced along the heads (pages one stride apart, rows not contiguous): used in place, the
    other heads of the storage untouched."""
    p = _paged_simple(hq=8, hkv=2, s_new=6, page_size=64)
    ref = p.reference()
    n, ps, hkv, d = p.k_pool.shape
    for ns in (1, 3):
        k_store = torch.randn(n, ps, 2 * hkv, d, device=DEV, dtype=p.k_pool.dtype)
        v_store = torch.randn(n, ps, 2 * hkv, d, device=DEV, dtype=p.v_pool.dtype)
        k_store[:, :, 1::2], v_store[:, :, 1::2] = p.k_pool, p.v_pool
        other_k, other_v = k_store[:, :, 0::2].clone(), v_store[:, :, 0::2].clone()
        kc, vc = k_store[:, :, 1::2], v_store[:, :, 1::2]
        out, lse = flash_attn_with_kvcache(p.logical.q, kc, vc, p.logical.k, p.logical.v, return_softmax_lse=True,
                                           num_splits=ns, **p.kwargs())
        p.check(ref, out, lse, kc, vc, f"strided pool num_splits={ns}")
        assert torch.equal(_bits(k_store[:, :, 0::2]), _bits(other_k))
        assert torch.equal(_bits(v_store[:, :, 0::2]), _bits(other_v))


def test_paged_shared_prefix_pages():
    """Sequences may share pages they only read (a common prefix); each appends into its own."""
    p = _paged_simple(rotary=None, s_new=2, page_size=16, fill="0", rows=64)
    lg = p.logical
    # Pages 0 and 1 of every sequence are sequence 0's: 32 shared rows, the appends after them.
    pt = p.page_table.clone()
    pt[1:, :2] = pt[0, :2]
    p.page_table = pt
    for i in range(1, BATCH):
        lg.k_cache[i, :32], lg.v_cache[i, :32] = lg.k_cache[0, :32], lg.v_cache[0, :32]
    lg.cache_seqlens = torch.tensor([32, 32, 40], dtype=torch.int32, device=DEV)
    # The pool as the table now reads it; pages no longer in the table stay as they were.
    p.k_pool[pt.reshape(-1).long()] = lg.k_cache.reshape(-1, 16, *lg.k_cache.shape[2:])
    p.v_pool[pt.reshape(-1).long()] = lg.v_cache.reshape(-1, 16, *lg.v_cache.shape[2:])
    ref = p.reference()
    for ns in (1, 0):
        p.check(ref, *p.run(num_splits=ns), f"shared prefix num_splits={ns}")


def test_paged_version_bump_and_no_autograd():
    """With a page table too: no autograd, the pools' version counters bumped only when k / v are
    written."""
    p = _paged_simple()
    q = p.logical.q.clone().requires_grad_(True)
    kc, vc = p.k_pool.clone(), p.v_pool.clone()
    v0k, v0v = kc._version, vc._version
    out = flash_attn_with_kvcache(q, kc, vc, p.logical.k, p.logical.v, **p.kwargs())
    assert not out.requires_grad and out.grad_fn is None
    assert kc._version > v0k and vc._version > v0v
    v1k, v1v = kc._version, vc._version
    flash_attn_with_kvcache(q, kc, vc, cache_seqlens=p.logical.cache_seqlens, page_table=p.page_table)
    assert kc._version == v1k and vc._version == v1v, "a pool's version bumped by a call without k / v"


def test_paged_empty_batch():
    """batch 0 with a (0, max_num_pages) table: empty results, nothing written."""
    skip_unless_paged_built(torch.bfloat16, 128, 128)
    q = torch.randn(0, 1, 8, 128, device=DEV, dtype=torch.bfloat16)
    kc = torch.randn(4, 16, 2, 128, device=DEV, dtype=torch.bfloat16)
    vc = kc.clone()
    k = torch.randn(0, 1, 2, 128, device=DEV, dtype=torch.bfloat16)
    before = kc.clone()
    out, lse = flash_attn_with_kvcache(q, kc, vc, k, k.clone(), cache_seqlens=0,
                                       page_table=torch.zeros(0, 4, dtype=I32, device=DEV), return_softmax_lse=True)
    assert out.shape == (0, 1, 8, 128) and lse.shape == (0, 8, 1)
    assert torch.equal(_bits(kc), _bits(before)) and torch.equal(_bits(vc), _bits(before))


def test_paged_scheduler_metadata():
    """get_scheduler_metadata takes page_size (FlashAttention-3's argument): the plan depends on the
    shapes only, so it equals the contiguous cache's plan of the same capacity, and passing it
    gives the bits of passing its values."""
    p = _paged_simple(sq=1, s_new=1, page_size=64, hq=16, hkv=2)
    lg = p.logical
    args = (BATCH, 1, p.capacity, 16, 2, 128, lg.cache_seqlens, torch.bfloat16)
    md = get_scheduler_metadata(*args, page_size=64, max_seqlen_k_new=1, causal=True)
    assert md.tolist() == get_scheduler_metadata(*args, max_seqlen_k_new=1, causal=True).tolist()
    ns, pack = md.tolist()
    a = p.run(scheduler_metadata=md)
    b = p.run(num_splits=ns, pack_gqa=bool(pack))
    for x, y in zip(a, b):
        assert torch.equal(_bits(x), _bits(y))
    p.check(p.reference(), *a, f"scheduler_metadata={md.tolist()}")


def test_paged_cuda_graph():
    """A paged decode step captured once and replayed with new q / k / v, cache_seqlens and a new
    page_table (another permutation of the pool): page_table is read on the device."""
    p = _paged_simple(sq=1, s_new=1, hq=16, hkv=2, page_size=16, rows=256)
    lg = p.logical
    kc, vc = p.k_pool.clone(), p.v_pool.clone()
    q, k, v = lg.q.clone(), lg.k.clone(), lg.v.clone()
    seqlens, pt = lg.cache_seqlens.clone(), p.page_table.clone()

    def step():
        return flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=lg.rotary_cos, rotary_sin=lg.rotary_sin,
                                       cache_seqlens=seqlens, page_table=pt, causal=True, return_softmax_lse=True)
    g, (out, lse) = _graph_capture(step)
    for it in range(3):
        n = _paged_simple(sq=1, s_new=1, hq=16, hkv=2, page_size=16, rows=256, seed=200 + it)
        n.logical.rotary_cos, n.logical.rotary_sin = lg.rotary_cos, lg.rotary_sin
        for dst, src in ((q, n.logical.q), (k, n.logical.k), (v, n.logical.v), (seqlens, n.logical.cache_seqlens),
                         (pt, n.page_table), (kc, n.k_pool), (vc, n.v_pool)):
            dst.copy_(src)
        ref = n.reference()
        g.replay()
        torch.cuda.synchronize()
        n.check(ref, out, lse, kc, vc, f"replay {it}")


def test_paged_compile():
    """torch.compile(fullgraph=True) with a page table (the fake implementation takes it; the pools
    mutated in place through the graph): the bits of eager."""
    p = _paged_simple(sq=4, s_new=2, page_size=16)
    lg = p.logical

    def f(q, kc, vc, k, v, seqlens, pt, cos, sin):
        return flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
                                       page_table=pt, causal=True, return_softmax_lse=True)
    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, dynamic=False)
    rest = (lg.cache_seqlens, p.page_table, lg.rotary_cos, lg.rotary_sin)
    kc1, vc1, kc2, vc2 = p.k_pool.clone(), p.v_pool.clone(), p.k_pool.clone(), p.v_pool.clone()
    want = f(lg.q, kc1, vc1, lg.k, lg.v, *rest)
    got = cf(lg.q, kc2, vc2, lg.k, lg.v, *rest)
    assert torch.equal(_bits(got[0]), _bits(want[0])) and torch.equal(_bits(got[1]), _bits(want[1]))
    assert got[1].stride() == want[1].stride()
    _assert_bitwise("k pool (compiled)", kc2, kc1)
    _assert_bitwise("v pool (compiled)", vc2, vc1)


@pytest.mark.parametrize("new_rows", [False, True])
def test_paged_opcheck(new_rows):
    """The schema with page_table (after cache_leftpad, FlashAttention-3's order), the fake
    implementation against the real kernel, autograd registration, AOT dispatch."""
    p = _paged_simple(sq=4, s_new=3 if new_rows else 0, rotary=(False, 0.5) if new_rows else None, page_size=16)
    lg = p.logical
    args = (lg.q, p.k_pool.clone(), p.v_pool.clone(), lg.k, lg.v, lg.rotary_cos, lg.rotary_sin, lg.cache_seqlens,
            None, None, p.page_table, None, None, True, -1, -1, 0.0, lg.rotary_interleaved, 0, -1)
    torch.library.opcheck(torch.ops.flash3.fwd_kvcache.default, args)


def _paged_err_problem():
    return _paged_simple(d=128, sq=2, s_new=3, hq=8, hkv=2, page_size=16, rows=64)


def _pset(**changes):
    """A paged error case: the good paged call with some arguments replaced (values may be
    functions of the PagedProblem)."""
    def make(p):
        kw = dict(p.kwargs(), k=p.logical.k, v=p.logical.v)
        for name, val in changes.items():
            kw[name] = val(p) if callable(val) else val
        return kw
    return make


PAGED_ERRORS = {
    # name: (make kwargs, exception, substrings of the message)
    "page_table_int64": (_pset(page_table=lambda p: p.page_table.long()), TypeError,
                         ["page_table.dtype", "torch.int64", "torch.int32"]),
    "page_table_cpu": (_pset(page_table=lambda p: p.page_table.cpu()), ValueError, ["page_table", "CUDA"]),
    "page_table_1d": (_pset(page_table=lambda p: p.page_table[0]), ValueError, ["page_table", "2-d"]),
    "page_table_3d": (_pset(page_table=lambda p: p.page_table[:, :, None]), ValueError, ["page_table", "2-d"]),
    "page_table_batch": (_pset(page_table=lambda p: p.page_table[:2]), ValueError,
                         ["page_table.shape[0] is 2", "expected 3"]),
    "page_table_stride1": (_pset(page_table=lambda p: torch.stack([p.page_table, p.page_table], -1)[..., 0]),
                           ValueError, ["page_table.stride(1) is 2", "expected 1"]),
    "page_table_rows_overlap": (_pset(page_table=lambda p: p.page_table[:1].expand(BATCH, -1)), ValueError,
                                ["page_table.stride(0) is 0"]),
    "page_table_no_pages": (_pset(page_table=lambda p: p.page_table[:, :0]), ValueError, ["page_table.shape[1]"]),
    "page_table_with_softcap": (_pset(softcap=5.0), NotImplementedError, ["page_table", "softcap"]),
    "page_table_new_rows_past_capacity": (
        _pset(k=lambda p: torch.zeros(BATCH, 65, 2, 128, dtype=p.logical.dtype, device=DEV),
              v=lambda p: torch.zeros(BATCH, 65, 2, 128, dtype=p.logical.dtype, device=DEV),
              rotary_cos=None, rotary_sin=None),
        ValueError, ["k.shape[1] (seqlen_new) is 65", "max_num_pages_per_seq * page_size", "= 64"]),
    "page_table_rotary_short": (_pset(rotary_cos=lambda p: p.logical.rotary_cos[:63],
                                      rotary_sin=lambda p: p.logical.rotary_sin[:63]),
                                ValueError, ["rotary_cos.shape[0] (seqlen_ro) is 63", "= 64"]),
}

if not flash3._C.serving_wip():  # paged with a cache index / left padding: FLASH3_SERVING_WIP builds only
    PAGED_ERRORS.update({
        "page_table_with_cache_batch_idx": (
            _pset(cache_batch_idx=lambda p: torch.arange(BATCH, dtype=I32, device=DEV)),
            NotImplementedError, ["page_table", "cache_batch_idx"]),
        "page_table_with_cache_leftpad": (_pset(cache_leftpad=lambda p: torch.zeros(BATCH, dtype=I32, device=DEV)),
                                          NotImplementedError, ["page_table", "cache_leftpad"]),
    })


@pytest.mark.parametrize("case", list(PAGED_ERRORS), ids=list(PAGED_ERRORS))
def test_paged_bad_argument_raises(case):
    """Raised before anything is launched or written, naming page_table (or the argument at fault)."""
    make, exc, words = PAGED_ERRORS[case]
    p = _paged_err_problem()
    kw = make(p)
    kc, vc = p.k_pool.clone(), p.v_pool.clone()
    with pytest.raises(exc) as ei:
        flash_attn_with_kvcache(p.logical.q, kc, vc, **kw)
    _assert_message(ei.value, words)
    torch.cuda.synchronize()
    assert torch.equal(_bits(kc), _bits(p.k_pool)) and torch.equal(_bits(vc), _bits(p.v_pool)), "pool written"


def test_paged_page_table_on_another_gpu():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    p = _paged_err_problem()
    with pytest.raises(ValueError) as ei:
        flash_attn_with_kvcache(p.logical.q, p.k_pool.clone(), p.v_pool.clone(),
                                **dict(_pset()(p), page_table=p.page_table.to("cuda:1")))
    _assert_message(ei.value, ["page_table is on device 'cuda:1'", "q is on device"])


def test_paged_pool_sliced_along_page_rows():
    """Pages must be one stride apart (page_size * row stride): a pool sliced along its rows is not."""
    p = _paged_err_problem()
    kc = torch.cat([p.k_pool, p.k_pool], 1)[:, :16]
    vc = torch.cat([p.v_pool, p.v_pool], 1)[:, :16]
    with pytest.raises(ValueError) as ei:
        flash_attn_with_kvcache(p.logical.q, kc, vc, **_pset()(p))
    _assert_message(ei.value, ["k_cache.stride(0) (num_pages)", "page_size * row stride"])


@pytest.mark.parametrize("case", ["page_table_int64", "page_table_1d", "page_table_stride1",
                                  "page_table_with_softcap", "page_table_new_rows_past_capacity"])
def test_paged_bad_argument_raises_under_compile(case):
    """A compiled call raises what the eager call raises (the fake implementation checks the scalar
    options while tracing; the operator checks the rest when the graph runs, before it launches or
    writes anything)."""
    make, exc, words = PAGED_ERRORS[case]
    p = _paged_err_problem()
    kw = make(p)
    torch._dynamo.reset()
    f = torch.compile(lambda q, kc, vc: flash_attn_with_kvcache(q, kc, vc, **kw), fullgraph=True, dynamic=False)
    with pytest.raises(Exception) as ei:
        f(p.logical.q, p.k_pool.clone(), p.v_pool.clone())
    e = ei.value
    chain = [e]
    while len(chain) < 10 and (chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    assert any(isinstance(x, exc) for x in chain) or f"{exc.__name__}(" in str(e), f"{type(e).__name__}: {e}"
    for w in words:
        assert w in str(e), f"message lacks {w!r}: {e}"
