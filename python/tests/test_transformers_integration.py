# SPDX-License-Identifier: BSD-3-Clause
# Copyright (c) 2026 the flash3 authors
"""flash3 in Hugging Face transformers (flash3.integrations.transformers, attn_implementation="flash3").

A small randomly initialised Llama-style model from a config (no download: 2 layers, hidden 256,
4 heads over 2 KV heads, head_dim 64, bf16, CUDA) runs with attn_implementation="sdpa" and
"flash3" on the same weights: logits, then one training step (loss and every parameter's
gradient) agree within bf16 tolerance; a padded batch (2-D attention mask), a padding-free packed
batch (position_ids restarting per document, and cu_seq_lens kwargs) and a sliding-window /
softcap model too. Registration and the errors for unsupported arguments are checked without a
GPU. Skipped without transformers (and the GPU parts without a Hopper GPU).
"""
import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flash3  # noqa: E402
import flash3.integrations.transformers as f3t  # noqa: E402

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="flash3 needs a Hopper (sm_90) GPU")
DEVICE = "cuda"
VOCAB = 512


def _config(**kw):
    cfg = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=64, max_position_embeddings=2048, attention_dropout=0.0)
    cfg.update(kw)
    return transformers.LlamaConfig(**cfg)


def _models(config=None, cls=None):
    """The same randomly initialised weights under "sdpa" and "flash3" (bf16, CUDA)."""
    cls = cls or transformers.LlamaForCausalLM
    torch.manual_seed(0)
    ref = cls._from_config(config or _config(), attn_implementation="sdpa", dtype=torch.bfloat16).to(DEVICE)
    ours = copy.deepcopy(ref)
    ours.set_attn_implementation("flash3")
    assert ours.config._attn_implementation == "flash3"
    return ref, ours


def _skip_unless_built():
    if not (flash3.forward_is_built(torch.bfloat16, 64, 64) and flash3.backward_is_built(torch.bfloat16, 64, 64)):
        pytest.skip("bf16 d=64 forward + backward kernels not built")


def _close(a, b, what, rtol=2e-2, atol=2e-2):
    """bf16 tolerance: |a - b| <= atol + rtol * max|b| (one model's bf16 rounding differs from
    the other's order of operations; a wrong mask or scale is off by O(1))."""
    a, b = a.float(), b.float()
    err = (a - b).abs().max().item()
    bound = atol + rtol * b.abs().max().item()
    assert err <= bound, f"{what}: max error {err:.4g} > {bound:.4g}"


def test_registered_with_attention_and_mask_interfaces():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    assert AttentionInterface()["flash3"] is f3t.flash3_attention_forward
    assert "flash3" in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    assert f3t.register("flash3_alias") == "flash3_alias"
    assert AttentionInterface()["flash3_alias"] is f3t.flash3_attention_forward


def test_model_creation_accepts_flash3_without_a_gpu():
    model = transformers.LlamaForCausalLM._from_config(_config(), attn_implementation="flash3")
    assert model.config._attn_implementation == "flash3"


def test_unsupported_arguments_raise():
    q = torch.zeros(1, 4, 8, 64)
    module = torch.nn.Module()
    with pytest.raises(NotImplementedError, match="dropout"):
        f3t.flash3_attention_forward(module, q, q, q, None, dropout=0.1)
    with pytest.raises(NotImplementedError, match="sinks"):
        f3t.flash3_attention_forward(module, q, q, q, None, s_aux=torch.zeros(4))


def _fake_flash3(monkeypatch):
    """flash3's two functions replaced by the float reference (ref.attention_ref), on the CPU: the
    integration's plumbing (layouts, masks, unpadding, packing) without a GPU."""
    from ref import attention_ref

    def func(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, deterministic=False):
        out, _ = attention_ref(q, k, v, causal=causal, window=tuple(window_size), softmax_scale=softmax_scale,
                               softcap=softcap)
        return out.to(q.dtype)

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=None, causal=False, window_size=(-1, -1),
               softcap=0.0, deterministic=False):
        assert isinstance(max_q, int) and isinstance(max_k, int) and cu_q.dtype == torch.int32
        outs = []
        for b in range(cu_q.numel() - 1):
            qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
            outs.append(func(q[qs][None], k[ks][None], v[ks][None], softmax_scale, causal, window_size, softcap)[0])
        return torch.cat(outs)

    monkeypatch.setattr(flash3, "flash_attn_func", func)
    monkeypatch.setattr(flash3, "flash_attn_varlen_func", varlen)


def test_plumbing_on_cpu_matches_sdpa(monkeypatch):
    """fp32 on the CPU, flash3's kernels replaced by the float reference: fixed length, a padded
    batch and a packed row give sdpa's logits."""
    _fake_flash3(monkeypatch)
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM._from_config(_config(), attn_implementation="sdpa")
    ours = copy.deepcopy(ref)
    ours.set_attn_implementation("flash3")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 40), generator=g)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, ref(ids).logits, rtol=1e-4, atol=1e-4)
        mask = torch.ones_like(ids)
        mask[0, :7] = 0
        mask[1, 30:] = 0
        a, b = ours(ids, attention_mask=mask).logits, ref(ids, attention_mask=mask).logits
        torch.testing.assert_close(a[mask.bool()], b[mask.bool()], rtol=1e-4, atol=1e-4)
        lengths = [11, 20, 9]
        docs = [torch.randint(0, VOCAB, (1, n), generator=g) for n in lengths]
        pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
        packed = ours(torch.cat(docs, dim=1), position_ids=pos).logits
        torch.testing.assert_close(packed, torch.cat([ref(d).logits for d in docs], dim=1), rtol=1e-4, atol=1e-4)


def _gemma2_config():
    return transformers.Gemma2Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=64,
                                     attn_logit_softcapping=30.0, final_logit_softcapping=None,
                                     query_pre_attn_scalar=64, attention_dropout=0.0)


def test_sliding_window_and_softcap_plumbing_on_cpu(monkeypatch):
    """Gemma 2 (sliding window 64 on every other layer, softcap 30, scaling from
    query_pre_attn_scalar), fp32 on the CPU with the reference in place of the kernels, against
    transformers' eager attention."""
    _fake_flash3(monkeypatch)
    torch.manual_seed(0)
    ref = transformers.Gemma2ForCausalLM._from_config(_gemma2_config(), attn_implementation="eager")
    ours = copy.deepcopy(ref)
    ours.set_attn_implementation("flash3")
    ids = torch.randint(0, VOCAB, (2, 150), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, ref(ids).logits, rtol=1e-4, atol=1e-4)


@needs_hopper
def test_logits_and_training_step_match_sdpa():
    _skip_unless_built()
    ref, ours = _models()
    ids = torch.randint(0, VOCAB, (2, 300), device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(1))
    with torch.no_grad():
        _close(ours(ids).logits, ref(ids).logits, "logits")
    flash3.sdpa.stats(reset=True)
    for m in (ref, ours):
        m.train()
        m.zero_grad()
    loss_ref = ref(ids, labels=ids).loss
    loss_ref.backward()
    prof_acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=prof_acts) as prof:
        loss = ours(ids, labels=ids).loss
        loss.backward()
        torch.cuda.synchronize()
    names = {e.key for e in prof.key_averages()}
    assert "flash3::fwd" in names and "flash3::bwd" in names, sorted(n for n in names if "flash" in n.lower())
    assert abs(loss.item() - loss_ref.item()) <= 1e-2 * abs(loss_ref.item()), (loss.item(), loss_ref.item())
    params_ref = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        _close(p.grad, params_ref[name].grad, f"grad {name}", rtol=5e-2, atol=1e-3)


@needs_hopper
def test_padded_batch_matches_sdpa():
    """A 2-D attention mask with left and right padding: flash3 unpads and runs varlen."""
    _skip_unless_built()
    ref, ours = _models()
    ids = torch.randint(0, VOCAB, (3, 200), device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :37] = 0    # left padding
    mask[1, 150:] = 0   # right padding
    with torch.no_grad():
        a, b = ours(ids, attention_mask=mask).logits, ref(ids, attention_mask=mask).logits
    keep = mask.bool()
    _close(a[keep], b[keep], "logits of the real tokens")


@needs_hopper
def test_packed_documents_match_separate_sequences():
    """Padding-free packing: documents of 70, 130, 1 and 55 tokens in one row with position_ids
    restarting at 0 (and the same through cu_seq_lens kwargs), against each document alone under
    sdpa."""
    _skip_unless_built()
    ref, ours = _models()
    lengths = [70, 130, 1, 55]
    g = torch.Generator(DEVICE).manual_seed(3)
    docs = [torch.randint(0, VOCAB, (1, n), device=DEVICE, generator=g) for n in lengths]
    ids = torch.cat(docs, dim=1)
    pos = torch.cat([torch.arange(n, device=DEVICE) for n in lengths]).unsqueeze(0)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), device=DEVICE, dtype=torch.int32)
    with torch.no_grad():
        packed = ours(ids, position_ids=pos).logits
        packed_kw = ours(ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lengths),
                         max_length_k=max(lengths)).logits
        separate = torch.cat([ref(d).logits for d in docs], dim=1)
    _close(packed, separate, "packed (position_ids)")
    _close(packed_kw, separate, "packed (cu_seq_lens)")


@needs_hopper
def test_packed_training_step_matches_padded_sdpa():
    """One training step on a packed row: loss and gradients equal those of the padded batch under sdpa."""
    _skip_unless_built()
    ref, ours = _models()
    lengths = [90, 40, 126]
    g = torch.Generator(DEVICE).manual_seed(4)
    docs = [torch.randint(0, VOCAB, (n,), device=DEVICE, generator=g) for n in lengths]
    ids = torch.cat(docs).unsqueeze(0)
    pos = torch.cat([torch.arange(n, device=DEVICE) for n in lengths]).unsqueeze(0)
    labels = ids.clone()
    starts = torch.tensor([0] + lengths[:-1], device=DEVICE).cumsum(0)
    labels[0, starts] = -100  # no prediction across a document boundary
    width = max(lengths)
    padded = torch.zeros(len(lengths), width, dtype=torch.long, device=DEVICE)
    mask = torch.zeros_like(padded)
    plabels = torch.full_like(padded, -100)
    for i, d in enumerate(docs):
        padded[i, :len(d)], mask[i, :len(d)], plabels[i, 1:len(d)] = d, 1, d[1:]
    for m in (ref, ours):
        m.train()
        m.zero_grad()
    # Sum of token losses in both (the means are over the same set of predicted tokens).
    loss_ours = ours(ids, position_ids=pos, labels=labels).loss
    loss_ref = ref(padded, attention_mask=mask, labels=plabels).loss
    loss_ours.backward()
    loss_ref.backward()
    assert abs(loss_ours.item() - loss_ref.item()) <= 1e-2 * abs(loss_ref.item()), (loss_ours.item(), loss_ref.item())
    params_ref = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        _close(p.grad, params_ref[name].grad, f"grad {name}", rtol=5e-2, atol=1e-3)


@needs_hopper
def test_sliding_window_and_softcap_match_sdpa():
    """Mistral-style sliding window (64) with Gemma-2-style softcap (30): transformers' eager
    attention as the reference (sdpa has no softcap)."""
    _skip_unless_built()
    if not flash3.forward_is_built(torch.bfloat16, 64, 64):
        pytest.skip("bf16 d=64 not built")
    torch.manual_seed(0)
    ref = transformers.Gemma2ForCausalLM._from_config(_gemma2_config(), attn_implementation="eager",
                                                      dtype=torch.bfloat16).to(DEVICE)
    ours = copy.deepcopy(ref)
    ours.set_attn_implementation("flash3")
    ids = torch.randint(0, VOCAB, (2, 300), device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(5))
    try:
        with torch.no_grad():
            a = ours(ids).logits
    except NotImplementedError as e:  # a build without the softcap units
        pytest.skip(str(e))
    with torch.no_grad():
        b = ref(ids).logits
    _close(a, b, "logits (sliding window + softcap)")
