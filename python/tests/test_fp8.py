"""flash3.flash_attn_func with FP8 (torch.float8_e4m3fn) inputs: FlashAttention-3's FP8 forward.

Tolerance (docs/design.md, "FP8"): err(flash3 vs fp32 reference on the dequantized inputs) <=
2 * err(plain FP8 implementation vs the same reference) + atol. The plain implementation computes
the scores in fp32 from the dequantized e4m3 values, rounds P to e4m3 after FlashAttention-3's 2^8
max offset, accumulates O in fp32 and writes bf16, as the C++ GPU tests' CPU reference does;
atol is bf16's rounding at the output's magnitude. The LSE is checked against the reference with
the FP8 tensor cores' accumulation error allowed (tests/gpu/test_fp8_gpu.cpp). Plus the
argument checks (dtypes, descale shapes, requires_grad) and torch.compile.
"""
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("flash3 needs a Hopper (sm_90) GPU", allow_module_level=True)

import flash3  # noqa: E402
from flash3 import flash_attn_func  # noqa: E402

DEVICE = "cuda"
E4M3 = torch.float8_e4m3fn


def _quantize(x):
    """(b, s, h, d) -> e4m3 and (b, h) descales (amax / 448 per batch and head)."""
    descale = x.float().abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
    return (x.float() / descale[:, None, :, None]).to(E4M3), descale.contiguous()


def _inputs(b, sq, sk, hq, hk, d, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(b, sq, hk, d, device=DEVICE, generator=g)  # q quantized per KV head: its group shares one
    q = q.repeat_interleave(hq // hk, dim=2) + 0.5 * torch.randn(b, sq, hq, d, device=DEVICE, generator=g)
    k, v = (torch.randn(b, sk, hk, d, device=DEVICE, generator=g) for _ in range(2))
    qg = q.view(b, sq, hk, hq // hk * d)
    q8g, qd = _quantize(qg)
    q8 = q8g.view(b, sq, hq, d)
    (k8, kd), (v8, vd) = _quantize(k), _quantize(v)
    return q8, k8, v8, qd, kd, vd


def _reference(q8, k8, v8, qd, kd, vd, causal, window, plain):
    """fp32 attention of the dequantized inputs; plain: P rounded to e4m3 (x 2^8) first, bf16 out."""
    b, sq, hq, d = q8.shape
    hk = k8.shape[2]
    g = hq // hk
    q = q8.float() * qd.repeat_interleave(g, dim=1)[:, None, :, None]
    k = k8.float() * kd[:, None, :, None]
    v = v8.float() * vd[:, None, :, None]
    k, v = (x.repeat_interleave(g, dim=2) for x in (k, v))
    s = torch.einsum("bihd,bjhd->bhij", q, k) / d ** 0.5
    sk = k.shape[1]
    i = torch.arange(sq, device=DEVICE)[:, None]
    j = torch.arange(sk, device=DEVICE)[None, :]
    visible = torch.ones(sq, sk, dtype=torch.bool, device=DEVICE)
    left, right = window
    if causal:
        right = 0
    if right >= 0:
        visible &= j <= i + sk - sq + right
    if left >= 0:
        visible &= j >= i + sk - sq - left
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    p = torch.exp(s - m.clamp(min=-1e30))
    p = torch.nan_to_num(p)
    lse = (m.squeeze(-1) + torch.log(p.sum(-1)))
    denom = p.sum(-1, keepdim=True)
    if plain:
        p = (p * 256).to(E4M3).float() / 256
    o = torch.einsum("bhij,bjhd->bihd", p, v) / denom.transpose(1, 2).clamp(min=1e-30)
    if plain:
        o = o.to(torch.bfloat16).float()
    return o, lse


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("mask", ["none", "causal", "window"])
@pytest.mark.parametrize("shape", [(2, 256, 256, 4, 4), (1, 77, 1000, 6, 2), (2, 513, 300, 4, 1)])
def test_forward(d, mask, shape):
    if not flash3.forward_is_built(E4M3, d, d):
        pytest.skip(f"fp8 forward d{d} not built")
    b, sq, sk, hq, hk = shape
    q8, k8, v8, qd, kd, vd = _inputs(b, sq, sk, hq, hk, d, seed=d + sq)
    causal, window = mask == "causal", ((97, 33) if mask == "window" else (-1, -1))
    out, lse = flash_attn_func(q8, k8, v8, causal=causal, window_size=window, q_descale=qd, k_descale=kd,
                               v_descale=vd, return_lse=True)
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, hq, d)
    ref_o, ref_l = _reference(q8, k8, v8, qd, kd, vd, causal, window, plain=False)
    plain_o, _ = _reference(q8, k8, v8, qd, kd, vd, causal, window, plain=True)
    err = (out.float() - ref_o).abs().max().item()
    base = (plain_o - ref_o).abs().max().item()
    atol = ref_o.abs().max().item() * 2 ** -8
    assert not torch.isnan(out).any()
    assert err <= 2 * base + atol, f"out: err {err} plain {base} atol {atol}"
    finite = torch.isfinite(ref_l)
    assert torch.equal(torch.isfinite(lse), finite)
    lse_err = (lse[finite] - ref_l[finite]).abs().max().item() if finite.any() else 0.0
    qn = (q8.float() * qd.repeat_interleave(hq // hk, 1)[:, None, :, None]).norm(dim=-1).max().item()
    kn = (k8.float() * kd[:, None, :, None]).norm(dim=-1).max().item()
    assert lse_err <= 1e-5 + 2 ** -13 * qn * kn / d ** 0.5, f"lse: err {lse_err}"


def test_no_descales_means_one():
    if not flash3.forward_is_built(E4M3, 128, 128):
        pytest.skip("fp8 forward d128 not built")
    q8, k8, v8, qd, kd, vd = _inputs(1, 64, 64, 2, 2, 128)
    ones = torch.ones_like(qd)
    a = flash_attn_func(q8, k8, v8)
    b = flash_attn_func(q8, k8, v8, q_descale=ones, k_descale=ones, v_descale=ones)
    assert torch.equal(a, b)


def test_errors():
    q8, k8, v8, qd, kd, vd = _inputs(2, 64, 64, 4, 2, 128)
    with pytest.raises(TypeError, match="k.dtype"):
        flash_attn_func(q8, k8.to(torch.bfloat16), v8)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        flash_attn_func(q8.to(torch.float8_e5m2), k8.to(torch.float8_e5m2), v8.to(torch.float8_e5m2))
    with pytest.raises(ValueError, match=r"k_descale has shape \(2, 4\); expected \(batch, num_heads_kv\)"):
        flash_attn_func(q8, k8, v8, k_descale=torch.ones(2, 4, device=DEVICE))
    with pytest.raises(TypeError, match="v_descale.dtype"):
        flash_attn_func(q8, k8, v8, v_descale=vd.double())
    with pytest.raises(NotImplementedError, match="softcap"):
        flash_attn_func(q8, k8, v8, softcap=5.0)
    with pytest.raises(NotImplementedError, match="q_descale"):
        flash_attn_func(q8.to(torch.bfloat16), k8.to(torch.bfloat16), v8.to(torch.bfloat16), q_descale=qd)
    try:
        q_rg = q8.clone().requires_grad_()
    except RuntimeError:  # a torch without autograd for float8 tensors: nothing to guard
        return
    with pytest.raises(RuntimeError, match="forward-only"):
        flash_attn_func(q_rg, k8, v8)


def test_torch_compile():
    if not flash3.forward_is_built(E4M3, 128, 128):
        pytest.skip("fp8 forward d128 not built")
    q8, k8, v8, qd, kd, vd = _inputs(2, 128, 128, 4, 2, 128)
    fn = torch.compile(lambda *a: flash_attn_func(*a[:3], q_descale=a[3], k_descale=a[4], v_descale=a[5]),
                       fullgraph=True)
    assert torch.equal(fn(q8, k8, v8, qd, kd, vd), flash_attn_func(q8, k8, v8, q_descale=qd, k_descale=kd,
                                                                   v_descale=vd))
