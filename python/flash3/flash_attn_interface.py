# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""flash3's PyTorch API, argument-compatible with FlashAttention-3's ``flash_attn_interface``.

Swapping the import is enough::

    # from flash_attn_interface import flash_attn_func
    from flash3.flash_attn_interface import flash_attn_func   # or: from flash3 import flash_attn_func

The work is done by three operators registered by the C++ extension ``flash3._C``:

* ``torch.ops.flash3.fwd(q, k, v, softmax_scale, causal, window_left, window_right, softcap,
  deterministic, pack_gqa=-1, num_splits=1) -> (out, softmax_lse)``
* ``torch.ops.flash3.bwd(dout, q, k, v, out, softmax_lse, dlse, softmax_scale, causal, window_left,
  window_right, softcap, deterministic) -> (dq, dk, dv)``
* ``torch.ops.flash3.varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
  max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
  deterministic, pack_gqa=-1, num_splits=1) -> (out, softmax_lse)`` (variable length)
* ``torch.ops.flash3.varlen_bwd(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k,
  seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
  window_right, softcap, deterministic, dlse=None) -> (dq, dk, dv)`` (variable length; dq / dk / dv
  are 0 in the rows no sequence covers)
* ``torch.ops.flash3.fwd_fp8(q, k, v, q_descale=None, k_descale=None, v_descale=None,
  softmax_scale=None, causal=False, window_left=-1, window_right=-1) -> (out, softmax_lse)`` (FP8:
  torch.float8_e4m3fn q / k / v, descales (batch, num_heads_kv) torch.float32, out torch.bfloat16;
  forward only)
* ``torch.ops.flash3.combine(out_partial, lse_partial, out, softmax_lse) -> ()`` (split-KV
  combine, writes out and softmax_lse in place; ``flash_attn_combine`` allocates them)
* ``torch.ops.flash3.fwd_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
  cache_batch_idx, cache_leftpad, page_table, rotary_seqlens, softmax_scale, causal, window_left,
  window_right, softcap, rotary_interleaved, num_splits=0, pack_gqa=-1) -> (out, softmax_lse)``
  (KV-cache attention, forward only; appends k / v to k_cache / v_cache in place, or to the pages
  of page_table when given; softmax_lse is a (batch, heads, seqlen_q) view of a contiguous
  (heads, batch, seqlen_q) tensor)
* ``torch.ops.flash3.forward_plan(dtype, batch, max_seqlen_q, max_seqlen_k, heads_q, heads_kv,
  head_dim, head_dim_v, causal, window_left, window_right, softcap, num_splits=0, pack_gqa=-1)
  -> [num_splits, pack_gqa]`` (the forward's launch plan on the current device, decided on the
  host; ``get_scheduler_metadata`` returns it as a CPU int32 tensor)

Their CUDA kernels, argument checks and autograd (``fwd``'s backward calls ``bwd``,
``varlen_fwd``'s calls ``varlen_bwd``; ``fwd_kvcache`` is forward only, its outputs never require
grad) are C++; this module adds their fake (meta) implementations, so
``torch.compile(fullgraph=True)`` traces them (forward and backward) without graph breaks, and the
Python entry points ``flash_attn_func``, ``flash_attn_varlen_func``, ``flash_attn_combine``,
``flash_attn_with_kvcache`` and ``get_scheduler_metadata``.
"""
import math
import operator
import struct
from typing import Optional, Tuple, Union

import torch

from . import _C

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "quantize_fp8", "flash_attn_combine", "flash_attn_with_kvcache",
           "get_scheduler_metadata", "forward_is_built", "backward_is_built", "device_is_supported"]

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

_VARLEN_LAYOUTS = {
    "q": "(total_q, num_heads_q, head_dim)",
    "k": "(total_k, num_heads_kv, head_dim)",
    "v": "(total_k, num_heads_kv, head_dim_v)",
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
# checks in csrc/flash3_torch.cpp, which are the ones that run in eager mode, so a traced
# program fails at compile time with the same exception as the eager one.
# ---------------------------------------------------------------------------
def _dtype_str(dt):
    return str(dt)


def _built_list(dtype, forward=True):
    fn = _C.forward_is_built if forward else _C.backward_is_built
    pairs = [(d, dv) for d in range(8, 257, 8) for dv in range(8, 257, 8) if fn(dtype, d, dv)]
    return ", ".join(f"({d}, {dv})" for d, dv in pairs) or "none"


def _check_qkv_device_dtype(q, k, v, fp8=False):
    """q, k, v: CUDA tensors of one device, fp16 / bf16 (fp8: float8_e4m3fn), one dtype (fixed length
    and varlen)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flash3: {name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cuda":
            raise ValueError(f"flash3: {name} must be a CUDA tensor, but {name} is on device '{t.device}' "
                             f"(move it with {name}.cuda())")
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"flash3: {name} is on device '{t.device}' but q is on device '{q.device}'; "
                             "expected all tensors on the same CUDA device")
    if fp8 and q.dtype != torch.float8_e4m3fn:
        raise TypeError(f"flash3: q.dtype is {_dtype_str(q.dtype)}; expected torch.float8_e4m3fn (flash3's FP8 "
                        "kernels take e4m3fn; e5m2 is not supported)")
    if not fp8 and q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"flash3: q.dtype is {_dtype_str(q.dtype)}; expected torch.float16 or torch.bfloat16")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"flash3: {name}.dtype is {_dtype_str(t.dtype)}; expected {_dtype_str(q.dtype)} "
                            "to match q.dtype")


def _check_forward_inputs(q, k, v, fp8=False):
    _check_qkv_device_dtype(q, k, v, fp8)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"flash3: {name} has {t.dim()} dimensions (shape {tuple(t.shape)}); expected a 4-d "
                             f"tensor {_FWD_LAYOUTS[name]}")
    for name, t, dim in (("q", q, "head_dim"), ("k", k, "head_dim"), ("v", v, "head_dim_v")):
        if t.stride(-1) != 1:
            raise ValueError(f"flash3: {name}.stride(-1) ({dim}) is {t.stride(-1)}; expected 1: the {dim} dimension "
                             f"must be contiguous (use {name}.contiguous())")
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
    if k.shape[2] < 1 or q.shape[2] % k.shape[2] != 0:
        raise ValueError(f"flash3: q.shape[2] (num_heads_q) is {q.shape[2]}, which is not a multiple of k.shape[2] "
                         f"(num_heads_kv) {k.shape[2]}; expected num_heads_q % num_heads_kv == 0 (GQA/MQA)")
    d, dv = q.shape[3], v.shape[3]
    if isinstance(d, int) and isinstance(dv, int) and not _C.forward_is_built(q.dtype, d, dv):
        _raise_not_built(q.dtype, d, dv, "v")


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


def _built_dtypes():
    names = [_dtype_str(dt) for dt in (torch.float16, torch.bfloat16, torch.float8_e4m3fn) if _built_list(dt) != "none"]
    return ", ".join(names) or "none"


def _check_int32_on_q_device(t, name, q, what):
    """A torch.int32 CUDA tensor on q's device (what: what its values are, for the dtype message)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"flash3: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"flash3: {name} must be a CUDA tensor on q's device ({q.device}), but {name} is on device "
                         f"'{t.device}' (move it with {name}.to(q.device))")
    if t.device != q.device:
        raise ValueError(f"flash3: {name} is on device '{t.device}' but q is on device '{q.device}'; "
                         "expected all tensors on the same CUDA device")
    if t.dtype != torch.int32:
        raise TypeError(f"flash3: {name}.dtype is {_dtype_str(t.dtype)}; expected torch.int32 ({what}; use "
                        f"{name}.to(torch.int32))")


def _check_int32_vector(t, name, q, what):
    _check_int32_on_q_device(t, name, q, what)
    if t.dim() != 1:
        raise ValueError(f"flash3: {name} has {t.dim()} dimensions (shape {tuple(t.shape)}); expected a 1-d tensor "
                         f"({what})")
    if not t.is_contiguous():
        raise ValueError(f"flash3: {name}.stride(0) is {t.stride(0)}; expected a contiguous tensor "
                         f"(use {name}.contiguous())")


_CU_SEQLENS_Q = "num_sequences + 1 prefix sums of the query lengths"
_CU_SEQLENS_K = "num_sequences + 1 prefix sums of the key lengths"


def _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k):
    """The checks of varlen_fwd (csrc/flash3_torch.cpp, check_varlen_inputs), in the same order."""
    _check_qkv_device_dtype(q, k, v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"flash3: {name} has {t.dim()} dimensions (shape {tuple(t.shape)}); expected a 3-d "
                             f"tensor {_VARLEN_LAYOUTS[name]} (variable length: the sequences concatenated along "
                             "dim 0)")
    for name, t, dim in (("q", q, "head_dim"), ("k", k, "head_dim"), ("v", v, "head_dim_v")):
        if t.stride(-1) != 1:
            raise ValueError(f"flash3: {name}.stride(-1) ({dim}) is {t.stride(-1)}; expected 1: the {dim} dimension "
                             f"must be contiguous (use {name}.contiguous())")
    checks = (
        ("v.shape[0] (total_k)", v.shape[0], k.shape[0], "k.shape[0]", ("k", k), ("v", v)),
        ("v.shape[1] (num_heads_kv)", v.shape[1], k.shape[1], "k.shape[1]", ("k", k), ("v", v)),
        ("k.shape[2] (head_dim)", k.shape[2], q.shape[2], "q.shape[2]", ("q", q), ("k", k)),
    )
    for what, got, want, ref, (n1, t1), (n2, t2) in checks:
        if got != want:
            raise ValueError(f"flash3: {what} is {got}; expected {want} to match {ref} ({n1} {tuple(t1.shape)}, "
                             f"{n2} {tuple(t2.shape)})")
    if k.shape[1] < 1 or q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"flash3: q.shape[1] (num_heads_q) is {q.shape[1]}, which is not a multiple of k.shape[1] "
                         f"(num_heads_kv) {k.shape[1]}; expected num_heads_q % num_heads_kv == 0 (GQA/MQA)")
    d, dv = q.shape[2], v.shape[2]
    if isinstance(d, int) and isinstance(dv, int) and not _C.forward_is_built(q.dtype, d, dv):
        _raise_not_built(q.dtype, d, dv, "v")
    _check_int32_vector(cu_seqlens_q, "cu_seqlens_q", q, _CU_SEQLENS_Q)
    _check_int32_vector(cu_seqlens_k, "cu_seqlens_k", q, _CU_SEQLENS_K)
    if cu_seqlens_q.numel() < 1:
        raise ValueError(f"flash3: cu_seqlens_q is empty (shape {tuple(cu_seqlens_q.shape)}); expected "
                         f"num_sequences + 1 >= 1 entries ({_CU_SEQLENS_Q}, starting with 0)")
    if cu_seqlens_k.numel() != cu_seqlens_q.numel():
        raise ValueError(f"flash3: cu_seqlens_k has {cu_seqlens_k.numel()} entries; expected {cu_seqlens_q.numel()} "
                         "to match cu_seqlens_q (both hold num_sequences + 1 prefix sums)")
    num_sequences = cu_seqlens_q.numel() - 1
    if num_sequences > _INT32_MAX:
        raise ValueError(f"flash3: cu_seqlens_q has {cu_seqlens_q.numel()} entries; expected at most 2147483648 "
                         "(num_sequences is an int32)")
    for name, t, what in (("seqused_q", seqused_q, "num_sequences counts of the real query tokens"),
                          ("seqused_k", seqused_k, "num_sequences counts of the real key tokens")):
        if t is None:
            continue
        _check_int32_vector(t, name, q, what)
        if t.numel() != num_sequences:
            raise ValueError(f"flash3: {name} has {t.numel()} entries; expected {num_sequences} "
                             "(num_sequences = cu_seqlens_q.numel() - 1)")
    for name, m, what in (("max_seqlen_q", max_seqlen_q, "query"), ("max_seqlen_k", max_seqlen_k, "key")):
        if not _is_int(m):
            raise TypeError(f"flash3: {name} is {m!r} ({type(m).__name__}); expected an int")
        if not 0 <= m <= _INT32_MAX:
            raise ValueError(f"flash3: {name} is {m}; expected a value in [0, 2147483647] (the length of the longest "
                             f"{what} sequence; 0: every sequence empty)")


def _check_varlen_backward_tensors(dout, q, v, out, softmax_lse, dlse):
    """The checks of varlen_bwd after varlen_fwd's (csrc/flash3_torch.cpp,
    check_varlen_backward_tensors), in the same order."""
    for name, t in (("dout", dout), ("out", out), ("softmax_lse", softmax_lse)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flash3: {name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("dout", dout), ("out", out), ("softmax_lse", softmax_lse)):
        if t.device.type != "cuda":
            raise ValueError(f"flash3: {name} must be a CUDA tensor, but {name} is on device '{t.device}' "
                             f"(move it with {name}.cuda())")
    for name, t in (("dout", dout), ("out", out), ("softmax_lse", softmax_lse)):
        if t.device != q.device:
            raise ValueError(f"flash3: {name} is on device '{t.device}' but q is on device '{q.device}'; "
                             "expected all tensors on the same CUDA device")
    for name, t in (("dout", dout), ("out", out)):
        if t.dtype != q.dtype:
            raise TypeError(f"flash3: {name}.dtype is {_dtype_str(t.dtype)}; expected {_dtype_str(q.dtype)} "
                            "to match q.dtype")
    if softmax_lse.dtype != torch.float32:
        raise TypeError(f"flash3: softmax_lse.dtype is {_dtype_str(softmax_lse.dtype)}; expected torch.float32")
    total_q, hq, dv = q.shape[0], q.shape[1], v.shape[2]
    if out.dim() != 3 or tuple(out.shape) != (total_q, hq, dv):
        raise ValueError(f"flash3: out has shape {_shape_str(out.shape)}; expected {_shape_str((total_q, hq, dv))} "
                         f"(total_q, num_heads_q, head_dim_v) from q {_shape_str(q.shape)} and v "
                         f"{_shape_str(v.shape)}")
    if tuple(dout.shape) != tuple(out.shape):
        raise ValueError(f"flash3: dout has shape {_shape_str(dout.shape)}; expected {_shape_str(out.shape)} "
                         "to match out")
    if softmax_lse.dim() != 2 or tuple(softmax_lse.shape) != (hq, total_q):
        raise ValueError(f"flash3: softmax_lse has shape {_shape_str(softmax_lse.shape)}; expected "
                         f"{_shape_str((hq, total_q))} (num_heads_q, total_q) from q {_shape_str(q.shape)}")
    d = q.shape[2]
    if isinstance(d, int) and isinstance(dv, int) and not _C.backward_is_built(q.dtype, d, dv):
        raise NotImplementedError(f"flash3: no backward kernel for {_dtype_str(q.dtype)} head_dim {d}, head_dim_v "
                                  f"{dv} in this build; backward kernels (head_dim, head_dim_v): "
                                  f"{_built_list(q.dtype, forward=False)}")
    if dlse is not None:
        if not isinstance(dlse, torch.Tensor):
            raise TypeError(f"flash3: dlse must be a torch.Tensor, got {type(dlse).__name__}")
        if dlse.device.type != "cuda":
            raise ValueError(f"flash3: dlse must be a CUDA tensor, but dlse is on device '{dlse.device}' "
                             "(move it with dlse.cuda())")
        if dlse.device != q.device:
            raise ValueError(f"flash3: dlse is on device '{dlse.device}' but q is on device '{q.device}'; "
                             "expected all tensors on the same CUDA device")
        if tuple(dlse.shape) != tuple(softmax_lse.shape):
            raise ValueError(f"flash3: dlse has shape {_shape_str(dlse.shape)}; expected "
                             f"{_shape_str(softmax_lse.shape)} to match softmax_lse")


def _shape_str(shape):
    """A shape as the C++ checks print it: (a, b, c), (a,) for one dimension."""
    return str(tuple(shape))


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
# Fake (meta) implementations: shapes, dtypes and strides of the real outputs (all contiguous).
# ---------------------------------------------------------------------------
@torch.library.register_fake("flash3::fwd")
def _fwd_fake(q, k, v, softmax_scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0,
              deterministic=False, pack_gqa=-1, num_splits=1):
    _check_forward_inputs(q, k, v)
    _check_softmax_scale(softmax_scale)
    _check_softcap(softcap)
    _check_pack_gqa(pack_gqa)
    _check_num_splits(num_splits)
    b, sq, hq, _ = q.shape
    dv = v.shape[3]
    out = q.new_empty((b, sq, hq, dv))
    lse = q.new_empty((b, hq, sq), dtype=torch.float32)
    return out, lse


def _check_fp8_inputs(q, k, v, q_descale, k_descale, v_descale):
    """The checks of torch.ops.flash3.fwd_fp8 (csrc/flash3_torch.cpp, same messages)."""
    _check_forward_inputs(q, k, v, fp8=True)
    b, hkv = q.shape[0], k.shape[2]
    for name, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if t is None:
            continue
        if t.device.type != "cuda":
            raise ValueError(f"flash3: {name} must be a CUDA tensor, but {name} is on device '{t.device}' "
                             f"(move it with {name}.cuda())")
        if t.device != q.device:
            raise ValueError(f"flash3: {name} is on device '{t.device}' but q is on device '{q.device}'; "
                             "expected all tensors on the same CUDA device")
        if t.dtype != torch.float32:
            raise TypeError(f"flash3: {name}.dtype is {_dtype_str(t.dtype)}; expected torch.float32")
        heads, seqlen = (q.shape[2], q.shape[1]) if name == "q_descale" else (hkv, k.shape[1])
        blocks = (seqlen + FP8_SCALE_BLOCK - 1) // FP8_SCALE_BLOCK
        per_head = t.dim() == 2 and tuple(t.shape) == (b, hkv)
        per_block = t.dim() == 3 and tuple(t.shape) == (b, heads, blocks)
        if not (per_head or per_block):
            raise ValueError(f"flash3: {name} has shape {tuple(t.shape)}; expected (batch, num_heads_kv) = "
                             f"({b}, {hkv}) or block scales (batch, num_heads, ceil(seqlen / "
                             f"{FP8_SCALE_BLOCK})) = ({b}, {heads}, {blocks})")


@torch.library.register_fake("flash3::fwd_fp8")
def _fwd_fp8_fake(q, k, v, q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                  window_left=-1, window_right=-1):
    _check_fp8_inputs(q, k, v, q_descale, k_descale, v_descale)
    _check_softmax_scale(softmax_scale)
    b, sq, hq, _ = q.shape
    out = q.new_empty((b, sq, hq, v.shape[3]), dtype=torch.bfloat16)
    lse = q.new_empty((b, hq, sq), dtype=torch.float32)
    return out, lse


@torch.library.register_fake("flash3::quantize_fp8")
def _quantize_fp8_fake(x, heads_per_scale=1, block_scales=False, hadamard=False, hadamard_seed=0, rotary_cos=None,
                       rotary_sin=None, rotary_interleaved=True):
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"flash3: x.dtype is {_dtype_str(x.dtype)}; expected torch.float16 or torch.bfloat16")
    if x.dim() != 4:
        raise ValueError(f"flash3: x has {x.dim()} dimensions (shape {tuple(x.shape)}); expected a 4-d tensor "
                         "(batch, seqlen, num_heads, head_dim)")
    if heads_per_scale < 1 or x.shape[2] % heads_per_scale != 0:
        raise ValueError(f"flash3: heads_per_scale is {heads_per_scale}; expected a divisor of x.shape[2] "
                         f"(num_heads) {x.shape[2]}")
    if block_scales and heads_per_scale != 1:
        raise ValueError(f"flash3: heads_per_scale is {heads_per_scale} with block_scales=True; expected 1 "
                         "(block scales are per head)")
    if block_scales:
        shape = (x.shape[0], x.shape[2], (x.shape[1] + FP8_SCALE_BLOCK - 1) // FP8_SCALE_BLOCK)
    else:
        shape = (x.shape[0], x.shape[2] // heads_per_scale)
    return x.new_empty(x.shape, dtype=torch.float8_e4m3fn), x.new_empty(shape, dtype=torch.float32)


@torch.library.register_fake("flash3::bwd")
def _bwd_fake(dout, q, k, v, out, softmax_lse, dlse=None, softmax_scale=None, causal=False, window_left=-1,
              window_right=-1, softcap=0.0, deterministic=False):
    _check_forward_inputs(q, k, v)
    _check_softmax_scale(softmax_scale)
    _check_softcap(softcap)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@torch.library.register_fake("flash3::varlen_fwd")
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                     softmax_scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0,
                     deterministic=False, pack_gqa=-1, num_splits=1):
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k)
    _check_softmax_scale(softmax_scale)
    _check_softcap(softcap)
    _check_pack_gqa(pack_gqa)
    _check_num_splits(num_splits)
    total_q, hq, _ = q.shape
    dv = v.shape[2]
    out = q.new_empty((total_q, hq, dv))
    lse = q.new_empty((hq, total_q), dtype=torch.float32)
    return out, lse


@torch.library.register_fake("flash3::varlen_bwd")
def _varlen_bwd_fake(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                     max_seqlen_k, softmax_scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0,
                     deterministic=False, dlse=None):
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k)
    _check_softmax_scale(softmax_scale)
    _check_varlen_backward_tensors(dout, q, v, out, softmax_lse, dlse)
    _check_softcap(softcap)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


_COMBINE_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_combine_inputs(out_partial, lse_partial, out, softmax_lse):
    """The binding's checks of torch.ops.flash3.combine (same messages): devices, dtypes, ranks,
    shapes, num_splits and head_dim ranges."""
    names = (("out_partial", out_partial), ("lse_partial", lse_partial), ("out", out),
             ("softmax_lse", softmax_lse))
    for name, t in names:
        if t.device.type != "cuda":
            raise ValueError(f"flash3: {name} must be a CUDA tensor, but {name} is on device '{t.device}' "
                             f"(move it with {name}.cuda())")
    for name, t in names[1:]:
        if t.device != out_partial.device:
            raise ValueError(f"flash3: {name} is on device '{t.device}' but out_partial is on device "
                             f"'{out_partial.device}'; expected all tensors on the same CUDA device")
    if out_partial.dtype != torch.float32:
        raise TypeError(f"flash3: out_partial.dtype is {out_partial.dtype}; expected torch.float32 (the split-KV "
                        "partials are fp32)")
    if lse_partial.dtype != torch.float32:
        raise TypeError(f"flash3: lse_partial.dtype is {lse_partial.dtype}; expected torch.float32")
    if out.dtype not in _COMBINE_OUT_DTYPES:
        raise TypeError(f"flash3: out.dtype is {out.dtype}; expected torch.float32, torch.float16 or torch.bfloat16")
    if softmax_lse.dtype != torch.float32:
        raise TypeError(f"flash3: softmax_lse.dtype is {softmax_lse.dtype}; expected torch.float32")
    if out_partial.dim() != 5:
        raise ValueError(f"flash3: out_partial has {out_partial.dim()} dimensions (shape "
                         f"{_shape_str(out_partial.shape)}); expected a 5-d tensor (num_splits, batch, seqlen, "
                         "num_heads, head_dim)")
    ns, b, s, h, d = out_partial.shape
    if not 1 <= ns <= 256:
        raise ValueError(f"flash3: out_partial.shape[0] (num_splits) is {ns}; expected 1 to 256")
    if not 1 <= d <= _MAX_COMBINE_HEAD_DIM:
        raise ValueError(f"flash3: out_partial.shape[4] (head_dim) is {d}; expected 1 to {_MAX_COMBINE_HEAD_DIM}")
    for name, t, want, layout in (("lse_partial", lse_partial, (ns, b, s, h), "(num_splits, batch, seqlen, num_heads)"),
                                  ("out", out, (b, s, h, d), "(batch, seqlen, num_heads, head_dim)"),
                                  ("softmax_lse", softmax_lse, (b, s, h), "(batch, seqlen, num_heads)")):
        if tuple(t.shape) != want:
            raise ValueError(f"flash3: {name} has shape {_shape_str(t.shape)}; expected {list(want)} {layout} to "
                             f"match out_partial {_shape_str(out_partial.shape)}")


@torch.library.register_fake("flash3::combine")
def _combine_fake(out_partial, lse_partial, out, softmax_lse):
    _check_combine_inputs(out_partial, lse_partial, out, softmax_lse)


# ---------------------------------------------------------------------------
# KV-cache attention: the checks of torch.ops.flash3.fwd_kvcache (csrc/flash3_torch.cpp,
# check_kvcache_inputs), same order and messages, and its fake implementation.
# ---------------------------------------------------------------------------
_KVCACHE_LAYOUTS = {
    "q": "(batch, seqlen_q, num_heads_q, head_dim)",
    "page_table": "(batch, max_num_pages_per_seq)",
    "k_cache": "(batch_cache, seqlen_cache, num_heads_kv, head_dim)",
    "v_cache": "(batch_cache, seqlen_cache, num_heads_kv, head_dim_v)",
    "k": "(batch, seqlen_new, num_heads_kv, head_dim)",
    "v": "(batch, seqlen_new, num_heads_kv, head_dim_v)",
}


def _kvcache_fake_outputs(q, v_cache, cu_seqlens_q):
    """fwd_kvcache's outputs (the C++ op checks every argument when it runs): out follows q's rows
    and heads with v_cache's head dim; softmax_lse is (num_heads_q, total_q) with cu_seqlens_q,
    else a (batch, num_heads_q, seqlen_q) view of a contiguous (num_heads_q, batch, seqlen_q)
    tensor."""
    dv, hq = v_cache.shape[3], q.shape[-2]
    if cu_seqlens_q is not None:
        return q.new_empty((q.shape[0], hq, dv)), q.new_empty((hq, q.shape[0]), dtype=torch.float32)
    b, sq = q.shape[0], q.shape[1]
    return q.new_empty((b, sq, hq, dv)), q.new_empty((hq, b, sq), dtype=torch.float32).permute(1, 0, 2)


@torch.library.register_fake("flash3::fwd_kvcache")
def _fwd_kvcache_fake(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                      cache_batch_idx=None, cache_leftpad=None, page_table=None, rotary_seqlens=None,
                      softmax_scale=None, causal=False, window_left=-1, window_right=-1, softcap=0.0,
                      rotary_interleaved=True, num_splits=0, pack_gqa=-1, cu_seqlens_q=None, cu_seqlens_k_new=None,
                      max_seqlen_q=None):
    _check_scalar_options(softmax_scale, softcap, pack_gqa, num_splits)
    return _kvcache_fake_outputs(q, v_cache, cu_seqlens_q)


@torch.library.register_fake("flash3::fwd_kvcache_out")
def _fwd_kvcache_out_fake(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                          cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                          rotary_seqlens=None, softmax_scale=None, causal=False, window_left=-1, window_right=-1,
                          softcap=0.0, rotary_interleaved=True, num_splits=0, pack_gqa=-1, cu_seqlens_q=None,
                          cu_seqlens_k_new=None, max_seqlen_q=None, *, out):
    _check_scalar_options(softmax_scale, softcap, pack_gqa, num_splits)
    return _kvcache_fake_outputs(q, v_cache, cu_seqlens_q)[1]


def _check_scalar_options(softmax_scale, softcap, pack_gqa, num_splits):
    _check_softmax_scale(softmax_scale)
    _check_softcap(softcap)
    _check_pack_gqa(pack_gqa)
    _check_num_splits(num_splits)


# ---------------------------------------------------------------------------
# Public API.
# ---------------------------------------------------------------------------
def _check_not_implemented(qv, q_descale, k_descale, v_descale, attention_chunk):
    """FlashAttention-3 features flash3 does not have: NotImplementedError unless left at the default.
    (flash_attn_func takes the descales with FP8 inputs.)"""
    if qv is not None:
        raise NotImplementedError("flash3: qv is not supported yet; pass None")
    if q_descale is not None or k_descale is not None or v_descale is not None:
        raise NotImplementedError("flash3: q_descale / k_descale / v_descale apply to FP8 (torch.float8_e4m3fn) "
                                  "inputs of flash_attn_func only; pass None")
    if attention_chunk != 0:
        raise NotImplementedError(f"flash3: attention_chunk={attention_chunk} is not supported yet; pass 0")


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


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    qv: Optional[torch.Tensor] = None,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    window_size: Tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: Optional[bool] = None,
    deterministic: bool = False,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
    out: Optional[torch.Tensor] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Scaled dot-product attention, FlashAttention-3 interface (positional order included).

    Arguments:
        q: (batch, seqlen_q, num_heads_q, head_dim), torch.float16 or torch.bfloat16, on a Hopper GPU;
            or torch.float8_e4m3fn (FP8, forward only: see q_descale).
        k: (batch, seqlen_k, num_heads_kv, head_dim), same dtype and device as q.
        v: (batch, seqlen_k, num_heads_kv, head_dim_v), same dtype and device as q.
            Any batch / seqlen / head strides; the last dimension must have stride 1.
            num_heads_q must be a multiple of num_heads_kv (GQA/MQA: query head h uses kv head
            h // (num_heads_q // num_heads_kv)). (head_dim, head_dim_v) must be one this build has
            kernels for: (64, 64), (96, 96), (128, 128), (192, 192), (256, 256), (192, 128) by default
            (see flash3.forward_is_built).
        softmax_scale: scaling of q @ k^T before the softmax. None means 1 / sqrt(head_dim); a
            number is used exactly as given, 0 included (every visible key then gets the same
            weight). Negative, infinite or NaN values (after rounding to float32) raise ValueError:
            the online softmax tracks the row maximum of the unscaled scores, which a negative
            scale would turn into the row minimum.
        causal: causal mask, aligned to the bottom-right corner when seqlen_q != seqlen_k
            (query i attends to keys j <= i + seqlen_k - seqlen_q); the same mask as
            window_size=(-1, 0) without causal.
        qv: a FlashAttention-3 argument flash3 does not implement yet; it must be None
            (NotImplementedError otherwise).
        q_descale, k_descale, v_descale: FP8 inputs only (q, k, v torch.float8_e4m3fn): the
            dequantization factors, torch.float32 on q's device, or None (1): (batch,
            num_heads_kv) as FlashAttention-3 takes them, or block scales (batch, num_heads,
            ceil(seqlen / 128)), one per 128 tokens of each head (q's heads and seqlen_q for
            q_descale, k's for k_descale / v_descale; flash3.quantize_fp8(block_scales=True)
            writes them). Descales must be positive. The scores are softmax_scale * (q_descale * q) @ (k_descale * k)^T and the output
            P @ (v_descale * v), in torch.bfloat16. FP8 calls are forward only (an input that
            requires grad raises RuntimeError) and take no softcap; the kernels keep the FP8
            precision of the inputs and of P (docs/design.md, "FP8").
        window_size: (left, right) sliding window, FlashAttention-3's rules. Query i attends to
            key j iff
                j >= i + seqlen_k - seqlen_q - left   (when left >= 0) and
                j <= i + seqlen_k - seqlen_q + right  (when right >= 0).
            Any negative side is unbounded. Any Python int is accepted: a side that can cut
            nothing (left >= seqlen_k - 1, right >= seqlen_q - 1, e.g. 2**31 - 1 or 2**40) is
            unbounded. With causal=True the right side is 0 whatever value is given and the left
            side is kept: causal with a finite left side is local (sliding-window causal)
            attention. A query that sees no key gives out = 0 and softmax_lse = -inf.
        attention_chunk: must be 0 (not implemented).
        softcap: tanh soft-capping of the attention scores, as in FlashAttention-3 (the logit
            soft-capping of e.g. Gemma 2); 0 (the default) disables it. With softcap > 0 each
            scaled score s = softmax_scale * q . k becomes softcap * tanh(s / softcap), i.e. it
            is squashed into (-softcap, softcap), before the mask and the softmax; softmax_lse is
            the logsumexp of the capped scores. Forward and backward (the gradients go through
            the tanh), with every mask, GQA/MQA and deterministic, for every built dtype and
            head dim.
            softmax_scale=0 makes every capped score 0 (uniform weights). Negative, infinite or
            NaN values (after rounding to float32) raise ValueError. A build configured without
            the softcap kernels (CMake FLASH3_FEATURES without "softcap") raises
            NotImplementedError for softcap > 0.
        num_splits: split-KV, as in FlashAttention-3 (forward only): the key/value range of each
            query tile is split over num_splits thread blocks, whose fp32 partial outputs a
            combine kernel then merges; this fills the GPU when there are few query tiles
            (decode-like calls: short seqlen_q, long seqlen_k). 1 (the default): no split; 0: a
            heuristic decides (splits where that fills the SMs); n in [2, 256]: at most n splits
            (fewer when there are fewer key blocks). Only the speed depends on it (and fp32
            rounding): where no split-capable kernel is built (softcap > 0, a build without the
            packgqa kernels) the unsplit kernel runs. Other ints raise ValueError, other types
            TypeError. The backward ignores it.
        sm_margin: FlashAttention-3 performance hint; accepted and ignored (flash3 uses every
            SM).
        pack_gqa: PackGQA, FlashAttention-3's forward option for GQA/MQA (num_heads_q >
            num_heads_kv): the query heads that share a KV head are packed into one tile, so each
            K/V tile is loaded once per group. None (the default) lets a heuristic decide (it packs
            when that fills the query tiles clearly better, e.g. short seqlen_q); True packs, False
            does not. Only the speed depends on it, never the results: where no packed
            kernel exists (num_heads_q == num_heads_kv, softcap > 0, a build without the packgqa
            kernels) the unpacked kernel runs. The backward never packs. A value other than None,
            True or False (or the ints 1 and 0) raises TypeError.
        deterministic: make the backward pass bitwise reproducible.
        return_attn_probs: as in FlashAttention-3: also return softmax_lse (the probabilities
            themselves are never returned).
        return_lse: keyword-only alias of return_attn_probs.

    Returns:
        out: (batch, seqlen_q, num_heads_q, head_dim_v), dtype of q; or, when return_attn_probs or
        return_lse is set, (out, softmax_lse) with softmax_lse (batch, num_heads_q, seqlen_q)
        torch.float32, the natural-log logsumexp of each row of the scaled (and, with softcap,
        capped) scores. Both are differentiable: gradients flow to q, k, v from out and from
        softmax_lse.

    Raises (before anything is launched):
        ValueError: a CPU tensor, mismatched devices or shapes, a last dimension that is not
            contiguous, an unsupported head dim, a negative / infinite / NaN softmax_scale or
            softcap.
        TypeError: a dtype other than float16/bfloat16, or q/k/v dtypes that differ; a pack_gqa
            other than None, True or False; a num_splits that is not an int.
        NotImplementedError: a feature flash3 does not have yet (qv, FP8 descales,
            attention_chunk; a non-Hopper GPU), softcap > 0 in a build without the softcap
            kernels.
        RuntimeError: a CUDA error.
    """
    if isinstance(q, torch.Tensor) and q.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return _flash_attn_fp8(q, k, v, softmax_scale, causal, qv, q_descale, k_descale, v_descale, window_size,
                               attention_chunk, softcap, num_splits, pack_gqa, deterministic, sm_margin,
                               return_attn_probs or return_lse)
    _check_not_implemented(qv, q_descale, k_descale, v_descale, attention_chunk)
    _check_sm_margin(sm_margin)
    if not torch.compiler.is_compiling():  # traced: the fake implementation checks it
        softcap = _check_softcap(softcap)
    window_left, window_right = _window_sides(window_size)
    result, lse = _fwd(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic,
                       _pack_gqa_arg(pack_gqa), _check_num_splits(num_splits))
    if out is not None:  # the caller's buffer gets a copy; with autograd the result carries the gradient
        _check_out(out, result, "(batch, seqlen_q, num_heads_q, head_dim_v)")
        with torch.no_grad():
            out.copy_(result)
        if not result.requires_grad:
            result = out
    if return_attn_probs or return_lse:
        return result, lse
    return result


def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    window_size: Tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    deterministic: bool = False,
    num_heads_q: Optional[int] = None,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """flash_attn_func on q, k, v packed in one tensor, FlashAttention-3 interface (positional
    order included).

    Arguments:
        qkv: (batch, seqlen, 3, num_heads, head_dim) (MHA), or (batch, seqlen, num_heads_q + 2 *
            num_heads_kv, head_dim) with num_heads_q given (q's heads, then k's, then v's: GQA /
            MQA). q, k and v are views of it (no copy: flash3 takes strided inputs).
        num_heads_q: the number of q heads of a 4-d qkv; ignored for a 5-d one.
        The other arguments are flash_attn_func's (FP8 qkv with its descales included).

    Returns:
        flash_attn_func's: out (batch, seqlen, num_heads_q, head_dim), and softmax_lse when
        return_attn_probs or return_lse is set. The gradient reaches qkv through the views (one
        tensor assembled from dq, dk and dv, where FlashAttention-3 writes them into it directly).

    Raises (before anything is launched):
        ValueError: a qkv that is not 4- or 5-d, a 5-d qkv whose third dimension is not 3, a 4-d
            qkv without num_heads_q or whose heads are not num_heads_q + 2 * num_heads_kv with
            num_heads_kv >= 1; and whatever flash_attn_func raises for q, k, v.
        TypeError: qkv not a tensor, num_heads_q not an int.
    """
    if not isinstance(qkv, torch.Tensor):
        raise TypeError(f"flash3: qkv is a {type(qkv).__name__}; expected a torch.Tensor")
    if qkv.dim() == 5:
        if qkv.shape[2] != 3:
            raise ValueError(f"flash3: qkv has shape {_shape_str(qkv.shape)}; expected (batch, seqlen, 3, "
                             "num_heads, head_dim)")
        q, k, v = qkv.unbind(dim=2)
    elif qkv.dim() == 4:
        if num_heads_q is None:
            raise ValueError(f"flash3: qkv has shape {_shape_str(qkv.shape)} and num_heads_q is None; a 4-d qkv "
                             "(batch, seqlen, num_heads_q + 2 * num_heads_kv, head_dim) needs num_heads_q")
        if not _is_int(num_heads_q):
            raise TypeError(f"flash3: num_heads_q is a {type(num_heads_q).__name__}; expected an int")
        kv_heads2 = qkv.shape[2] - num_heads_q
        if num_heads_q < 1 or kv_heads2 < 2 or kv_heads2 % 2 != 0:
            raise ValueError(f"flash3: qkv has {qkv.shape[2]} heads with num_heads_q = {num_heads_q}; expected "
                             "num_heads_q + 2 * num_heads_kv heads with num_heads_q >= 1 and num_heads_kv >= 1")
        q, k, v = qkv.split([num_heads_q, kv_heads2 // 2, kv_heads2 // 2], dim=2)
    else:
        raise ValueError(f"flash3: qkv has shape {_shape_str(qkv.shape)}; expected (batch, seqlen, 3, num_heads, "
                         "head_dim) or (batch, seqlen, num_heads_q + 2 * num_heads_kv, head_dim)")
    return flash_attn_func(q, k, v, softmax_scale, causal, None, q_descale, k_descale, v_descale, window_size,
                           attention_chunk, softcap, 1, None, deterministic, sm_margin, return_attn_probs,
                           return_lse=return_lse)


class _Fp8NoBackward(torch.autograd.Function):
    """FP8 outputs for inputs that require grad (FlashAttention-3's behaviour): the forward
    runs, and only a backward that actually reaches the inputs raises."""

    @staticmethod
    def forward(ctx, out, lse, q, k, v):
        ctx.mark_non_differentiable(lse)
        return out.detach(), lse.detach()

    @staticmethod
    def backward(ctx, dout, dlse):
        raise RuntimeError("flash3: FP8 attention is forward-only: there is no backward for torch.float8_e4m3fn "
                           "q / k / v (FlashAttention-3 has none either); run the bf16 / fp16 path for training")


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


def _check_sm_margin(sm_margin):
    if not _is_int(sm_margin):
        raise TypeError(f"flash3: sm_margin is {sm_margin!r} ({type(sm_margin).__name__}); expected an int")
    if sm_margin < 0:
        raise ValueError(f"flash3: sm_margin is {sm_margin}; expected >= 0 (SMs to leave free; flash3 uses every SM)")


def _flash_attn_fp8(q, k, v, softmax_scale, causal, qv, q_descale, k_descale, v_descale, window_size,
                    attention_chunk, softcap, num_splits, pack_gqa, deterministic, sm_margin, return_lse):
    """flash_attn_func's FP8 path (torch.ops.flash3.fwd_fp8): forward only, out torch.bfloat16.
    Every argument is checked as on the 16-bit path; num_splits, pack_gqa and deterministic only
    change the speed there and are accepted here (the FP8 kernels run unsplit and unpacked)."""
    _check_not_implemented(qv, None, None, None, attention_chunk)
    softcap = _check_softcap(softcap)
    if softcap != 0.0:
        raise NotImplementedError(f"flash3: softcap={softcap} with FP8 inputs is not supported yet; pass 0.0")
    _check_num_splits(num_splits)
    _pack_gqa_arg(pack_gqa)
    if not isinstance(deterministic, bool):
        raise TypeError(f"flash3: deterministic is {deterministic!r} ({type(deterministic).__name__}); "
                        "expected a bool")
    _check_sm_margin(sm_margin)
    window_left, window_right = _window_sides(window_size)
    needs_grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))
    if needs_grad:
        with torch.no_grad():
            out, lse = _fwd_fp8(q.detach(), k.detach(), v.detach(), q_descale, k_descale, v_descale, softmax_scale,
                                causal, window_left, window_right)
        out, lse = _Fp8NoBackward.apply(out, lse, q, k, v)
    else:
        out, lse = _fwd_fp8(q, k, v, q_descale, k_descale, v_descale, softmax_scale, causal, window_left,
                            window_right)
    if return_lse:
        return out, lse
    return out


def quantize_fp8(x: torch.Tensor, heads_per_scale: int = 1, hadamard: bool = False,
                 hadamard_seed: int = 0, block_scales: bool = False, rotary_cos: Optional[torch.Tensor] = None,
                 rotary_sin: Optional[torch.Tensor] = None,
                 rotary_interleaved: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """FP8 (e4m3) quantization for flash_attn_func's FP8 path (torch.ops.flash3.quantize_fp8).

    x: (batch, seqlen, num_heads, head_dim), torch.float16 or torch.bfloat16, CUDA, rows 16-byte
    aligned. Returns (x8, descale): x8 torch.float8_e4m3fn of x's shape and torch.float32
    descales = amax / 448 of each group (1 for an all-zero group), so x8 * descale ~ x:
      * block_scales=False: descale (batch, num_heads / heads_per_scale), one per group of heads
        (two passes over x). For q with GQA pass heads_per_scale = num_heads_q // num_heads_kv:
        the descale is then flash_attn_func's (batch, num_heads_kv) q_descale.
      * block_scales=True: descale (batch, num_heads, ceil(seqlen / 128)), one per 128 tokens of
        each head (FlashAttention-3's block quantization; one pass over x). flash_attn_func takes
        these directly as q_descale / k_descale / v_descale.
    hadamard: rotate first, x -> x (1/sqrt(head_dim)) H D (randomized Hadamard, signs from
    hadamard_seed; head_dim a power of two in [32, 256]). Rotate q and k with the same seed
    (q k^T is unchanged, outliers are spread over the row); never v.
    rotary_cos, rotary_sin: optional (seqlen_ro >= seqlen, rotary_dim / 2) tables in x's dtype (both
    or neither; q and k only): rotary is applied first, in fp32, token s by table row s (for a chunk
    at position p pass the tables from row p), pairs (2i, 2i + 1) when rotary_interleaved (GPT-J),
    else (i, i + rotary_dim / 2) (GPT-NeoX); rotary_dim a multiple of 16 up to head_dim (a power
    of two when not interleaved), rows 16-byte aligned.
    """
    return _quantize_fp8(x, heads_per_scale, block_scales, hadamard, hadamard_seed, rotary_cos, rotary_sin,
                         rotary_interleaved)


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    seqused_q: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    qv: Optional[torch.Tensor] = None,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    window_size: Tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: Optional[bool] = None,
    deterministic: bool = False,
    sm_margin: int = 0,
    return_attn_probs: bool = False,
    *,
    return_lse: bool = False,
    page_table: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Attention over a batch of sequences of different lengths, concatenated along dim 0
    (FlashAttention-3 interface, positional order included), differentiable in q, k, v.

    Serving form (the call vLLM makes): with page_table (block_table is accepted as its alias),
    k / v are paged KV caches (num_pages, page_size, num_heads_kv, head_dim[_v]), cu_seqlens_k is
    None and sequence b attends to its first seqused_k[b] cache rows (all of its pages' rows
    without seqused_k). That call is flash_attn_with_kvcache(q, k, v, cache_seqlens=seqused_k,
    page_table=..., cu_seqlens_q=..., max_seqlen_q=...) without new rows: forward only (the
    outputs never require grad), seqused_q unsupported.

    out= (keyword): the caller's output (total_q, num_heads_q, head_dim_v) in q's dtype, written
    in place and returned (the serving form writes it directly; the differentiable form copies
    into it, and then out does not carry the gradient: use the returned tensor for that).

    Arguments:
        q: (total_q, num_heads_q, head_dim), torch.float16 or torch.bfloat16, on a Hopper GPU.
        k: (total_k, num_heads_kv, head_dim), same dtype and device as q.
        v: (total_k, num_heads_kv, head_dim_v), same dtype and device as q.
            Head counts, head dims and strides as in flash_attn_func (last dimension stride 1).
        cu_seqlens_q: (num_sequences + 1,) torch.int32 on q's device, contiguous: the prefix sums
            of the query lengths; sequence b is q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]].
        cu_seqlens_k: (num_sequences + 1,) torch.int32, the same for k and v.
        max_seqlen_q, max_seqlen_k: the longest query / key sequence, in [0, 2**31 - 1] (0: every
            sequence empty, FlashAttention-3's empty batch). Used to
            normalise the window (a side >= max_seqlen - 1 cuts nothing); a value below a real
            length is not detected (see below).
        seqused_q, seqused_k: optional (num_sequences,) torch.int32 on q's device: only the first
            seqused[b] rows of sequence b are real (clamped on the device to the sequence's
            length); the others are neither read nor written.
        softmax_scale, causal, window_size, softcap, deterministic: as in flash_attn_func. Masks
            are aligned to the bottom-right corner of each sequence (offset = seqlen_k_b - seqlen_q_b,
            the used lengths when seqused is given); softcap (> 0: s -> softcap * tanh(s / softcap)
            before the mask, forward and backward) applies to every sequence.
        qv, q_descale, k_descale, v_descale: must be None (NotImplementedError otherwise).
        attention_chunk: must be 0 (NotImplementedError otherwise).
        pack_gqa: as in flash_attn_func (None: the heuristic, which packs every GQA/MQA varlen
            call; True / False; the results do not depend on it).
        num_splits: as in flash_attn_func (1: no split, 0: heuristic, n: at most n splits).
        sm_margin: FlashAttention-3 performance hint; accepted and ignored, as in flash_attn_func.
        return_attn_probs: also return softmax_lse (the probabilities are never returned).
        return_lse: keyword-only alias of return_attn_probs.

    Returns:
        out: (total_q, num_heads_q, head_dim_v), dtype of q; or (out, softmax_lse) when
        return_attn_probs or return_lse is set, with softmax_lse (num_heads_q, total_q)
        torch.float32 (natural-log logsumexp of each row of the scaled, capped when softcap > 0,
        scores). A query row that sees no key (e.g. of a sequence with no keys) gets out = 0 and
        softmax_lse = -inf. Rows that no sequence covers (beyond seqused, from cu_seqlens_q[-1]
        on) are not written: their contents are undefined (freshly allocated memory), as in
        FlashAttention-3.

    Backward (torch.ops.flash3.varlen_bwd): gradients flow to q, k, v from out and from
    softmax_lse, per sequence exactly as flash_attn_func's backward on that sequence. The rows of
    dq beyond seqused_q[b], of dk / dv beyond seqused_k[b], and rows no sequence covers are 0 (as
    in FlashAttention-3); the gradient arriving for the rows of out / softmax_lse that are not
    written is ignored. deterministic=True makes dq / dk / dv bitwise reproducible.

    Checked on the host, before anything is launched (the eager checks and the fake
    implementation's): everything flash_attn_func checks, for 3-d tensors; cu_seqlens_* and
    seqused_* are CUDA tensors on q's device, torch.int32, 1-d and contiguous; cu_seqlens_q and
    cu_seqlens_k have the same length (>= 1); seqused_* have cu_seqlens_q.numel() - 1 entries;
    max_seqlen_* in [0, 2**31 - 1]; softmax_scale (when given) and softcap finite and >= 0. Not
    checked (the contents of cu_seqlens_* / seqused_* stay on the device: no synchronisation):
    that cu_seqlens_* start at 0, increase and end at most at total_q / total_k, that
    max_seqlen_* are at least the real lengths, that seqused_* are at most the lengths. The
    kernels clamp what they read, so nothing outside the tensors is ever read or written, but
    such inputs give meaningless results.

    Raises: as flash_attn_func (ValueError / TypeError / NotImplementedError / RuntimeError);
    backward() raises NotImplementedError when this build has no backward kernel for the head dims
    (flash3.backward_is_built).
    """
    _check_not_implemented(qv, q_descale, k_descale, v_descale, attention_chunk)
    _check_sm_margin(sm_margin)
    if block_table is not None:
        if page_table is not None and page_table is not block_table:
            raise ValueError("flash3: page_table and block_table are both given; block_table is an alias of "
                             "page_table: pass one")
        page_table = block_table
    if page_table is not None:
        if cu_seqlens_k is not None:
            raise ValueError("flash3: cu_seqlens_k is given with page_table; a paged cache's lengths come from "
                             "seqused_k (pass cu_seqlens_k=None)")
        if seqused_q is not None:
            raise NotImplementedError("flash3: seqused_q with page_table is not supported; pass None")
        return flash_attn_with_kvcache(q, k, v, cache_seqlens=seqused_k, page_table=page_table,
                                       cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                                       softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                                       softcap=softcap, num_splits=num_splits, pack_gqa=pack_gqa,
                                       return_softmax_lse=return_attn_probs or return_lse, out=out)
    if not torch.compiler.is_compiling():  # traced: the fake implementation checks it
        softcap = _check_softcap(softcap)
    window_left, window_right = _window_sides(window_size)
    result, lse = _varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                              softmax_scale, causal, window_left, window_right, softcap, deterministic,
                              _pack_gqa_arg(pack_gqa), _check_num_splits(num_splits))
    if out is not None:
        _check_out(out, result, "(total_q, num_heads_q, head_dim_v)")
        with torch.no_grad():
            out.copy_(result)
        if not result.requires_grad:
            result = out
    if return_attn_probs or return_lse:
        return result, lse
    return result


def flash_attn_combine(out_partial: torch.Tensor, lse_partial: torch.Tensor, out: Optional[torch.Tensor] = None,
                       out_dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merges the partial results of a split-KV attention (FlashAttention-3's flash_attn_combine).

    Each of num_splits splits attended to a part of the keys and produced an fp32 partial
    output and logsumexp; per row (batch, seqlen, head):
        softmax_lse = log(sum_s exp(lse_partial[s])),
        out = sum_s exp(lse_partial[s] - softmax_lse) * out_partial[s].
    A split whose lse is -inf (no visible key) weighs 0 and its out_partial is not read (it may
    hold anything, NaN included); a row with every split at -inf gets out = 0 and
    softmax_lse = -inf (never NaN).

    Arguments:
        out_partial: (num_splits, batch, seqlen, num_heads, head_dim) torch.float32 CUDA tensor,
            num_splits in [1, 256], head_dim in [1, 256]. Any strides (copied or zero-padded to a
            multiple of 4 in head_dim where the kernel cannot read it as is, as FlashAttention-3
            pads).
        lse_partial: (num_splits, batch, seqlen, num_heads) torch.float32 (natural log), any
            strides.
        out: optional (batch, seqlen, num_heads, head_dim) output, written in place and
            returned; its dtype must be out_dtype's. It must not overlap the inputs.
        out_dtype: torch.float32 (the default: out_partial's dtype, as in FlashAttention-3),
            torch.float16 or torch.bfloat16.

    Returns:
        (out, softmax_lse): out (batch, seqlen, num_heads, head_dim) in out_dtype; softmax_lse
        (batch, seqlen, num_heads) torch.float32, a transposed view of a (batch, num_heads,
        seqlen) tensor (FlashAttention-3's layout).

    Raises (before anything is launched): ValueError (a CPU tensor, mismatched devices or shapes,
    num_splits or head_dim out of range, out overlapping the inputs), TypeError (dtypes).
    """
    if not isinstance(out_partial, torch.Tensor) or out_partial.dim() != 5:
        shape = _shape_str(out_partial.shape) if isinstance(out_partial, torch.Tensor) else repr(out_partial)
        raise ValueError(f"flash3: out_partial has shape {shape}; expected a 5-d tensor (num_splits, batch, "
                         "seqlen, num_heads, head_dim)")
    if out_dtype is None:
        out_dtype = out_partial.dtype
    if out_dtype not in _COMBINE_OUT_DTYPES:
        raise TypeError(f"flash3: out_dtype is {out_dtype}; expected torch.float32, torch.float16 or "
                        "torch.bfloat16")
    _, b, s, h, d = out_partial.shape
    if out is None:
        out = torch.empty((b, s, h, d), dtype=out_dtype, device=out_partial.device)
    elif out.dtype != out_dtype:
        raise TypeError(f"flash3: out.dtype is {out.dtype}; expected {out_dtype} (out_dtype, which defaults to "
                        "out_partial.dtype, torch.float32)")
    # An out that shares memory with an input is refused here: the op declares out as its only
    # mutated argument, and torch's dispatcher must not see it alias another argument.
    for name, t in (("out_partial", out_partial), ("lse_partial", lse_partial)):
        if isinstance(t, torch.Tensor) and _byte_ranges_overlap(out, t):
            raise ValueError(f"flash3: out (data {out.data_ptr():#x}, shape {_shape_str(out.shape)}) overlaps {name} "
                             f"(data {t.data_ptr():#x}, shape {_shape_str(t.shape)}); expected out to have memory "
                             "of its own")
    softmax_lse = torch.empty((b, h, s), dtype=torch.float32, device=out_partial.device).transpose(1, 2)
    _combine(out_partial, lse_partial, out, softmax_lse)
    return out, softmax_lse


# ---------------------------------------------------------------------------
# KV-cache attention.
# ---------------------------------------------------------------------------
def _cache_seqlens_tensor(cache_seqlens, q, batch, k_cache, page_table, k, cu_seqlens_k_new):
    """An int cache_seqlens (every sequence holds that many rows) as FlashAttention-3 makes it: a
    (batch,) torch.int32 tensor on q's device. The host knows its value, so the append's rows must
    fit: cache_seqlens + seqlen_new <= the capacity (seqlen_cache, or max_num_pages_per_seq *
    page_size), where the kernels would drop the rows past it (a tensor cache_seqlens is the
    caller's contract there: rows past the capacity are not written)."""
    if not _is_int(cache_seqlens):
        raise TypeError(f"flash3: cache_seqlens is {cache_seqlens!r} ({type(cache_seqlens).__name__}); expected "
                        "None, an int or a (batch,) torch.int32 tensor")
    cache_seqlens = int(cache_seqlens)
    if not 0 <= cache_seqlens <= _INT32_MAX:
        raise ValueError(f"flash3: cache_seqlens is {cache_seqlens}; expected an int in [0, 2147483647] (the number "
                         "of rows each cache entry holds) or a (batch,) torch.int32 tensor")
    if isinstance(k_cache, torch.Tensor) and k_cache.dim() == 4:
        paged = isinstance(page_table, torch.Tensor) and page_table.dim() == 2
        capacity = page_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
        new = k.shape[1] if isinstance(k, torch.Tensor) and k.dim() == 4 and cu_seqlens_k_new is None else 0
        if cache_seqlens + new > capacity:
            raise ValueError(f"flash3: cache_seqlens is {cache_seqlens} with {new} new rows; expected cache_seqlens + "
                             f"seqlen_new <= {capacity}, the rows a cache entry holds "
                             f"({'max_num_pages_per_seq * page_size' if paged else 'k_cache.shape[1]'}): the new rows "
                             "would not fit")
    return torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)


def _is_int(x):
    """An integer other than a bool (Python ints, NumPy integers, 0-d integer tensors)."""
    if isinstance(x, bool):
        return False
    try:
        operator.index(x)
        return True
    except TypeError:
        return False


def _scheduler_metadata_plan(scheduler_metadata):
    """(num_splits, pack_gqa) from get_scheduler_metadata's result: a CPU torch.int32 tensor of 2
    values (or a tuple / list of 2 ints, e.g. its .tolist(), which torch.compile(fullgraph=True)
    can trace without reading a tensor)."""
    md = scheduler_metadata
    if isinstance(md, torch.Tensor):
        if md.device.type != "cpu":
            raise ValueError(f"flash3: scheduler_metadata is on device '{md.device}'; expected the CPU torch.int32 "
                             "tensor [num_splits, pack_gqa] that flash3.get_scheduler_metadata returns (flash3's "
                             "plan is decided on the host)")
        if md.dtype != torch.int32:
            raise TypeError(f"flash3: scheduler_metadata.dtype is {_dtype_str(md.dtype)}; expected torch.int32 (the "
                            "[num_splits, pack_gqa] tensor of flash3.get_scheduler_metadata)")
        if tuple(md.shape) != (2,):
            raise ValueError(f"flash3: scheduler_metadata has shape {_shape_str(md.shape)}; expected (2,) "
                             "([num_splits, pack_gqa], as flash3.get_scheduler_metadata returns it)")
        values = md.tolist()
    elif isinstance(md, (tuple, list)) and len(md) == 2 and _is_int(md[0]) and _is_int(md[1]):
        values = [md[0], md[1]]
    else:
        raise TypeError(f"flash3: scheduler_metadata is {type(md).__name__}; expected None or the CPU torch.int32 "
                        "tensor [num_splits, pack_gqa] of flash3.get_scheduler_metadata (or a tuple of those two "
                        "ints)")
    num_splits, pack_gqa = values
    if not (1 <= num_splits <= 256 and pack_gqa in (0, 1)):
        raise ValueError(f"flash3: scheduler_metadata holds [num_splits, pack_gqa] = [{num_splits}, {pack_gqa}]; "
                         "expected num_splits in [1, 256] and pack_gqa 0 or 1 (use flash3.get_scheduler_metadata)")
    return num_splits, pack_gqa


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    qv: Optional[torch.Tensor] = None,
    rotary_cos: Optional[torch.Tensor] = None,
    rotary_sin: Optional[torch.Tensor] = None,
    cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
    cache_batch_idx: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    page_table: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k_new: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    rotary_seqlens: Optional[torch.Tensor] = None,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    scheduler_metadata: Optional[Union[torch.Tensor, Tuple[int, int]]] = None,
    num_splits: int = 0,
    pack_gqa: Optional[bool] = None,
    sm_margin: int = 0,
    return_softmax_lse: bool = False,
    *,
    out: Optional[torch.Tensor] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Attention of q over a KV cache, after appending new keys / values to it (FlashAttention-3's
    flash_attn_with_kvcache, positional order included): the incremental-decoding step. Forward
    only.

    Per sequence b of the batch:
      1. when k / v are given, their seqlen_new rows are written into the cache *in place*, at rows
         [cache_seqlens[b], cache_seqlens[b] + seqlen_new) of cache entry cache_batch_idx[b], or of
         sequence b's pages with a page_table (rows at or past seqlen_cache, or the paged capacity,
         are dropped: the cache must have room for them); with rotary_cos / rotary_sin the keys are
         rotated first (the values never are);
      2. q[b] (rotated too when rotary tables are given) attends to rows
         [cache_leftpad[b], cache_seqlens[b] + seqlen_new) of that cache entry, i.e.
         seqlen_k = cache_seqlens[b] - cache_leftpad[b] + seqlen_new keys. Masks are aligned to
         the bottom-right corner of each sequence, as in flash_attn_func: query i sees key j
         (counted from the leftpad) iff j <= i + seqlen_k - seqlen_q under causal, and
         i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right with
         window_size = (left, right). A query that sees no key gets out = 0 and
         softmax_lse = -inf.

    Arguments:
        q: (batch, seqlen_q, num_heads_q, head_dim), torch.float16 or torch.bfloat16, on a Hopper
            GPU; last dimension contiguous (a q whose (batch, seqlen_q) rows are not one stride
            apart, e.g. a slice along seqlen, is copied first). Not modified.
        k_cache: (batch_cache, seqlen_cache, num_heads_kv, head_dim) without page_table, or
            (num_blocks, page_block_size, num_heads_kv, head_dim) with one (a paged KV cache: a
            pool of pages of any page_block_size >= 1, e.g. 1, 16, 64, 256), q's dtype and
            device, last dimension contiguous and the rows of all entries (pages) one stride
            apart (k_cache.stride(0) == k_cache.shape[1] * k_cache.stride(1): e.g. contiguous, or
            a slice along the heads). Written in place when k is given.
        v_cache: (batch_cache, seqlen_cache, num_heads_kv, head_dim_v), or
            (num_blocks, page_block_size, num_heads_kv, head_dim_v) with page_table, likewise.
            (head_dim, head_dim_v) must be one this build has forward kernels for
            (flash3.forward_is_built); num_heads_q a multiple of num_heads_kv (GQA / MQA).
        k, v: optional new rows (both or neither), (batch, seqlen_new, num_heads_kv, head_dim) /
            (batch, seqlen_new, num_heads_kv, head_dim_v), q's dtype, last dimension
            contiguous; need cache_seqlens. seqlen_new may be 0, at most seqlen_cache. They must
            not share memory with the caches.
        qv: FlashAttention-3's extra query for head_dim_v (MLA); not supported yet
            (NotImplementedError unless None).
        rotary_cos, rotary_sin: optional rotary embedding tables (both or neither; need k and v),
            (seqlen_ro, rotary_dim / 2) each, q's dtype, last dimension contiguous, rotary_dim
            even and <= head_dim (any even rotary_dim: FlashAttention-3 wants a multiple of 16),
            seqlen_ro >= seqlen_cache (with page_table: >= max_num_blocks_per_seq *
            page_block_size). New key i of sequence b is rotated to position pos_b + i,
            with pos_b = rotary_seqlens[b] if given, else cache_seqlens[b]; query i is rotated to
            position pos_b + i when causal or local (a window that cuts something), else to pos_b
            (all queries at the first new position), as in FlashAttention-3. Per pair (x0, x1)
            at a position with table entries (c, s), in fp32: x0' = fma(x0, c, -(x1 s)),
            x1' = fma(x0, s, x1 c), rounded to the dtype; dims >= rotary_dim are unchanged.
        cache_seqlens: the number of rows each cache entry holds before the append: an int (every
            sequence) or a (batch,) torch.int32 tensor on q's device (contiguous). None: every
            entry holds seqlen_cache rows (with page_table: max_num_blocks_per_seq *
            page_block_size; k / v then cannot be given).
        cache_batch_idx: optional (batch,) torch.int32 on q's device: the cache entry of each
            sequence (default: entry b, which needs batch_cache >= batch). With k / v, entries
            should be distinct (which of several sequences' rows a shared entry keeps is
            unspecified).
        cache_leftpad: optional (batch,) torch.int32 on q's device: the first row of each entry
            that attention reads (left padding; default 0). The append position ignores it.
        page_table: optional (batch, max_num_blocks_per_seq) torch.int32 on q's device, each row
            contiguous (stride(1) == 1; rows may be further apart, e.g. a slice of a wider
            table): a paged KV cache, as in FlashAttention-3. Row r of sequence b lives at row
            r % page_block_size of page page_table[b, r // page_block_size] of k_cache / v_cache
            (sequences may share pages, e.g. a common prefix, but not rows the call appends). A
            sequence then holds at most max_num_blocks_per_seq * page_block_size rows, the role
            seqlen_cache has without pages: cache_seqlens=None means every sequence is that
            full, and seqlen_new and seqlen_ro are checked against it. Not with cache_batch_idx
            or cache_leftpad, nor with softcap > 0 (NotImplementedError). The page indices a
            call uses (those of rows below cache_seqlens[b] + seqlen_new) must lie in
            [0, num_blocks): the caller's contract, not checked (an index out of range reads or
            writes outside the pool). Read on the device only.
        cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q (meaningful only with cu_seqlens_q):
            variable-length q / new rows are not supported yet (NotImplementedError unless None).
        rotary_seqlens: optional (batch,) torch.int32 on q's device: the rotary position of the
            first new row (default cache_seqlens); ignored without rotary tables (as in
            FlashAttention-3).
        q_descale, k_descale, v_descale: FP8 descaling; not supported yet (NotImplementedError
            unless None).
        softmax_scale, causal, window_size, softcap: as in flash_attn_func (None scale:
            1 / sqrt(head_dim); causal keeps window_size's left side: local attention).
        attention_chunk: must be 0 (NotImplementedError otherwise).
        rotary_interleaved: True: rotary pairs are dims (2j, 2j + 1) (GPT-J); False: (j,
            j + rotary_dim / 2) (GPT-NeoX).
        scheduler_metadata: None, or the plan of get_scheduler_metadata (a CPU torch.int32 tensor
            [num_splits, pack_gqa], or a tuple of those two ints): used instead of num_splits and
            pack_gqa, so that every call (a CUDA graph's replays included) runs the same plan.
            flash3 decides its plan on the host from the shapes, so this is never needed for
            CUDA-graph capture; it only pins the plan. Under torch.compile(fullgraph=True) pass
            the tuple (reading a tensor's values would break the graph).
        num_splits: split-KV: 0 (the default, as FlashAttention-3 here): a heuristic decides
            (it splits when there are few query tiles, e.g. decoding); 1: no split; n in
            [2, 256]: at most n splits. Only the speed depends on it (and fp32 rounding).
        pack_gqa: None (heuristic), True or False; only the speed depends on it.
        sm_margin: must be 0 (NotImplementedError otherwise).
        return_softmax_lse: also return softmax_lse.

    The int32 tensors are read on the device only (no synchronisation; the call can be captured
    in a CUDA graph and replayed with new values in them). Their values are the caller's
    contract: cache_batch_idx outside [0, batch_cache), cache_seqlens / cache_leftpad outside
    [0, seqlen_cache] are clamped on the device (nothing outside the tensors is read or written,
    but the results are meaningless), cache_leftpad should not exceed cache_seqlens; page_table
    entries are not checked at all (see page_table).

    Returns:
        out: (batch, seqlen_q, num_heads_q, head_dim_v), q's dtype, contiguous; or, with
        return_softmax_lse, (out, softmax_lse): softmax_lse (batch, num_heads_q, seqlen_q)
        torch.float32, the natural-log logsumexp of each row of the scaled (and capped) scores,
        a permuted view of a contiguous (num_heads_q, batch, seqlen_q) tensor. (FlashAttention-3
        returns two more internal tensors after softmax_lse; ``out, lse, *rest = ...`` works
        with both.)

    No backward: the outputs never require grad (gradients do not flow to q, the caches or
    k / v), as FlashAttention-3's flash_attn_with_kvcache has no backward either. The caches'
    version counters are bumped when k / v are written.

    Raises (before anything is launched or written): ValueError (CPU tensors, mismatched
    devices or shapes, strides, k without v, rotary tables without k, a page_table that is not
    2-d, has not batch rows or has a non-unit stride(1), a bad scheduler_metadata,
    softmax_scale / softcap out of range), TypeError (dtypes, int arrays and page_table that
    are not torch.int32, pack_gqa / num_splits types), NotImplementedError (the arguments above
    that flash3 does not support yet; page_table with cache_batch_idx, cache_leftpad or softcap
    > 0; softcap > 0 in a build without the softcap kernels; page_table in a build without the
    forward's packgqa unit for the dtype and head dims), RuntimeError (a CUDA error).
    """
    _check_not_implemented(qv, q_descale, k_descale, v_descale, attention_chunk)
    _check_sm_margin(sm_margin)
    if not torch.compiler.is_compiling():  # traced: the fake implementation checks it
        softcap = _check_softcap(softcap)
    varlen_q = cu_seqlens_q is not None
    if (varlen_q or cu_seqlens_k_new is not None) and not _C.serving_wip():
        name = "cu_seqlens_q (variable-length queries" if varlen_q else "cu_seqlens_k_new (variable-length new rows"
        raise NotImplementedError(f"flash3: {name} with a KV cache) is not supported by this build: it needs "
                                  "libflash3 built with FLASH3_SERVING_WIP, whose kernels have not run on a GPU yet")
    if varlen_q and max_seqlen_q is not None and not _is_int(max_seqlen_q):
        raise TypeError(f"flash3: max_seqlen_q is {max_seqlen_q!r} ({type(max_seqlen_q).__name__}); expected an int")
    if cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor):
        batch = cu_seqlens_q.numel() - 1 if isinstance(cu_seqlens_q, torch.Tensor) else q.shape[0]
        cache_seqlens = _cache_seqlens_tensor(cache_seqlens, q, batch, k_cache, page_table, k, cu_seqlens_k_new)
    window_left, window_right = _window_sides(window_size)
    if scheduler_metadata is not None:
        num_splits, pack = _scheduler_metadata_plan(scheduler_metadata)
    else:
        num_splits, pack = _check_num_splits(num_splits), _pack_gqa_arg(pack_gqa)
    args = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
            page_table, rotary_seqlens, softmax_scale, causal, window_left, window_right, softcap, rotary_interleaved,
            num_splits, pack, cu_seqlens_q, cu_seqlens_k_new,
            int(max_seqlen_q) if varlen_q and max_seqlen_q is not None else None)
    if out is None:
        out, lse = _fwd_kvcache(*args)
    else:  # written in place (out is checked by the operator)
        lse = _fwd_kvcache_out(*args, out=out)
    if return_softmax_lse:
        return out, lse
    return out


def get_scheduler_metadata(
    batch_size: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
    num_heads_q: int,
    num_heads_kv: int,
    headdim: int,
    cache_seqlens: Optional[torch.Tensor] = None,
    qkv_dtype: torch.dtype = torch.bfloat16,
    headdim_v: Optional[int] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k_new: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    page_size: Optional[int] = None,
    max_seqlen_k_new: int = 0,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    has_softcap: bool = False,
    num_splits: int = 0,
    pack_gqa: Optional[bool] = None,
    sm_margin: int = 0,
) -> torch.Tensor:
    """The launch plan of flash_attn_with_kvcache for these shapes (FlashAttention-3's
    get_scheduler_metadata, same arguments), to pass back as its scheduler_metadata.

    flash3 decides its plan on the host from the shapes and options only (the number of KV
    splits and whether the query heads are packed, flash3::forward_plan on the current device,
    or cache_seqlens' device when that is a CUDA tensor), never from the values of cache_seqlens
    / cache_leftpad, which are accepted and ignored. The plan is made for keys of length
    max_seqlen_k, the cache's capacity, exactly as flash_attn_with_kvcache plans a call without
    scheduler_metadata (its k_cache.shape[1], or max_num_pages_per_seq * page_size): pass that
    value and the two decide the same; max_seqlen_k_new (the new rows, which fit in the capacity)
    does not change it.

    Arguments: batch_size, max_seqlen_q, max_seqlen_k (the cache size, seqlen_cache; for a paged
    cache its capacity per sequence, max_num_blocks_per_seq * page_size, as FlashAttention-3
    takes it), num_heads_q, num_heads_kv, headdim, headdim_v (default headdim): the shapes of
    the flash_attn_with_kvcache calls; qkv_dtype torch.bfloat16 or torch.float16;
    max_seqlen_k_new: seqlen_new of k / v; causal, window_size, has_softcap (softcap > 0),
    num_splits (0: heuristic, 1: none, n: at most n), pack_gqa (None: heuristic): as in those
    calls. page_size: None (contiguous caches) or the page_block_size of a paged cache (an int
    >= 1); accepted and checked, but the plan does not depend on it (a paged call of the same
    shapes and capacity takes the same plan as a contiguous one). cu_seqlens_q and
    cu_seqlens_k_new (varlen calls: max_seqlen_q is then the longest query sequence) and
    sm_margin are accepted and change nothing; attention_chunk != 0 is not supported yet
    (NotImplementedError).

    Returns:
        A CPU torch.int32 tensor [num_splits, pack_gqa] (num_splits >= 1: 1 means no split;
        pack_gqa 0 or 1). Unlike FlashAttention-3's (a device tensor), it carries no per-batch
        data: any call with the same shapes and options may use it.

    Raises: NotImplementedError (above), TypeError (non-int sizes or page_size, a dtype other
    than torch.float16 / torch.bfloat16, pack_gqa / num_splits types), ValueError (sizes < 1 or
    beyond int32, page_size < 1, bad num_splits, shapes or options flash3::forward_plan
    rejects), RuntimeError (no usable CUDA device).
    """
    if page_size is not None:  # a paged cache: the plan depends on the shapes only, not on the page size
        if isinstance(page_size, bool) or not isinstance(page_size, int):
            raise TypeError(f"flash3: page_size is {page_size!r} ({type(page_size).__name__}); expected None or an "
                            "int (the page_block_size of a paged cache)")
        if not 1 <= page_size <= _INT32_MAX:
            raise ValueError(f"flash3: page_size is {page_size}; expected None or an int in [1, 2147483647] (the "
                             "page_block_size of a paged cache)")
    if attention_chunk != 0:
        raise NotImplementedError(f"flash3: attention_chunk={attention_chunk} is not supported yet; pass 0")
    _check_sm_margin(sm_margin)
    if headdim_v is None:
        headdim_v = headdim
    sizes = (("batch_size", batch_size, 1), ("max_seqlen_q", max_seqlen_q, 1), ("max_seqlen_k", max_seqlen_k, 0),
             ("num_heads_q", num_heads_q, 1), ("num_heads_kv", num_heads_kv, 1), ("headdim", headdim, 1),
             ("headdim_v", headdim_v, 1), ("max_seqlen_k_new", max_seqlen_k_new, 0))
    for name, x, lo in sizes:
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError(f"flash3: {name} is {x!r} ({type(x).__name__}); expected an int")
        if not lo <= x <= _INT32_MAX:
            raise ValueError(f"flash3: {name} is {x}; expected an int in [{lo}, 2147483647]")
    # The call plans for its cache's capacity (flash3::forward_kvcache), which max_seqlen_k is:
    # the same decision, whatever max_seqlen_k_new (the new rows fit in the capacity).
    seqlen_k = max_seqlen_k
    window_left, window_right = _window_sides(window_size)
    num_splits = _check_num_splits(num_splits)
    pack = _pack_gqa_arg(pack_gqa)
    args = (qkv_dtype, batch_size, max_seqlen_q, seqlen_k, num_heads_q, num_heads_kv, headdim, headdim_v,
            bool(causal), window_left, window_right, 1.0 if has_softcap else 0.0, num_splits, pack)
    if isinstance(cache_seqlens, torch.Tensor) and cache_seqlens.device.type == "cuda":
        with torch.cuda.device(cache_seqlens.device):
            plan = _forward_plan(*args)
    else:
        plan = _forward_plan(*args)
    return torch.tensor(plan, dtype=torch.int32)


def _byte_ranges_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the byte ranges spanned by two strided tensors intersect (conservative)."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False

    def span(t):
        last = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()) if n > 1)
        return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1
