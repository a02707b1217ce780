# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
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


def _dequantize(x8, descale, g):
    """x8 * descale for (batch, num_heads_kv) descales (g heads of x share one) or block scales
    (batch, num_heads, ceil(seqlen / 128))."""
    if descale.dim() == 2:
        return x8.float() * descale.repeat_interleave(g, dim=1)[:, None, :, None]
    per_row = descale.repeat_interleave(flash3.FP8_SCALE_BLOCK, dim=2)[:, :, :x8.shape[1]]
    return x8.float() * per_row.transpose(1, 2)[..., None]


def _rotate(x, seed):
    """x (..., d) -> x (1/sqrt d) H D in torch: Sylvester's H by butterflies, then the seeded signs
    (splitmix64, as flash3::hadamard_sign_bits)."""
    d = x.shape[-1]
    h = x.float().reshape(-1, d).clone()
    n = 1
    while n < d:
        h = h.view(-1, d // (2 * n), 2, n)
        h = torch.cat([h[:, :, 0] + h[:, :, 1], h[:, :, 0] - h[:, :, 1]], dim=-1).reshape(-1, d)
        n *= 2
    signs = torch.ones(d, device=x.device)
    state = seed
    for j in range(d):
        state = (state + 0x9E3779B97F4A7C15) % 2 ** 64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2 ** 64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2 ** 64
        z ^= z >> 31
        if z >> 63:
            signs[j] = -1
    return (h * signs / d ** 0.5).view(x.shape)


def _reference(q8, k8, v8, qd, kd, vd, causal, window, plain):
    """fp32 attention of the dequantized inputs; plain: P rounded to e4m3 (x 2^8) first, bf16 out."""
    b, sq, hq, d = q8.shape
    hk = k8.shape[2]
    g = hq // hk
    q, k, v = _dequantize(q8, qd, g), _dequantize(k8, kd, 1), _dequantize(v8, vd, 1)
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
    _check_forward(out, lse, q8, k8, v8, qd, kd, vd, causal, window)


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
    # As FlashAttention-3: inputs that require grad still run the forward (an inference call on
    # parameters); only a backward that reaches them raises.
    out = flash_attn_func(q_rg, k8, v8)
    assert torch.equal(out, flash_attn_func(q8, k8, v8)) and out.requires_grad
    with pytest.raises(RuntimeError, match="forward-only"):
        out.float().sum().backward()


def test_torch_compile():
    if not flash3.forward_is_built(E4M3, 128, 128):
        pytest.skip("fp8 forward d128 not built")
    q8, k8, v8, qd, kd, vd = _inputs(2, 128, 128, 4, 2, 128)
    fn = torch.compile(lambda *a: flash_attn_func(*a[:3], q_descale=a[3], k_descale=a[4], v_descale=a[5]),
                       fullgraph=True)
    assert torch.equal(fn(q8, k8, v8, qd, kd, vd), flash_attn_func(q8, k8, v8, q_descale=qd, k_descale=kd,
                                                                   v_descale=vd))


@pytest.mark.parametrize("hadamard", [False, True])
def test_quantize_fp8(hadamard):
    g = torch.Generator(device=DEVICE).manual_seed(5)
    x = torch.randn(2, 200, 8, 128, device=DEVICE, dtype=torch.bfloat16, generator=g)
    x8, descale = flash3.quantize_fp8(x, heads_per_scale=4, hadamard=hadamard, hadamard_seed=11)
    assert x8.dtype == E4M3 and x8.shape == x.shape and descale.shape == (2, 2)
    y = _rotate(x, 11) if hadamard else x.float()
    amax = y.abs().view(2, 200, 2, 4 * 128).amax(dim=(1, 3))
    torch.testing.assert_close(descale, amax / 448, rtol=2e-6, atol=0)
    deq = x8.float() * descale.repeat_interleave(4, dim=1)[:, None, :, None]
    # e4m3: 3 mantissa bits, relative error <= 2^-4 (plus the subnormal step).
    assert ((deq - y).abs() <= y.abs() * 2 ** -4 + 2 ** -9 * descale.max()).all()
    # q and k rotated alike keep the scores; the FP8 forward then runs on them.
    out = flash_attn_func(x8, x8[:, :, ::4].contiguous(), x8[:, :, ::4].contiguous(), q_descale=descale,
                          k_descale=descale, v_descale=descale)
    assert out.dtype == torch.bfloat16 and not torch.isnan(out).any()


def _check_forward(out, lse, q8, k8, v8, qd, kd, vd, causal, window):
    """The FP8 tolerance rule for out and the LSE (as test_forward)."""
    hq, hk, d = q8.shape[2], k8.shape[2], q8.shape[3]
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
    qn = _dequantize(q8, qd, hq // hk).norm(dim=-1).max().item()
    kn = _dequantize(k8, kd, 1).norm(dim=-1).max().item()
    assert lse_err <= 1e-5 + 2 ** -13 * qn * kn / d ** 0.5, f"lse: err {lse_err}"


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("hadamard", [False, True])
def test_block_scales(d, hadamard):
    """quantize_fp8(block_scales=True) -> flash_attn_func with (batch, heads, blocks) descales:
    the descales are each 128-token block's amax / 448 (after the rotation), the forward passes
    the FP8 tolerance rule, and with the rotation it still approximates attention of the
    unrotated inputs."""
    if not flash3.forward_is_built(E4M3, d, d):
        pytest.skip(f"fp8 forward d{d} not built")
    b, sq, sk, hq, hk = 2, 300, 700, 4, 2
    gen = torch.Generator(device=DEVICE).manual_seed(d + hadamard)

    def make(s, h, lo, hi):  # N(0, 1) times 2^u per (batch, 128-token block, head), u in [lo, hi]
        x = torch.randn(b, s, h, d, device=DEVICE, generator=gen)
        u = torch.randint(lo, hi + 1, (b, (s + 127) // 128, h), device=DEVICE, generator=gen).float()
        return (x * (2 ** u).repeat_interleave(128, dim=1)[:, :s, :, None]).to(torch.bfloat16)

    # v's blocks differ by up to 2^8; q's and k's by 2^3 only: the FP8 tensor cores' accumulation
    # error grows with |q| |k| (tests/gpu/test_fp8_gpu.cpp), which the O bound does not include.
    q, k, v = make(sq, hq, -2, 1), make(sk, hk, -2, 1), make(sk, hk, -4, 4)
    q8, qd = flash3.quantize_fp8(q, block_scales=True, hadamard=hadamard, hadamard_seed=7)
    k8, kd = flash3.quantize_fp8(k, block_scales=True, hadamard=hadamard, hadamard_seed=7)
    v8, vd = flash3.quantize_fp8(v, block_scales=True)
    assert qd.shape == (b, hq, 3) and kd.shape == (b, hk, 6) and vd.shape == (b, hk, 6)
    kr = _rotate(k, 7) if hadamard else k.float()
    kpad = torch.nn.functional.pad(kr, (0, 0, 0, 0, 0, 6 * 128 - sk))
    amax = kpad.abs().view(b, 6, 128, hk, d).amax(dim=(2, 4)).transpose(1, 2)
    torch.testing.assert_close(kd, amax / 448, rtol=2e-6, atol=0)
    for causal, window in ((False, (-1, -1)), (True, (-1, -1)), (False, (97, 33))):
        out, lse = flash_attn_func(q8, k8, v8, causal=causal, window_size=window, q_descale=qd, k_descale=kd,
                                   v_descale=vd, return_lse=True)
        _check_forward(out, lse, q8, k8, v8, qd, kd, vd, causal, window)
    # Mixed forms: q per KV head, k / v per block.
    q8h, qdh = flash3.quantize_fp8(q, heads_per_scale=hq // hk, hadamard=hadamard, hadamard_seed=7)
    out, lse = flash_attn_func(q8h, k8, v8, causal=True, q_descale=qdh, k_descale=kd, v_descale=vd,
                               return_lse=True)
    _check_forward(out, lse, q8h, k8, v8, qdh, kd, vd, True, (-1, -1))
    # The rotation keeps q k^T: on N(0, 1) inputs, the rotated FP8 forward is about as close to
    # the bf16 forward of the original inputs as the unrotated one (3x margin).
    if hadamard:
        q, k, v = (torch.randn(b, s, h, d, device=DEVICE, generator=gen).to(torch.bfloat16)
                   for s, h in ((sq, hq), (sk, hk), (sk, hk)))
        want = flash_attn_func(q, k, v, causal=True).float()
        v8, vd = flash3.quantize_fp8(v, block_scales=True)
        errs = []
        for rot in (True, False):
            q8, qd = flash3.quantize_fp8(q, block_scales=True, hadamard=rot, hadamard_seed=9)
            k8, kd = flash3.quantize_fp8(k, block_scales=True, hadamard=rot, hadamard_seed=9)
            o = flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
            errs.append((o.float() - want).abs().max().item())
        assert errs[0] <= 3 * errs[1] + 1e-3, f"rotated {errs[0]} unrotated {errs[1]}"


def test_block_scales_checked():
    q8, k8, v8, qd, kd, vd = _inputs(1, 200, 300, 4, 2, 128)
    if not flash3.forward_is_built(E4M3, 128, 128):
        pytest.skip("fp8 forward d128 not built")
    with pytest.raises(ValueError, match=r"k_descale has shape \(1, 2, 2\).*\(1, 2, 3\)"):
        flash_attn_func(q8, k8, v8, k_descale=torch.ones(1, 2, 2, device=DEVICE))
    with pytest.raises(ValueError, match=r"heads_per_scale is 2 with block_scales=True"):
        flash3.quantize_fp8(torch.zeros(1, 8, 4, 64, device=DEVICE, dtype=torch.bfloat16), heads_per_scale=2,
                            block_scales=True)


@pytest.mark.parametrize("interleaved", [True, False])
def test_quantize_fp8_rotary(interleaved):
    """Rotary (then the rotation) in the quantization pass: the result dequantizes to torch's
    rotary of x (fp32), then rotated, within e4m3's step."""
    g = torch.Generator(device=DEVICE).manual_seed(3)
    b, s, h, d, rd = 2, 200, 4, 128, 64
    x = torch.randn(b, s, h, d, device=DEVICE, dtype=torch.bfloat16, generator=g)
    ang = torch.rand(s + 5, rd // 2, device=DEVICE, generator=g) * 6.3
    cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
    x8, ds = flash3.quantize_fp8(x, block_scales=True, hadamard=True, hadamard_seed=5, rotary_cos=cos,
                                 rotary_sin=sin, rotary_interleaved=interleaved)
    xf = x.float()
    c, sn = cos[:s].float()[None, :, None, :], sin[:s].float()[None, :, None, :]
    if interleaved:
        x0, x1 = xf[..., 0:rd:2], xf[..., 1:rd:2]
        r = torch.stack([x0 * c - x1 * sn, x0 * sn + x1 * c], dim=-1).flatten(-2)
    else:
        x0, x1 = xf[..., :rd // 2], xf[..., rd // 2:rd]
        r = torch.cat([x0 * c - x1 * sn, x0 * sn + x1 * c], dim=-1)
    y = _rotate(torch.cat([r, xf[..., rd:]], dim=-1), 5)
    deq = _dequantize(x8, ds, 1)
    step = ds.repeat_interleave(128, dim=2)[:, :, :s].transpose(1, 2)[..., None]
    assert ((deq - y).abs() <= y.abs() * 2 ** -4 + 2 ** -9 * step + 1e-5).all()
    with pytest.raises(ValueError, match="rotary_sin is missing"):
        flash3.quantize_fp8(x, rotary_cos=cos)
