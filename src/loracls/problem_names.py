"""The problem types by name, with what each predicts: what the config needs to check `problem` without
importing the problems themselves (they import torch; a bad config is refused before torch loads).
loracls.problems registers one Problem per name here (a test checks the two agree)."""

__all__ = ["PROBLEM_SUMMARIES"]

PROBLEM_SUMMARIES = {
    "single_label": "one label a text (softmax)",
    "multi_label": "a set, maybe empty (sigmoid)",
    "label_and_comment": "one label a text, scored by the causal LM, and a short generated comment",
}
