# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""bench.py: the C ABI mirror of include/flash3/flash3_c.h (ctypes), and flash3 loaded through it."""
import ctypes

FLASH3_OK, FLASH3_INVALID_ARGUMENT, FLASH3_NOT_SUPPORTED, FLASH3_CUDA_ERROR, FLASH3_INTERNAL = 0, 1, 2, 3, 4
FLASH3_FP16, FLASH3_BF16, FLASH3_FP32, FLASH3_FP8_E4M3 = 0, 1, 2, 3
STATUS_NAMES = {0: "ok", 1: "invalid argument", 2: "not supported yet", 3: "cuda error", 4: "internal error"}


class F3Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * 4),
        ("stride", ctypes.c_int64 * 4),
    ]


_OPTION_FIELDS = [
    ("softmax_scale", ctypes.c_float),
    ("causal", ctypes.c_int32),
    ("window_left", ctypes.c_int32),
    ("window_right", ctypes.c_int32),
    ("softcap", ctypes.c_float),
    ("deterministic", ctypes.c_int32),
    ("cu_seqlens_q", ctypes.POINTER(ctypes.c_int32)),
    ("cu_seqlens_k", ctypes.POINTER(ctypes.c_int32)),
    ("max_seqlen_q", ctypes.c_int32),
    ("max_seqlen_k", ctypes.c_int32),
]


_VARLEN_FIELDS = [
    ("num_sequences", ctypes.c_int32),
    ("seqused_q", ctypes.POINTER(ctypes.c_int32)),
    ("seqused_k", ctypes.POINTER(ctypes.c_int32)),
]


_PACK_FIELDS = [
    ("pack_gqa", ctypes.c_int32),
]


_SPLIT_FIELDS = [
    ("num_splits", ctypes.c_int32),
    ("reserved0", ctypes.c_int32),  # keeps sizeof apart from the pack_gqa layout's (padding)
]


class F3Options(ctypes.Structure):
    """flash3_options: struct_size first (set by flash3_default_options)."""
    _fields_ = [("struct_size", ctypes.c_uint32)] + _OPTION_FIELDS + _VARLEN_FIELDS + _PACK_FIELDS + _SPLIT_FIELDS


class F3OptionsV3(ctypes.Structure):
    """flash3_options before num_splits: --ab / --pack-gqa against such builds (not --split-kv)."""
    _fields_ = [("struct_size", ctypes.c_uint32)] + _OPTION_FIELDS + _VARLEN_FIELDS + _PACK_FIELDS


class F3OptionsV2(ctypes.Structure):
    """flash3_options before pack_gqa: --ab against such builds (not --pack-gqa)."""
    _fields_ = [("struct_size", ctypes.c_uint32)] + _OPTION_FIELDS + _VARLEN_FIELDS


class F3OptionsV1(ctypes.Structure):
    """flash3_options before the varlen fields (num_sequences, seqused_*): --ab against such builds."""
    _fields_ = [("struct_size", ctypes.c_uint32)] + _OPTION_FIELDS


class F3OptionsNoSize(ctypes.Structure):
    """The flash3_options layout without struct_size (softmax_scale first, <= 0 meaning
    1/sqrt(d)): --ab against libraries built with that header."""
    _fields_ = _OPTION_FIELDS


class F3KVCacheArgs(ctypes.Structure):
    """flash3_kvcache_args (flash3_c.h)."""
    _fields_ = [("struct_size", ctypes.c_uint32), ("rotary_interleaved", ctypes.c_int32)] + [
        (n, ctypes.POINTER(F3Tensor)) for n in ("q", "k_cache", "v_cache", "k_new", "v_new", "rotary_cos",
                                                "rotary_sin", "out", "lse")] + [
        (n, ctypes.c_void_p) for n in ("cache_seqlens", "cache_batch_idx", "cache_leftpad", "rotary_seqlens")] + [
        ("page_table", ctypes.c_void_p), ("page_table_batch_stride", ctypes.c_int64),
        ("page_table_max_pages", ctypes.c_int32)]


class Flash3Lib:
    def __init__(self, path):
        self.path = path
        self.lib = lib = ctypes.CDLL(path)  # RTLD_LOCAL: several builds can be loaded side by side
        # The options layout: flash3_default_options() of the struct_size layout
        # returns sizeof(flash3_options) in its first field; the other layout
        # has softmax_scale there (0.0f, or a NaN: never that integer's bits).
        # F3Options is the larger struct, so either library's return fits.
        lib.flash3_default_options.restype = F3Options
        lib.flash3_default_options.argtypes = []
        probe = lib.flash3_default_options()
        sized = {ctypes.sizeof(c): c for c in (F3Options, F3OptionsV3, F3OptionsV2, F3OptionsV1)}
        self.Options = sized.get(probe.struct_size, F3OptionsNoSize)
        self.has_pack_gqa = any(name == "pack_gqa" for name, _ in self.Options._fields_)
        self.has_num_splits = any(name == "num_splits" for name, _ in self.Options._fields_)
        # The forward with caller scratch (builds with a forward workspace).
        self.has_fwd_workspace = hasattr(lib, "flash3_forward_workspace_size")
        lib.flash3_default_options.restype = self.Options
        T = ctypes.POINTER(F3Tensor)
        O = ctypes.POINTER(self.Options)
        lib.flash3_forward.restype = ctypes.c_int
        lib.flash3_forward.argtypes = [T, T, T, T, T, O, ctypes.c_void_p]
        lib.flash3_backward.restype = ctypes.c_int
        lib.flash3_backward.argtypes = [T, T, T, T, T, T, T, T, T, T, O, ctypes.c_void_p, ctypes.c_size_t,
                                        ctypes.c_void_p]
        lib.flash3_backward_workspace_size.restype = ctypes.c_size_t
        lib.flash3_backward_workspace_size.argtypes = [T, T, T, O]
        if self.has_fwd_workspace:
            lib.flash3_forward_workspace_size.restype = ctypes.c_size_t
            lib.flash3_forward_workspace_size.argtypes = [T, T, T, O]
            lib.flash3_forward_with_workspace.restype = ctypes.c_int
            lib.flash3_forward_with_workspace.argtypes = [T, T, T, T, T, O, ctypes.c_void_p, ctypes.c_size_t,
                                                          ctypes.c_void_p]
        self.has_kvcache = hasattr(lib, "flash3_forward_kvcache")
        if self.has_kvcache:
            K = ctypes.POINTER(F3KVCacheArgs)
            lib.flash3_default_kvcache_args.restype = F3KVCacheArgs
            lib.flash3_default_kvcache_args.argtypes = []
            lib.flash3_forward_kvcache.restype = ctypes.c_int
            lib.flash3_forward_kvcache.argtypes = [K, O, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            lib.flash3_kvcache_workspace_size.restype = ctypes.c_size_t
            lib.flash3_kvcache_workspace_size.argtypes = [K, O]
        lib.flash3_validate_forward.restype = ctypes.c_int
        lib.flash3_validate_forward.argtypes = [T, T, T, T, T, O]
        for fn in (lib.flash3_forward_is_built, lib.flash3_backward_is_built):
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]
        lib.flash3_device_is_supported.restype = ctypes.c_int
        lib.flash3_device_is_supported.argtypes = []
        lib.flash3_last_error.restype = ctypes.c_char_p
        lib.flash3_last_error.argtypes = []
        lib.flash3_version.restype = ctypes.c_char_p
        lib.flash3_version.argtypes = []

    def options(self, scale, causal=False, deterministic=False, softcap=0.0, pack_gqa=None, num_splits=None):
        """flash3_default_options() with the softmax scale, causal, deterministic and softcap set;
        pack_gqa None keeps the library's default (the heuristic), True / False set 1 / 0;
        num_splits None keeps the default (1), else sets it (0: the heuristic)."""
        opts = self.lib.flash3_default_options()
        opts.softmax_scale = scale
        opts.causal = 1 if causal else 0
        opts.deterministic = 1 if deterministic else 0
        opts.softcap = softcap
        if pack_gqa is not None:
            if not self.has_pack_gqa:
                raise RuntimeError(f"{self.path}: its flash3_options has no pack_gqa (a build before PackGQA)")
            opts.pack_gqa = 1 if pack_gqa else 0
        if num_splits is not None:
            if not self.has_num_splits:
                raise RuntimeError(f"{self.path}: its flash3_options has no num_splits (a build before split-KV)")
            opts.num_splits = num_splits
        return opts

    def last_error(self):
        m = self.lib.flash3_last_error()
        return m.decode(errors="replace") if m else ""

    def version(self):
        v = self.lib.flash3_version()
        return v.decode() if v else "?"


def f3_tensor(t, f3_dtype):
    """A flash3_tensor view of a torch CUDA tensor (strides in elements)."""
    ft = F3Tensor()
    ft.data = t.data_ptr()
    ft.dtype = f3_dtype
    ft.ndim = t.dim()
    for i in range(t.dim()):
        ft.shape[i] = t.shape[i]
        ft.stride[i] = t.stride(i)
    return ft
