# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""The code of flash3.flash_attn_interface, split by entry point (private: import from
flash3 or flash3.flash_attn_interface, which re-exports every name and registers the fake
implementations).

* ``common``: the operator handles, introspection, dtype / head-dim helpers, the q / k / v
  checks the fake implementations share, scalar option checks, and the small steps the entry
  points share (unsupported FlashAttention-3 arguments, window, out=);
* ``func``: flash_attn_func and flash_attn_qkvpacked_func;
* ``fp8``: flash_attn_func's FP8 path and quantize_fp8;
* ``varlen``: flash_attn_varlen_func and the varlen operators' checks;
* ``combine``: flash_attn_combine and the combine operator's checks;
* ``kvcache``: flash_attn_with_kvcache, get_scheduler_metadata and their helpers;
* ``fake``: the fake (meta) implementations of the operators (registered by
  flash3.flash_attn_interface, the module the C++ library names for them).
"""
