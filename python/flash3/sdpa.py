# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""flash3 behind ``torch.nn.functional.scaled_dot_product_attention`` (torch's SDPA).

PyTorch 2.11 and newer let a library replace the kernels of SDPA's FlashAttention backend::

    import torch
    import flash3                                   # registers "flash3" (activates nothing)
    torch.nn.attention.activate_flash_attention_impl("flash3")
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # flash3
    torch.nn.attention.restore_flash_attention_impl()   # torch's own kernels again

``register()`` (called by ``import flash3``) adds "flash3" to
``torch.nn.attention.list_flash_attention_impls()``. Activating it overrides the CUDA kernels of
``aten::_scaled_dot_product_flash_attention`` and its backward, the operators SDPA runs when it
picks its FlashAttention backend, and moves that backend to the front of SDPA's priority order
(``torch._C._set_sdp_priority_order``; restored on deactivation). The forward and backward then
run ``torch.ops.flash3.fwd`` / ``torch.ops.flash3.bwd`` on (batch, seqlen, heads, head_dim)
views of SDPA's (batch, heads, seqlen, head_dim) tensors (no copies), eager and under
``torch.compile`` (whose generated code calls the same operators).

A call flash3 cannot serve runs torch's original kernel of the operator instead (the one that
was registered before activation); the reasons: dropout_p > 0, return_debug_mask, inputs that are
not CUDA fp16 / bf16 of one dtype on one device, a GPU other than Hopper (sm_90), a head dim pair
(head_dim, head_dim_v) this build has no kernels for (see ``flash3.forward_is_built``; inputs that
require grad also need the backward kernels), a negative or non-finite scale, num_heads_q not a
multiple of num_heads_kv. Calls that never reach SDPA's FlashAttention backend (an ``attn_mask``,
CPU tensors, a backend excluded with ``torch.nn.attention.sdpa_kernel``, head dims FlashAttention
does not take, is_causal with seqlen_q != seqlen_k) run torch's other backends as before.
``stats()`` counts the calls flash3 served and the fallbacks by reason.

Semantics are those of the replaced kernel: is_causal masks query i from keys j > i (SDPA only
takes this backend for is_causal when seqlen_q == seqlen_k; for direct calls of the operator with
seqlen_q != seqlen_k both align the mask to the bottom-right corner), the scale is SDPA's
(1/sqrt(head_dim) when None), GQA (``enable_gqa=True``) runs natively. The backward is
deterministic when ``torch.use_deterministic_algorithms(True)`` is set.
"""
import collections
import math
import threading
import warnings
from dataclasses import dataclass
from typing import Optional

import torch

from . import _C

__all__ = ["NAME", "is_supported_by_torch", "register", "activate", "deactivate", "is_active", "stats"]

NAME = "flash3"

# The aten operators whose CUDA kernels activation replaces: SDPA's FlashAttention forward and
# backward (the lower-level aten::_flash_attention_forward / _backward, used by nested tensors
# and torch.nn.attention.varlen, keep torch's kernels).
_FWD_OP = "_scaled_dot_product_flash_attention"
_BWD_OP = "_scaled_dot_product_flash_attention_backward"

_lock = threading.Lock()
_stats = collections.Counter()
_active = None  # the _Handle of the current activation, if any


def is_supported_by_torch() -> bool:
    """Whether this torch can route SDPA to flash3: it needs
    torch.nn.attention.register_flash_attention_impl (2.11+) and torch.library.get_kernel (the
    original kernels that unsupported calls fall back to)."""
    attention = getattr(torch.nn, "attention", None)
    return (attention is not None and hasattr(attention, "register_flash_attention_impl")
            and hasattr(torch.library, "get_kernel"))


def register(name: str = NAME) -> bool:
    """Registers flash3 with torch's FlashAttention registry under ``name`` (activates nothing;
    ``torch.nn.attention.activate_flash_attention_impl(name)`` does). Returns False, registering
    nothing, where torch lacks the registry (``is_supported_by_torch``). Idempotent."""
    if not is_supported_by_torch():
        return False
    torch.nn.attention.register_flash_attention_impl(name, register_fn=_activate)
    return True


def activate(name: str = NAME) -> None:
    """``register(name)`` then ``torch.nn.attention.activate_flash_attention_impl(name)``.
    Raises RuntimeError where torch lacks the registry."""
    if not register(name):
        raise RuntimeError(f"flash3: torch {torch.__version__} has no torch.nn.attention."
                           "register_flash_attention_impl / torch.library.get_kernel (PyTorch 2.11 or newer "
                           "routes scaled_dot_product_attention to a registered implementation); call "
                           "flash3.flash_attn_func directly instead")
    torch.nn.attention.activate_flash_attention_impl(name)


def deactivate() -> None:
    """``torch.nn.attention.restore_flash_attention_impl()`` when flash3 is the active
    implementation (torch's own kernels again); nothing otherwise."""
    if is_active():
        torch.nn.attention.restore_flash_attention_impl()


def is_active() -> bool:
    """Whether flash3's kernels are installed in SDPA now."""
    return _active is not None and _active.library is not None


def stats(reset: bool = False) -> dict:
    """Counts since import (or the last reset): "forward" / "backward" (calls flash3 ran) and
    "fallback: <reason>" (calls handed to torch's original kernel)."""
    with _lock:
        out = dict(_stats)
        if reset:
            _stats.clear()
    return out


def _count(key):
    with _lock:
        _stats[key] += 1


@dataclass
class _Handle:
    """What activation installed: the aten::IMPL library holding the two CUDA kernels, and SDPA's
    priority order before activation. torch's registry calls remove() on
    restore_flash_attention_impl() and before activating another implementation."""
    library: Optional[torch.library.Library]
    previous_priority: Optional[list]

    def remove(self) -> None:
        global _active
        lib, self.library = self.library, None
        if lib is not None:
            destroy = getattr(lib, "_destroy", None)
            if destroy is not None:
                destroy()  # deregisters the kernels now (dropping the last reference does too)
        if self.previous_priority is not None and hasattr(torch._C, "_set_sdp_priority_order"):
            torch._C._set_sdp_priority_order(self.previous_priority)
            self.previous_priority = None
        if _active is self:
            _active = None


def _activate() -> _Handle:
    """register_fn of torch's registry: installs flash3's kernels (torch has already removed
    those of a previously active implementation, so get_kernel returns torch's own)."""
    global _active
    fwd_op = getattr(torch.ops.aten, _FWD_OP).default
    bwd_op = getattr(torch.ops.aten, _BWD_OP).default
    fwd_fallback = torch.library.get_kernel(fwd_op, "CUDA")
    bwd_fallback = torch.library.get_kernel(bwd_op, "CUDA")
    lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 (overriding aten kernels is the point)

    def fwd_kernel(keyset, *args, **kwargs):
        return _sdpa_forward(fwd_fallback, keyset, *args, **kwargs)

    def bwd_kernel(keyset, *args, **kwargs):
        return _sdpa_backward(bwd_fallback, keyset, *args, **kwargs)

    with warnings.catch_warnings():  # "Overriding a previously registered kernel": intended
        warnings.filterwarnings("ignore", message=r"(?s).*Overriding a previously registered kernel")
        lib.impl(_FWD_OP, fwd_kernel, "CUDA", with_keyset=True)
        lib.impl(_BWD_OP, bwd_kernel, "CUDA", with_keyset=True)
    previous = None
    if hasattr(torch._C, "_get_sdp_priority_order"):
        previous = [int(b) for b in torch._C._get_sdp_priority_order()]
        flash = int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)
        torch._C._set_sdp_priority_order([flash] + [b for b in previous if b != flash])
    _active = _Handle(lib, previous)
    return _active


# ---------------------------------------------------------------------------
# Which calls flash3 serves.
# ---------------------------------------------------------------------------
_HOPPER = {}


def _is_hopper(device):
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _HOPPER:
        _HOPPER[idx] = torch.cuda.get_device_capability(idx) == (9, 0)
    return _HOPPER[idx]


def _scale_ok(scale):
    return scale is None or (math.isfinite(float(scale)) and float(scale) >= 0.0)


def _unsupported(query, key, value, scale, backward, needs_backward):
    """Why flash3 cannot run this SDPA call ((batch, heads, seqlen, head_dim) tensors), or None.
    The forward and the backward decide alike, so a forward flash3 ran is differentiated by
    flash3 and one it handed back by torch."""
    tensors = (query, key, value)
    if any(t.device.type != "cuda" for t in tensors):
        return "not CUDA"
    if key.device != query.device or value.device != query.device:
        return "devices differ"
    if query.dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {query.dtype}"
    if key.dtype != query.dtype or value.dtype != query.dtype:
        return "dtypes differ"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "not 4-d"
    if any(t.stride(-1) != 1 for t in tensors):
        return "head_dim not contiguous"
    hq, hk = query.shape[1], key.shape[1]
    if hk < 1 or hq % hk != 0 or value.shape[1] != hk:
        return "head counts"
    if not _scale_ok(scale):
        return "scale"
    if not _is_hopper(query.device):
        return "not a Hopper GPU"
    d, dv = int(query.shape[-1]), int(value.shape[-1])
    if not _C.forward_is_built(query.dtype, d, dv):
        return f"no forward kernel for head dims ({d}, {dv})"
    if (backward or needs_backward) and not _C.backward_is_built(query.dtype, d, dv):
        return f"no backward kernel for head dims ({d}, {dv})"
    return None


def _fallback(fallback, keyset, reason, *args, **kwargs):
    _count(f"fallback: {reason}")
    return fallback.call_boxed(keyset, *args, **kwargs)


def _bshd(t):
    return t.transpose(1, 2)


def _bhsd_like_flash(t):
    """(batch, seqlen, heads, d) -> the (batch, heads, seqlen, d) view SDPA's FlashAttention
    kernels return (a transpose of contiguous (batch, seqlen, heads, d) memory, the layout
    torch.compile's meta functions assume)."""
    return (t if t.is_contiguous() else t.contiguous()).transpose(1, 2)


def _sdpa_forward(fallback, keyset, query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                  *, scale=None, **extra):
    args = (query, key, value, dropout_p, is_causal, return_debug_mask)
    kwargs = dict(extra, scale=scale)
    if any(v is not None for v in extra.values()):
        return _fallback(fallback, keyset, "arguments of a newer torch", *args, **kwargs)
    if dropout_p != 0.0:
        return _fallback(fallback, keyset, "dropout_p > 0", *args, **kwargs)
    if return_debug_mask:
        return _fallback(fallback, keyset, "return_debug_mask", *args, **kwargs)
    needs_backward = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    why = _unsupported(query, key, value, scale, False, needs_backward)
    if why is not None:
        return _fallback(fallback, keyset, why, *args, **kwargs)
    out, lse = torch.ops.flash3.fwd.default(_bshd(query), _bshd(key), _bshd(value), scale, bool(is_causal))
    _count("forward")
    dev = query.device
    rng_state = torch.zeros((2,), dtype=torch.uint64, device=dev)  # no dropout: no RNG state
    philox_offset = torch.zeros((), dtype=torch.uint64, device=dev)
    debug_mask = torch.empty(0, dtype=query.dtype, device=dev)
    return (_bhsd_like_flash(out), lse, None, None, query.shape[2], key.shape[2], rng_state, philox_offset,
            debug_mask)


def _sdpa_backward(fallback, keyset, grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
                   max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None, **extra):
    args = (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
            philox_seed, philox_offset)
    kwargs = dict(extra, scale=scale)
    if any(v is not None for v in extra.values()):
        return _fallback(fallback, keyset, "arguments of a newer torch", *args, **kwargs)
    if dropout_p != 0.0:
        return _fallback(fallback, keyset, "dropout_p > 0", *args, **kwargs)
    why = _unsupported(query, key, value, scale, True, True)
    if why is None and (logsumexp.dtype != torch.float32 or tuple(logsumexp.shape) != tuple(query.shape[:3])):
        why = "logsumexp layout"
    if why is not None:
        return _fallback(fallback, keyset, why, *args, **kwargs)
    dq, dk, dv = torch.ops.flash3.bwd.default(
        _bshd(grad_out), _bshd(query), _bshd(key), _bshd(value), _bshd(out), logsumexp, None, scale,
        bool(is_causal), -1, -1, 0.0, torch.are_deterministic_algorithms_enabled())
    _count("backward")
    return _bhsd_like_flash(dq), _bhsd_like_flash(dk), _bhsd_like_flash(dv)
