"""A decoder inside a checkpoint: the one place that reads where a model's language model sits.

Text-only causal LMs keep their decoder under `model.*`. The multimodal wrappers of 2025-26 keep it deeper
(Gemma 4, Qwen3.5: `model.language_model.*`; Gemma 3, Mistral 3: `language_model.model.*`) beside vision and
audio towers. The prefix is not taken from a list of names: the text decoder transformers builds for the
checkpoint's text config is instantiated on the meta device, and the prefix is the one under which the
checkpoint holds most of that decoder's weight names. The classifier, the causal LM of the zero-shot baseline
and of label_and_comment, `modules` and every engine read the checkpoint through `read_decoder`; the weights
are then loaded by transformers with `key_mapping`, so the decoder gets transformers' own load-time steps
(its renames, buffer initialisation) and the towers are never loaded.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, PretrainedConfig

from loracls.errors import LoraclsError, first_line

__all__ = ["DecoderCheckpoint", "read_decoder", "load_causal_lm", "text_config_of", "checkpoint_keys"]


def text_config_of(config: PretrainedConfig) -> PretrainedConfig:
    """The language model's config: the config itself for a text-only decoder, its text_config for a wrapper."""
    if hasattr(config, "get_text_config"):
        return config.get_text_config(decoder=True)
    return config


def read_config(model_dir: Path) -> PretrainedConfig:
    try:
        return AutoConfig.from_pretrained(str(model_dir))
    except Exception as exc:
        raise LoraclsError(f"cannot read the model config in {model_dir}: {first_line(exc)}") from None


def checkpoint_keys(model_dir: Path) -> dict[str, int]:
    """Every tensor name in the checkpoint's safetensors files -> its number of elements (headers only)."""
    from safetensors import safe_open

    shapes: dict[str, int] = {}
    for shard in sorted(Path(model_dir).glob("*.safetensors")):
        try:
            with safe_open(str(shard), framework="pt") as tensors:
                for key in tensors.keys():
                    numel = 1
                    for size in tensors.get_slice(key).get_shape():
                        numel *= size
                    shapes[key] = numel
        except Exception as exc:
            raise LoraclsError(f"cannot read the weights file {shard}: {first_line(exc)}") from None
    return shapes


def decoder_weight_names(text_config: PretrainedConfig) -> set[str]:
    """The weight names of the text decoder transformers builds for this config (built on the meta device)."""
    backbone = AutoModel._model_mapping.get(type(text_config), None)
    if backbone is None:
        raise LoraclsError(f"model type {text_config.model_type!r} is not a decoder transformers knows")
    with torch.device("meta"):
        model = backbone(text_config)
    return set(model.state_dict())


def _prefix_votes(keys, names: set[str]) -> Counter:
    """For each prefix P, how many of the decoder's weight names sit in the checkpoint as P + name."""
    votes: Counter = Counter()
    for key in keys:
        parts = key.split(".")
        for cut in range(len(parts)):
            if ".".join(parts[cut:]) in names:
                votes[".".join(parts[:cut]) + ("." if cut else "")] += 1
                break
    return votes


def _group(key: str, prefix: str) -> str:
    """The shortest leading part of `key` that is not a leading part of the decoder's prefix: the tower it is in."""
    parts = key.split(".")
    for cut in range(1, len(parts) + 1):
        head = ".".join(parts[:cut])
        if not prefix.startswith(head + "."):
            return head.removesuffix(".weight")
    return key


@dataclass(frozen=True)
class DecoderCheckpoint:
    """Where a checkpoint keeps its language model, and what else it holds."""

    directory: Path
    config: PretrainedConfig  # the language model's (text) config
    architecture: str  # the checkpoint's top-level class, as its config.json names it
    prefix: str  # the decoder's weights sit under this prefix ("model." for a text-only causal LM)
    lm_head: str | None  # the LM head's key when the checkpoint stores it (untied)
    skipped: dict[str, int] = field(default_factory=dict)  # towers never loaded -> their parameters
    wrapper: bool = False  # the config is a wrapper's: the decoder is its text_config, wherever its weights sit

    @property
    def wrapped(self) -> bool:
        """A multimodal wrapper, told by its config (a text_config that is not the config itself), not by where
        its decoder sits: Qwen2.5-VL keeps its language model under `model.*`, where a text-only one does."""
        return self.wrapper or self.prefix not in ("", "model.")

    def key_mapping(self, base_model_prefix: str = "model") -> dict[str, str] | None:
        """transformers' `key_mapping` that reads the decoder (and the LM head) into a text-only class."""
        if not self.wrapped:
            return None
        mapping = {}
        if self.prefix != base_model_prefix + ".":  # Qwen2.5-VL: already where a text-only class reads it
            mapping["^" + re.escape(self.prefix)] = base_model_prefix + "."
        if self.lm_head and self.lm_head != "lm_head.weight":
            mapping["^" + re.escape(self.lm_head) + "$"] = "lm_head.weight"
        return mapping or None

    def describe(self) -> str | None:
        """One line for the log when the decoder sits inside a wrapper: where, and what is skipped."""
        if not self.wrapped:
            return None
        towers = ", ".join(f"{name} ({count / 1e6:.2f}M)" for name, count in self.skipped.items()) or "none"
        return (
            f"model: {self.architecture} checkpoint: the language model under {self.prefix}*; "
            f"skipped, never loaded: {towers}"
        )


def read_decoder(model_dir: Path) -> DecoderCheckpoint:
    """Find the language model inside the checkpoint in `model_dir` (refusing one that holds none)."""
    config = read_config(model_dir)
    text = text_config_of(config)
    architecture = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    keys = checkpoint_keys(model_dir)
    if not keys:  # no safetensors (a .bin checkpoint): transformers' own layout handling applies
        return DecoderCheckpoint(Path(model_dir), text, architecture, "model.", None, wrapper=text is not config)
    names = decoder_weight_names(text)
    votes = _prefix_votes(keys, names)
    prefix, found = votes.most_common(1)[0] if votes else ("", 0)
    if found * 2 < len(names):
        held = sorted({".".join(key.split(".")[:2]) for key in keys if not key.startswith(prefix) or not found})[:4]
        raise LoraclsError(
            f"checkpoint {model_dir} ({architecture}) holds {found} of its language model's {len(names)} "
            f"weights (it holds {', '.join(held)}); refusing to train on randomly initialised layers"
        )
    lm_head = next((key for key in keys if key.endswith("lm_head.weight")), None)
    skipped: Counter = Counter()
    for key, numel in keys.items():
        if not key.startswith(prefix) and key != lm_head:
            skipped[_group(key, prefix)] += numel
    return DecoderCheckpoint(Path(model_dir), text, architecture, prefix, lm_head, dict(skipped), text is not config)


def load_causal_lm(model_dir: Path, dtype: torch.dtype = torch.float32, log=None):
    """The checkpoint's language model with its LM head, as transformers' text-only causal LM (a wrapper's
    towers are not loaded): the zero-shot baseline and label_and_comment score and write with it."""
    from transformers import AutoModelForCausalLM

    checkpoint = read_decoder(model_dir)
    if log is not None and checkpoint.describe():
        log(checkpoint.describe())
    model_class = AutoModelForCausalLM._model_mapping.get(type(checkpoint.config), None)
    if model_class is None:
        raise LoraclsError(
            f"model type {checkpoint.config.model_type!r} has no causal-LM class in transformers: the zero-shot "
            f"baseline and label_and_comment need one (baselines without zero_shot, baseline: false)"
        )
    try:
        return model_class.from_pretrained(
            str(model_dir), config=checkpoint.config, dtype=dtype, key_mapping=checkpoint.key_mapping()
        )
    except Exception as exc:
        raise LoraclsError(f"cannot load {model_dir} as a causal LM: {first_line(exc, 200)}") from None
