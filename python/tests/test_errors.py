"""Bad arguments raise a Python exception of the right type, naming the argument, before any
kernel is launched (eager mode: the C++ checks; torch.compile: the fake implementation)."""
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("flash3 needs a Hopper (sm_90) GPU", allow_module_level=True)

import flash3  # noqa: E402
from flash3 import flash_attn_func  # noqa: E402

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
    "softcap_not_implemented": (lambda: list(good()), {"softcap": 30.0}, NotImplementedError, ["softcap"]),
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
                                  "softmax_scale_negative"])
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


def test_introspection():
    assert isinstance(flash3.__version__, str)
    ok, why = flash3.device_is_supported()
    assert ok, why
    assert not flash3.forward_is_built(torch.bfloat16, 80)
    with pytest.raises(TypeError):
        flash3.forward_is_built(torch.float32, 128)
