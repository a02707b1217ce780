# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""FlashAttention-3's ``flash_attn_3`` package name, served by flash3 (flash3-fa3-shim): its
``flash_attn_3.flash_attn_interface`` is the shim's ``flash_attn_interface``."""
