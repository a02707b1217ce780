# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""The opt-in FlashAttention-3 module-name shim (python/shim, distribution flash3-fa3-shim).

Imported from the source tree (python/shim on sys.path), as an installed shim would be:
``flash_attn_interface`` and ``flash_attn_3.flash_attn_interface`` expose FA3's public functions
(flash3's) and ``_flash_attn_forward`` / ``_flash_attn_backward`` with FA3's parameter lists; the
import refuses while another distribution provides those modules (monkeypatched, no GPU). On a
Hopper GPU the low-level functions are checked against flash3's own functions, bit for bit.
"""
import importlib
import inspect
import os
import sys
import tarfile

import pytest

torch = pytest.importorskip("torch")
import flash3  # noqa: E402

SHIM_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shim")
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="flash3 needs a Hopper (sm_90) GPU")
PUBLIC = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func", "flash_attn_with_kvcache",
          "flash_attn_combine", "get_scheduler_metadata"]
MODULES = ("_flash3_fa3_shim", "flash_attn_interface", "flash_attn_3", "flash_attn_3.flash_attn_interface")


def _forget():
    for name in MODULES:
        sys.modules.pop(name, None)


@pytest.fixture
def shim(monkeypatch):
    """Imports the shim from python/shim with no FlashAttention-3 distribution installed."""
    monkeypatch.syspath_prepend(SHIM_DIR)
    monkeypatch.delenv("FLASH3_FA3_SHIM", raising=False)
    _forget()
    core = importlib.import_module("_flash3_fa3_shim")
    if core._distributions_providing():
        pytest.skip(f"a FlashAttention-3 distribution is installed here: {core._distributions_providing()}")
    yield importlib.import_module("flash_attn_interface"), importlib.import_module("flash_attn_3.flash_attn_interface")
    _forget()


def test_both_module_names_export_flash3s_functions(shim):
    top, pkg = shim
    for name in PUBLIC:
        assert getattr(top, name) is getattr(flash3, name), name
        assert getattr(pkg, name) is getattr(flash3, name), name
    for name in ("_flash_attn_forward", "_flash_attn_backward"):
        assert getattr(top, name) is getattr(pkg, name)


def _fa3_parameters(function):
    """Parameter names of FlashAttention-3's function of that name, from the official source
    archive in shared/anchors (skipped where it is not present)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    candidates = [os.path.join(root, "shared", "anchors", "fa3-hopper-0251105.tgz"),
                  os.path.join(os.path.dirname(root), "shared", "anchors", "fa3-hopper-0251105.tgz")]
    path = next((p for p in candidates if os.path.exists(p)), None)
    if path is None:
        pytest.skip("FlashAttention-3's source archive (shared/anchors) is not here")
    import ast

    with tarfile.open(path) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("hopper/flash_attn_interface.py"))
        tree = ast.parse(tar.extractfile(member).read().decode())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    return [a.arg for a in fn.args.args]


@pytest.mark.parametrize("function", ["_flash_attn_forward", "_flash_attn_backward"])
def test_low_level_functions_take_fa3s_parameters(shim, function):
    ours = list(inspect.signature(getattr(shim[0], function)).parameters)
    assert ours == _fa3_parameters(function)


def test_refuses_to_shadow_a_real_fa3(monkeypatch):
    monkeypatch.syspath_prepend(SHIM_DIR)
    monkeypatch.delenv("FLASH3_FA3_SHIM", raising=False)
    _forget()
    from importlib import metadata

    class FakeDist:
        metadata = {"Name": "flash_attn_3"}
        files = None

        @staticmethod
        def read_text(name):
            return "flash_attn_3\nflash_attn_interface\n" if name == "top_level.txt" else None

    real = metadata.distributions
    monkeypatch.setattr(metadata, "distributions", lambda: list(real()) + [FakeDist()])
    with pytest.raises(ImportError, match="flash_attn_3 .*pip uninstall flash3-fa3-shim"):
        importlib.import_module("flash_attn_interface")
    _forget()
    with pytest.raises(ImportError, match="refuses to shadow"):
        importlib.import_module("flash_attn_3.flash_attn_interface")
    _forget()
    monkeypatch.setenv("FLASH3_FA3_SHIM", "force")
    mod = importlib.import_module("flash_attn_interface")
    assert mod.flash_attn_func is flash3.flash_attn_func
    _forget()


def test_unsupported_arguments_name_themselves(shim):
    top, _ = shim
    q = torch.zeros(1, 8, 2, 64)
    for kwargs, word in (({"qv": q}, "qv"), ({"attention_chunk": 128}, "attention_chunk"),
                         ({"cu_seqlens_k_new": torch.zeros(2, dtype=torch.int32)}, "cu_seqlens_k_new")):
        with pytest.raises(NotImplementedError, match=word):
            top._flash_attn_forward(q, q, q, **kwargs)


@needs_hopper
@pytest.mark.parametrize("causal", [False, True])
def test_forward_backward_equal_flash3(shim, causal):
    top, _ = shim
    if not (flash3.forward_is_built(torch.bfloat16, 128, 128) and flash3.backward_is_built(torch.bfloat16, 128, 128)):
        pytest.skip("bf16 d=128 not built")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(2, 300, h, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                   for h in (8, 2, 2, 8))
    out, lse, out_accum, lse_accum = top._flash_attn_forward(q, k, v, causal=causal, window_size_left=-1,
                                                             window_size_right=-1)
    assert out_accum.numel() == 0 and lse_accum.numel() == 0
    ref_out, ref_lse = flash3.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    softmax_d = top._flash_attn_backward(do, q, k, v, out, lse, None, None, None, None, None, None, dq, dk, dv,
                                         None, causal, -1, -1, 0.0, True, 0)
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    o = flash3.flash_attn_func(qg, kg, vg, causal=causal, deterministic=True)
    rq, rk, rv = torch.autograd.grad(o, (qg, kg, vg), do)
    assert torch.equal(dq, rq) and torch.equal(dk, rk) and torch.equal(dv, rv)
    assert softmax_d.shape == (2, 8, 300)
    torch.testing.assert_close(softmax_d, (do.float() * out.float()).sum(-1).transpose(1, 2))


@needs_hopper
def test_varlen_and_kvcache_paths(shim):
    top, _ = shim
    if not flash3.forward_is_built(torch.bfloat16, 64, 64):
        pytest.skip("bf16 d=64 not built")
    g = torch.Generator(device="cuda").manual_seed(1)
    lengths = [17, 200, 64]
    cu = torch.tensor([0, 17, 217, 281], device="cuda", dtype=torch.int32)
    q, k, v = (torch.randn(281, h, 64, device="cuda", dtype=torch.bfloat16, generator=g) for h in (4, 2, 2))
    out, lse, *_ = top._flash_attn_forward(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lengths),
                                          max_seqlen_k=max(lengths), causal=True)
    ref = flash3.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)
    assert torch.equal(out, ref)
    # KV cache as flash_attn_with_kvcache passes it: the cache lengths as seqused_k.
    qd = torch.randn(3, 1, 4, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    kc, vc = (torch.randn(3, 256, 2, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    seqlens = torch.tensor([5, 256, 100], device="cuda", dtype=torch.int32)
    out, *_ = top._flash_attn_forward(qd, kc, vc, seqused_k=seqlens, causal=True, num_splits=0)
    ref = flash3.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=seqlens, causal=True)
    torch.testing.assert_close(out, ref)
