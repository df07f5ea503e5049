"""LoRA stage: resolve target modules, refuse setups that cannot learn, inject adapters with PEFT.

A target entry is a module-name suffix as in PEFT (`q_proj` matches `model.layers.0.self_attn.q_proj`);
an entry with regex characters is matched against the whole module name (`.*layers\\.1[0-7].*q_proj`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import torch
from peft import LoraConfig, PeftModel, TaskType, get_peft_model
from torch import nn

from loracls.errors import Log, LoraclsError

LORA_LAYER_TYPES = (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d)
REGEX_CHARS = set("*[]()|\\^$+?{}")
HEAD_NAMES = ("score", "classifier")


def _matches(name: str, pattern: str) -> bool:
    if REGEX_CHARS & set(pattern):
        return re.fullmatch(pattern, name) is not None
    return name == pattern or name.endswith("." + pattern)


def head_name(model: nn.Module) -> str:
    for name in HEAD_NAMES:
        if isinstance(getattr(model, name, None), nn.Module):
            return name
    raise LoraclsError(f"{type(model).__name__} has no classification head named {' or '.join(HEAD_NAMES)}")


def match_targets(model: nn.Module, patterns: list[str]) -> list[str]:
    """Full names of the leaf modules LoRA would wrap for these patterns."""
    for pattern in patterns:
        if REGEX_CHARS & set(pattern):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise LoraclsError(f"target_modules: {pattern!r} is not a valid regex ({exc})") from None
    return [
        name
        for name, module in model.named_modules()
        if name and any(_matches(name, p) for p in patterns) and isinstance(module, LORA_LAYER_TYPES)
    ]


def module_summary(model: nn.Module) -> list[tuple[str, str, int]]:
    """(name with layer numbers folded to *, description, count) for every leaf module LoRA can wrap."""
    groups: Counter = Counter()
    descriptions = {}
    for name, module in model.named_modules():
        if not name or not isinstance(module, LORA_LAYER_TYPES):
            continue
        folded = re.sub(r"\.\d+\.", ".*.", name)
        groups[folded] += 1
        if isinstance(module, nn.Linear):
            descriptions[folded] = f"Linear {module.in_features}->{module.out_features}"
        elif isinstance(module, nn.Embedding):
            descriptions[folded] = f"Embedding {module.num_embeddings}x{module.embedding_dim}"
        else:
            descriptions[folded] = type(module).__name__
    return [(name, descriptions[name], count) for name, count in groups.items()]


def check_targets(model: nn.Module, patterns: list[str], head: str | None = "") -> list[str]:
    """Refuse targets that match nothing, only embeddings, or the head (it is trained in full instead; head
    None: a causal LM keeps its LM head frozen, and no target may be it either)."""
    matched = match_targets(model, patterns)
    if not matched:
        suffixes = sorted(
            {
                name.rsplit(".", 1)[-1]
                for name, m in model.named_modules()
                if isinstance(m, nn.Linear) and not name.startswith(HEAD_NAMES)
            }
        )
        raise LoraclsError(f"target_modules {patterns} match no module; linear modules here: {', '.join(suffixes)}")
    modules = dict(model.named_modules())
    if all(isinstance(modules[name], nn.Embedding) for name in matched):
        raise LoraclsError(
            f"target_modules {patterns} match only embeddings ({', '.join(matched[:3])}); "
            f"LoRA there cannot change the classification; target attention/MLP projections"
        )
    head = head_name(model) if head == "" else head or "lm_head"
    on_head = [name for name in matched if name == head or name.startswith(head + ".")]
    if on_head:
        raise LoraclsError(
            f"target_modules {patterns} match the classification head {head!r}; "
            f"the head is trained in full, target the decoder's projections"
        )
    return matched


DEFAULT_TARGETS = ["q_proj", "v_proj"]
# a fused query/key/value projection (Phi-3 / Phi-4 qkv_proj, GPT-NeoX query_key_value, MPT Wqkv, GPT-2 c_attn)
FUSED_QKV = re.compile(r"(.*qkv.*|query_key_value|c_attn)", re.IGNORECASE)


def default_targets(model: nn.Module, log: Log = print) -> list[str]:
    """`target_modules: null`: the query and value projections, q_proj and v_proj; where they do not exist,
    the fused query/key/value projections that the model has (said in one line)."""
    if match_targets(model, DEFAULT_TARGETS):
        return list(DEFAULT_TARGETS)
    fused = sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and FUSED_QKV.fullmatch(name.rsplit(".", 1)[-1])
        }
    )
    if not fused:
        return list(DEFAULT_TARGETS)  # check_targets then refuses, listing the linear modules there are
    log(f"lora: this model has no q_proj / v_proj; target_modules defaults to its fused {', '.join(fused)}")
    return fused


def resolve_targets(model: nn.Module, patterns: list[str] | None, log: Log = print) -> list[str]:
    """The config's target_modules, strict; null: the family's default."""
    return default_targets(model, log) if patterns is None else list(patterns)


# PEFT's LoRA variants, by name: the LoraConfig fields each sets
VARIANTS = {"lora": {}, "rslora": {"use_rslora": True}, "dora": {"use_dora": True}}


@dataclass(frozen=True)
class LoraSpec:
    """What LoRA a run puts on the decoder (PEFT's names): rank, scaling, dropout, targets (None: the family's
    query and value projections) and the variant."""

    r: int
    alpha: float
    dropout: float
    targets: list[str] | None = None
    variant: str = "lora"

    @classmethod
    def of(cls, config) -> LoraSpec:
        return cls(config.r, config.lora_alpha, config.lora_dropout, config.target_modules, config.lora_variant)

    def peft_config(self, task_type, matched: list[str], modules_to_save: list[str] | None = None) -> LoraConfig:
        return LoraConfig(
            task_type=task_type,
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=matched,
            modules_to_save=modules_to_save,
            **VARIANTS[self.variant],
        )

    def describe(self) -> str:
        variant = "" if self.variant == "lora" else f" ({self.variant})"
        return f"r={self.r} alpha={self.alpha:g} dropout={self.dropout:g}{variant}"


@dataclass
class LoraReport:
    matched: list[str]
    trainable: int
    total: int
    head: str


def check_rank(model: nn.Module, matched: list[str], r: int) -> None:
    """A rank beyond a targeted module's narrower side adds parameters and no capacity (and at r = 1,000,000 on
    a 32-wide model, 11 GB): refused with the module and its shape."""
    modules = dict(model.named_modules())
    for name in matched:
        weight = getattr(modules[name], "weight", None)
        if weight is not None and weight.dim() == 2 and r > min(weight.shape):
            raise LoraclsError(
                f"lora: r {r} is more than {name}'s narrower side ({weight.shape[1]} in x {weight.shape[0]} out); "
                f"choose r <= {min(weight.shape)} (8-64 is usual)"
            )


def apply_lora(
    model: nn.Module, spec: LoraSpec, log: Log = print, cheap_dropout: bool = True
) -> tuple[PeftModel, LoraReport]:
    matched = check_targets(model, resolve_targets(model, spec.targets, log))
    check_rank(model, matched, spec.r)
    head = head_name(model)
    peft_model = get_peft_model(model, spec.peft_config(TaskType.SEQ_CLS, matched, [head]))
    if cheap_dropout:
        use_cheap_dropout(peft_model)
    report = LoraReport(matched, *count_parameters(peft_model), head)
    check_head_trainable(peft_model, head)
    folded = Counter(re.sub(r"\.\d+\.", ".*.", name) for name in matched)
    log(f"lora: {spec.describe()}; {len(matched)} modules: " + ", ".join(f"{n} x{c}" for n, c in folded.items()))
    log(
        f"lora: trainable {report.trainable:,} of {report.total:,} parameters "
        f"({100 * report.trainable / report.total:.3f}%), head {head!r} trained in full"
    )
    return peft_model, report


def apply_causal_lora(model: nn.Module, spec: LoraSpec, log: Log = print) -> tuple[PeftModel, LoraReport]:
    """LoRA on a causal LM that keeps its own LM head (label_and_comment: no classification head)."""
    matched = check_targets(model, resolve_targets(model, spec.targets, log), head=None)
    check_rank(model, matched, spec.r)
    peft_model = get_peft_model(model, spec.peft_config(TaskType.CAUSAL_LM, matched))
    use_cheap_dropout(peft_model)
    report = LoraReport(matched, *count_parameters(peft_model), "lm_head")
    log(
        f"lora: {spec.describe()} on the causal LM; {len(matched)} modules; trainable "
        f"{report.trainable:,} of {report.total:,} parameters ({100 * report.trainable / report.total:.3f}%)"
    )
    return peft_model, report


class CheapRandomDropout(nn.Dropout):
    """Dropout with cheaper random numbers on CPU, the same distribution (p exact to 1/32768).

    torch's CPU dropout draws one 32-bit random number per element on one thread: with LoRA on q/v of the
    embedded model that was 8.8% of a train step. Here one 64-bit draw gives four 15-bit uniforms, drawn
    from the same seeded generator (so runs repeat and resume exactly). Elsewhere: plain dropout."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0 or x.device.type != "cpu":
            return super().forward(x)
        n = x.numel()
        draws = torch.empty((n + 3) // 4, dtype=torch.int64).random_()
        uniform15 = draws.view(torch.int16)[:n].view(x.shape) & 0x7FFF
        mask = (uniform15 >= round(self.p * 32768)).to(x.dtype).mul_(1.0 / (1.0 - self.p))
        return x * mask


def use_cheap_dropout(model: nn.Module) -> int:
    """Swap PEFT's LoRA dropout modules for CheapRandomDropout; returns how many were swapped."""
    swapped = 0
    for module in model.modules():
        dropouts = getattr(module, "lora_dropout", None)
        if isinstance(dropouts, nn.ModuleDict):
            for name, dropout in dropouts.items():
                if type(dropout) is nn.Dropout:
                    dropouts[name] = CheapRandomDropout(dropout.p)
                    swapped += 1
    return swapped


def count_parameters(model: nn.Module) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())


def check_head_trainable(peft_model: nn.Module, head: str) -> None:
    head_params = [(n, p) for n, p in peft_model.named_parameters() if f".{head}." in f".{n}"]
    if not any(p.requires_grad for _, p in head_params):
        raise LoraclsError(
            f"the classification head {head!r} is frozen: it would stay random; it must be in modules_to_save"
        )
