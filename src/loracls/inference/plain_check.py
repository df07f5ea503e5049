"""An export read back the way a user reads it: a fresh Python process that imports transformers and nothing
of loracls, loads the directory with `AutoModelForSequenceClassification` (`trust_remote_code=True` only for
the generic head's module), applies transformers' pipeline rule (softmax, or a sigmoid for
`multi_label_classification`) and returns probabilities. A load-time key mapping, a registered class or a
temperature kept outside the weights would all pass an in-process check and fail here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from loracls import files
from loracls.errors import LoraclsError, first_line
from loracls.runs import InputFormat

PLAIN_TEXTS = 200  # the first test texts read back in the fresh process (one forward each)

# the child process: transformers only
_CHILD = """
import json, sys
import torch
from transformers import AutoModelForSequenceClassification
directory, inputs, output = sys.argv[1:4]
job = json.load(open(inputs))
model = AutoModelForSequenceClassification.from_pretrained(
    directory, trust_remote_code=job["remote_code"], dtype=torch.float32).eval()
sigmoid = model.config.problem_type == "multi_label_classification"
rows = []
with torch.no_grad():
    for ids in job["ids"]:
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
        rows.append((logits.sigmoid() if sigmoid else logits.softmax(-1)).tolist())
json.dump(rows, open(output, "w"))
"""


def plain_probabilities(directory: Path, ids: list[list[int]]) -> np.ndarray:
    """Probabilities from a fresh process with plain transformers (see the module's doc)."""
    remote_code = "auto_map" in json.loads((directory / "config.json").read_text())
    with tempfile.TemporaryDirectory(prefix="loracls-plain-") as scratch:
        inputs, output = Path(scratch) / "in.json", Path(scratch) / "out.json"
        inputs.write_text(json.dumps({"ids": ids, "remote_code": remote_code}))
        env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(directory), str(inputs), str(output)],
            capture_output=True,
            text=True,
            env=env,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise LoraclsError(f"plain transformers cannot load the export in {directory}: {first_line(last, 240)}")
        return np.asarray(json.loads(output.read_text()), dtype=np.float32)


def plain_transformers_probabilities(directory: Path, ids: list[list[int]]) -> np.ndarray:
    """The first PLAIN_TEXTS test texts' probabilities through plain transformers in a fresh process (the
    export compares them with the adapter's, as its in-process check does)."""
    return plain_probabilities(directory, ids[:PLAIN_TEXTS])


def write_model_card(directory: Path, config, fmt: InputFormat) -> None:
    """README.md: what a client needs beyond the weights (the input format, and the decision where it is not
    already in them)."""
    labels = [config.id2label[i] for i in range(len(config.id2label))]
    thresholds = getattr(config, "loracls_thresholds", None)
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-classification",
        "tags: [loracls, lora, text-classification]",
        "---",
        "# A loracls classifier (LoRA merged)",
        "",
        f"Labels: {', '.join(labels)}. Problem type: `{config.problem_type}`.",
        "",
        "```python",
        "from transformers import pipeline",
        'classify = pipeline("text-classification", model="PATH"'
        + (", trust_remote_code=True" if "auto_map" in json.loads((directory / "config.json").read_text()) else "")
        + ", top_k=None)",
        "```",
        "",
        f"Inputs: max_length {fmt.max_length} tokens; texts longer are handled by `{fmt.long_text}` in loracls.",
    ]
    if fmt.input_template:
        lines.append(f"Each text is placed in the template `{fmt.input_template!r}` before tokenizing.")
    if thresholds:
        cut = ", ".join(f"{name} {value:.3f}" for name, value in thresholds.items())
        lines.append(f"A label is chosen where its sigmoid probability is at or above its threshold: {cut}")
    else:
        lines.append("The softmax of the logits is the calibrated probability (the fitted temperature is in the head).")
    files.write_text(directory / "README.md", "\n".join(lines) + "\n")
