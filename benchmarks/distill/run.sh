#!/usr/bin/env bash
# loracls 15's measurement: each finished LoRA run of the defaults study (benchmarks/study13/run.sh OUT: the
# `defaults` variant, 2000 training texts a set) distilled into MiniLM with the texts its splits left out as the
# unlabeled set (at most MAX_UNLABELED, default 3000), 1 thread; the student's record is kept under
# benchmarks/distill/results/SET.json (committed), beside the same MiniLM fine-tuned on the gold labels alone
# (the study's `encoders` run of the set, or, where that has not run, `loracls baseline` with MiniLM alone: the
# same early stopping and learning-rate grid, kept as results/gold-SET.json) and the teacher. Resumable: a set
# with a kept record is skipped; the teacher's scores are cached in the run. The teacher's metrics.json is kept
# beside each record (results/teacher-SET[-TAG].json): a teacher trained again (study13's REBUILD=1) is the
# one its records are read against.
# MAX_UNLABELED=N, WEIGHTS=0.5,1 (the teacher weights tried) and TAG=NAME (the record kept as SET-NAME.json,
# e.g. TAG=all MAX_UNLABELED=20000 WEIGHTS=1: every left-out text, one weight) and STUDENT_LAYERS=N (the student
# keeps N of MiniLM's 6 layers: `--student-layers`) and AUGMENT=K (K variants of each training text labelled by
# the teacher too: `--augment`) and TEMPERATURE=T (the distillation temperature: `--temperature`) vary the
# measurement.
# Table: python3 benchmarks/distill/summarize.py STUDY_OUT
# Usage: bash benchmarks/distill/run.sh STUDY_OUT [SET ...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(cd "$1" && pwd)"
shift
sets=("$@")
[ ${#sets[@]} -gt 0 ] || sets=(rt chinese tweets imbalanced emotions)
mkdir -p "$here/results"
for set in "${sets[@]}"; do
  run="$out/runs/defaults-$set"
  kept="$here/results/$set${TAG:+-$TAG}.json"
  [ -f "$kept" ] && continue
  [ -f "$run/metrics.json" ] || { echo "distill: $run has not finished; skipped"; continue; }
  echo "$(date -u +%FT%TZ) distill $set"
  OMP_NUM_THREADS=1 python3 -m loracls distill "$run" --student minilm --max-unlabeled "${MAX_UNLABELED:-3000}" \
    --weights "${WEIGHTS:-0.5,1}" ${STUDENT_LAYERS:+--student-layers "$STUDENT_LAYERS"} \
    ${AUGMENT:+--augment "$AUGMENT"} ${TEMPERATURE:+--temperature "$TEMPERATURE"} >> "$out/logs/distill-$set${TAG:+-$TAG}.log" 2>&1 && cp "$run/student.json" "$kept" \
    && cp "$run/metrics.json" "$here/results/teacher-$set${TAG:+-$TAG}.json" \
    || echo "failed: distill $set" >> "$out/logs/progress.txt"
done
for set in "${sets[@]}"; do  # the gold-label MiniLM where the study's encoders runs of the set are missing
  run="$out/runs/defaults-$set"
  study="$here/../study13/results/runs"  # the study's encoders run, in one process or one a learning rate
  [ -f "$here/results/gold-$set.json" ] || [ -f "$study/encoders-$set.json" ] && continue
  compgen -G "$study/enc_minilm_*-$set.json" > /dev/null && continue
  [ -f "$run/metrics.json" ] || continue
  echo "$(date -u +%FT%TZ) gold MiniLM $set"
  OMP_NUM_THREADS=1 python3 -m loracls baseline "$run/config.yaml" --set baseline=true "baselines=[encoder]" \
    encoder_model=minilm > "$out/runs/gold-$set.json.part" 2>> "$out/logs/gold-$set.log" \
    && mv "$out/runs/gold-$set.json.part" "$here/results/gold-$set.json" \
    || echo "failed: gold $set" >> "$out/logs/progress.txt"
done
