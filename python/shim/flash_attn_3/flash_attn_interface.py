# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""FlashAttention-3's ``flash_attn_3.flash_attn_interface`` (TransformerEngine's import path),
served by flash3 (flash3-fa3-shim); the same functions as the top-level ``flash_attn_interface``."""
from _flash3_fa3_shim import *  # noqa: F401,F403
from _flash3_fa3_shim import __all__  # noqa: F401
