# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""What the entry points of flash3.flash_attn_interface share: the operator handles, the
introspection functions, dtype / head-dim helpers, the q / k / v checks of the fake
implementations, the scalar option checks, and the small steps of the entry points
(FlashAttention-3 arguments flash3 does not have, window_size, out=)."""
import math
import operator
import struct
from typing import Optional, Tuple

import torch

from .. import _C

_fwd = torch.ops.flash3.fwd.default
_bwd = torch.ops.flash3.bwd.default
_varlen_fwd = torch.ops.flash3.varlen_fwd.default
_varlen_bwd = torch.ops.flash3.varlen_bwd.default
_combine = torch.ops.flash3.combine.default
_fwd_kvcache = torch.ops.flash3.fwd_kvcache.default
_fwd_kvcache_out = torch.ops.flash3.fwd_kvcache_out.default
_fwd_fp8 = torch.ops.flash3.fwd_fp8.default
_quantize_fp8 = torch.ops.flash3.quantize_fp8.default
_forward_plan = torch.ops.flash3.forward_plan.default

_INT32_MAX = 2 ** 31 - 1
FP8_SCALE_BLOCK = 128  # tokens per FP8 block scale (flash3::kFp8ScaleBlock)
_MAX_COMBINE_HEAD_DIM = 512  # flash3::kMaxCombineHeadDim (FlashAttention-3's MLA value dim)

_FWD_LAYOUTS = {
    "q": "(batch, seqlen_q, num_heads_q, head_dim)",
    "k": "(batch, seqlen_k, num_heads_kv, head_dim)",
    "v": "(batch, seqlen_k, num_heads_kv, head_dim_v)",
}


# ---------------------------------------------------------------------------
# Introspection.
# ---------------------------------------------------------------------------
def forward_is_built(dtype: torch.dtype, head_dim: int, head_dim_v: Optional[int] = None) -> bool:
    """Whether this build has forward kernels for (dtype, head_dim, head_dim_v)."""
    return _C.forward_is_built(dtype, int(head_dim), int(head_dim if head_dim_v is None else head_dim_v))


def backward_is_built(dtype: torch.dtype, head_dim: int, head_dim_v: Optional[int] = None) -> bool:
    """Whether this build has backward kernels for (dtype, head_dim, head_dim_v)."""
    return _C.backward_is_built(dtype, int(head_dim), int(head_dim if head_dim_v is None else head_dim_v))


def device_is_supported() -> Tuple[bool, str]:
    """(True, "") when the current CUDA device is a Hopper (sm_90) GPU, else (False, reason)."""
    return _C.device_is_supported()


# ---------------------------------------------------------------------------
# Argument checks of the fake implementations (torch.compile tracing). They mirror the C++
# checks in csrc/*.cpp, which are the ones that run in eager mode, so a traced
# program fails at compile time with the same exception as the eager one.
# ---------------------------------------------------------------------------
def _dtype_str(dt):
    return str(dt)


def _shape_str(shape):
    """A shape as the C++ checks print it: (a, b, c), (a,) for one dimension."""
    return str(tuple(shape))


def _is_int(x):
    """An integer other than a bool (Python ints, NumPy integers, 0-d integer tensors)."""
    if isinstance(x, bool):
        return False
    try:
        operator.index(x)
        return True
    except TypeError:
        return False


def _built_list(dtype, forward=True):
    fn = _C.forward_is_built if forward else _C.backward_is_built
    pairs = [(d, dv) for d in range(8, 257, 8) for dv in range(8, 257, 8) if fn(dtype, d, dv)]
    return ", ".join(f"({d}, {dv})" for d, dv in pairs) or "none"


def _built_dtypes():
    names = [_dtype_str(dt) for dt in (torch.float16, torch.bfloat16, torch.float8_e4m3fn) if _built_list(dt) != "none"]
    return ", ".join(names) or "none"


def _raise_not_built(dtype, d, dv, v_name):
    """The error for a (dtype, head_dim, head_dim_v) without a forward kernel (the binding's
    check_head_dim, same messages): NotImplementedError naming the dtype when the build has no
    kernels of that dtype at all (CMake FLASH3_DTYPES), else ValueError naming the head dims."""
    built = _built_list(dtype)
    if built == "none":
        raise NotImplementedError(f"flash3: q.dtype is {_dtype_str(dtype)}, and this flash3 build has no "
                                  f"{_dtype_str(dtype)} kernels (CMake FLASH3_DTYPES); built dtypes: "
                                  f"{_built_dtypes()}")
    raise ValueError(f"flash3: unsupported head dim: q.shape[-1] (head_dim) is {d} and {v_name}.shape[-1] "
                     f"(head_dim_v) is {dv}; this flash3 build has {_dtype_str(dtype)} kernels for "
                     f"(head_dim, head_dim_v) in {built}")


def _require_tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"flash3: {name} must be a torch.Tensor, got {type(t).__name__}")


def _require_cuda(name, t):
    if t.device.type != "cuda":
        raise ValueError(f"flash3: {name} must be a CUDA tensor, but {name} is on device '{t.device}' "
                         f"(move it with {name}.cuda())")


def _require_device_of_q(name, t, q):
    if t.device != q.device:
        raise ValueError(f"flash3: {name} is on device '{t.device}' but q is on device '{q.device}'; "
                         "expected all tensors on the same CUDA device")


def _require_dtype_of_q(name, t, q):
    if t.dtype != q.dtype:
        raise TypeError(f"flash3: {name}.dtype is {_dtype_str(t.dtype)}; expected {_dtype_str(q.dtype)} "
                        "to match q.dtype")


def _check_tensors_on_q_device(named, q):
    """Each (name, tensor) of `named` a torch.Tensor, then each a CUDA tensor, then each on q's
    device (every tensor checked at each step before the next step)."""
    for name, t in named:
        _require_tensor(name, t)
    for name, t in named:
        _require_cuda(name, t)
    for name, t in named:
        _require_device_of_q(name, t, q)


def _check_qkv_device_dtype(q, k, v, fp8=False):
    """q, k, v: CUDA tensors of one device, fp16 / bf16 (fp8: float8_e4m3fn), one dtype (fixed length
    and varlen)."""
    _check_tensors_on_q_device((("q", q), ("k", k), ("v", v)), q)
    if fp8 and q.dtype != torch.float8_e4m3fn:
        raise TypeError(f"flash3: q.dtype is {_dtype_str(q.dtype)}; expected torch.float8_e4m3fn (flash3's FP8 "
                        "kernels take e4m3fn; e5m2 is not supported)")
    if not fp8 and q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"flash3: q.dtype is {_dtype_str(q.dtype)}; expected torch.float16 or torch.bfloat16")
    for name, t in (("k", k), ("v", v)):
        _require_dtype_of_q(name, t, q)


def _check_qkv_layout(q, k, v, ndim, layouts, why=""):
    """q, k, v of `ndim` dimensions (layouts: their layouts by name, for the message; why: what
    follows it) with a contiguous last dimension."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != ndim:
            raise ValueError(f"flash3: {name} has {t.dim()} dimensions (shape {tuple(t.shape)}); expected a "
                             f"{ndim}-d tensor {layouts[name]}{why}")
    for name, t, dim in (("q", q, "head_dim"), ("k", k, "head_dim"), ("v", v, "head_dim_v")):
        if t.stride(-1) != 1:
            raise ValueError(f"flash3: {name}.stride(-1) ({dim}) is {t.stride(-1)}; expected 1: the {dim} dimension "
                             f"must be contiguous (use {name}.contiguous())")


def _check_heads_and_head_dims(q, k, v):
    """num_heads_q a multiple of num_heads_kv (the heads are dimension -2: 2 for fixed length, 1
    for varlen), and a forward kernel built for (head_dim, head_dim_v)."""
    i = q.dim() - 2
    if k.shape[i] < 1 or q.shape[i] % k.shape[i] != 0:
        raise ValueError(f"flash3: q.shape[{i}] (num_heads_q) is {q.shape[i]}, which is not a multiple of "
                         f"k.shape[{i}] (num_heads_kv) {k.shape[i]}; expected num_heads_q % num_heads_kv == 0 "
                         "(GQA/MQA)")
    d, dv = q.shape[i + 1], v.shape[i + 1]
    if isinstance(d, int) and isinstance(dv, int) and not _C.forward_is_built(q.dtype, d, dv):
        _raise_not_built(q.dtype, d, dv, "v")


def _check_forward_inputs(q, k, v, fp8=False):
    _check_qkv_device_dtype(q, k, v, fp8)
    _check_qkv_layout(q, k, v, 4, _FWD_LAYOUTS)
    checks = (
        ("k.shape[0] (batch)", k.shape[0], q.shape[0], "q.shape[0]"),
        ("v.shape[0] (batch)", v.shape[0], q.shape[0], "q.shape[0]"),
        ("v.shape[1] (seqlen_k)", v.shape[1], k.shape[1], "k.shape[1]"),
        ("v.shape[2] (num_heads_kv)", v.shape[2], k.shape[2], "k.shape[2]"),
        ("k.shape[3] (head_dim)", k.shape[3], q.shape[3], "q.shape[3]"),
    )
    for what, got, want, ref in checks:
        if got != want:
            raise ValueError(f"flash3: {what} is {got}; expected {want} to match {ref} (q {tuple(q.shape)}, "
                             f"k {tuple(k.shape)}, v {tuple(v.shape)})")
    _check_heads_and_head_dims(q, k, v)


# ---------------------------------------------------------------------------
# Scalar options: the binding's checks, made in Python before anything is allocated (the entry
# points) or traced (the fake implementations).
# ---------------------------------------------------------------------------
_FLT_MIN = 2.0 ** -126  # fp32's smallest normal
_KERNEL_FLOAT_MAX = (2.0 - 2.0 ** -23) * 2.0 ** 126  # FLT_MAX / 2: times log2(e) stays finite
_KERNEL_FLOAT_WHY = (" (fp32's normal range, [1.17549435e-38, 1.70141173e+38]: the kernels flush subnormal floats "
                     "to 0 and multiply the value by log2(e))")


def _as_float32(x, name):
    """x as the binding's static_cast<float> sees it (inf beyond the float32 range); a TypeError
    naming the argument for what float() cannot take."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        try:
            x = float(x)
        except (TypeError, ValueError):
            raise TypeError(f"flash3: {name} is {x!r} ({type(x).__name__}); expected a number") from None
    s = float(x)
    try:
        return s, struct.unpack("f", struct.pack("f", s))[0]
    except OverflowError:  # a finite double beyond the float32 range
        return s, math.inf


def _kernel_float_ok(f):
    return f == 0.0 or _FLT_MIN <= f <= _KERNEL_FLOAT_MAX


def _check_softmax_scale(softmax_scale):
    """The binding's check: the float32 value of the scale must be finite and >= 0, and 0 or a normal float."""
    if softmax_scale is None:
        return
    s, f = _as_float32(softmax_scale, "softmax_scale")
    if not (f >= 0.0 and math.isfinite(f)):
        raise ValueError(f"flash3: softmax_scale is {s:.9g}; expected None (1/sqrt(head_dim)) or a finite number "
                         ">= 0 (as float32): the online softmax tracks the row maximum of the unscaled scores, "
                         "which a negative scale would turn into the row minimum")
    if not _kernel_float_ok(f):
        raise ValueError(f"flash3: softmax_scale is {s:.9g}; expected 0 or a value in fp32's normal range"
                         + _KERNEL_FLOAT_WHY)


def _check_softcap(softcap):
    """The library's check of opts.softcap (float32 value finite and >= 0; 0 disables), made in
    Python before anything is allocated (flash_attn_func, flash_attn_varlen_func: so a double
    beyond the float32 range never reaches the binding's cast) or traced (the fake
    implementations, which torch.compile runs instead). Returns softcap as a Python float."""
    s, f = _as_float32(softcap, "softcap")
    if not (f >= 0.0 and math.isfinite(f)):
        raise ValueError(f"flash3: softcap is {s:.9g}; expected a finite number >= 0 (as float32): 0 disables "
                         "the capping, a value > 0 caps the scaled scores s -> softcap * tanh(s / softcap)")
    if not _kernel_float_ok(f):
        raise ValueError(f"flash3: softcap is {s:.9g}; expected 0 (off) or a value in fp32's normal range"
                         + _KERNEL_FLOAT_WHY)
    return s


def _check_pack_gqa(pack_gqa):
    """The binding's check of the operators' int pack_gqa (the fake implementations run it when
    traced): -1 heuristic, 0 off, 1 on."""
    if pack_gqa not in (-1, 0, 1):
        raise ValueError(f"flash3: pack_gqa is {pack_gqa}; expected -1 (heuristic), 0 (off) or 1 (on)")


def _check_num_splits(num_splits):
    """The binding's check of the operators' int num_splits (the fake implementations run it when
    traced, flash_attn_func / flash_attn_varlen_func before anything is allocated): 1 no split,
    0 heuristic, n in [2, 256] at most n KV splits."""
    if isinstance(num_splits, bool) or not isinstance(num_splits, int):
        raise TypeError(f"flash3: num_splits is {num_splits!r} ({type(num_splits).__name__}); expected an int")
    if not 0 <= num_splits <= 256:
        raise ValueError(f"flash3: num_splits is {num_splits}; expected 0 (heuristic), 1 (no split) or n in "
                         "[2, 256] (at most n KV splits)")
    return num_splits


def _check_scalar_options(softmax_scale, softcap, pack_gqa, num_splits):
    _check_softmax_scale(softmax_scale)
    _check_softcap(softcap)
    _check_pack_gqa(pack_gqa)
    _check_num_splits(num_splits)


def _pack_gqa_arg(pack_gqa):
    """flash_attn_func's / flash_attn_varlen_func's pack_gqa (FlashAttention-3's Optional[bool]) as
    the operators' int: None -> -1 (heuristic), True (or 1) -> 1, False (or 0) -> 0."""
    if pack_gqa is None:
        return -1
    if not isinstance(pack_gqa, int) or pack_gqa not in (0, 1):  # (bool is an int)
        raise TypeError(f"flash3: pack_gqa is {pack_gqa!r} ({type(pack_gqa).__name__}); expected None "
                        "(heuristic), True or False")
    return int(pack_gqa)


# ---------------------------------------------------------------------------
# Steps the entry points share.
# ---------------------------------------------------------------------------
def _check_attention_chunk(attention_chunk):
    if attention_chunk != 0:
        raise NotImplementedError(f"flash3: attention_chunk={attention_chunk} is not supported yet; pass 0")


def _check_not_implemented(qv, q_descale, k_descale, v_descale, attention_chunk):
    """FlashAttention-3 features flash3 does not have: NotImplementedError unless left at the default.
    (flash_attn_func takes the descales with FP8 inputs.)"""
    if qv is not None:
        raise NotImplementedError("flash3: qv is not supported yet; pass None")
    if q_descale is not None or k_descale is not None or v_descale is not None:
        raise NotImplementedError("flash3: q_descale / k_descale / v_descale apply to FP8 (torch.float8_e4m3fn) "
                                  "inputs of flash_attn_func only; pass None")
    _check_attention_chunk(attention_chunk)


def _check_sm_margin(sm_margin):
    if not _is_int(sm_margin):
        raise TypeError(f"flash3: sm_margin is {sm_margin!r} ({type(sm_margin).__name__}); expected an int")
    if sm_margin < 0:
        raise ValueError(f"flash3: sm_margin is {sm_margin}; expected >= 0 (SMs to leave free; flash3 uses every SM)")


def _check_entry(qv, q_descale, k_descale, v_descale, attention_chunk, sm_margin):
    """The first checks of flash_attn_func, flash_attn_varlen_func and flash_attn_with_kvcache:
    the FlashAttention-3 arguments flash3 does not have, then sm_margin."""
    _check_not_implemented(qv, q_descale, k_descale, v_descale, attention_chunk)
    _check_sm_margin(sm_margin)


def _softcap_arg(softcap):
    """softcap as the operators take it: checked (and a Python float) in eager mode; traced, the
    fake implementation checks it."""
    if not torch.compiler.is_compiling():
        softcap = _check_softcap(softcap)
    return softcap


def _window_sides(window_size):
    """window_size (a pair of ints, FlashAttention-3's (left, right)) into the operators' int64
    range (Python ints are unbounded); the binding maps the values to the library's int32 window
    the same way (negative -> -1, above INT32_MAX -> INT32_MAX). Anything else is a TypeError
    naming window_size: floats (NaN included), strings, None, a sequence of another length."""
    try:
        window_left, window_right = window_size
    except (TypeError, ValueError):
        raise TypeError(f"flash3: window_size is {window_size!r}; expected a pair of ints (left, right), "
                        "-1 for an unbounded side") from None
    for side, w in (("left", window_left), ("right", window_right)):
        if isinstance(w, bool) or not _is_int(w):
            raise TypeError(f"flash3: window_size is {window_size!r}: its {side} side is {w!r} "
                            f"({type(w).__name__}); expected an int (-1: unbounded)")
    window_left, window_right = int(window_left), int(window_right)
    if not -1 <= window_left <= _INT32_MAX:
        window_left = -1 if window_left < 0 else _INT32_MAX
    if not -1 <= window_right <= _INT32_MAX:
        window_right = -1 if window_right < 0 else _INT32_MAX
    return window_left, window_right


def _check_out(out, like, layout):
    """out= of flash_attn_func / flash_attn_varlen_func: a tensor of the result's shape, dtype and
    device, sharing no memory with the inputs' result (the copy would read what it writes)."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"flash3: out is a {type(out).__name__}; expected a torch.Tensor {layout}")
    if out.device != like.device:
        raise ValueError(f"flash3: out is on device '{out.device}'; expected '{like.device}' (q's)")
    if out.dtype != like.dtype:
        raise TypeError(f"flash3: out.dtype is {_dtype_str(out.dtype)}; expected {_dtype_str(like.dtype)} (q's)")
    if tuple(out.shape) != tuple(like.shape):
        raise ValueError(f"flash3: out has shape {_shape_str(out.shape)}; expected {_shape_str(like.shape)} {layout}")


def _with_out(result, lse, out, layout, return_lse):
    """The return value of flash_attn_func / flash_attn_varlen_func: with out= (laid out as
    `layout`), the caller's buffer gets a copy of the result; with autograd the result carries the
    gradient, else out is returned. (result, lse) when return_lse."""
    if out is not None:
        _check_out(out, result, layout)
        with torch.no_grad():
            out.copy_(result)
        if not result.requires_grad:
            result = out
    if return_lse:
        return result, lse
    return result
