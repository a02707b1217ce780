# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""flash3.flash_attn_varlen_func (variable-length forward, cu_seqlens / seqused) vs the fp32
reference of ref.py, called per sequence on the sliced tensors.

Batches of 1-9 sequences with lengths in 0..1100 (0, 1, 127, 128, 129 and 1100 drawn often),
query and key lengths equal or independent, seqused shorter than the allocation (0 included),
rows after cu_seqlens[-1]; no mask / causal / window / causal with a left window; MHA, GQA, MQA;
head dims 64, 128, 256 (those forward_is_built has); bf16 and fp16.

Tolerances (as test_flash_attn.py): out, err(flash3 vs fp32 reference) <= 2 * err(plain PyTorch
in the same low precision vs fp32 reference) + atol (the dtype's rounding error at the
reference's magnitude); softmax_lse, the C++ GPU tests' rule (ref.check_close): err <= 2 *
err(plain low-precision lse) + 1e-5, no NaN, -inf exactly where the reference has it. A sequence
with query rows but no keys: out = 0 and softmax_lse = -inf exactly.

Rows that no sequence covers (beyond seqused, from cu_seqlens_q[-1] on, sequences of length 0)
must be left alone: out and softmax_lse are allocated by the operator, so the tests make them
land on NaN-filled memory (a private CUDA memory pool holding only NaN-filled blocks of the
same sizes) and check those rows are still NaN afterwards.

Backward (dq, dk, dv of a loss using out and softmax_lse) against autograd through the same
reference on each sequence's slices, assembled into full tensors, with the forward's out rule
(FlashAttention's: err <= 2 * err(plain PyTorch in the same low precision) + atol), as
test_flash_attn.py checks the fixed-length gradients; rows that are not real tokens (beyond
seqused, after cu_seqlens[-1], of sequences without keys / without queries) must be exactly 0.
Over head dims 64, 128, 256, no mask / causal / window, MHA / GQA / MQA, both dtypes, seqused on
about half the cases, every special length (0 and 1 included); deterministic=True bitwise
reproducible.

softcap (s -> softcap * tanh(s / softcap) after the scale, before the mask): forward and backward
with softcap 5 and 30 over dtypes, head dims, every mask and MHA / GQA / MQA, against the same
reference with the capped scores and the same rules; the special-length batch; deterministic
backward; torch.compile and opcheck with softcap. They skip where the build lacks the softcap
kernels (CMake FLASH3_FEATURES without "softcap").

pack_gqa (PackGQA, forward only; the heuristic packs every GQA/MQA varlen call): GQA and MQA
with pack_gqa None / True / False, query lengths 1, 7 and 133 next to empty sequences, seqused
and rows after cu_seqlens[-1], no mask / causal, forward and the backward after it against the
same reference with the same rules; torch.compile and opcheck with pack_gqa.

Also: CUDA graph capture and replay with new cu_seqlens / seqused values (forward, and forward +
backward), torch.compile (fullgraph=True, forward and forward + backward), torch.library.opcheck.
"""
import random
import zlib

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("flash3 needs a Hopper (sm_90) GPU", allow_module_level=True)

import flash3  # noqa: E402
from flash3 import flash_attn_varlen_func  # noqa: E402
from builds import skip_unless_built as _skip_unless_built  # noqa: E402
from builds import skip_unless_softcap_built as _skip_unless_softcap_built  # noqa: E402
from builds import softcap_built  # noqa: E402
from ref import attention_ref, check_close, lse_lowp, max_err, rounding_atol, tol_factor  # noqa: E402

DEVICE = "cuda"
EPS_LSE = 1e-5  # kEpsLse of tests/gpu/test_fwd_gpu.cpp
INT32_MAX = 2 ** 31 - 1

SPECIAL_LENGTHS = [0, 1, 127, 128, 129, 1100]
MAX_LENGTH = 1100
HDIMS = [(64, 64), (128, 128), (256, 256)]
HEADS = {"mha": (4, 4), "gqa": (8, 2), "mqa": (6, 1)}
MASKS = ["none", "causal", "window", "causal_left"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


# ---------------------------------------------------------------------------
# Batches.
# ---------------------------------------------------------------------------
class Batch:
    """A varlen batch: host lists (lengths, used lengths, offsets) and the device tensors."""

    def __init__(self, lens_q, lens_k, hq, hk, d, dv, dtype, used_q=None, used_k=None, pad_q=0, pad_k=0, seed=0):
        assert len(lens_q) == len(lens_k)
        self.lens_q, self.lens_k = list(lens_q), list(lens_k)
        self.used_q = None if used_q is None else list(used_q)
        self.used_k = None if used_k is None else list(used_k)
        self.off_q = [0]
        self.off_k = [0]
        for a, b in zip(self.lens_q, self.lens_k):
            self.off_q.append(self.off_q[-1] + a)
            self.off_k.append(self.off_k[-1] + b)
        self.total_q = self.off_q[-1] + pad_q
        self.total_k = self.off_k[-1] + pad_k
        self.hq, self.hk, self.d, self.dv, self.dtype = hq, hk, d, dv, dtype
        g = torch.Generator(device=DEVICE).manual_seed(seed)
        self.q = torch.randn(self.total_q, hq, d, device=DEVICE, dtype=dtype, generator=g)
        self.k = torch.randn(self.total_k, hk, d, device=DEVICE, dtype=dtype, generator=g)
        self.v = torch.randn(self.total_k, hk, dv, device=DEVICE, dtype=dtype, generator=g)
        self.cu_q = _i32(self.off_q)
        self.cu_k = _i32(self.off_k)
        self.seqused_q = None if used_q is None else _i32(used_q)
        self.seqused_k = None if used_k is None else _i32(used_k)
        self.max_q = max([1] + self.lens_q)
        self.max_k = max([1] + self.lens_k)

    @property
    def num_sequences(self):
        return len(self.lens_q)

    def real_q(self, b):
        """The real query rows of sequence b (seqused clamped to the allocation, as the kernels do)."""
        n = self.lens_q[b]
        return n if self.used_q is None else min(max(self.used_q[b], 0), n)

    def real_k(self, b):
        n = self.lens_k[b]
        return n if self.used_k is None else min(max(self.used_k[b], 0), n)

    def written_rows(self):
        """(total_q,) bool on the device: the rows of out / softmax_lse the forward writes."""
        w = torch.zeros(self.total_q, dtype=torch.bool)
        for b in range(self.num_sequences):
            w[self.off_q[b]:self.off_q[b] + self.real_q(b)] = True
        return w.to(DEVICE)

    def key_rows(self):
        """(total_k,) bool on the device: the rows of k / v that are real keys (dk / dv written)."""
        w = torch.zeros(self.total_k, dtype=torch.bool)
        for b in range(self.num_sequences):
            w[self.off_k[b]:self.off_k[b] + self.real_k(b)] = True
        return w.to(DEVICE)

    def call(self, **kwargs):
        return flash_attn_varlen_func(self.q, self.k, self.v, self.cu_q, self.cu_k, self.max_q, self.max_k,
                                      seqused_q=self.seqused_q, seqused_k=self.seqused_k, return_attn_probs=True,
                                      **kwargs)


def _i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _draw_lengths(r, n):
    out = []
    for _ in range(n):
        x = r.random()
        out.append(r.choice(SPECIAL_LENGTHS) if x < 0.45 else r.randint(0, MAX_LENGTH))
    return out


def _draw_used(r, lens):
    """seqused below the allocation: 0, the full length, or anything in between."""
    used = []
    for n in lens:
        x = r.random()
        used.append(0 if x < 0.15 else n if x < 0.3 else r.randint(0, n))
    return used


def _random_batch(seed, hq, hk, d, dv, dtype, seqused):
    r = random.Random(seed)
    n = r.randint(1, 9)
    lens_q = _draw_lengths(r, n)
    lens_k = list(lens_q) if r.random() < 0.4 else _draw_lengths(r, n)
    used_q = _draw_used(r, lens_q) if seqused else None
    used_k = _draw_used(r, lens_k) if seqused and r.random() < 0.8 else None
    pad_q = r.choice([0, 0, 1, 100])
    pad_k = r.choice([0, 0, 3])
    return Batch(lens_q, lens_k, hq, hk, d, dv, dtype, used_q, used_k, pad_q, pad_k, seed=seed)


def _mask_args(mask, batch, r):
    """(causal, window): window sides drawn in [0, max_seqlen_k) as in FlashAttention's tests."""
    if mask == "none":
        return False, (-1, -1)
    if mask == "causal":
        return True, (-1, -1)
    if mask == "window":
        return False, (r.randrange(batch.max_k), r.randrange(batch.max_k))
    return True, (r.randrange(batch.max_k), -1)  # causal_left: local (sliding-window causal)


# ---------------------------------------------------------------------------
# Checks.
# ---------------------------------------------------------------------------
def _call_on_poisoned_memory(fn, batch):
    """Runs fn() (one varlen forward: allocates out, then softmax_lse) with the allocator handing
    it NaN-filled memory: a private memory pool holding only NaN-filled blocks of out's and
    softmax_lse's sizes, freed just before the call. Returns (out, lse, poisoned) (copies of the
    results outside the pool); poisoned is False only when this torch has no MemPool."""
    out_shape = (batch.total_q, batch.hq, batch.dv)
    lse_shape = (batch.hq, batch.total_q)
    if not (hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")):
        out, lse = fn()
        return out, lse, False
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        p_out = torch.full(out_shape, float("nan"), device=DEVICE, dtype=batch.dtype)
        p_lse = torch.full(lse_shape, float("nan"), device=DEVICE, dtype=torch.float32)
        want = (p_out.data_ptr(), p_lse.data_ptr())
        del p_out, p_lse
        out, lse = fn()
    got = (out.data_ptr(), lse.data_ptr())
    assert got == want, ("test harness: the private pool did not hand the NaN-filled blocks to the operator's out / "
                         f"softmax_lse (pointers {got} vs {want})")
    out_c, lse_c = out.clone(), lse.clone()
    del out, lse
    torch.cuda.synchronize()
    return out_c, lse_c, True


def _assert_untouched(out, lse, batch):
    """Rows no sequence covers are still NaN (never written); written rows have no NaN."""
    w = batch.written_rows()
    assert bool(torch.isnan(out[~w]).all()), "out: rows beyond seqused / cu_seqlens_q[-1] were written"
    assert bool(torch.isnan(lse[:, ~w]).all()), "softmax_lse: rows beyond seqused / cu_seqlens_q[-1] were written"
    assert not bool(torch.isnan(out[w]).any()), "out: NaN in a written row"
    assert not bool(torch.isnan(lse[:, w]).any()), "softmax_lse: NaN in a written row"


def _assert_close_fa(name, ours, ref, base, dtype, rtol=2.0):
    """FlashAttention rule: |ours - ref| <= rtol * |base - ref| + atol."""
    e_ours = max_err(ours, ref)
    e_base = max_err(base, ref)
    atol = rounding_atol(ref, dtype)
    assert not torch.isnan(ours).any(), f"{name}: NaN"
    assert e_ours <= rtol * e_base + atol, (
        f"{name}: max|flash3 - ref| = {e_ours:.3e} > {rtol} * max|torch {dtype} - ref| ({e_base:.3e}) + {atol:.1e}")


def _check_against_reference(out, lse, batch, causal, window, softmax_scale=None, what="", softcap=0.0):
    """Per sequence: out and softmax_lse of its real rows against ref.attention_ref on the slices."""
    assert out.shape == (batch.total_q, batch.hq, batch.dv) and out.dtype == batch.dtype
    assert lse.shape == (batch.hq, batch.total_q) and lse.dtype == torch.float32
    for b in range(batch.num_sequences):
        sq, sk = batch.real_q(b), batch.real_k(b)
        if sq == 0:
            continue
        r0, r1 = batch.off_q[b], batch.off_q[b] + sq
        o, l = out[r0:r1], lse[:, r0:r1]
        tag = f"{what} (sequence {b} of {batch.num_sequences}: seqlen_q {sq}, seqlen_k {sk})"
        if sk == 0:  # query rows but no keys
            assert torch.count_nonzero(o) == 0, f"out{tag}: expected 0 for a sequence without keys"
            assert bool(torch.isneginf(l).all()), f"softmax_lse{tag}: expected -inf for a sequence without keys"
            continue
        q = batch.q[r0:r1].unsqueeze(0)
        k = batch.k[batch.off_k[b]:batch.off_k[b] + sk].unsqueeze(0)
        v = batch.v[batch.off_k[b]:batch.off_k[b] + sk].unsqueeze(0)
        out_ref, lse_ref = attention_ref(q, k, v, causal, window, softmax_scale, upcast=True, softcap=softcap)
        out_base, _ = attention_ref(q, k, v, causal, window, softmax_scale, upcast=False, softcap=softcap)
        _assert_close_fa(f"out{tag}", o.unsqueeze(0), out_ref, out_base, batch.dtype, tol_factor(softcap))
        lse_low = lse_lowp(q, k, causal, window, softmax_scale, softcap=softcap)
        ok, err, base, bound, nans = check_close(l.unsqueeze(0), lse_ref, lse_low, EPS_LSE, tol_factor(softcap))
        assert ok, (f"softmax_lse{tag}: max|flash3 - ref| = {err:.3e} > {tol_factor(softcap)} * max|lowp - ref| ({base:.3e}) + "
                    f"{EPS_LSE:.0e} = {bound:.3e}; NaN entries: {nans}")


def _run_and_check(batch, causal, window, softmax_scale=None, what="", softcap=0.0, pack_gqa=None):
    out, lse, poisoned = _call_on_poisoned_memory(
        lambda: batch.call(softmax_scale=softmax_scale, causal=causal, window_size=window, softcap=softcap,
                           pack_gqa=pack_gqa), batch)
    if poisoned:
        _assert_untouched(out, lse, batch)
    _check_against_reference(out, lse, batch, causal, window, softmax_scale, what, softcap=softcap)
    return out, lse


# ---------------------------------------------------------------------------
# Forward against the reference.
# ---------------------------------------------------------------------------
def _matrix_cases():
    cases = []
    for dname in DTYPES:
        for d, dv in HDIMS:
            for mask in MASKS:
                for heads in HEADS:
                    key = f"{dname}-d{d}x{dv}-{mask}-{heads}"
                    seed = zlib.crc32(key.encode())
                    seqused = random.Random(seed).random() < 0.5
                    cases.append((dname, d, dv, mask, heads, seqused, seed))
    return cases


MATRIX = _matrix_cases()


def _matrix_id(c):
    dname, d, dv, mask, heads, seqused, _ = c
    return f"{dname}-d{d}x{dv}-{mask}-{heads}" + ("-seqused" if seqused else "")


@pytest.mark.parametrize("case", MATRIX, ids=[_matrix_id(c) for c in MATRIX])
def test_forward(case):
    dname, d, dv, mask, heads, seqused, seed = case
    dtype = DTYPES[dname]
    _skip_unless_built(dtype, d, dv)
    hq, hk = HEADS[heads]
    batch = _random_batch(seed, hq, hk, d, dv, dtype, seqused)
    causal, window = _mask_args(mask, batch, random.Random(seed + 1))
    _run_and_check(batch, causal, window,
                   what=f" [lens_q {batch.lens_q}, lens_k {batch.lens_k}, used_q {batch.used_q}, "
                        f"used_k {batch.used_k}, causal={causal}, window={window}]")


@pytest.mark.parametrize("mask", MASKS, ids=MASKS)
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_special_lengths(dtype, mask):
    """Every special length in one batch, for q and (in another order) k, with seqused below and
    at the allocation and trailing rows after cu_seqlens[-1]."""
    _skip_unless_built(dtype, 128, 128)
    lens_q = [0, 1, 127, 128, 129, 1100, 129, 1]
    lens_k = [1, 0, 129, 128, 127, 1100, 1, 129]
    used_q = [0, 1, 100, 128, 128, 1000, 129, 0]
    used_k = [1, 0, 64, 128, 0, 1100, 1, 100]
    for seqused in (False, True):
        batch = Batch(lens_q, lens_k, 8, 2, 128, 128, dtype, used_q=used_q if seqused else None,
                      used_k=used_k if seqused else None, pad_q=5, pad_k=7, seed=3)
        causal, window = _mask_args(mask, batch, random.Random(7))
        _run_and_check(batch, causal, window, what=f" [seqused={seqused}, causal={causal}, window={window}]")


def test_seqused_clamped_to_the_allocation():
    """seqused values beyond the sequence's length or negative act as the clamped values."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    lens = [100, 0, 300, 129]
    raw_q, raw_k = [500, 7, -3, 129], [-1, 4, 1000, 64]
    batch = Batch(lens, lens, 4, 2, 128, 128, torch.bfloat16, used_q=raw_q, used_k=raw_k, seed=5)
    out, lse = _run_and_check(batch, True, (-1, -1))
    clamped = Batch(lens, lens, 4, 2, 128, 128, torch.bfloat16,
                    used_q=[batch.real_q(b) for b in range(4)], used_k=[batch.real_k(b) for b in range(4)], seed=5)
    out2, lse2 = clamped.call(causal=True)
    w = batch.written_rows()
    assert torch.equal(out[w], out2[w]) and torch.equal(lse[:, w], lse2[:, w])


@pytest.mark.parametrize("scale", [0.0, 0.05, 1.0], ids=["scale0", "scale0.05", "scale1"])
def test_softmax_scale(scale):
    _skip_unless_built(torch.bfloat16, 64, 64)
    batch = _random_batch(11, 4, 4, 64, 64, torch.bfloat16, seqused=True)
    _run_and_check(batch, False, (-1, -1), softmax_scale=scale)


def test_no_sequences():
    """cu_seqlens with one entry (num_sequences = 0): nothing is written, nothing fails."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    batch = Batch([], [], 4, 4, 128, 128, torch.bfloat16, pad_q=9, pad_k=4)
    out, lse, poisoned = _call_on_poisoned_memory(lambda: batch.call(), batch)
    assert out.shape == (9, 4, 128) and lse.shape == (4, 9)
    if poisoned:
        _assert_untouched(out, lse, batch)
    empty = Batch([], [], 4, 4, 128, 128, torch.bfloat16)
    out, lse = empty.call(causal=True)
    assert out.shape == (0, 4, 128) and lse.shape == (4, 0)


def test_max_seqlen_zero():
    """max_seqlen_q / max_seqlen_k 0 (FlashAttention-3 accepts them): every sequence of that side
    is empty; nothing is written, the call neither fails nor launches past the tensors."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    batch = Batch([0, 0], [5, 7], 4, 4, 128, 128, torch.bfloat16, pad_q=3)
    out, lse = flash_attn_varlen_func(batch.q, batch.k, batch.v, batch.cu_q, batch.cu_k, 0, 7,
                                      return_attn_probs=True)
    assert out.shape == (3, 4, 128) and lse.shape == (4, 3)
    keyless = Batch([3, 2], [0, 0], 4, 4, 128, 128, torch.bfloat16)
    out, lse = flash_attn_varlen_func(keyless.q, keyless.k, keyless.v, keyless.cu_q, keyless.cu_k, 3, 0,
                                      return_attn_probs=True)
    torch.cuda.synchronize()
    # No key: FlashAttention's convention, out 0 and softmax_lse -inf for every real row.
    assert torch.equal(out, torch.zeros_like(out)) and bool((lse == float("-inf")).all())


def test_return_conventions_and_positional_order():
    _skip_unless_built(torch.bfloat16, 128, 128)
    b = Batch([100, 37], [80, 200], 4, 2, 128, 128, torch.bfloat16, seed=2)
    out = flash_attn_varlen_func(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k)
    assert isinstance(out, torch.Tensor)
    out2, lse2 = flash_attn_varlen_func(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, return_attn_probs=True)
    out3, lse3 = flash_attn_varlen_func(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, return_lse=True)
    assert torch.equal(out, out2) and torch.equal(out, out3) and torch.equal(lse2, lse3)
    # FlashAttention-3's positional order: (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    # max_seqlen_k, seqused_q, seqused_k, softmax_scale, causal, qv, q_descale, k_descale,
    # v_descale, window_size, attention_chunk, softcap, num_splits, pack_gqa, deterministic,
    # sm_margin, return_attn_probs)
    used_q, used_k = _i32([50, 37]), _i32([80, 150])
    o_pos, l_pos = flash_attn_varlen_func(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, used_q, used_k, 0.1, True,
                                          None, None, None, None, (20, 3), 0, 0.0, 1, None, False, 0, True)
    o_kw, l_kw = flash_attn_varlen_func(b.q, b.k, b.v, b.cu_q, b.cu_k, b.max_q, b.max_k, seqused_q=used_q,
                                        seqused_k=used_k, softmax_scale=0.1, causal=True, window_size=(20, 3),
                                        return_attn_probs=True)
    rows = torch.cat([torch.arange(0, 50), torch.arange(100, 137)]).to(DEVICE)
    assert torch.equal(o_pos[rows], o_kw[rows]) and torch.equal(l_pos[:, rows], l_kw[:, rows])


def test_performance_hints():
    """sm_margin is accepted and ignored, as by flash_attn_func; num_splits (split-KV) changes the
    speed and the fp32 rounding only (pack_gqa: test_pack_gqa)."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    b = Batch([300, 5, 700], [300, 900, 2], 8, 2, 128, 128, torch.bfloat16, seed=4)
    want_out, want_lse = b.call(causal=True)
    out, lse = b.call(causal=True, sm_margin=8)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    for n in (4, 0):
        out, lse = b.call(causal=True, num_splits=n)
        torch.testing.assert_close(out, want_out, atol=2e-2, rtol=2e-2, msg=f"num_splits={n}")
        torch.testing.assert_close(lse, want_lse, atol=1e-4, rtol=1e-5, msg=f"num_splits={n}")


def test_strided_inputs_from_packed_qkv():
    """q, k, v as views of one packed (total, 3, heads, head_dim) tensor: same result as contiguous copies."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    lens = [257, 0, 1, 640]
    qkv = torch.randn(sum(lens), 3, 4, 128, device=DEVICE, dtype=torch.bfloat16)
    q, k, v = qkv.unbind(dim=1)
    assert not q.is_contiguous()
    cu = _i32([0, 257, 257, 258, 898])
    out = flash_attn_varlen_func(q, k, v, cu, cu, 640, 640, causal=True)
    ref = flash_attn_varlen_func(q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, 640, 640, causal=True)
    assert torch.equal(out, ref)


def test_current_stream():
    """The kernel runs on the caller's current stream."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    b = Batch([512, 300, 9], [512, 1000, 9], 4, 4, 128, 128, torch.bfloat16, seed=6)
    ref_out, ref_lse = b.call()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out, lse = b.call()
        done = torch.cuda.Event()
        done.record(s)
    done.synchronize()
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


# ---------------------------------------------------------------------------
# Backward against the reference.
# ---------------------------------------------------------------------------
def _cotangents(batch, seed):
    """Random fp32 weights of the loss: g_out (total_q, hq, dv), g_lse (hq, total_q)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    g_out = torch.randn(batch.total_q, batch.hq, batch.dv, device=DEVICE, generator=g)
    g_lse = torch.randn(batch.hq, batch.total_q, device=DEVICE, generator=g)
    return g_out, g_lse


def _loss(out, lse, g_out, g_lse, rows_q):
    """sum(out * g_out) + sum(lse * g_lse) over the real query rows; -inf entries of lse (rows that
    see no key) carry no gradient. torch.where rather than boolean indexing: no data-dependent
    shapes under torch.compile, and the unwritten (possibly NaN) rows reach neither the sum nor
    the gradients."""
    o = torch.where(rows_q.view(-1, 1, 1), out.float(), 0.0)
    lf = torch.where(rows_q.view(1, -1) & torch.isfinite(lse), lse, 0.0)
    return (o * g_out).sum() + (lf * g_lse).sum()


def _grads(batch, g_out, g_lse, **kwargs):
    """(out, lse, dq, dk, dv) of flash_attn_varlen_func on the batch, gradients of _loss."""
    q, k, v = (t.detach().requires_grad_() for t in (batch.q, batch.k, batch.v))
    out, lse = flash_attn_varlen_func(q, k, v, batch.cu_q, batch.cu_k, batch.max_q, batch.max_k,
                                      seqused_q=batch.seqused_q, seqused_k=batch.seqused_k, return_attn_probs=True,
                                      **kwargs)
    dq, dk, dv = torch.autograd.grad(_loss(out, lse, g_out, g_lse, batch.written_rows()), (q, k, v))
    return out.detach(), lse.detach(), dq, dk, dv


def _reference_grads(batch, causal, window, softmax_scale, g_out, g_lse, upcast, softcap=0.0):
    """dq, dk, dv of the same loss through ref.attention_ref on each sequence's slices (upcast: the
    fp32 reference; otherwise plain PyTorch in the inputs' dtype), as full fp32 tensors with 0 in
    the rows that are not real tokens. A sequence without queries or without keys has gradient 0."""
    full = [torch.zeros(t.shape, device=DEVICE) for t in (batch.q, batch.k, batch.v)]
    for b in range(batch.num_sequences):
        sq, sk = batch.real_q(b), batch.real_k(b)
        if sq == 0 or sk == 0:
            continue
        rq = slice(batch.off_q[b], batch.off_q[b] + sq)
        rk = slice(batch.off_k[b], batch.off_k[b] + sk)
        q = batch.q.detach()[rq].unsqueeze(0).requires_grad_()
        k = batch.k.detach()[rk].unsqueeze(0).requires_grad_()
        v = batch.v.detach()[rk].unsqueeze(0).requires_grad_()
        o, l = attention_ref(q, k, v, causal, window, softmax_scale, upcast=upcast, softcap=softcap)
        loss = (o.float() * g_out[rq].unsqueeze(0)).sum()
        loss = loss + (torch.where(torch.isfinite(l), l, 0.0) * g_lse[:, rq].unsqueeze(0)).sum()
        grads = torch.autograd.grad(loss, (q, k, v), allow_unused=True)
        for dst, g, rows in zip(full, grads, (rq, rk, rk)):
            if g is not None:
                dst[rows] = g[0].float()
    return full


def _check_grads(grads, batch, causal, window, g_out, g_lse, softmax_scale=None, what="", softcap=0.0):
    dq, dk, dv = grads
    for name, g, t in (("dq", dq, batch.q), ("dk", dk, batch.k), ("dv", dv, batch.v)):
        assert g.shape == t.shape and g.dtype == t.dtype, f"{name}{what}: {g.shape} {g.dtype}"
    rows_q, rows_k = batch.written_rows(), batch.key_rows()
    for name, g, rows in (("dq", dq, rows_q), ("dk", dk, rows_k), ("dv", dv, rows_k)):
        assert torch.count_nonzero(g[~rows]) == 0, (
            f"{name}{what}: non-zero rows that are not real tokens (beyond seqused, after cu_seqlens[-1])")
    for b in range(batch.num_sequences):
        sq, sk = batch.real_q(b), batch.real_k(b)
        if sk == 0:
            assert torch.count_nonzero(dq[batch.off_q[b]:batch.off_q[b] + sq]) == 0, (
                f"dq{what}: sequence {b} has no keys, expected 0")
        if sq == 0:
            for name, g in (("dk", dk), ("dv", dv)):
                assert torch.count_nonzero(g[batch.off_k[b]:batch.off_k[b] + sk]) == 0, (
                    f"{name}{what}: sequence {b} has no queries, expected 0")
    ref = _reference_grads(batch, causal, window, softmax_scale, g_out, g_lse, upcast=True, softcap=softcap)
    base = _reference_grads(batch, causal, window, softmax_scale, g_out, g_lse, upcast=False, softcap=softcap)
    for name, o, r, bb in zip(("dq", "dk", "dv"), grads, ref, base):
        _assert_close_fa(f"{name}{what}", o, r, bb, batch.dtype, tol_factor(softcap))


def _run_and_check_backward(batch, causal, window, softmax_scale=None, seed=0, what="", softcap=0.0, **kwargs):
    g_out, g_lse = _cotangents(batch, seed)
    out, lse, *grads = _grads(batch, g_out, g_lse, softmax_scale=softmax_scale, causal=causal, window_size=window,
                              softcap=softcap, **kwargs)
    _check_grads(grads, batch, causal, window, g_out, g_lse, softmax_scale, what, softcap=softcap)
    return grads


BWD_MASKS = ["none", "causal", "window"]


def _backward_cases():
    """Every (head dim, mask, heads) once; the dtype alternates so that each dtype meets every head
    dim, mask and head layout; seqused on about half the cases."""
    cases = []
    i = 0
    for d, dv in HDIMS:
        for mask in BWD_MASKS:
            for heads in HEADS:
                dname = list(DTYPES)[i % 2]
                i += 1
                key = f"bwd-{dname}-d{d}x{dv}-{mask}-{heads}"
                seed = zlib.crc32(key.encode())
                seqused = random.Random(seed).random() < 0.5
                cases.append((dname, d, dv, mask, heads, seqused, seed))
    return cases


BACKWARD_MATRIX = _backward_cases()


@pytest.mark.parametrize("case", BACKWARD_MATRIX, ids=[_matrix_id(c) for c in BACKWARD_MATRIX])
def test_backward(case):
    dname, d, dv, mask, heads, seqused, seed = case
    dtype = DTYPES[dname]
    _skip_unless_built(dtype, d, dv, backward=True)
    hq, hk = HEADS[heads]
    batch = _random_batch(seed, hq, hk, d, dv, dtype, seqused)
    causal, window = _mask_args(mask, batch, random.Random(seed + 1))
    _run_and_check_backward(batch, causal, window, seed=seed,
                            what=f" [lens_q {batch.lens_q}, lens_k {batch.lens_k}, used_q {batch.used_q}, "
                                 f"used_k {batch.used_k}, causal={causal}, window={window}]")


@pytest.mark.parametrize("mask", MASKS, ids=MASKS)
def test_backward_special_lengths(mask):
    """test_special_lengths' batch (lengths 0, 1, 127, 128, 129, 1100; sequences without keys or
    without queries; trailing rows), with and without seqused."""
    dtype = torch.bfloat16
    _skip_unless_built(dtype, 128, 128, backward=True)
    lens_q = [0, 1, 127, 128, 129, 1100, 129, 1]
    lens_k = [1, 0, 129, 128, 127, 1100, 1, 129]
    used_q = [0, 1, 100, 128, 128, 1000, 129, 0]
    used_k = [1, 0, 64, 128, 0, 1100, 1, 100]
    for seqused in (False, True):
        batch = Batch(lens_q, lens_k, 8, 2, 128, 128, dtype, used_q=used_q if seqused else None,
                      used_k=used_k if seqused else None, pad_q=5, pad_k=7, seed=3)
        causal, window = _mask_args(mask, batch, random.Random(7))
        _run_and_check_backward(batch, causal, window, seed=17,
                                what=f" [seqused={seqused}, causal={causal}, window={window}]")


@pytest.mark.parametrize("scale", [0.0, 0.3], ids=["scale0", "scale0.3"])
def test_backward_softmax_scale(scale):
    """The backward uses the forward's scale (0 included)."""
    _skip_unless_built(torch.bfloat16, 64, 64, backward=True)
    batch = _random_batch(21, 4, 2, 64, 64, torch.bfloat16, seqused=True)
    _run_and_check_backward(batch, True, (-1, -1), softmax_scale=scale, seed=21)


@pytest.mark.parametrize("heads", ["gqa", "mqa"], ids=["gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["nomask", "causal"])
def test_backward_deterministic_is_bitwise_reproducible(causal, heads):
    _skip_unless_built(torch.bfloat16, 128, 128, backward=True)
    hq, hk = HEADS[heads]
    batch = Batch([700, 0, 1, 1100, 300], [1100, 5, 0, 1100, 64], hq, hk, 128, 128, torch.bfloat16,
                  used_q=[650, 0, 1, 1100, 299], used_k=[1100, 5, 0, 1000, 64], pad_q=3, pad_k=9, seed=22)
    g_out, g_lse = _cotangents(batch, 23)
    runs = [_grads(batch, g_out, g_lse, causal=causal, deterministic=True)[2:] for _ in range(2)]
    for name, a, b in zip(("dq", "dk", "dv"), *runs):
        assert torch.equal(a, b), f"{name} differs between two deterministic backward passes"
    _check_grads(runs[0], batch, causal, (-1, -1), g_out, g_lse, what=" (deterministic)")


def test_backward_autograd_conventions():
    """Gradients only for the inputs that require grad; none for cu_seqlens / seqused; an unused
    softmax_lse changes nothing (bitwise, deterministic); no autograd node without grad."""
    _skip_unless_built(torch.bfloat16, 128, 128, backward=True)
    b = Batch([100, 200], [150, 50], 4, 2, 128, 128, torch.bfloat16, used_q=[90, 200], seed=8)
    g = torch.randn(b.total_q, 4, 128, device=DEVICE, dtype=torch.bfloat16)

    def run(q, k, v, **kw):
        return flash_attn_varlen_func(q, k, v, b.cu_q, b.cu_k, b.max_q, b.max_k, seqused_q=b.seqused_q, causal=True,
                                      deterministic=True, **kw)

    q, k, v = (t.detach().requires_grad_() for t in (b.q, b.k, b.v))
    out = run(q, k, v)
    assert out.requires_grad and out.grad_fn is not None
    want = torch.autograd.grad(out, (q, k, v), g)
    out, lse = run(q, k, v, return_attn_probs=True)  # lse returned, not used by the loss
    got = torch.autograd.grad(out, (q, k, v), g)
    for name, x, y in zip(("dq", "dk", "dv"), got, want):
        assert torch.equal(x, y), f"{name}: an unused softmax_lse changed the gradient"
    # only k requires grad
    out = run(b.q.detach(), k, b.v.detach())
    dk, = torch.autograd.grad(out, (k,), g)
    assert torch.equal(dk, want[1])
    # no grad mode: no autograd node at all
    with torch.no_grad():
        out = run(q, k, v)
    assert out.grad_fn is None and not out.requires_grad


# ---------------------------------------------------------------------------
# softcap: s -> softcap * tanh(s / softcap) after the scale, before the mask, per sequence;
# forward and backward against ref.attention_ref(softcap=...).
# ---------------------------------------------------------------------------
def _softcap_cases():
    """dtype x head dim x softcap {5, 30}; the mask and the head layout cycle so that every mask
    and head layout meets both dtypes and both softcaps; seqused on half the cases (both dtypes)."""
    cases = []
    i = 0
    for dname in DTYPES:
        for d, dv in HDIMS:
            for softcap in (5.0, 30.0):
                mask = MASKS[i % len(MASKS)]
                heads = list(HEADS)[i % len(HEADS)]
                key = f"softcap-{dname}-d{d}x{dv}-{softcap}-{mask}-{heads}"
                seed = zlib.crc32(key.encode())
                seqused = (i + i // 4) % 2 == 0
                i += 1
                cases.append((dname, d, dv, softcap, mask, heads, seqused, seed))
    return cases


SOFTCAP_MATRIX = _softcap_cases()


def _softcap_id(c):
    dname, d, dv, softcap, mask, heads, seqused, _ = c
    return f"{dname}-d{d}x{dv}-cap{softcap:g}-{mask}-{heads}" + ("-seqused" if seqused else "")


@pytest.mark.parametrize("case", SOFTCAP_MATRIX, ids=[_softcap_id(c) for c in SOFTCAP_MATRIX])
def test_softcap(case):
    """A random batch (lengths 0..1100, seqused, trailing rows): out / softmax_lse per sequence and,
    where the backward softcap kernel is built, dq / dk / dv (0 in the rows that are not real
    tokens) against the reference with the capped scores."""
    dname, d, dv, softcap, mask, heads, seqused, seed = case
    dtype = DTYPES[dname]
    _skip_unless_softcap_built(dtype, d, dv)
    hq, hk = HEADS[heads]
    batch = _random_batch(seed, hq, hk, d, dv, dtype, seqused)
    causal, window = _mask_args(mask, batch, random.Random(seed + 1))
    # scores of a few units at 1/sqrt(d) (N(0, 1) inputs): scaled up so that softcap 5 bends many
    scale = 4.0 / d ** 0.5
    what = (f" [softcap={softcap}, lens_q {batch.lens_q}, lens_k {batch.lens_k}, used_q {batch.used_q}, "
            f"used_k {batch.used_k}, causal={causal}, window={window}]")
    _run_and_check(batch, causal, window, softmax_scale=scale, what=what, softcap=softcap)
    if flash3.backward_is_built(dtype, d, dv) and softcap_built(dtype, d, dv, backward=True):
        _run_and_check_backward(batch, causal, window, softmax_scale=scale, seed=seed, what=what, softcap=softcap)


@pytest.mark.parametrize("softcap", [1.0, 5.0, 30.0], ids=["cap1", "cap5", "cap30"])
@pytest.mark.parametrize("mask", MASKS, ids=MASKS)
def test_softcap_special_lengths(mask, softcap):
    """test_special_lengths' batch with softcap (1: saturated scores), forward and backward, with
    and without seqused."""
    dtype = torch.bfloat16
    _skip_unless_softcap_built(dtype, 128, 128)
    backward = flash3.backward_is_built(dtype, 128, 128) and softcap_built(dtype, 128, 128, backward=True)
    lens_q = [0, 1, 127, 128, 129, 1100, 129, 1]
    lens_k = [1, 0, 129, 128, 127, 1100, 1, 129]
    used_q = [0, 1, 100, 128, 128, 1000, 129, 0]
    used_k = [1, 0, 64, 128, 0, 1100, 1, 100]
    for seqused in (False, True):
        batch = Batch(lens_q, lens_k, 8, 2, 128, 128, dtype, used_q=used_q if seqused else None,
                      used_k=used_k if seqused else None, pad_q=5, pad_k=7, seed=3)
        causal, window = _mask_args(mask, batch, random.Random(7))
        scale = 4.0 / 128 ** 0.5  # scores of several units: softcap 1 and 5 saturate many
        what = f" [softcap={softcap}, seqused={seqused}, causal={causal}, window={window}]"
        _run_and_check(batch, causal, window, softmax_scale=scale, what=what, softcap=softcap)
        if backward:
            _run_and_check_backward(batch, causal, window, softmax_scale=scale, seed=17, what=what, softcap=softcap)


def test_softcap_scale_zero_is_uniform_attention():
    """softcap with softmax_scale=0: every capped score is 0, so each sequence's out is the mean of
    v over its visible keys and softmax_lse = log(count), as without softcap."""
    _skip_unless_softcap_built(torch.bfloat16, 128, 128)
    b = Batch([300, 0, 129, 64], [200, 5, 1100, 0], 4, 2, 128, 128, torch.bfloat16, seed=33)
    want_out, want_lse = b.call(softmax_scale=0.0, causal=True, window_size=(50, -1))
    out, lse = b.call(softmax_scale=0.0, causal=True, window_size=(50, -1), softcap=5.0)
    w = b.written_rows()
    torch.testing.assert_close(out[w], want_out[w], atol=1e-2, rtol=1e-2)
    ok, err, _, _, _ = check_close(lse[:, w], want_lse[:, w], want_lse[:, w], EPS_LSE)
    assert ok, f"lse err {err:.3e} vs softcap-free softmax_scale=0"
    _check_against_reference(out, lse, b, True, (50, -1), 0.0, " (softcap 5, scale 0)", softcap=5.0)


@pytest.mark.parametrize("heads", ["gqa", "mqa"], ids=["gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["nomask", "causal"])
def test_softcap_backward_deterministic_is_bitwise_reproducible(causal, heads):
    _skip_unless_softcap_built(torch.bfloat16, 128, 128, backward=True)
    hq, hk = HEADS[heads]
    batch = Batch([700, 0, 1, 1100, 300], [1100, 5, 0, 1100, 64], hq, hk, 128, 128, torch.bfloat16,
                  used_q=[650, 0, 1, 1100, 299], used_k=[1100, 5, 0, 1000, 64], pad_q=3, pad_k=9, seed=34)
    g_out, g_lse = _cotangents(batch, 35)
    runs = [_grads(batch, g_out, g_lse, causal=causal, softcap=30.0, deterministic=True)[2:] for _ in range(2)]
    for name, a, b in zip(("dq", "dk", "dv"), *runs):
        assert torch.equal(a, b), f"{name} differs between two deterministic softcap backward passes"
    _check_grads(runs[0], batch, causal, (-1, -1), g_out, g_lse, what=" (softcap 30, deterministic)", softcap=30.0)


def test_softcap_compile_and_opcheck():
    """softcap through torch.compile(fullgraph=True) (forward and backward: the fake
    implementations of varlen_fwd / varlen_bwd) computes what eager does; torch.library.opcheck of
    varlen_fwd with softcap."""
    _skip_unless_softcap_built(torch.bfloat16, 128, 128)
    bwd = flash3.backward_is_built(torch.bfloat16, 128, 128) and softcap_built(torch.bfloat16, 128, 128, True)
    b = Batch([300, 0, 129, 1], [200, 5, 1100, 0], 8, 2, 128, 128, torch.bfloat16, used_q=[300, 0, 100, 1], pad_q=2,
              seed=36)
    g_out, g_lse = _cotangents(b, 36)
    rows = b.written_rows()

    def f(q, k, v, cu_q, cu_k, used_q):
        out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, b.max_q, b.max_k, seqused_q=used_q, causal=True,
                                          softcap=30.0, deterministic=True, return_attn_probs=True)
        c = flash_attn_varlen_func(q, k, v, cu_q, cu_k, b.max_q, b.max_k, seqused_q=used_q, softmax_scale=0.3,
                                   window_size=(64, 5), softcap=5.0, deterministic=True)
        return out, lse, c

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    results = []
    for fn in (f, compiled):
        q, k, v = (t.detach().requires_grad_(bwd) for t in (b.q, b.k, b.v))
        out, lse, c = fn(q, k, v, b.cu_q, b.cu_k, b.seqused_q)
        grads = ()
        if bwd:
            loss = _loss(out, lse, g_out, g_lse, rows) + _loss(c, lse.detach(), g_out, g_lse, rows)
            grads = torch.autograd.grad(loss, (q, k, v))
        results.append((out.detach()[rows], lse.detach()[:, rows], c.detach()[rows], *grads))
    for name, x, y in zip(("out", "lse", "out2", "dq", "dk", "dv"), results[1], results[0]):
        if name in ("out", "lse", "out2"):
            assert torch.equal(x, y), f"{name}: compiled differs from eager"
        else:  # the compiled graph may sum the loss's terms into dout in another order
            torch.testing.assert_close(x, y, atol=2e-2, rtol=2e-2)
    op = torch.ops.flash3.varlen_fwd.default
    full = Batch([100, 0, 333, 1], [150, 7, 333, 0], 4, 2, 128, 128, torch.bfloat16, seed=37)
    tests = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    if bwd:
        tests += ("test_autograd_registration",)
    q, k, v = (t.detach().requires_grad_(bwd) for t in (full.q, full.k, full.v))
    for scale, causal, wl, wr, softcap in [(None, True, -1, -1, 30.0), (0.3, False, 17, 2 ** 40, 5.0)]:
        torch.library.opcheck(op, (q, k, v, full.cu_q, full.cu_k, None, None, full.max_q, full.max_k, scale, causal,
                                   wl, wr, softcap, True),
                              test_utils=tests)


# ---------------------------------------------------------------------------
# pack_gqa (PackGQA, forward only): only the speed depends on it.
# ---------------------------------------------------------------------------
PACK_GQA = [None, True, False]
PACK_IDS = ["packNone", "packTrue", "packFalse"]
PACK_HEADS = {"gqa": (8, 2), "mqa": (4, 1)}
PACK_SEQLENS_Q = [1, 7, 128 + 5]
PACK_HDIMS = [(64, 64), (128, 128), (192, 128)]


def _pack_batch(sq, hq, hk, d, dv, seqused, seed):
    """Sequences of sq queries (one of sq + 64) next to an empty one, over keys longer, shorter
    (causal rows that see no key) and absent; rows after cu_seqlens_q[-1]."""
    lens_q = [sq, 0, sq, sq + 64, sq]
    lens_k = [300, 17, 1, 129, 0]
    used_q = [sq, 0, max(sq - 3, 0), sq + 10, sq] if seqused else None
    used_k = [250, 17, 1, 100, 0] if seqused else None
    return Batch(lens_q, lens_k, hq, hk, d, dv, torch.bfloat16, used_q=used_q, used_k=used_k, pad_q=3, pad_k=2,
                 seed=seed)


@pytest.mark.parametrize("pack_gqa", PACK_GQA, ids=PACK_IDS)
@pytest.mark.parametrize("seqused", [False, True], ids=["full", "seqused"])
@pytest.mark.parametrize("causal", [False, True], ids=["nomask", "causal"])
@pytest.mark.parametrize("sq", PACK_SEQLENS_Q, ids=[f"sq{s}" for s in PACK_SEQLENS_Q])
@pytest.mark.parametrize("heads", list(PACK_HEADS), ids=list(PACK_HEADS))
@pytest.mark.parametrize("hdim", PACK_HDIMS, ids=[f"d{a}x{b}" for a, b in PACK_HDIMS])
def test_pack_gqa(hdim, heads, sq, causal, seqused, pack_gqa):
    """Forward (unwritten rows left alone) and the backward after it (which never packs) against
    the reference, for every pack_gqa."""
    d, dv = hdim
    _skip_unless_built(torch.bfloat16, d, dv)
    hq, hk = PACK_HEADS[heads]
    batch = _pack_batch(sq, hq, hk, d, dv, seqused, seed=zlib.crc32(f"{d}x{dv}-{heads}-{sq}".encode()))
    what = f" [pack_gqa={pack_gqa}, hq={hq}, hkv={hk}, lens_q {batch.lens_q}, used_q {batch.used_q}, causal={causal}]"
    _run_and_check(batch, causal, (-1, -1), what=what, pack_gqa=pack_gqa)
    if flash3.backward_is_built(torch.bfloat16, d, dv):
        _run_and_check_backward(batch, causal, (-1, -1), seed=sq, what=what, pack_gqa=pack_gqa)


def test_pack_gqa_compile_and_opcheck():
    """pack_gqa through torch.compile(fullgraph=True) computes what eager does (on the rows it
    writes); torch.library.opcheck of varlen_fwd with an explicit pack_gqa."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    b = _pack_batch(7, 8, 2, 128, 128, True, seed=38)
    w = b.written_rows()

    def f(q, k, v, cu_q, cu_k, used_q, used_k):
        return [flash_attn_varlen_func(q, k, v, cu_q, cu_k, b.max_q, b.max_k, seqused_q=used_q, seqused_k=used_k,
                                       causal=True, pack_gqa=pack, return_attn_probs=True)
                for pack in PACK_GQA]

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    args = (b.q, b.k, b.v, b.cu_q, b.cu_k, b.seqused_q, b.seqused_k)
    with torch.no_grad():
        for (out, lse), (want_out, want_lse) in zip(compiled(*args), f(*args)):
            assert torch.equal(out[w], want_out[w]) and torch.equal(lse[:, w], want_lse[:, w])
    op = torch.ops.flash3.varlen_fwd.default
    full = Batch([7, 0, 133, 1], [150, 7, 333, 0], 8, 2, 128, 128, torch.bfloat16, seed=39)
    tests = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    bwd = flash3.backward_is_built(torch.bfloat16, 128, 128)
    if bwd:
        tests += ("test_autograd_registration",)
    q, k, v = (t.detach().requires_grad_(bwd) for t in (full.q, full.k, full.v))
    for pack in (-1, 0, 1):
        torch.library.opcheck(op, (q, k, v, full.cu_q, full.cu_k, None, None, full.max_q, full.max_k, None, True,
                                   -1, -1, 0.0, True, pack),
                              test_utils=tests)


# ---------------------------------------------------------------------------
# torch.compile, opcheck, CUDA graphs.
# ---------------------------------------------------------------------------
def test_opcheck():
    """Schema, fake (meta) implementation vs the real kernel, autograd registration; AOT dispatch
    (which compares eager and traced outputs in full) on a batch whose rows are all written."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    op = torch.ops.flash3.varlen_fwd.default
    b = Batch([100, 0, 333], [150, 7, 333], 4, 2, 128, 128, torch.bfloat16, used_q=[50, 0, 333], used_k=[150, 7, 1],
              pad_q=3, seed=10)
    arg_lists = [(None, None, None, True, -1, -1), (b.seqused_q, b.seqused_k, 0.3, False, 17, 2 ** 40),
                 (b.seqused_q, None, 0.0, True, 64, 5)]
    for sq, sk, scale, causal, wl, wr in arg_lists:
        torch.library.opcheck(op, (b.q, b.k, b.v, b.cu_q, b.cu_k, sq, sk, b.max_q, b.max_k, scale, causal, wl, wr,
                                   0.0, False),
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    full = Batch([100, 0, 333, 1], [150, 7, 333, 0], 4, 2, 128, 128, torch.bfloat16, seed=10)
    for scale, causal, wl, wr in [(None, True, -1, -1), (0.3, False, 17, 2 ** 40)]:
        torch.library.opcheck(op, (full.q, full.k, full.v, full.cu_q, full.cu_k, None, None, full.max_q, full.max_k,
                                   scale, causal, wl, wr, 0.0, False),
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    if not flash3.backward_is_built(torch.bfloat16, 128, 128):
        return
    # With inputs that require grad: the autograd kernel, and AOT dispatch of forward + backward
    # (varlen_bwd through its fake implementation; deterministic, so eager and traced gradients
    # are comparable).
    q, k, v = (t.detach().requires_grad_() for t in (full.q, full.k, full.v))
    for scale, causal, wl, wr in [(None, True, -1, -1), (0.3, False, 17, 2 ** 40)]:
        torch.library.opcheck(op, (q, k, v, full.cu_q, full.cu_k, None, None, full.max_q, full.max_k, scale, causal,
                                   wl, wr, 0.0, True),
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                          "test_aot_dispatch_dynamic"))
    # varlen_bwd itself: schema and fake vs real outputs, with seqused and dlse
    out, lse = op(b.q, b.k, b.v, b.cu_q, b.cu_k, b.seqused_q, b.seqused_k, b.max_q, b.max_k, None, True, -1, -1, 0.0,
                  False)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    for sq, sk, scale, causal, wl, wr, dl in [(None, None, None, True, -1, -1, None),
                                              (b.seqused_q, b.seqused_k, 0.3, False, 17, 2 ** 40, dlse)]:
        torch.library.opcheck(torch.ops.flash3.varlen_bwd.default,
                              (dout, b.q, b.k, b.v, out, lse, b.cu_q, b.cu_k, sq, sk, b.max_q, b.max_k, scale, causal,
                               wl, wr, 0.0, True, dl),
                              test_utils=("test_schema", "test_faketensor"))


def test_compile_fullgraph():
    """flash_attn_varlen_func traces without graph breaks (fake implementation), and the compiled
    calls compute what the eager ones do (on the rows they write), for two batch shapes."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    torch._dynamo.reset()

    def f(q, k, v, cu_q, cu_k, used_q, max_q, max_k):
        a, la = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True, return_attn_probs=True)
        c = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, seqused_q=used_q, softmax_scale=0.2,
                                   window_size=(64, 2 ** 40))
        return a * 2, la + 1, c

    compiled = torch.compile(f, fullgraph=True)
    for seed, lens_q, lens_k, used in ((12, [300, 0, 129], [200, 5, 1100], [300, 0, 100]),
                                       (13, [1, 700, 128, 64], [1, 700, 127, 1000], [0, 699, 128, 64])):
        b = Batch(lens_q, lens_k, 8, 2, 128, 128, torch.bfloat16, used_q=used, seed=seed)
        args = (b.q, b.k, b.v, b.cu_q, b.cu_k, b.seqused_q, b.max_q, b.max_k)
        with torch.no_grad():
            want = f(*args)
            got = compiled(*args)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        w = b.written_rows()
        assert torch.equal(got[2][w], want[2][w])


def test_compile_fullgraph_forward_backward():
    """Forward + backward under torch.compile(fullgraph=True): the backward graph calls varlen_bwd
    through its fake implementation; deterministic gradients equal the eager ones bitwise, for
    two batch shapes (the second one traced with dynamic shapes)."""
    _skip_unless_built(torch.bfloat16, 128, 128, backward=True)
    torch._dynamo.reset()
    max_q = max_k = 1100  # an upper bound of both batches

    def f(q, k, v, cu_q, cu_k, used_q, used_k, g_out, g_lse, rows_q):
        out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, seqused_q=used_q, seqused_k=used_k,
                                          causal=True, deterministic=True, return_attn_probs=True)
        return _loss(out, lse, g_out, g_lse, rows_q)

    compiled = torch.compile(f, fullgraph=True)
    for seed, lens_q, lens_k, used_q, used_k in ((24, [300, 0, 129], [200, 5, 1100], [300, 0, 100], [150, 5, 1100]),
                                                 (25, [1, 700, 128, 64], [1, 700, 127, 1000], [0, 699, 128, 64],
                                                  [1, 700, 0, 999])):
        b = Batch(lens_q, lens_k, 8, 2, 128, 128, torch.bfloat16, used_q=used_q, used_k=used_k, pad_q=2, seed=seed)
        g_out, g_lse = _cotangents(b, seed)
        results = []
        for fn in (f, compiled):
            q, k, v = (t.detach().requires_grad_() for t in (b.q, b.k, b.v))
            loss = fn(q, k, v, b.cu_q, b.cu_k, b.seqused_q, b.seqused_k, g_out, g_lse, b.written_rows())
            results.append((loss.detach(), *torch.autograd.grad(loss, (q, k, v))))
        # the loss is a sum the compiled graph may order differently; the gradients are flash3's
        # deterministic kernels on bitwise-equal dout / dlse
        torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-4, atol=1e-2)
        for name, got, want in zip(("dq", "dk", "dv"), results[1][1:], results[0][1:]):
            assert torch.equal(got, want), f"{name}: compiled differs from eager (seed {seed})"
        _check_grads(results[1][1:], b, True, (-1, -1), g_out, g_lse, what=f" (compiled, seed {seed})")


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


def test_cuda_graph():
    """Capture once; replay with new q / k / v and new cu_seqlens / seqused values (same number of
    sequences and tokens): the kernels read the lengths on the device, so each replay computes
    the new batch, equal to an eager call on the rows both write."""
    _skip_unless_built(torch.bfloat16, 128, 128)
    lens_q, lens_k = [300, 129, 0, 595], [128, 1000, 1, 71]
    b = Batch(lens_q, lens_k, 8, 2, 128, 128, torch.bfloat16, used_q=lens_q, used_k=lens_k, seed=14)
    max_q, max_k = 1100, 1100  # an upper bound of every batch replayed below
    g, (out, lse) = _graph_capture(lambda: flash_attn_varlen_func(
        b.q, b.k, b.v, b.cu_q, b.cu_k, max_q, max_k, seqused_q=b.seqused_q, seqused_k=b.seqused_k, causal=True,
        window_size=(200, -1), return_attn_probs=True))
    r = random.Random(15)
    for it in range(3):
        # new lengths with the same totals, seqused at or below them
        new_q = _split(r, sum(lens_q), 4, max_q)
        new_k = _split(r, sum(lens_k), 4, max_k)
        nb = Batch(new_q, new_k, 8, 2, 128, 128, torch.bfloat16, used_q=_draw_used(r, new_q),
                   used_k=_draw_used(r, new_k), seed=100 + it)
        for dst, src in ((b.q, nb.q), (b.k, nb.k), (b.v, nb.v), (b.cu_q, nb.cu_q), (b.cu_k, nb.cu_k),
                         (b.seqused_q, nb.seqused_q), (b.seqused_k, nb.seqused_k)):
            dst.copy_(src)
        g.replay()
        want_out, want_lse = flash_attn_varlen_func(nb.q, nb.k, nb.v, nb.cu_q, nb.cu_k, max_q, max_k,
                                                    seqused_q=nb.seqused_q, seqused_k=nb.seqused_k, causal=True,
                                                    window_size=(200, -1), return_attn_probs=True)
        torch.cuda.synchronize()
        w = nb.written_rows()
        assert torch.equal(out[w], want_out[w]) and torch.equal(lse[:, w], want_lse[:, w]), f"replay {it}"
        _check_against_reference(out, lse, nb, True, (200, -1), what=f" (replay {it})")


def test_cuda_graph_forward_backward():
    """Forward + backward captured once (deterministic); replays with new q / k / v / dout and new
    cu_seqlens / seqused values give the eager gradients of the new batch bitwise, 0 included in
    the rows that are not real tokens of the new batch."""
    _skip_unless_built(torch.bfloat16, 128, 128, backward=True)
    lens_q, lens_k = [300, 129, 0, 595], [128, 1000, 1, 71]
    b = Batch(lens_q, lens_k, 8, 2, 128, 128, torch.bfloat16, used_q=lens_q, used_k=lens_k, pad_q=4, pad_k=2,
              seed=26)
    q, k, v = (t.requires_grad_() for t in (b.q, b.k, b.v))
    dout = torch.randn(b.total_q, 8, 128, device=DEVICE, dtype=torch.bfloat16)
    max_q, max_k = 1100, 1100  # an upper bound of every batch replayed below

    def step(q, k, v, cu_q, cu_k, used_q, used_k, dout):
        out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, seqused_q=used_q, seqused_k=used_k,
                                     causal=True, window_size=(200, -1), deterministic=True)
        return (out.detach(), *torch.autograd.grad(out, (q, k, v), dout))

    g, static = _graph_capture(lambda: step(q, k, v, b.cu_q, b.cu_k, b.seqused_q, b.seqused_k, dout))
    r = random.Random(27)
    for it in range(2):
        new_q = _split(r, sum(lens_q), 4, max_q)
        new_k = _split(r, sum(lens_k), 4, max_k)
        nb = Batch(new_q, new_k, 8, 2, 128, 128, torch.bfloat16, used_q=_draw_used(r, new_q),
                   used_k=_draw_used(r, new_k), pad_q=4, pad_k=2, seed=200 + it)
        new_dout = torch.randn_like(dout)
        with torch.no_grad():
            for dst, src in ((q, nb.q), (k, nb.k), (v, nb.v), (b.cu_q, nb.cu_q), (b.cu_k, nb.cu_k),
                             (b.seqused_q, nb.seqused_q), (b.seqused_k, nb.seqused_k), (dout, new_dout)):
                dst.copy_(src)
        g.replay()
        nq, nk, nv = (t.requires_grad_() for t in (nb.q, nb.k, nb.v))
        eager = step(nq, nk, nv, nb.cu_q, nb.cu_k, nb.seqused_q, nb.seqused_k, new_dout)
        torch.cuda.synchronize()
        w = nb.written_rows()
        assert torch.equal(static[0][w], eager[0][w]), f"out: replay {it} differs from eager"
        for name, a, e in zip(("dq", "dk", "dv"), static[1:], eager[1:]):
            assert torch.equal(a, e), f"{name}: replay {it} differs from eager"
        assert torch.count_nonzero(static[1][~w]) == 0 and torch.count_nonzero(static[2][~nb.key_rows()]) == 0


def _split(r, total, n, cap):
    """n lengths in [0, cap] adding up to total (total <= n * cap)."""
    while True:
        cuts = sorted(r.randint(0, total) for _ in range(n - 1))
        lens = [b - a for a, b in zip([0] + cuts, cuts + [total])]
        if max(lens) <= cap:
            return lens
