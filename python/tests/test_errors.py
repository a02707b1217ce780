# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""Bad arguments raise a Python exception of the right type, naming the argument, before any
kernel is launched (eager mode: the C++ checks; torch.compile: the fake implementation)."""
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("flash3 needs a Hopper (sm_90) GPU", allow_module_level=True)

import flash3  # noqa: E402
from flash3 import flash_attn_func, flash_attn_varlen_func  # noqa: E402

DEV = "cuda"
BF16 = torch.bfloat16


def good(b=2, sq=64, sk=64, hq=4, hk=4, d=128, dv=None, dtype=BF16, device=DEV):
    dv = d if dv is None else dv
    return (torch.randn(b, sq, hq, d, device=device, dtype=dtype),
            torch.randn(b, sk, hk, d, device=device, dtype=dtype),
            torch.randn(b, sk, hk, dv, device=device, dtype=dtype))


def _noncontig_last(t):
    """Same shape, stride(-1) == 2."""
    big = torch.randn(*t.shape[:-1], 2 * t.shape[-1], device=t.device, dtype=t.dtype)
    return big[..., ::2]


def _with(i, t):
    def make():
        args = list(good())
        args[i] = t(args[i]) if callable(t) else t
        return args
    return make


CASES = {
    # name: (make args, kwargs (or a function making them), exception type, substrings the message must contain)
    "q_on_cpu": (lambda: [a.cpu() if i == 0 else a for i, a in enumerate(good())], {}, ValueError, ["q", "CUDA"]),
    "all_on_cpu": (lambda: list(good(device="cpu")), {}, ValueError, ["q", "CUDA"]),
    "k_on_cpu": (_with(1, lambda t: t.cpu()), {}, ValueError, ["k", "CUDA"]),
    "v_on_cpu": (_with(2, lambda t: t.cpu()), {}, ValueError, ["v", "CUDA"]),
    "fp32": (lambda: list(good(dtype=torch.float32)), {}, TypeError, ["q.dtype", "float32"]),
    "fp64": (lambda: list(good(dtype=torch.float64)), {}, TypeError, ["q.dtype"]),
    "k_dtype_mismatch": (_with(1, lambda t: t.half()), {}, TypeError, ["k.dtype", "q.dtype"]),
    "v_dtype_mismatch": (_with(2, lambda t: t.float()), {}, TypeError, ["v.dtype"]),
    "q_head_dim_not_contiguous": (_with(0, _noncontig_last), {}, ValueError, ["q.stride(-1)", "head_dim"]),
    "k_head_dim_not_contiguous": (_with(1, _noncontig_last), {}, ValueError, ["k.stride(-1)", "head_dim"]),
    "v_head_dim_not_contiguous": (_with(2, _noncontig_last), {}, ValueError, ["v.stride(-1)", "head_dim_v"]),
    "q_3d": (_with(0, lambda t: t[0]), {}, ValueError, ["q", "4-d"]),
    "batch_mismatch": (_with(1, lambda t: t[:1]), {}, ValueError, ["k.shape[0]", "batch"]),
    "seqlen_k_v_mismatch": (_with(2, lambda t: t[:, :10]), {}, ValueError, ["v.shape[1]", "seqlen_k"]),
    "heads_k_v_mismatch": (_with(2, lambda t: t[:, :, :2]), {}, ValueError, ["v.shape[2]", "num_heads_kv"]),
    "head_dim_q_k_mismatch": (_with(1, lambda t: t[..., :64].contiguous()), {}, ValueError, ["k.shape[3]", "head_dim"]),
    "gqa_not_divisible": (lambda: list(good(hq=6, hk=4)), {}, ValueError, ["num_heads_q", "num_heads_kv", "multiple"]),
    "hdim_80": (lambda: list(good(d=80)), {}, ValueError, ["head_dim", "80"]),
    "hdim_512": (lambda: list(good(d=512)), {}, ValueError, ["head_dim", "512"]),
    "hdim_pair_unsupported": (lambda: list(good(d=128, dv=64)), {}, ValueError, ["head_dim_v", "64"]),
    # No window is an error (FlashAttention-3's rules): see test_flash_attn.py's mask tests.
    "softmax_scale_negative": (lambda: list(good()), {"softmax_scale": -0.5}, ValueError, ["softmax_scale", "-0.5"]),
    "softmax_scale_negative_tiny": (lambda: list(good()), {"softmax_scale": -1e-30}, ValueError, ["softmax_scale"]),
    "softmax_scale_nan": (lambda: list(good()), {"softmax_scale": float("nan")}, ValueError, ["softmax_scale"]),
    "softmax_scale_inf": (lambda: list(good()), {"softmax_scale": float("inf")}, ValueError, ["softmax_scale"]),
    "softmax_scale_float32_overflow": (lambda: list(good()), {"softmax_scale": 1e39}, ValueError, ["softmax_scale"]),
    # softcap: 0 disables, > 0 caps (test_flash_attn.py); negative / NaN / inf (as float32) are errors
    "softcap_negative": (lambda: list(good()), {"softcap": -1.0}, ValueError, ["softcap", "-1"]),
    "softcap_negative_tiny": (lambda: list(good()), {"softcap": -1e-30}, ValueError, ["softcap"]),
    "softcap_nan": (lambda: list(good()), {"softcap": float("nan")}, ValueError, ["softcap", "nan"]),
    "softcap_inf": (lambda: list(good()), {"softcap": float("inf")}, ValueError, ["softcap", "inf"]),
    "softcap_float32_overflow": (lambda: list(good()), {"softcap": 1e39}, ValueError, ["softcap"]),
    # pack_gqa: None (heuristic), True or False (FlashAttention-3's Optional[bool])
    "pack_gqa_str": (lambda: list(good(hk=2)), {"pack_gqa": "yes"}, TypeError, ["pack_gqa", "'yes'", "None", "True"]),
    "pack_gqa_int": (lambda: list(good(hk=2)), {"pack_gqa": 2}, TypeError, ["pack_gqa", "int"]),
    "qv_not_implemented": (lambda: list(good()), lambda: {"qv": torch.zeros(1, device=DEV)}, NotImplementedError, ["qv"]),
    "descale_not_implemented": (lambda: list(good()), lambda: {"q_descale": torch.ones(1, device=DEV)}, NotImplementedError,
                                ["descale"]),
    "attention_chunk_not_implemented": (lambda: list(good()), {"attention_chunk": 128}, NotImplementedError,
                                        ["attention_chunk"]),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_argument_raises(case):
    make, kwargs, exc, words = CASES[case]
    args = make()
    kwargs = kwargs() if callable(kwargs) else kwargs
    with pytest.raises(exc) as ei:
        flash_attn_func(*args, **kwargs)
    msg = str(ei.value)
    for w in words:
        assert w in msg, f"message lacks {w!r}: {msg}"


@pytest.mark.parametrize("case", ["fp32", "hdim_80", "gqa_not_divisible", "q_head_dim_not_contiguous",
                                  "softmax_scale_negative", "softcap_negative", "softcap_nan"])
def test_bad_argument_raises_same_type_under_compile(case):
    """Traced (fake) calls fail like eager ones (torch.compile wraps the error; its cause is ours)."""
    make, kwargs, exc, words = CASES[case]
    args = make()
    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v: flash_attn_func(q, k, v, **kwargs), fullgraph=True, dynamic=False)
    with pytest.raises(Exception) as ei:
        f(*args)
    e = ei.value
    chain = [e]
    while len(chain) < 10 and (chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    # Dynamo re-raises as TorchRuntimeError("... got TypeError('flash3: ...')"): the original type
    # is either in the chain or named in the message.
    assert any(isinstance(x, exc) for x in chain) or f"{exc.__name__}(" in str(e), f"{type(e).__name__}: {e}"
    for w in words:
        assert w in str(e), f"message lacks {w!r}: {e}"


def test_no_kernel_launched_on_error():
    """An invalid call queues no GPU work (checked with the CUDA profiler)."""
    from torch.profiler import ProfilerActivity, profile

    args = list(good(d=80))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with pytest.raises(ValueError):
            flash_attn_func(*args)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert not kernels, f"kernels launched by an invalid call: {kernels}"


@pytest.mark.parametrize("scale", [-1.0, float("nan")], ids=["negative", "nan"])
def test_backward_op_rejects_bad_scale_before_any_work(scale):
    """torch.ops.flash3.bwd with a bad softmax_scale raises ValueError before it copies the
    expanded dout or launches anything."""
    from torch.profiler import ProfilerActivity, profile

    q, k, v = good()
    out, lse = torch.ops.flash3.fwd(q, k, v, None, False, -1, -1, 0.0, False)
    dout = torch.ones(1, device=DEV, dtype=BF16).expand_as(out)  # strides 0: would need a copy
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with pytest.raises(ValueError, match="softmax_scale"):
            torch.ops.flash3.bwd(dout, q, k, v, out, lse, None, scale, False, -1, -1, 0.0, False)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert not kernels, f"kernels launched by an invalid call: {kernels}"


@pytest.mark.parametrize("softcap", [-1.0, float("nan"), float("inf")], ids=["negative", "nan", "inf"])
def test_ops_reject_bad_softcap(softcap):
    """The operators called directly (no flash_attn_func check in front), fwd and bwd: a bad
    softcap is the library's InvalidArgument, a ValueError naming softcap, before any kernel is
    queued."""
    from torch.profiler import ProfilerActivity, profile

    q, k, v = good()
    out, lse = torch.ops.flash3.fwd(q, k, v, None, False, -1, -1, 0.0, False)
    dout = torch.randn_like(out)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with pytest.raises(ValueError, match="softcap"):
            torch.ops.flash3.fwd(q, k, v, None, False, -1, -1, softcap, False)
        if flash3.backward_is_built(BF16, 128, 128):
            with pytest.raises(ValueError, match="softcap"):
                torch.ops.flash3.bwd(dout, q, k, v, out, lse, None, None, False, -1, -1, softcap, False)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert not kernels, f"kernels launched by an invalid call: {kernels}"


@pytest.mark.parametrize("pack_gqa", [2, -2, 2 ** 40], ids=["2", "-2", "2pow40"])
def test_ops_reject_bad_pack_gqa(pack_gqa):
    """fwd and varlen_fwd called directly with an int pack_gqa other than -1, 0, 1: ValueError naming
    pack_gqa before any kernel is queued; under torch.compile the fake implementations raise it."""
    from torch.profiler import ProfilerActivity, profile

    q, k, v = good(hk=2)
    a = vgood()
    varlen = (a["q"], a["k"], a["v"], a["cu_seqlens_q"], a["cu_seqlens_k"], None, None, a["max_seqlen_q"],
              a["max_seqlen_k"])
    want = f"pack_gqa is {pack_gqa}; expected -1 (heuristic), 0 (off) or 1 (on)"
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with pytest.raises(ValueError, match=want.replace("(", r"\(").replace(")", r"\)")):
            torch.ops.flash3.fwd(q, k, v, None, False, -1, -1, 0.0, False, pack_gqa)
        with pytest.raises(ValueError, match="pack_gqa"):
            torch.ops.flash3.varlen_fwd(*varlen, None, False, -1, -1, 0.0, False, pack_gqa)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert not kernels, f"kernels launched by an invalid call: {kernels}"
    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v: torch.ops.flash3.fwd(q, k, v, None, False, -1, -1, 0.0, False, pack_gqa),
                      fullgraph=True, dynamic=False)
    with pytest.raises(Exception) as ei:
        f(q, k, v)
    e = ei.value
    chain = [e]
    while len(chain) < 10 and (chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    assert any(isinstance(x, ValueError) for x in chain) or "ValueError(" in str(e), f"{type(e).__name__}: {e}"
    assert want in str(e) or any(want in str(x) for x in chain), f"{type(e).__name__}: {e}"


def test_pack_gqa_is_accepted():
    """None, True and False run (GQA, MQA and MHA alike: MHA has no packed kernel and runs the
    unpacked one); the operators take -1, 0 and 1, positionally or by name; the backward after a
    packed forward runs."""
    for hk in (2, 1, 4):
        q, k, v = good(hk=hk)
        want = flash_attn_func(q, k, v, pack_gqa=False)
        for pack in (None, True, False):
            out = flash_attn_func(q, k, v, pack_gqa=pack)
            assert out.shape == want.shape and not torch.isnan(out).any()
        for pack in (-1, 0, 1):
            out, lse = torch.ops.flash3.fwd(q, k, v, None, False, -1, -1, 0.0, False, pack)
            out_kw, _ = torch.ops.flash3.fwd(q, k, v, pack_gqa=pack)
            assert torch.equal(out, out_kw) and lse.shape == (2, 4, 64)
    if flash3.backward_is_built(BF16, 128, 128):
        q, k, v = (t.requires_grad_() for t in good(hk=2))
        flash_attn_func(q, k, v, pack_gqa=True).sum().backward()
        assert q.grad is not None and k.grad.shape == k.shape


def test_softcap_is_accepted():
    """softcap > 0 is no longer NotImplementedError: it runs (where this build has the softcap
    kernels, CMake FLASH3_FEATURES) or names FLASH3_FEATURES; 0 (and -0.0) disable it."""
    q, k, v = good()
    want = flash_attn_func(q, k, v)
    for off in (0.0, -0.0, 0):
        assert torch.equal(flash_attn_func(q, k, v, softcap=off), want)
    try:
        out = flash_attn_func(q, k, v, softcap=30.0)
    except NotImplementedError as e:
        assert "opts.softcap" in str(e) and "FLASH3_FEATURES" in str(e), str(e)
        return
    assert out.shape == want.shape and not torch.isnan(out).any()
    out_int = flash_attn_func(q, k, v, softcap=30)  # an int is a number too
    assert torch.equal(out_int, out)


# ---------------------------------------------------------------------------
# flash_attn_varlen_func / torch.ops.flash3.varlen_fwd: the torch-side checks (the contents of
# cu_seqlens_* / seqused_* are never read by the host, so only their tensors are checked).
# ---------------------------------------------------------------------------
I32 = torch.int32


def vgood(hq=4, hk=2, d=128, dv=None, dtype=BF16, device=DEV):
    """Keyword arguments of a valid flash_attn_varlen_func call: 3 sequences, q 300 rows, k 260 rows."""
    dv = d if dv is None else dv
    return dict(q=torch.randn(300, hq, d, device=device, dtype=dtype),
                k=torch.randn(260, hk, d, device=device, dtype=dtype),
                v=torch.randn(260, hk, dv, device=device, dtype=dtype),
                cu_seqlens_q=torch.tensor([0, 100, 100, 300], dtype=I32, device=device),
                cu_seqlens_k=torch.tensor([0, 60, 70, 260], dtype=I32, device=device),
                max_seqlen_q=200, max_seqlen_k=190)


def _vwith(**changes):
    """vgood() with some arguments replaced: a value, or a function of the valid call's kwargs."""
    def make():
        a = vgood()
        for name, c in changes.items():
            a[name] = c(a) if callable(c) else c
        return a
    return make


def _i32(*values, device=DEV):
    return torch.tensor(values, dtype=I32, device=device)


VARLEN_CASES = {
    # name: (make kwargs, exception type, substrings the message must contain)
    "ok": (vgood, None, []),
    "ok_seqused": (_vwith(seqused_q=lambda a: _i32(50, 0, 200), seqused_k=lambda a: _i32(60, 10, 7)), None, []),
    "all_on_cpu": (lambda: vgood(device="cpu"), ValueError, ["q", "CUDA"]),
    "q_on_cpu": (_vwith(q=lambda a: a["q"].cpu()), ValueError, ["q", "CUDA"]),
    "v_on_cpu": (_vwith(v=lambda a: a["v"].cpu()), ValueError, ["v", "CUDA"]),
    "fp32": (lambda: vgood(dtype=torch.float32), TypeError, ["q.dtype", "float32"]),
    "k_dtype_mismatch": (_vwith(k=lambda a: a["k"].half()), TypeError, ["k.dtype", "q.dtype"]),
    "q_4d": (_vwith(q=lambda a: a["q"].unsqueeze(0)), ValueError, ["q", "3-d", "total_q"]),
    "k_4d": (_vwith(k=lambda a: a["k"].unsqueeze(0)), ValueError, ["k", "3-d", "total_k"]),
    "v_2d": (_vwith(v=lambda a: a["v"].flatten(1)), ValueError, ["v", "3-d"]),
    "q_head_dim_not_contiguous": (_vwith(q=lambda a: _noncontig_last(a["q"])), ValueError,
                                  ["q.stride(-1)", "head_dim"]),
    "v_head_dim_not_contiguous": (_vwith(v=lambda a: _noncontig_last(a["v"])), ValueError,
                                  ["v.stride(-1)", "head_dim_v"]),
    "total_k_mismatch": (_vwith(v=lambda a: a["v"][:200]), ValueError, ["v.shape[0]", "total_k"]),
    "heads_k_v_mismatch": (_vwith(v=lambda a: a["v"][:, :1]), ValueError, ["v.shape[1]", "num_heads_kv"]),
    "head_dim_q_k_mismatch": (_vwith(k=lambda a: a["k"][..., :64].contiguous()), ValueError,
                              ["k.shape[2]", "head_dim"]),
    "gqa_not_divisible": (lambda: vgood(hq=6, hk=4), ValueError, ["num_heads_q", "num_heads_kv", "multiple"]),
    "hdim_80": (lambda: vgood(d=80), ValueError, ["head_dim", "80"]),
    # cu_seqlens_*: int32, 1-d, contiguous, on q's device, the same length (>= 1)
    "cu_seqlens_q_on_cpu": (_vwith(cu_seqlens_q=lambda a: a["cu_seqlens_q"].cpu()), ValueError,
                            ["cu_seqlens_q", "CUDA", "cpu"]),
    "cu_seqlens_k_on_cpu": (_vwith(cu_seqlens_k=lambda a: a["cu_seqlens_k"].cpu()), ValueError,
                            ["cu_seqlens_k", "CUDA", "cpu"]),
    "cu_seqlens_q_int64": (_vwith(cu_seqlens_q=lambda a: a["cu_seqlens_q"].long()), TypeError,
                           ["cu_seqlens_q.dtype", "torch.int64", "torch.int32"]),
    "cu_seqlens_k_float": (_vwith(cu_seqlens_k=lambda a: a["cu_seqlens_k"].float()), TypeError,
                           ["cu_seqlens_k.dtype", "torch.int32"]),
    "cu_seqlens_q_2d": (_vwith(cu_seqlens_q=lambda a: a["cu_seqlens_q"].view(4, 1)), ValueError,
                        ["cu_seqlens_q", "1-d"]),
    "cu_seqlens_k_0d": (_vwith(cu_seqlens_k=lambda a: a["cu_seqlens_k"][0]), ValueError, ["cu_seqlens_k", "1-d"]),
    "cu_seqlens_q_not_contiguous": (_vwith(cu_seqlens_q=lambda a: _i32(0, 9, 100, 9, 100, 9, 300, 9)[::2]),
                                    ValueError, ["cu_seqlens_q.stride(0)", "contiguous"]),
    "cu_seqlens_k_not_contiguous": (_vwith(cu_seqlens_k=lambda a: _i32(0, 9, 60, 9, 70, 9, 260, 9)[::2]),
                                    ValueError, ["cu_seqlens_k.stride(0)", "contiguous"]),
    "cu_seqlens_length_mismatch": (_vwith(cu_seqlens_k=lambda a: _i32(0, 60, 260)), ValueError,
                                   ["cu_seqlens_k", "entries", "cu_seqlens_q"]),
    "cu_seqlens_empty": (_vwith(cu_seqlens_q=lambda a: _i32(), cu_seqlens_k=lambda a: _i32()), ValueError,
                         ["cu_seqlens_q", "empty"]),
    # seqused_*: int32, 1-d, contiguous, on q's device, num_sequences entries
    "seqused_q_on_cpu": (_vwith(seqused_q=lambda a: _i32(1, 2, 3, device="cpu")), ValueError,
                         ["seqused_q", "CUDA", "cpu"]),
    "seqused_k_on_cpu": (_vwith(seqused_k=lambda a: _i32(1, 2, 3, device="cpu")), ValueError,
                         ["seqused_k", "CUDA", "cpu"]),
    "seqused_q_int64": (_vwith(seqused_q=lambda a: _i32(1, 2, 3).long()), TypeError,
                        ["seqused_q.dtype", "torch.int64", "torch.int32"]),
    "seqused_k_int16": (_vwith(seqused_k=lambda a: _i32(1, 2, 3).short()), TypeError,
                        ["seqused_k.dtype", "torch.int16", "torch.int32"]),
    "seqused_q_2d": (_vwith(seqused_q=lambda a: _i32(1, 2, 3).view(1, 3)), ValueError, ["seqused_q", "1-d"]),
    "seqused_k_not_contiguous": (_vwith(seqused_k=lambda a: _i32(1, 0, 2, 0, 3, 0)[::2]), ValueError,
                                 ["seqused_k.stride(0)", "contiguous"]),
    "seqused_q_too_long": (_vwith(seqused_q=lambda a: _i32(1, 2, 3, 4)), ValueError,
                           ["seqused_q", "4 entries", "expected 3"]),
    "seqused_k_too_short": (_vwith(seqused_k=lambda a: _i32(1, 2)), ValueError,
                            ["seqused_k", "2 entries", "expected 3"]),
    # max_seqlen_*: in [0, 2**31 - 1] (0: every sequence of that side is empty)
    "max_seqlen_q_float": (_vwith(max_seqlen_q=2.0), TypeError, ["max_seqlen_q", "float"]),
    "max_seqlen_k_negative": (_vwith(max_seqlen_k=-1), ValueError, ["max_seqlen_k", "-1"]),
    "max_seqlen_q_beyond_int32": (_vwith(max_seqlen_q=2 ** 31), ValueError, ["max_seqlen_q", "2147483648"]),
    # scale and not-implemented features, as flash_attn_func
    "softmax_scale_negative": (_vwith(softmax_scale=-0.5), ValueError, ["softmax_scale", "-0.5"]),
    "softmax_scale_nan": (_vwith(softmax_scale=float("nan")), ValueError, ["softmax_scale"]),
    "softcap_negative": (_vwith(softcap=-0.5), ValueError, ["softcap", "-0.5"]),
    "softcap_inf": (_vwith(softcap=float("inf")), ValueError, ["softcap", "inf"]),
    "qv_not_implemented": (_vwith(qv=lambda a: torch.zeros(1, device=DEV)), NotImplementedError, ["qv"]),
    "descale_not_implemented": (_vwith(k_descale=lambda a: torch.ones(1, device=DEV)), NotImplementedError,
                                ["descale"]),
    "attention_chunk_not_implemented": (_vwith(attention_chunk=128), NotImplementedError, ["attention_chunk"]),
    # pack_gqa: None (heuristic), True or False
    "ok_pack_gqa_true": (_vwith(pack_gqa=True), None, []),
    "ok_pack_gqa_false": (_vwith(pack_gqa=False), None, []),
    "pack_gqa_str": (_vwith(pack_gqa="yes"), TypeError, ["pack_gqa", "'yes'"]),
    "pack_gqa_float": (_vwith(pack_gqa=1.0), TypeError, ["pack_gqa", "float"]),
}


@pytest.mark.parametrize("case", list(VARLEN_CASES), ids=list(VARLEN_CASES))
def test_varlen_bad_argument_raises(case):
    make, exc, words = VARLEN_CASES[case]
    kwargs = make()
    if exc is None:  # the valid calls the bad ones are derived from
        out, lse = flash_attn_varlen_func(**kwargs, return_attn_probs=True)
        assert out.shape == (300, 4, 128) and lse.shape == (4, 300)
        return
    with pytest.raises(exc) as ei:
        flash_attn_varlen_func(**kwargs)
    msg = str(ei.value)
    for w in words:
        assert w in msg, f"message lacks {w!r}: {msg}"


@pytest.mark.parametrize("case", ["cu_seqlens_q_int64", "cu_seqlens_q_on_cpu", "cu_seqlens_length_mismatch",
                                  "seqused_q_too_long", "q_4d", "max_seqlen_k_negative", "hdim_80", "softcap_negative"])
def test_varlen_bad_argument_raises_same_type_under_compile(case):
    """The fake implementation of varlen_fwd raises what the eager checks raise."""
    make, exc, words = VARLEN_CASES[case]
    kwargs = make()
    torch._dynamo.reset()
    f = torch.compile(lambda kw: flash_attn_varlen_func(**kw), fullgraph=True, dynamic=False)
    with pytest.raises(Exception) as ei:
        f(kwargs)
    e = ei.value
    chain = [e]
    while len(chain) < 10 and (chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    assert any(isinstance(x, exc) for x in chain) or f"{exc.__name__}(" in str(e), f"{type(e).__name__}: {e}"
    for w in words:
        assert w in str(e), f"message lacks {w!r}: {e}"


def test_varlen_tensors_on_another_gpu():
    """cu_seqlens / seqused on another CUDA device than q: ValueError naming the argument."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    for name in ("cu_seqlens_q", "cu_seqlens_k", "seqused_q", "seqused_k"):
        kwargs = vgood()
        base = kwargs.get(name)
        kwargs[name] = (base if base is not None else _i32(1, 2, 3)).to("cuda:1")
        with pytest.raises(ValueError, match=f"{name} is on device 'cuda:1' but q is on device 'cuda:0'"):
            flash_attn_varlen_func(**kwargs)


def test_varlen_no_kernel_launched_on_error():
    """An invalid varlen call queues no GPU work (checked with the CUDA profiler)."""
    from torch.profiler import ProfilerActivity, profile

    kwargs = VARLEN_CASES["seqused_q_too_long"][0]()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with pytest.raises(ValueError):
            flash_attn_varlen_func(**kwargs)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert not kernels, f"kernels launched by an invalid call: {kernels}"


# ---------------------------------------------------------------------------
# torch.ops.flash3.varlen_bwd: the checks beyond varlen_fwd's (which it runs first, the same way):
# dout / out / softmax_lse / dlse as varlen_fwd returns them.
# ---------------------------------------------------------------------------
def vbgood(seqused=False):
    """Keyword arguments of a valid varlen_bwd call (vgood()'s batch; out / softmax_lse from varlen_fwd)."""
    a = vgood()
    a["seqused_q"] = _i32(50, 0, 200) if seqused else None
    a["seqused_k"] = _i32(60, 10, 7) if seqused else None
    out, lse = torch.ops.flash3.varlen_fwd(a["q"], a["k"], a["v"], a["cu_seqlens_q"], a["cu_seqlens_k"],
                                           a["seqused_q"], a["seqused_k"], a["max_seqlen_q"], a["max_seqlen_k"])
    a.update(dout=torch.randn_like(out), out=out, softmax_lse=lse, softmax_scale=None, dlse=None)
    return a


def _varlen_bwd(a):
    return torch.ops.flash3.varlen_bwd(a["dout"], a["q"], a["k"], a["v"], a["out"], a["softmax_lse"], a["cu_seqlens_q"],
                                       a["cu_seqlens_k"], a["seqused_q"], a["seqused_k"], a["max_seqlen_q"],
                                       a["max_seqlen_k"], a["softmax_scale"], False, -1, -1, 0.0, False, a["dlse"])


def _vbwith(**changes):
    def make():
        a = vbgood()
        for name, c in changes.items():
            a[name] = c(a) if callable(c) else c
        return a
    return make


VARLEN_BWD_CASES = {
    # name: (make kwargs, exception type, substrings the message must contain)
    "ok": (vbgood, None, []),
    "ok_seqused_and_dlse": (lambda: dict(vbgood(seqused=True), dlse=torch.randn(4, 300, device=DEV)), None, []),
    "ok_dlse_bf16_expanded": (_vbwith(dlse=lambda a: torch.ones(1, 1, device=DEV, dtype=BF16).expand(4, 300)), None,
                              []),
    "ok_dout_expanded": (_vbwith(dout=lambda a: torch.ones(1, 1, 1, device=DEV, dtype=BF16).expand(300, 4, 128)), None,
                         []),
    "dout_on_cpu": (_vbwith(dout=lambda a: a["dout"].cpu()), ValueError, ["dout", "CUDA", "cpu"]),
    "out_on_cpu": (_vbwith(out=lambda a: a["out"].cpu()), ValueError, ["out", "CUDA", "cpu"]),
    "softmax_lse_on_cpu": (_vbwith(softmax_lse=lambda a: a["softmax_lse"].cpu()), ValueError,
                           ["softmax_lse", "CUDA", "cpu"]),
    "dlse_on_cpu": (_vbwith(dlse=lambda a: torch.zeros(4, 300)), ValueError, ["dlse", "CUDA", "cpu"]),
    "dout_dtype": (_vbwith(dout=lambda a: a["dout"].half()), TypeError, ["dout.dtype", "torch.float16", "q.dtype"]),
    "out_dtype": (_vbwith(out=lambda a: a["out"].float()), TypeError, ["out.dtype", "torch.float32", "q.dtype"]),
    "softmax_lse_dtype": (_vbwith(softmax_lse=lambda a: a["softmax_lse"].to(BF16)), TypeError,
                          ["softmax_lse.dtype", "torch.bfloat16", "expected torch.float32"]),
    "out_head_dim": (_vbwith(out=lambda a: a["out"][..., :64], dout=lambda a: a["dout"][..., :64]), ValueError,
                     ["out has shape (300, 4, 64)", "expected (300, 4, 128)", "total_q, num_heads_q, head_dim_v"]),
    "out_4d": (_vbwith(out=lambda a: a["out"].unsqueeze(0)), ValueError, ["out has shape (1, 300, 4, 128)"]),
    "dout_rows": (_vbwith(dout=lambda a: a["dout"][:200]), ValueError,
                  ["dout has shape (200, 4, 128)", "expected (300, 4, 128)", "match out"]),
    "softmax_lse_rows": (_vbwith(softmax_lse=lambda a: a["softmax_lse"][:, :200]), ValueError,
                         ["softmax_lse has shape (4, 200)", "expected (4, 300)", "num_heads_q, total_q"]),
    "softmax_lse_transposed": (_vbwith(softmax_lse=lambda a: a["softmax_lse"].t()), ValueError,
                               ["softmax_lse has shape (300, 4)", "expected (4, 300)"]),
    "softmax_lse_fixed_length_layout": (_vbwith(softmax_lse=lambda a: a["softmax_lse"].unsqueeze(0)), ValueError,
                                        ["softmax_lse has shape (1, 4, 300)"]),
    "dlse_shape": (_vbwith(dlse=lambda a: torch.zeros(4, 299, device=DEV)), ValueError,
                   ["dlse has shape (4, 299)", "match softmax_lse"]),
    # the forward's checks run first
    "cu_seqlens_k_int64": (_vbwith(cu_seqlens_k=lambda a: a["cu_seqlens_k"].long(), dout=lambda a: a["dout"][:1]),
                           TypeError, ["cu_seqlens_k.dtype", "torch.int64"]),
    "seqused_k_too_long": (_vbwith(seqused_k=lambda a: _i32(1, 2, 3, 4)), ValueError, ["seqused_k", "4 entries"]),
    "softmax_scale_negative": (_vbwith(softmax_scale=-0.5, dout=lambda a: a["dout"][:1]), ValueError,
                               ["softmax_scale", "-0.5"]),
}


@pytest.mark.parametrize("case", list(VARLEN_BWD_CASES), ids=list(VARLEN_BWD_CASES))
def test_varlen_bwd_bad_argument_raises(case):
    make, exc, words = VARLEN_BWD_CASES[case]
    if not flash3.backward_is_built(BF16, 128, 128):
        pytest.skip("backward kernel bf16 128x128 not built")
    a = make()
    if exc is None:
        dq, dk, dv = _varlen_bwd(a)
        assert dq.shape == a["q"].shape and dk.shape == a["k"].shape and dv.shape == a["v"].shape
        return
    with pytest.raises(exc) as ei:
        _varlen_bwd(a)
    msg = str(ei.value)
    for w in words:
        assert w in msg, f"message lacks {w!r}: {msg}"


@pytest.mark.parametrize("case", ["dout_dtype", "softmax_lse_dtype", "out_head_dim", "dout_rows", "softmax_lse_rows",
                                  "dlse_shape", "cu_seqlens_k_int64"])
def test_varlen_bwd_bad_argument_raises_same_under_compile(case):
    """The fake implementation of varlen_bwd raises what the eager checks raise, with the same message."""
    make, exc, words = VARLEN_BWD_CASES[case]
    if not flash3.backward_is_built(BF16, 128, 128):
        pytest.skip("backward kernel bf16 128x128 not built")
    a = make()
    with pytest.raises(exc) as ei:
        _varlen_bwd(a)
    eager_msg = str(ei.value)
    torch._dynamo.reset()
    f = torch.compile(_varlen_bwd, fullgraph=True, dynamic=False)
    with pytest.raises(Exception) as ei:
        f(a)
    e = ei.value
    chain = [e]
    while len(chain) < 10 and (chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    assert any(isinstance(x, exc) for x in chain) or f"{exc.__name__}(" in str(e), f"{type(e).__name__}: {e}"
    assert eager_msg in str(e) or any(str(x) == eager_msg for x in chain), f"{type(e).__name__}: {e}"


def test_varlen_bwd_no_backward_kernel():
    """A head-dim pair with a forward kernel but no backward kernel: NotImplementedError from
    varlen_bwd, i.e. from backward() through flash_attn_varlen_func."""
    pair = next(((dt, d, dv) for dt in (BF16, torch.float16) for d in range(8, 257, 8) for dv in range(8, 257, 8)
                 if flash3.forward_is_built(dt, d, dv) and not flash3.backward_is_built(dt, d, dv)), None)
    if pair is None:
        pytest.skip("every built forward kernel has a backward kernel")
    dt, d, dv = pair
    q = torch.randn(300, 4, d, device=DEV, dtype=dt, requires_grad=True)
    k = torch.randn(260, 2, d, device=DEV, dtype=dt)
    v = torch.randn(260, 2, dv, device=DEV, dtype=dt)
    cu_q, cu_k = _i32(0, 100, 100, 300), _i32(0, 60, 70, 260)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 200, 190)
    with pytest.raises(NotImplementedError, match="no backward kernel"):
        out.sum().backward()


def test_varlen_bwd_no_kernel_launched_on_error():
    """An invalid varlen_bwd call (a bad softmax_lse shape, with an expanded dout that a valid call
    would copy first) queues no GPU work."""
    from torch.profiler import ProfilerActivity, profile

    if not flash3.backward_is_built(BF16, 128, 128):
        pytest.skip("backward kernel bf16 128x128 not built")
    a = _vbwith(dout=lambda a: torch.ones(1, 1, 1, device=DEV, dtype=BF16).expand(300, 4, 128),
                softmax_lse=lambda a: a["softmax_lse"][:, :200])()
    b = _vbwith(dout=lambda a: torch.ones(1, 1, 1, device=DEV, dtype=BF16).expand(300, 4, 128),
                softmax_scale=float("nan"))()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with pytest.raises(ValueError, match="softmax_lse has shape"):
            _varlen_bwd(a)
        with pytest.raises(ValueError, match="softmax_scale"):
            _varlen_bwd(b)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert not kernels, f"kernels launched by an invalid call: {kernels}"


@pytest.mark.parametrize("case", ["3d", "5d_not_3", "4d_no_num_heads_q", "4d_odd_kv_heads", "4d_no_kv_heads",
                                  "num_heads_q_float", "not_a_tensor"])
def test_qkvpacked_bad_argument_raises(case):
    qkv5 = torch.randn(2, 64, 3, 4, 128, device=DEV, dtype=BF16)
    qkv4 = torch.randn(2, 64, 12, 128, device=DEV, dtype=BF16)
    args, kw, exc, words = {
        "3d": ((qkv4[0],), {}, ValueError, ["qkv", "shape"]),
        "5d_not_3": ((torch.randn(2, 64, 2, 4, 128, device=DEV, dtype=BF16),), {}, ValueError, ["qkv", "3"]),
        "4d_no_num_heads_q": ((qkv4,), {}, ValueError, ["num_heads_q"]),
        "4d_odd_kv_heads": ((qkv4,), dict(num_heads_q=9), ValueError, ["num_heads_q", "num_heads_kv"]),
        "4d_no_kv_heads": ((qkv4,), dict(num_heads_q=12), ValueError, ["num_heads_q", "num_heads_kv"]),
        "num_heads_q_float": ((qkv4,), dict(num_heads_q=8.0), TypeError, ["num_heads_q"]),
        "not_a_tensor": (([1, 2, 3],), {}, TypeError, ["qkv"]),
    }[case]
    with pytest.raises(exc) as e:
        flash3.flash_attn_qkvpacked_func(*args, **kw)
    for w in words:
        assert w in str(e.value)
    flash3.flash_attn_qkvpacked_func(qkv5)  # the good layouts run
    flash3.flash_attn_qkvpacked_func(qkv4, num_heads_q=8)


def test_introspection():
    assert isinstance(flash3.__version__, str)
    ok, why = flash3.device_is_supported()
    assert ok, why
    assert not flash3.forward_is_built(torch.bfloat16, 80)
    with pytest.raises(TypeError):
        flash3.forward_is_built(torch.float32, 128)
