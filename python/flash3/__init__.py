# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""flash3: FlashAttention-3 for Hopper GPUs, with the PyTorch API of FlashAttention-3.

    from flash3 import flash_attn_func          # instead of: from flash_attn_interface import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)  # q, k, v: (batch, seqlen, heads, head_dim) fp16/bf16 CUDA

Importing flash3 loads flash3._C, which registers the operators torch.ops.flash3.fwd,
torch.ops.flash3.bwd, torch.ops.flash3.varlen_fwd, torch.ops.flash3.varlen_bwd,
torch.ops.flash3.combine, torch.ops.flash3.fwd_kvcache and torch.ops.flash3.forward_plan (CUDA
kernels and autograd in C++), and flash3.flash_attn_interface, which registers their fake
implementations for torch.compile. flash3.flash_attn_qkvpacked_func is flash_attn_func on one
packed qkv tensor; flash3.flash_attn_varlen_func is the variable-length
(cu_seqlens) attention, differentiable like flash_attn_func; flash3.flash_attn_combine merges
split-KV partial results (FlashAttention-3's); flash3.flash_attn_with_kvcache is the KV-cache
(decoding) attention, forward only, with flash3.get_scheduler_metadata to pin its plan.
flash_attn_func also takes FP8 (torch.float8_e4m3fn) q / k / v with their descales
(torch.ops.flash3.fwd_fp8, forward only); flash3.quantize_fp8 makes them from fp16 / bf16
(torch.ops.flash3.quantize_fp8, optionally with the randomized Hadamard rotation).
"""
import torch  # noqa: F401  (loads libtorch / libc10_cuda / libcudart before the extension)

from . import _C  # noqa: F401  (registers torch.ops.flash3.*)
from .flash_attn_interface import (  # noqa: F401
    FP8_SCALE_BLOCK,
    backward_is_built,
    device_is_supported,
    flash_attn_combine,
    flash_attn_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
    forward_is_built,
    get_scheduler_metadata,
    quantize_fp8,
)

__version__ = _C.version()  # the loaded libflash3's version (top-level VERSION file, include/flash3/version.h)
try:  # the package's own version (setup.py writes _version.py from VERSION at build time)
    from ._version import __version__ as _package_version
except ImportError:  # a source tree on sys.path, not built by setup.py
    _package_version = __version__

# flash3 as an implementation of torch's SDPA FlashAttention backend: registered (torch 2.11+),
# never activated here: torch.nn.attention.activate_flash_attention_impl("flash3") does (flash3.sdpa).
from . import sdpa  # noqa: E402

sdpa.register()

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_combine",
    "flash_attn_with_kvcache",
    "get_scheduler_metadata",
    "forward_is_built",
    "backward_is_built",
    "device_is_supported",
    "sdpa",
    "__version__",
]
