# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""flash3 as a Hugging Face transformers attention implementation::

    import flash3.integrations.transformers        # registers "flash3"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="flash3", dtype=torch.bfloat16)
    # or, on a loaded model: model.set_attn_implementation("flash3")

Importing this module registers ``flash3_attention_forward`` with ``transformers.AttentionInterface``
and transformers' FlashAttention mask function (a 2-D padding mask, or None) with
``AttentionMaskInterface``, both under the name "flash3" (``register(name)`` registers another).

It is transformers' own FlashAttention path (``integrations.flash_attention``, the one
``attn_implementation="flash_attention_3"`` takes) with flash3's FlashAttention-3-compatible
functions in place of ``flash_attn_interface``'s, so every input layout transformers feeds a
FlashAttention kernel works alike: fixed length; padded batches (a 2-D attention mask: the tokens
are unpadded and run through ``flash_attn_varlen_func``); padding-free packed batches
(``position_ids`` restarting per document, or ``cu_seq_lens_q/k`` with ``max_length_q/k`` from
``DataCollatorWithFlattening``); decoding with a KV cache (bottom-right causal alignment);
GQA / MQA natively; ``sliding_window`` (FlashAttention's ``window_size = (w - 1, w - 1)``, right
side cut by causal); ``softcap`` (Gemma 2 style); ``scaling``; deterministic backward
(``FLASH_ATTENTION_DETERMINISTIC=1`` or ``torch.use_deterministic_algorithms(True)``).
Not supported, with an error instead of a silently different result: attention dropout > 0
(flash3 has none: ``config.attention_dropout = 0`` or ``attn_implementation="sdpa"`` for
training with dropout), attention sinks (``s_aux``, e.g. gpt-oss). fp32 activations are cast to
the autocast dtype or the model's weight dtype first, as transformers does for FlashAttention.

transformers treats an implementation whose name contains "flash" as a FlashAttention library
and looks its functions up (``lazy_import_flash_attention``, at model creation and whenever the
implementation in use changes); this module makes that lookup return flash3's functions for the
names registered here and leaves every other name to transformers (a wrapper around the private
``modeling_flash_attention_utils._lazy_imports``; ImportError where a transformers version lacks
it). Tested with transformers 5.17 (python/tests/test_transformers_integration.py).
"""
import os

import torch

import flash3

__all__ = ["NAME", "flash3_attention_forward", "register"]

NAME = "flash3"
_registered_names = set()


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, softmax_scale=None,
            causal=False, window_size=(-1, -1), softcap=0.0, deterministic=False):
    """flash3.flash_attn_varlen_func with transformers' argument forms: max_seqlen as a 0-d tensor
    (prepare_fa_kwargs_from_position_ids), cu_seqlens of any integer dtype. Its parameter names are
    what transformers introspects to decide which keyword arguments to pass (no dropout_p, no
    s_aux: flash3_attention_forward rejects those first)."""
    if isinstance(max_seqlen_q, torch.Tensor):
        max_seqlen_q = int(max_seqlen_q)
    if isinstance(max_seqlen_k, torch.Tensor):
        max_seqlen_k = max_seqlen_q if max_seqlen_k is max_seqlen_q else int(max_seqlen_k)
    cu_seqlens_q, cu_seqlens_k = (c if c.dtype == torch.int32 else c.to(torch.int32)
                                  for c in (cu_seqlens_q, cu_seqlens_k))
    return flash3.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                         softmax_scale=softmax_scale, causal=causal, window_size=tuple(window_size),
                                         softcap=0.0 if softcap is None else softcap, deterministic=deterministic)


def _dense(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, deterministic=False):
    return flash3.flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=tuple(window_size),
                                  softcap=0.0 if softcap is None else softcap, deterministic=deterministic)


def _install_functions():
    """Makes transformers' FlashAttention path find flash3's functions for the registered names:
    ``modeling_flash_attention_utils._lazy_imports`` (what ``lazy_import_flash_attention`` calls,
    at model creation and whenever the implementation in use changes) returns them for those
    names and defers to transformers for every other one."""
    from transformers import modeling_flash_attention_utils as mfa

    needed = ("_lazy_imports", "_pad_input", "_unpad_input", "lazy_import_flash_attention")
    missing = [n for n in needed if not hasattr(mfa, n)]
    if missing:
        import transformers

        raise ImportError(f"flash3: transformers {transformers.__version__} lacks {', '.join(missing)} in "
                          "modeling_flash_attention_utils, which flash3's integration hooks into (written against "
                          "transformers 5.17); use attn_implementation='sdpa' with flash3.sdpa instead")
    if getattr(mfa._lazy_imports, "_flash3_names", None) is not None:
        return
    original = mfa._lazy_imports

    def _lazy_imports(implementation, *args, **kwargs):
        base = implementation.split("|")[-1] if isinstance(implementation, str) else implementation
        if base in _registered_names:  # ("paged|flash3" too: continuous batching's varlen + KV-cache calls)
            return _dense, _varlen, flash3.flash_attn_with_kvcache, mfa._pad_input, mfa._unpad_input
        return original(implementation, *args, **kwargs)

    _lazy_imports._flash3_names = _registered_names
    mfa._lazy_imports = _lazy_imports


def flash3_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                             sliding_window=None, softcap=None, is_causal=None, s_aux=None, **kwargs):
    """transformers attention function: query (batch, heads, seqlen, head_dim), key / value
    (batch, kv_heads, kv_seqlen, head_dim), attention_mask None or a 2-D (batch, kv_seqlen)
    padding mask (the mask function registered with it makes no other). Returns
    (attn_output (batch, seqlen, heads, head_dim_v), None)."""
    if dropout:
        raise NotImplementedError(f"flash3: attention dropout ({dropout}) is not supported; set the model's "
                                  "attention_dropout to 0 or use attn_implementation='sdpa' for training with dropout")
    if s_aux is not None:
        raise NotImplementedError("flash3: attention sinks (s_aux) are not supported; use attn_implementation='sdpa' "
                                  "or 'eager' for this model")
    from transformers.integrations.flash_attention import flash_attention_forward

    if kwargs.get("deterministic") is None and torch.are_deterministic_algorithms_enabled() \
            and os.environ.get("FLASH_ATTENTION_DETERMINISTIC") is None:
        kwargs["deterministic"] = True
    return flash_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=scaling,
                                   sliding_window=sliding_window, softcap=softcap, is_causal=is_causal, **kwargs)


def register(name: str = NAME) -> str:
    """Registers flash3 with transformers under ``name`` (attention function and mask function)
    and returns the name. Raises ImportError without transformers."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    _registered_names.add(name)
    _install_functions()  # model creation looks the functions up (lazy_import_flash_attention)
    AttentionInterface.register(name, flash3_attention_forward)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"])
    return name


register()
