"""Tokenizer: fast, falling back to slow; a pad token from eos/unk when missing (the classifier pools the
last non-pad token, so a missing pad token is a silent failure, not a crash)."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from loracls.errors import Log, LoraclsError, first_line


def load_tokenizer(model_dir: Path, log: Log = print):
    """Fast tokenizer, falling back to the slow one; pad token set from eos/unk when missing."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), use_fast=True)
    except Exception as fast_error:
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(model_dir), use_fast=False)
            log(f"tokenizer: fast tokenizer failed ({first_line(fast_error)}); using the slow one")
        except Exception as slow_error:
            raise LoraclsError(f"cannot load a tokenizer from {model_dir}: {first_line(slow_error)}") from None
    fix_special_tokens(tokenizer, log)
    tokenizer.padding_side = "right"
    return tokenizer


def fix_special_tokens(tokenizer, log: Log = print) -> list[str]:
    """Give the tokenizer a pad token (from eos, else unk, else a new <pad>); say what was changed."""
    notes = []
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
            notes.append(f"tokenizer: no pad token; using eos {tokenizer.eos_token!r} as pad")
        elif tokenizer.unk_token is not None:
            tokenizer.pad_token = tokenizer.unk_token
            notes.append(f"tokenizer: no pad token; using unk {tokenizer.unk_token!r} as pad")
        else:
            tokenizer.add_special_tokens({"pad_token": "<pad>"})
            notes.append("tokenizer: no pad, eos or unk token; added a new '<pad>' token (embeddings resized)")
    if tokenizer.unk_token is None:
        notes.append("tokenizer: no unk token (fine for byte-level tokenizers; unknown characters are bytes)")
    for note in notes:
        log(note)
    return notes
