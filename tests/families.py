"""Tiny randomly initialised checkpoints of the released model families: the same top-level class (the one
each official config.json names in `architectures`) and the same on-disk key layout, written from configs in
the suite (no download). A new family is one line in FAMILIES."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from unittest.mock import patch

import torch
import transformers

from conftest import TINY_DECODER as TEXT  # the sizes every tiny decoder of the suite shares

SLIDING = dict(sliding_window=16, layer_types=["sliding_attention", "full_attention"])
HYBRID = dict(layer_types=["linear_attention", "full_attention"])
LINEAR_ATTENTION = dict(
    linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8
)
GEMMA4_TEXT = dict(
    **SLIDING,
    vocab_size_per_layer_input=None,
    hidden_size_per_layer_input=8,
    global_head_dim=16,
    num_kv_shared_layers=0,
)
GEMMA4_VISION = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=8,
    patch_size=4,
    position_embedding_size=64,
    pooling_kernel_size=2,
)
GEMMA4_AUDIO = dict(
    hidden_size=16, num_hidden_layers=1, num_attention_heads=2, subsampling_conv_channels=[8, 4], output_proj_dims=32
)
SIGLIP = dict(
    hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=4
)
PIXTRAL = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    head_dim=8,
    image_size=16,
    patch_size=4,
)
QWEN25_VISION = dict(
    depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, fullatt_block_indexes=[0]
)
QWEN_VISION = dict(
    depth=1,
    hidden_size=16,
    intermediate_size=32,
    num_heads=2,
    out_hidden_size=32,
    num_position_embeddings=16,
    patch_size=4,
)
GEMMA3N_AUDIO = dict(
    input_feat_size=16,
    hidden_size=32,
    conf_num_attention_heads=2,
    conf_num_hidden_layers=1,
    sscp_conv_channel_size=[8, 4],
)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


@dataclass(frozen=True)
class Family:
    """One released layout: `model_type` of its config.json, the class in `architectures`, and the tiny sizes
    (`text` for a text-only config; a wrapper's `text_config` plus its towers' configs)."""

    name: str
    model_type: str
    architecture: str
    text: dict = field(default_factory=dict)
    towers: dict = field(default_factory=dict)  # sub-config name -> its sizes
    wrapper: dict = field(default_factory=dict)  # the wrapper config's own fields
    fused_targets: bool = False  # the default q_proj, v_proj match nothing (fused qkv_proj)
    moe: bool = False
    byte_level: bool = False  # transformers forces a byte-level BPE tokenizer class on this model type

    @property
    def multimodal(self) -> bool:
        return bool(self.towers) or "text_config" in self.wrapper or self.architecture.endswith("Generation")


FAMILIES = [
    # text-only decoders
    Family("gemma3-270m", "gemma3_text", "Gemma3ForCausalLM", dict(**SLIDING)),
    Family("qwen3", "qwen3", "Qwen3ForCausalLM"),
    Family("llama", "llama", "LlamaForCausalLM"),
    Family("phi3", "phi3", "Phi3ForCausalLM", dict(num_key_value_heads=2), fused_targets=True),
    Family("qwen3-moe", "qwen3_moe", "Qwen3MoeForCausalLM", dict(**MOE, num_local_experts=4), moe=True),
    Family("olmo-hybrid", "olmo_hybrid", "OlmoHybridForCausalLM", dict(**HYBRID, **LINEAR_ATTENTION)),
    # multimodal wrappers: the language model under model.language_model.* (or language_model.model.*)
    Family(
        "gemma4-e2b",
        "gemma4",
        "Gemma4ForConditionalGeneration",
        GEMMA4_TEXT,
        {"vision_config": GEMMA4_VISION, "audio_config": GEMMA4_AUDIO},
    ),
    Family(
        "gemma4-26b-a4b",
        "gemma4",
        "Gemma4ForConditionalGeneration",
        dict(**GEMMA4_TEXT, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32),
        {"vision_config": GEMMA4_VISION},
        moe=True,
    ),
    Family("gemma4-31b", "gemma4", "Gemma4ForConditionalGeneration", GEMMA4_TEXT, {"vision_config": GEMMA4_VISION}),
    Family("gemma4-12b-unified", "gemma4_unified", "Gemma4UnifiedForConditionalGeneration", GEMMA4_TEXT),
    Family("gemma3-4b", "gemma3", "Gemma3ForConditionalGeneration", dict(**SLIDING), {"vision_config": SIGLIP}),
    Family(
        "gemma3n-e2b",
        "gemma3n",
        "Gemma3nForConditionalGeneration",
        dict(
            **SLIDING,
            vocab_size_per_layer_input=None,
            hidden_size_per_layer_input=8,
            num_kv_shared_layers=0,
            intermediate_size=[64, 64],
            activation_sparsity_pattern=[0.0, 0.0],
            laurel_rank=4,
            altup_num_inputs=2,
        ),
        {"vision_config": dict(hidden_size=32), "audio_config": GEMMA3N_AUDIO},
    ),
    # Qwen2.5-VL: a wrapper whose language model sits under model.*, where a text-only decoder's does (the
    # vision tower under visual.*): told by its config, not its prefix
    Family(
        "qwen2.5-vl",
        "qwen2_5_vl",
        "Qwen2_5_VLForConditionalGeneration",
        {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}},
        {"vision_config": dict(QWEN25_VISION)},
        byte_level=True,
    ),
    Family("ministral3", "mistral3", "Mistral3ForConditionalGeneration", {}, {"vision_config": PIXTRAL}),
    Family(
        "qwen3.5-moe",
        "qwen3_5_moe",
        "Qwen3_5MoeForConditionalGeneration",
        dict(**HYBRID, **LINEAR_ATTENTION, **MOE, shared_expert_intermediate_size=32),
        {"vision_config": QWEN_VISION},
        moe=True,
        byte_level=True,
    ),
]
BY_NAME = {family.name: family for family in FAMILIES}


def _text_fields(family: Family, vocab_size: int) -> dict:
    fields = {**TEXT, **family.text, "vocab_size": vocab_size}
    if "vocab_size_per_layer_input" in fields:
        fields["vocab_size_per_layer_input"] = vocab_size
    return fields


def family_config(family: Family, vocab_size: int):
    config_class = transformers.CONFIG_MAPPING[family.model_type]
    text = _text_fields(family, vocab_size)
    if "text_config" not in config_class.sub_configs:
        return config_class(**text)
    config = config_class(text_config=text, **family.wrapper, **family.towers)
    for name in ("vision_config", "audio_config"):  # towers the family's release does not ship
        if name in config_class.sub_configs and name not in family.towers and hasattr(config, name):
            setattr(config, name, None)
    return config


class TimmStandIn(torch.nn.Module):
    """Gemma 3n's vision tower is a timm model; where timm is not installed, a module with a timm key layout
    stands in for it (loracls never loads a tower: what matters is that its weights sit in the checkpoint)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.timm_model = torch.nn.ModuleDict({"conv_stem": torch.nn.Conv2d(3, config.hidden_size, 3)})


@contextmanager
def towers_without_backends():
    from transformers.utils import is_timm_available

    if is_timm_available():
        yield
        return
    original = transformers.AutoModel.from_config

    def from_config(config, **kwargs):
        if type(config).__name__.endswith("VisionConfig") and hasattr(config, "architecture"):
            return TimmStandIn(config)
        return original(config, **kwargs)

    with patch.object(transformers.AutoModel, "from_config", from_config):
        yield


def byte_level_tokenizer():
    """A byte-level BPE trained on the synthetic words (Qwen3.5's tokenizer class rebuilds one from the
    saved vocabulary and merges, and reads a word-level tokenizer's texts as no tokens at all)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from conftest import NEGATIVE, NEUTRAL, POSITIVE, SPECIALS

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, initial_alphabet=alphabet)
    words = POSITIVE + NEGATIVE + NEUTRAL + [str(i) for i in range(100)]
    backend.train_from_iterator([" ".join(words)] * 20 + words, trainer)
    specials = {"eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>", "pad_token": "<pad>"}
    return PreTrainedTokenizerFast(tokenizer_object=backend, **specials)


def write_family(directory: Path, family: Family, tokenizer=None) -> Path:
    """A checkpoint of the family's released class, written by save_pretrained (its on-disk layout)."""
    from conftest import make_tokenizer

    torch.manual_seed(0)
    tokenizer = byte_level_tokenizer() if family.byte_level else (tokenizer or make_tokenizer())
    config = family_config(family, len(tokenizer))
    config.architectures = [family.architecture]
    with towers_without_backends():
        model = getattr(transformers, family.architecture)(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
