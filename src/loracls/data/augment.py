"""Augmented transfer texts for distillation (Tang et al. 2019, "Distilling Task-Specific Knowledge from BERT
into Simple Neural Networks", section 3.2): variants of the training texts that the teacher labels, so the
student sees the teacher's answers near the training texts and not only on them.

Each variant is made from one text, word by word: a word is deleted with probability `delete` (the paper's
masking: the teacher is a decoder with no [MASK] token, so the word goes), or replaced with probability `replace`
by a word drawn from all the texts' words by frequency (the paper draws one of the same part of speech: no tagger
is shipped for every language), then with probability `ngram` only a random n-gram of 1 to `max_ngram` words is
kept. A "word" is a run of non-space characters, or one character of a script written without spaces (Chinese,
Japanese), each keeping the spaces that followed it. Variants that are empty, repeated, or equal to a text of the
data's splits are dropped. Seeded: the same texts and seed give the same variants.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

__all__ = ["Augmentation", "augmented_texts", "words"]

_UNSPACED = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # kana and CJK ideographs: one word a character
_WORD = re.compile(rf"([{_UNSPACED}]|[^\s{_UNSPACED}]+)(\s*)")


@dataclass(frozen=True)
class Augmentation:
    """How the variants are made (the paper's probabilities)."""

    copies: int  # variants tried per text (fewer are kept where they repeat)
    delete: float = 0.1  # each word's chance to be deleted
    replace: float = 0.1  # each word's chance to be replaced by a word of the texts, drawn by frequency
    ngram: float = 0.25  # the variant's chance to be cut to one n-gram
    max_ngram: int = 5  # the n-gram's words: 1 to this many


def words(text: str) -> list[tuple[str, str]]:
    """The text's words, each with the spaces that followed it."""
    return [(match.group(1), match.group(2)) for match in _WORD.finditer(text)]


def augmented_texts(texts: list[str], how: Augmentation, seed: int, exclude: set[str] = frozenset()) -> list[str]:
    """`how.copies` variants of each text (module docstring), in the texts' order, without empty ones, repeats
    or texts in `exclude` (the splits' texts; the texts themselves are always left out)."""
    split = [words(text) for text in texts]
    vocabulary = [word for text in split for word, _ in text]
    if how.copies <= 0 or not vocabulary:
        return []
    rng = np.random.default_rng(seed)
    seen, kept = set(exclude) | set(texts), []
    for text in split:
        for _ in range(how.copies):
            variant = _variant(text, vocabulary, how, rng)
            if variant and variant not in seen:
                seen.add(variant)
                kept.append(variant)
    return kept


def _variant(text: list[tuple[str, str]], vocabulary: list[str], how: Augmentation, rng) -> str:
    changed = []
    for word, space in text:
        draw = rng.random()
        if draw < how.delete:
            continue
        if draw < how.delete + how.replace:
            word = vocabulary[rng.integers(len(vocabulary))]
        changed.append((word, space))
    if changed and rng.random() < how.ngram:
        length = min(len(changed), int(rng.integers(1, how.max_ngram + 1)))
        start = int(rng.integers(len(changed) - length + 1))
        changed = changed[start : start + length]
    return "".join(word + space for word, space in changed).strip()
