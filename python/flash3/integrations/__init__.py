# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""flash3 inside other libraries. Nothing here is imported by ``import flash3``:

* ``flash3.integrations.transformers``: importing it registers flash3 with Hugging Face
  transformers (``attn_implementation="flash3"``).
* The torch SDPA backend is ``flash3.sdpa`` (torch's own registry, no extra import).
"""
