# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""flash3 behind FlashAttention-3's module names (the flash3-fa3-shim distribution).

Code written for FlashAttention-3 imports ``flash_attn_interface`` (transformers'
``attn_implementation="flash_attention_3"``, vLLM, Megatron) or ``flash_attn_3.flash_attn_interface``
(TransformerEngine, sglang). With this shim installed both names are flash3:

* the public functions are flash3's FlashAttention-3-compatible ones: ``flash_attn_func``,
  ``flash_attn_varlen_func``, ``flash_attn_qkvpacked_func``, ``flash_attn_with_kvcache``,
  ``flash_attn_combine``, ``get_scheduler_metadata`` (same arguments; see docs/python.md for
  what flash3 does not implement: it raises NotImplementedError naming the argument);
* the low-level ``_flash_attn_forward`` / ``_flash_attn_backward`` take FlashAttention-3's
  positional arguments and run ``torch.ops.flash3.fwd`` / ``varlen_fwd`` / ``fwd_kvcache`` /
  ``fwd_fp8`` and ``bwd`` / ``varlen_bwd``. ``_flash_attn_forward`` returns (out, softmax_lse,
  out_accum, softmax_lse_accum) with empty accumulators (flash3 merges split-KV partials itself);
  ``_flash_attn_backward`` writes dq / dk / dv in place and returns softmax_d (rowsum(dout * out), fp32, (batch, heads, seqlen_q) or (heads, total_q)).
  FlashAttention-3 arguments flash3 lacks raise NotImplementedError naming them: qv,
  attention_chunk != 0, cu_seqlens_k_new, varlen q with a KV cache, seqused_q without cu_seqlens,
  only one of cu_seqlens_q / cu_seqlens_k, softcap / windows with FP8. sm_margin is ignored.

The shim never shadows a real FlashAttention-3: importing it raises ImportError while another
installed distribution provides ``flash_attn_interface`` or ``flash_attn_3`` (pip would have
overwritten that distribution's files with the shim's). Uninstall one of the two; or set
FLASH3_FA3_SHIM=force to import the shim anyway.
"""
import os

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func", "flash_attn_with_kvcache",
           "flash_attn_combine", "get_scheduler_metadata", "_flash_attn_forward", "_flash_attn_backward"]

SHIM_DISTRIBUTION = "flash3-fa3-shim"
_PROVIDED = ("flash_attn_interface", "flash_attn_3")


def _normalize(name):
    return name.lower().replace("_", "-").replace(".", "-")


def _distributions_providing(modules=_PROVIDED):
    """{distribution name: [top-level names]} of the installed distributions other than this shim
    whose files include one of ``modules`` (a top-level module or package)."""
    from importlib import metadata

    found = {}
    for dist in metadata.distributions():
        name = dist.metadata.get("Name") or ""
        if _normalize(name) == SHIM_DISTRIBUTION:
            continue
        tops = set()
        top_level = dist.read_text("top_level.txt")
        if top_level:
            tops.update(line.strip() for line in top_level.splitlines() if line.strip())
        for f in dist.files or ():
            parts = f.parts
            if parts and not parts[0].endswith((".dist-info", ".egg-info", ".data")) and parts[0] != "..":
                tops.add(parts[0][:-3] if parts[0].endswith(".py") else parts[0])
        hits = sorted(m for m in modules if m in tops)
        if hits:
            found[name] = hits
    return found


def _refuse_to_shadow():
    if os.environ.get("FLASH3_FA3_SHIM", "") == "force":
        return
    others = _distributions_providing()
    if others:
        listing = "; ".join(f"{name} (provides {', '.join(mods)})" for name, mods in sorted(others.items()))
        raise ImportError(
            "flash3-fa3-shim: a FlashAttention-3 installation is present: " + listing + ". The shim serves "
            "flash_attn_interface / flash_attn_3 with flash3 and refuses to shadow it. Choose one: to keep "
            f"FlashAttention-3, `pip uninstall {SHIM_DISTRIBUTION}` (and reinstall FlashAttention-3, whose files "
            f"the shim's installation replaced); to use flash3, uninstall {', '.join(sorted(others))} and reinstall "
            f"{SHIM_DISTRIBUTION}. FLASH3_FA3_SHIM=force imports the shim anyway.")


_refuse_to_shadow()

try:
    import torch

    import flash3
    from flash3 import (  # noqa: F401 (re-exported)
        flash_attn_combine,
        flash_attn_func,
        flash_attn_qkvpacked_func,
        flash_attn_varlen_func,
        flash_attn_with_kvcache,
        get_scheduler_metadata,
    )
    from flash3.flash_attn_interface import _scheduler_metadata_plan
except ImportError as e:  # flash3 itself missing or broken
    raise ImportError(f"flash3-fa3-shim: flash3 cannot be imported ({e}); install flash3 first "
                      "(pip install --no-build-isolation ./python in the flash3 repository, or its wheel)") from e


def _not_implemented(what):
    raise NotImplementedError(f"flash3 (FlashAttention-3 shim): {what} is not supported by flash3")


def _pack_gqa(pack_gqa):
    return -1 if pack_gqa is None else int(bool(pack_gqa))


def _empty(device):
    return torch.empty(0, device=device)


def _flash_attn_forward(q, k, v, k_new=None, v_new=None, qv=None, out_=None, cu_seqlens_q=None, cu_seqlens_k=None,
                        cu_seqlens_k_new=None, seqused_q=None, seqused_k=None, max_seqlen_q=None, max_seqlen_k=None,
                        page_table=None, kv_batch_idx=None, leftpad_k=None, rotary_cos=None, rotary_sin=None,
                        seqlens_rotary=None, q_descale=None, k_descale=None, v_descale=None, softmax_scale=None,
                        causal=False, window_size_left=-1, window_size_right=-1, attention_chunk=0, softcap=0.0,
                        rotary_interleaved=True, scheduler_metadata=None, num_splits=1, pack_gqa=None, sm_margin=0):
    """FlashAttention-3's ``_flash_attn_forward`` (same positional order) on flash3's operators.
    Returns (out, softmax_lse, out_accum, softmax_lse_accum); the accumulators are empty."""
    if qv is not None:
        _not_implemented("qv")
    if attention_chunk:
        _not_implemented(f"attention_chunk={attention_chunk}")
    if cu_seqlens_k_new is not None:
        _not_implemented("cu_seqlens_k_new")
    softmax_scale = None if softmax_scale is None else float(softmax_scale)
    softcap = float(softcap or 0.0)
    if scheduler_metadata is not None:
        num_splits, plan_pack = _scheduler_metadata_plan(scheduler_metadata)
        pack = plan_pack
    else:
        pack = _pack_gqa(pack_gqa)
    kvcache = any(t is not None for t in (k_new, v_new, page_table, kv_batch_idx, leftpad_k, rotary_cos, rotary_sin,
                                          seqlens_rotary))
    if q.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        if kvcache or cu_seqlens_q is not None or cu_seqlens_k is not None or seqused_q is not None \
                or seqused_k is not None:
            _not_implemented("FP8 with varlen / KV-cache arguments")
        if softcap:
            _not_implemented("softcap with FP8 inputs")
        out, lse = torch.ops.flash3.fwd_fp8(q, k, v, q_descale, k_descale, v_descale, softmax_scale, bool(causal),
                                            int(window_size_left), int(window_size_right))
    elif q_descale is not None or k_descale is not None or v_descale is not None:
        _not_implemented("q_descale / k_descale / v_descale with fp16 / bf16 inputs")
    elif kvcache or (seqused_k is not None and cu_seqlens_q is None and cu_seqlens_k is None):
        # KV cache (flash_attn_with_kvcache passes cache_seqlens as seqused_k), or a fixed-length
        # batch with per-sequence key counts: the KV-cache forward serves both.
        if cu_seqlens_q is not None or cu_seqlens_k is not None or seqused_q is not None:
            _not_implemented("cu_seqlens_q / cu_seqlens_k / seqused_q with a KV cache")
        out, lse = torch.ops.flash3.fwd_kvcache(
            q, k, v, k_new, v_new, rotary_cos, rotary_sin, seqused_k, kv_batch_idx, leftpad_k, page_table,
            seqlens_rotary, softmax_scale, bool(causal), int(window_size_left), int(window_size_right), softcap,
            bool(rotary_interleaved), int(num_splits), pack)
    elif cu_seqlens_q is not None or cu_seqlens_k is not None:
        if cu_seqlens_q is None or cu_seqlens_k is None:
            _not_implemented("only one of cu_seqlens_q / cu_seqlens_k")
        if max_seqlen_q is None or max_seqlen_k is None:
            raise ValueError("flash3 (FlashAttention-3 shim): varlen calls need max_seqlen_q and max_seqlen_k")
        out, lse = torch.ops.flash3.varlen_fwd(
            q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, int(max_seqlen_q), int(max_seqlen_k),
            softmax_scale, bool(causal), int(window_size_left), int(window_size_right), softcap, False, pack,
            int(num_splits))
    else:
        if seqused_q is not None:
            _not_implemented("seqused_q without cu_seqlens_q")
        out, lse = torch.ops.flash3.fwd(q, k, v, softmax_scale, bool(causal), int(window_size_left),
                                        int(window_size_right), softcap, False, pack, int(num_splits))
    if out_ is not None:
        out_.copy_(out)
        out = out_
    return out, lse, _empty(out.device), _empty(out.device)


def _flash_attn_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q=None, cu_seqlens_k=None, sequed_q=None,
                         sequed_k=None, max_seqlen_q=None, max_seqlen_k=None, dq=None, dk=None, dv=None,
                         softmax_scale=None, is_causal=False, window_size_left=-1, window_size_right=-1, softcap=0.0,
                         deterministic=False, sm_margin=0):
    """FlashAttention-3's ``_flash_attn_backward`` (same positional order, its ``sequed_q`` /
    ``sequed_k`` spelling included) on flash3's operators: the gradients are written into dq / dk /
    dv in place (as FlashAttention-3; one passed as None is not returned); returns softmax_d,
    rowsum(dout * out) in fp32."""
    softmax_scale = None if softmax_scale is None else float(softmax_scale)
    softcap = float(softcap or 0.0)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen:
        if cu_seqlens_q is None or cu_seqlens_k is None:
            _not_implemented("only one of cu_seqlens_q / cu_seqlens_k")
        gq, gk, gv = torch.ops.flash3.varlen_bwd(
            dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, sequed_q, sequed_k, int(max_seqlen_q),
            int(max_seqlen_k), softmax_scale, bool(is_causal), int(window_size_left), int(window_size_right), softcap,
            bool(deterministic))
    else:
        if sequed_q is not None or sequed_k is not None:
            _not_implemented("sequed_q / sequed_k without cu_seqlens (fixed-length backward)")
        gq, gk, gv = torch.ops.flash3.bwd(dout, q, k, v, out, softmax_lse, None, softmax_scale, bool(is_causal),
                                          int(window_size_left), int(window_size_right), softcap, bool(deterministic))
    for given, grad in ((dq, gq), (dk, gk), (dv, gv)):
        if given is not None:
            given.copy_(grad)
    softmax_d = (dout.float() * out.float()).sum(-1)  # (b, s, h) or (total, h)
    softmax_d = softmax_d.transpose(0, 1) if varlen else softmax_d.transpose(1, 2)
    return softmax_d.contiguous()
