"""Augmented transfer texts (data/augment.py): seeded, made of the texts' own words, never a split's text."""

from loracls.data.augment import Augmentation, augmented_texts, words

TEXTS = [
    "a gripping and beautifully shot film about grief",
    "the plot drags and the jokes fall flat",
    "one of the best performances of the year",
]


def test_variants_are_seeded_made_of_the_texts_words_and_never_a_kept_out_text():
    how = Augmentation(copies=20)
    first = augmented_texts(TEXTS, how, seed=7)
    assert first == augmented_texts(TEXTS, how, seed=7) and first != augmented_texts(TEXTS, how, seed=8)
    assert 0 < len(first) <= 20 * len(TEXTS) and len(set(first)) == len(first)
    vocabulary = {word for text in TEXTS for word, _ in words(text)}
    assert all(text and set(text.split()) <= vocabulary for text in first)
    assert not set(first) & set(TEXTS)
    excluded = set(first[:5])
    again = augmented_texts(TEXTS, how, seed=7, exclude=excluded)
    assert not set(again) & excluded and set(first[5:]) <= set(again) | excluded
    # the n-grams: some variants are a few words cut from a text
    assert any(len(text.split()) <= Augmentation(1).max_ngram for text in first)


def test_each_rule_alone_does_what_it_says():
    only_delete = augmented_texts(TEXTS, Augmentation(10, delete=0.5, replace=0, ngram=0), seed=1)
    assert only_delete and all(_is_subsequence(t.split(), _source(t).split()) for t in only_delete)
    only_ngram = augmented_texts(TEXTS, Augmentation(10, delete=0, replace=0, ngram=1, max_ngram=3), seed=1)
    assert only_ngram and all(1 <= len(t.split()) <= 3 and any(t in s for s in TEXTS) for t in only_ngram)
    only_replace = augmented_texts(TEXTS, Augmentation(10, delete=0, replace=0.3, ngram=0), seed=1)
    assert only_replace and all(len(t.split()) in {len(s.split()) for s in TEXTS} for t in only_replace)


def test_a_script_without_spaces_is_augmented_a_character_at_a_time_and_nothing_comes_of_nothing():
    assert [word for word, _ in words("质量很好 ok!")] == ["质", "量", "很", "好", "ok!"]
    variants = augmented_texts(["这本书的质量很好", "物流太慢了"], Augmentation(10, ngram=0), seed=3)
    assert variants and all(" " not in text for text in variants)
    assert augmented_texts(["", "   "], Augmentation(5), seed=0) == []
    assert augmented_texts(TEXTS, Augmentation(0), seed=0) == []


def _source(variant: str) -> str:
    return next(text for text in TEXTS if _is_subsequence(variant.split(), text.split()))


def _is_subsequence(part: list[str], whole: list[str]) -> bool:
    rest = iter(whole)
    return all(word in rest for word in part)
