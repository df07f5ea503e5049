"""The loop's speed-ups change no results: cheap CPU dropout has dropout's distribution and gradient, and
frozen weights kept in the compute dtype give the same autocast outputs bit for bit."""

import torch

from loracls.model.classifier import load_classifier
from loracls.model.lora import CheapRandomDropout, LoraSpec, apply_lora
from loracls.model.speedups import pick_attention, store_frozen_linears_in

LABELS = {0: "neg", 1: "pos"}
quiet = lambda *a: None  # noqa: E731


def test_cheap_dropout_keeps_one_minus_p_scales_and_masks_the_gradient():
    torch.manual_seed(0)
    dropout = CheapRandomDropout(0.25).train()
    x = torch.ones(1000, 400, requires_grad=True)
    y = dropout(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.75) < 0.005
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.75))
    y.sum().backward()
    assert torch.equal(x.grad, kept.float() / 0.75)
    assert not torch.equal(dropout(x), dropout(x))  # a new mask per call
    dropout.eval()
    assert torch.equal(dropout(x), x)


def test_cheap_dropout_follows_the_seed():
    dropout = CheapRandomDropout(0.1).train()
    x = torch.randn(64, 32)
    torch.manual_seed(3)
    first = dropout(x)
    torch.manual_seed(3)
    assert torch.equal(first, dropout(x))


def test_lora_dropout_is_swapped_only_when_asked(gemma3_dir):
    ours, _ = apply_lora(load_classifier(gemma3_dir, LABELS, log=quiet).model, LoraSpec(4, 8, 0.1, ["q_proj"]), quiet)
    plain, _ = apply_lora(
        load_classifier(gemma3_dir, LABELS, log=quiet).model,
        LoraSpec(4, 8, 0.1, ["q_proj"]),
        quiet,
        cheap_dropout=False,
    )
    kinds = lambda m: {
        type(d).__name__
        for mod in m.modules()
        if hasattr(mod, "lora_dropout")  # noqa: E731
        for d in mod.lora_dropout.values()
    }
    assert kinds(ours) == {"CheapRandomDropout"} and kinds(plain) == {"Dropout"}


def _model_with_live_adapters(gemma3_dir):
    """LoRA on q/v without dropout, with non-zero LoRA B and head so the adapters take part."""
    torch.manual_seed(0)
    model, _ = apply_lora(
        load_classifier(gemma3_dir, LABELS, log=quiet).model, LoraSpec(4, 8, 0.0, ["q_proj", "v_proj"]), quiet
    )
    for name, param in model.named_parameters():
        if "lora_B" in name or "score" in name:
            torch.nn.init.normal_(param, std=0.5)
    return model


def test_frozen_linears_in_bf16_give_identical_autocast_outputs(gemma3_dir):
    model = _model_with_live_adapters(gemma3_dir)
    batch = torch.tensor([[2, 5, 6, 7, 0], [2, 7, 8, 9, 10]])
    mask = (batch != 0).long()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = model(input_ids=batch, attention_mask=mask).logits
    trainable = {n: p.dtype for n, p in model.named_parameters() if p.requires_grad}
    assert store_frozen_linears_in(model, torch.bfloat16) > 0
    assert store_frozen_linears_in(model, torch.float32) == 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        after = model(input_ids=batch, attention_mask=mask).logits
    assert torch.equal(before, after)
    assert {n: p.dtype for n, p in model.named_parameters() if p.requires_grad} == trainable  # fp32 for AdamW
    frozen = [m.weight.dtype for m in model.modules() if type(m) is torch.nn.Linear and not m.weight.requires_grad]
    assert frozen and set(frozen) == {torch.bfloat16}


def test_cpu_training_uses_eager_attention_with_the_same_outputs_and_gradients(gemma3_dir, monkeypatch):
    from transformers.models.gemma3 import modeling_gemma3

    eager_calls = []
    eager = modeling_gemma3.eager_attention_forward
    monkeypatch.setattr(
        modeling_gemma3, "eager_attention_forward", lambda *a, **k: eager_calls.append(1) or eager(*a, **k)
    )
    model = _model_with_live_adapters(gemma3_dir)
    batch = torch.tensor([[2, 5, 6, 7, 0, 0], [2, 7, 8, 9, 10, 11]])  # a padded row: the mask matters
    mask = (batch != 0).long()

    def logits_and_grads():
        model.zero_grad()
        logits = model(input_ids=batch, attention_mask=mask).logits
        logits.sum().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    assert model.config._attn_implementation == "sdpa"
    sdpa_logits, sdpa_grads = logits_and_grads()
    assert not eager_calls
    assert pick_attention(model, torch.device("cuda")) is None and model.config._attn_implementation == "sdpa"
    assert pick_attention(model, torch.device("cpu")) == "eager"
    eager_logits, eager_grads = logits_and_grads()
    assert len(eager_calls) == model.config.num_hidden_layers
    assert torch.allclose(eager_logits, sdpa_logits, atol=1e-5)
    for name, grad in sdpa_grads.items():
        assert torch.allclose(eager_grads[name], grad, atol=1e-5, rtol=1e-4), name


def test_a_linear_kept_in_bf16_reads_a_strided_view_as_a_contiguous_tensor():
    """torch's CPU bf16 matmul takes a slow path (the weight expanded per row for a bmm) for a strided 3-D bf16
    view, such as transformers' `logits_to_keep` slice that reaches the LM head in generation: the stored
    Linear gets a contiguous copy, with the same output."""
    torch.manual_seed(0)
    head = torch.nn.Sequential(torch.nn.Linear(16, 64, bias=False).requires_grad_(False))
    hidden = torch.randn(4, 5, 16, dtype=torch.bfloat16)
    view = hidden[:, -1:, :]
    assert not view.is_contiguous()
    with torch.inference_mode():
        expected = torch.nn.functional.linear(view.contiguous(), head[0].weight.bfloat16())
    assert store_frozen_linears_in(head, torch.bfloat16) == 1
    seen = []
    head[0].register_forward_hook(lambda _m, args, _out: seen.append(args[0].is_contiguous()))
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = head(view)
    assert seen == [True] and torch.equal(out, expected)
