"""Tiny GGUF files written by the `gguf` package's writer from a randomly initialised transformers model: the
tensor names are transformers' own GGUF map read backwards, the metadata keys the ones llama.cpp writes, the
vocabulary a SentencePiece-style one ("▁word"), as llama.cpp's converter stores Gemma's."""

from pathlib import Path

import gguf
import torch
from transformers.modeling_gguf_pytorch_utils import TensorProcessor, get_gguf_hf_weights_map

from conftest import NEGATIVE, NEUTRAL, POSITIVE, SPECIALS

# llama.cpp stores Gemma 2 / 3 RMSNorm weights as 1 + w (transformers' Gemma2TensorProcessor takes the 1 off)
NORM_OFFSET = {"gemma2": 1.0, "gemma3": 1.0}


def _vocabulary() -> list[str]:
    """Every character, then every prefix of every "▁word": a GGUF stores no merges, and transformers rebuilds
    them from pairs of tokens that join into a third."""
    words = ["▁" + word for word in POSITIVE + NEGATIVE + NEUTRAL]
    tokens = sorted({char for word in words for char in word})
    for word in words:
        tokens += [word[:end] for end in range(2, len(word) + 1) if word[:end] not in tokens]
    return SPECIALS + tokens


VOCABULARY = _vocabulary()


def _metadata(writer: gguf.GGUFWriter, config) -> None:
    writer.add_name(f"tiny {config.model_type}")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_embedding_length(config.hidden_size)
    writer.add_key_length(getattr(config, "global_head_dim", None) or config.head_dim)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_sliding_window(config.sliding_window)
    writer.add_vocab_size(config.vocab_size)


def _tokenizer(writer: gguf.GGUFWriter) -> None:
    writer.add_tokenizer_model("llama")
    writer.add_token_list(VOCABULARY)
    writer.add_token_scores([0.0] * len(SPECIALS) + [-float(i) for i in range(len(VOCABULARY) - len(SPECIALS))])
    writer.add_token_types([3] * 3 + [2] + [1] * (len(VOCABULARY) - len(SPECIALS)))  # control; <unk> unknown
    writer.add_pad_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_bos_token_id(2)
    writer.add_unk_token_id(3)


def write_gguf(model: torch.nn.Module, path: Path, architecture: str) -> Path:
    """`model` (a causal LM whose vocabulary is VOCABULARY) as an fp32 GGUF of `architecture`."""
    names = {hf: name for name, hf in get_gguf_hf_weights_map(model, TensorProcessor()).items()}
    writer = gguf.GGUFWriter(str(path), architecture)
    _metadata(writer, model.config)
    _tokenizer(writer)
    offset = NORM_OFFSET.get(architecture, 0.0)
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        value = tensor.float() + (offset if "norm.weight" in key else 0.0)
        writer.add_tensor(names[key], value.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
