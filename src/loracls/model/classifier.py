"""The classifier: a decoder + a sequence classification head. transformers' own *ForSequenceClassification
where it has one, else `classifier_class` builds one from transformers' generic last-non-pad-token head.
Loading refuses checkpoints missing weights beyond the head and layers offloaded to CPU."""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    PreTrainedModel,
)
from transformers.modeling_layers import GenericForSequenceClassification
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

from loracls.errors import Log, LoraclsError, first_line
from loracls.model import pooling as pooling_module
from loracls.model.checkpoint import read_config, read_decoder, text_config_of
from loracls.model.lora import HEAD_NAMES, head_name
from loracls.model.pooling import MeanPooling
from loracls.model.tokenizer import load_tokenizer
from loracls.problems import problem_for

HEAD_PREFIXES = tuple(f"{name}." for name in HEAD_NAMES)
GENERIC_MODULE = "modeling_loracls_generic.py"


def _pretrained_base(model_class: type) -> type:
    for base in model_class.__mro__[1:]:
        if issubclass(base, PreTrainedModel) and base is not PreTrainedModel:
            return base
    return PreTrainedModel


def classifier_class(config, pooling: str = "last", wrapped: bool = False) -> type:
    """transformers' own *ForSequenceClassification, else a generic head on the last non-pad token; with
    `pooling: mean` always the generic head, with MeanPooling's forward. A decoder is a config transformers
    has a causal LM for, or (`wrapped`) the text config of a multimodal checkpoint's language model, which
    may be registered under AutoModel alone."""
    # transformers' own classes only: loading a generic-head export with trust_remote_code registers its
    # class in the auto mapping for the rest of the process, which must not replace ours
    if pooling == "last" and config.model_type in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES:
        return AutoModelForSequenceClassification._model_mapping[type(config)]
    decoder = type(config) in AutoModelForCausalLM._model_mapping or wrapped
    if not decoder or type(config) not in AutoModel._model_mapping:
        raise LoraclsError(f"model type {config.model_type!r} is not a decoder transformers knows")
    backbone = AutoModel._model_mapping[type(config)]
    name = backbone.__name__.removesuffix("Model") + "ForSequenceClassification"
    pooled = (MeanPooling,) if pooling == "mean" else ()
    return type(
        name,
        (*pooled, GenericForSequenceClassification, _pretrained_base(backbone)),
        {
            "config_class": type(config),
            "__module__": __name__,
            "loracls_generic_head": True,
            "loracls_pooling": pooling,
            **transformers_own_class_flags(backbone),
        },
    )


def transformers_own_class_flags(backbone: type) -> dict:
    """Class attributes that make transformers treat the generic head as its own class: it reads a class's
    source to decide whether attention / experts implementations can be set, and skips its load-time key
    renames and buffer initialisation for classes defined outside it (Qwen3.5 and Gemma 3n load only so)."""
    return {
        "is_custom_code": classmethod(_not_custom_code),
        "_can_set_attn_implementation_cached_value": backbone._can_set_attn_implementation(),
        "_can_set_experts_implementation_cached_value": backbone._can_set_experts_implementation(),
    }


def _not_custom_code(cls) -> bool:
    """transformers' GenericForSequenceClassification on transformers' own decoder: not custom code."""
    return False


def is_generic(model_class: type) -> bool:
    return getattr(model_class, "loracls_generic_head", False)


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: object
    model_dir: Path
    hidden_size: int
    parameters: int


def quantization_kwargs(quantization: str) -> dict:
    """from_pretrained arguments for QLoRA (bitsandbytes on a GPU; checked by the caller)."""
    if quantization == "none":
        return {}
    from transformers import BitsAndBytesConfig

    if quantization == "4bit":
        config = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
    else:
        config = BitsAndBytesConfig(load_in_8bit=True)
    return {"quantization_config": config, "device_map": {"": 0}}


def check_max_length(model_dir: Path, max_length: int) -> None:
    """max_length must fit the model's positions (beyond them a model reads garbage or fails mid-run)."""
    config = text_config_of(read_config(model_dir))
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and max_length > positions:
        raise LoraclsError(
            f"config: max_length {max_length} is beyond the model's {positions} positions "
            f"({model_dir}); use max_length <= {positions}"
        )


@dataclass(frozen=True)
class HeadSpec:
    """The classification head a decoder gets: for which `problem` (its loss and saved problem_type), how it
    starts (`init`: zero, or transformers' random init), what it reads (`pooling`: the last token, or the mean
    over the text's tokens) and whether the family's attention is switched to `bidirectional`."""

    problem: str = "single_label"
    init: str = "zero"
    pooling: str = "last"
    bidirectional: bool = False

    @classmethod
    def of(cls, config) -> HeadSpec:
        """A run's head (a verbalizer head starts at zero and is filled from the label words afterwards)."""
        init = "random" if config.head_init == "random" else "zero"
        return cls(config.problem, init, config.pooling, config.bidirectional_attention)


def load_classifier(
    model_dir: Path,
    id2label: dict[int, str],
    dtype: torch.dtype = torch.float32,
    log: Log = print,
    quantization: str = "none",
    head: HeadSpec = HeadSpec(),
) -> LoadedModel:
    """Base decoder + a new classification head (`head`: zeros or transformers' random init, reading the last
    token or the mean over the text's tokens, bidirectional attention where the family's config has that
    switch). Refuses checkpoints missing weights beyond the head."""
    problem, pooling, bidirectional = head.problem, head.pooling, head.bidirectional
    tokenizer = load_tokenizer(model_dir, log)
    checkpoint = read_decoder(model_dir)
    config = checkpoint.config
    config.num_labels = len(id2label)
    config.id2label = {int(i): name for i, name in id2label.items()}
    config.label2id = {name: int(i) for i, name in id2label.items()}
    config.pad_token_id = tokenizer.pad_token_id
    # saved with the merged model: transformers' pipeline then applies a sigmoid for label sets
    config.problem_type = problem_for(problem).hf_problem_type
    if bidirectional:
        use_bidirectional_attention(config)
    if pooling != "last":
        config.loracls_pooling = pooling  # saved with the exports: what the head reads
    model_class = classifier_class(config, pooling, checkpoint.wrapped)
    if checkpoint.describe():
        log(checkpoint.describe())
    try:
        model, info = model_class.from_pretrained(
            str(model_dir),
            config=config,
            dtype=dtype,
            output_loading_info=True,
            key_mapping=checkpoint.key_mapping(model_class.base_model_prefix),
            **quantization_kwargs(quantization),
        )
    except Exception as exc:
        raise LoraclsError(f"cannot load model weights from {model_dir}: {first_line(exc)}") from None
    check_loaded_weights(info, model_dir)
    check_no_offload(model)
    if head.init == "zero":
        zero_new_head(model, info)
    if quantization != "none":
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))
    hidden = config.hidden_size
    parameters = sum(p.numel() for p in model.parameters())
    log(
        f"model: {model_class.__name__}{' (generic head)' if is_generic(model_class) else ''}, "
        f"hidden size {hidden}, {parameters / 1e6:.1f}M parameters, {config.num_hidden_layers} layers"
    )
    return LoadedModel(model, tokenizer, model_dir, hidden, parameters)


def zero_new_head(model, info: dict) -> None:
    """A new head starts at zero: uniform predictions, loss ln(num_labels), no random bias to unlearn.

    transformers' normal(0, 0.02) init times the large final hidden states of Gemma gives logits of a few
    units and a starting loss near 2.7; measured on the embedded job (2000 examples, one epoch), validation
    accuracy 0.69 with that init against 0.86 with zeros. LoRA's B is zero too, so the first step trains the
    head alone and the next ones the adapters as well."""
    new = [k for k in info.get("missing_keys", []) if k.startswith(HEAD_PREFIXES)]
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in new:
                param.zero_()


def check_no_offload(model) -> None:
    """Layers offloaded to CPU/disk by a device map run far slower than fitting the batch with accumulation."""
    placement = getattr(model, "hf_device_map", None) or {}
    offloaded = sorted(name for name, where in placement.items() if str(where) in ("cpu", "disk"))
    if offloaded and any(str(where) not in ("cpu", "disk") for where in placement.values()):
        raise LoraclsError(
            f"{len(offloaded)} module(s) were offloaded to CPU/disk (e.g. {offloaded[0]}): offload was "
            f"measured ~6x slower than gradient accumulation; lower micro_batch_size and raise "
            f"gradient_accumulation, or use quantization: 4bit"
        )


def check_loaded_weights(info: dict, source) -> None:
    missing = [k for k in info.get("missing_keys", []) if not k.startswith(HEAD_PREFIXES)]
    if missing:
        shown = ", ".join(sorted(missing)[:3])
        raise LoraclsError(
            f"checkpoint {source} is missing {len(missing)} weight(s) beyond the head (e.g. {shown}); "
            f"refusing to train on randomly initialised layers"
        )


def use_bidirectional_attention(config) -> None:
    """The family's own switch to bidirectional attention (Gemma 3: True; Gemma 4: "all")."""
    if not hasattr(config, "use_bidirectional_attention"):
        raise LoraclsError(
            f"bidirectional_attention: {config.model_type} has no use_bidirectional_attention switch in its config"
        )
    takes_a_word = isinstance(config.use_bidirectional_attention, str) or config.model_type.startswith("gemma4")
    config.use_bidirectional_attention = "all" if takes_a_word else True


def write_generic_module(directory: Path, model_class: type) -> None:
    """Make a generic-head model directory loadable by plain transformers (trust_remote_code=True); a
    mean-pooling head carries MeanPooling's source with it."""
    base, config_class = _pretrained_base(model_class), model_class.config_class
    flags = transformers_own_class_flags(base)
    mean = getattr(model_class, "loracls_pooling", "last") == "mean"
    pooling_source = inspect.getsource(pooling_module) + "\n\n" if mean else ""
    source = (
        pooling_source
        + '"""Written by loracls: a sequence classifier for a decoder transformers has no head class for."""\n'
        "from transformers.modeling_layers import GenericForSequenceClassification\n"
        f"from {base.__module__} import {base.__name__}\n"
        f"from {config_class.__module__} import {config_class.__name__}\n\n\n"
        f"class {model_class.__name__}({'MeanPooling, ' if mean else ''}GenericForSequenceClassification, "
        f"{base.__name__}):\n"
        f"    config_class = {config_class.__name__}\n"
        "    loracls_generic_head = True\n"
        "    # transformers' own head on its own decoder: its load-time steps apply as to its own classes\n"
        f"    _can_set_attn_implementation_cached_value = {flags['_can_set_attn_implementation_cached_value']}\n"
        f"    _can_set_experts_implementation_cached_value = {flags['_can_set_experts_implementation_cached_value']}\n"
        "\n"
        "    @classmethod\n"
        "    def is_custom_code(cls):\n"
        "        return False\n"
    )
    (directory / GENERIC_MODULE).write_text(source)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = {"AutoModelForSequenceClassification": f"{GENERIC_MODULE[:-3]}.{model_class.__name__}"}
    config_path.write_text(json.dumps(config, indent=2) + "\n")


def load_standalone(directory: Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """Load a merged model directory the way a user with plain transformers would; a damaged one (a cut
    safetensors file, a broken config.json) is one line for every caller: predict, serve, export, distill."""
    try:
        remote_code = "auto_map" in json.loads((directory / "config.json").read_text())  # a generic-head export
        return AutoModelForSequenceClassification.from_pretrained(
            str(directory), dtype=dtype, trust_remote_code=remote_code
        )
    except Exception as exc:
        raise LoraclsError(f"cannot load {directory} as a sequence classifier: {first_line(exc, 200)}") from None


def lm_head_weight(model, model_dir: Path) -> torch.Tensor:
    """The causal LM's output embedding: the input embedding when tied, else `lm_head.weight` read from the
    checkpoint (a classifier does not load it)."""
    if getattr(model.config, "tie_word_embeddings", False):
        return model.get_input_embeddings().weight
    from safetensors import safe_open

    for shard in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as tensors:
            if "lm_head.weight" in tensors.keys():
                return tensors.get_tensor("lm_head.weight")
    raise LoraclsError(f"head_init: verbalizer needs the LM head's weights, and {model_dir} has no lm_head.weight")


def init_head_from_verbalizers(model, model_dir: Path, token_ids: list[int]) -> None:
    """Row k of the classification head = the LM head's row for label k's verbalizer token, so that before
    any training the classifier computes the zero-shot prompt's label logits (for one-token verbalizers)."""
    head = getattr(model, head_name(model))
    rows = lm_head_weight(model, model_dir)[torch.tensor(token_ids)]
    with torch.no_grad():
        head.weight.copy_(rows.to(head.weight.dtype))
        if getattr(head, "bias", None) is not None:
            head.bias.zero_()
