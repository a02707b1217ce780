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
from builds import skip_unless_built, skip_unless_softcap_built  # noqa: E402
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
            p.cache_batch_idx, p.cache_leftpad, None, None, True, -1, -1, 0.0, p.rotary_interleaved, 0, -1)
    torch.library.opcheck(torch.ops.flash3.fwd_kvcache.default, args)


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
    "page_table": (_set(page_table=lambda p: torch.zeros(BATCH, 4, dtype=I32, device=DEV)), NotImplementedError,
                   ["page_table"]),
    "cu_seqlens_q": (_set(cu_seqlens_q=lambda p: torch.zeros(BATCH + 1, dtype=I32, device=DEV)),
                     NotImplementedError, ["cu_seqlens_q"]),
    "cu_seqlens_k_new": (_set(cu_seqlens_k_new=lambda p: torch.zeros(BATCH + 1, dtype=I32, device=DEV)),
                         NotImplementedError, ["cu_seqlens_k_new"]),
    "max_seqlen_q": (_set(max_seqlen_q=2), NotImplementedError, ["max_seqlen_q"]),
    "qv": (_set(qv=lambda p: torch.zeros_like(p.q)), NotImplementedError, ["qv"]),
    "q_descale": (_set(q_descale=lambda p: torch.ones(1, device=DEV)), NotImplementedError, ["descale"]),
    "attention_chunk": (_set(attention_chunk=64), NotImplementedError, ["attention_chunk"]),
    "sm_margin": (_set(sm_margin=4), NotImplementedError, ["sm_margin"]),
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
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with pytest.raises(NotImplementedError):
            flash_attn_with_kvcache(p.q, kc, vc, p.k, p.v, page_table=p.cache_seqlens, **p.kwargs())
        kw = dict(p.kwargs(), cache_seqlens=bad_seqlens)
        with pytest.raises(TypeError):
            flash_attn_with_kvcache(p.q, kc, vc, p.k, p.v, **kw)
        with pytest.raises(ValueError):
            torch.ops.flash3.fwd_kvcache(p.q, kc, vc, p.k, p.v, None, None, p.cache_seqlens, None, None, None, None,
                                         False, -1, -1, 0.0, True, 0, 5)  # pack_gqa 5
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert not kernels, f"kernels launched by an invalid call: {kernels}"


@pytest.mark.parametrize("case", ["cache_seqlens_int64", "k_without_v", "rotary_dim_too_large", "k_heads"])
def test_bad_argument_raises_under_compile(case):
    """The fake implementation raises what the eager op raises (torch.compile wraps the error)."""
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
    "cu_seqlens_q": (dict(cu_seqlens_q=torch.zeros(4, dtype=I32)), NotImplementedError, ["cu_seqlens_q"]),
    "cu_seqlens_k_new": (dict(cu_seqlens_k_new=torch.zeros(4, dtype=I32)), NotImplementedError, ["cu_seqlens_k_new"]),
    "page_size": (dict(page_size=16), NotImplementedError, ["page_size"]),
    "attention_chunk": (dict(attention_chunk=64), NotImplementedError, ["attention_chunk"]),
    "sm_margin": (dict(sm_margin=8), NotImplementedError, ["sm_margin"]),
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


def test_public_names():
    assert "flash_attn_with_kvcache" in flash3.__all__ and "get_scheduler_metadata" in flash3.__all__
    assert flash3.flash_attn_with_kvcache is flash_attn_with_kvcache
