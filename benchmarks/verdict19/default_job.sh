#!/usr/bin/env bash
# loracls 19: the default job (the README's first command, `python3 -m loracls train`) at the shipped defaults,
# with mpnet-base in the verdict and the ensemble row. One thread, pinned to one core (taskset -c CORE, default
# 1), so that other work on the other core does not change its timing much; the README's wall time is this
# figure (an upper bound for the same job on both cores). Resumable: a killed job is continued with
# `train --resume`; a finished one is not run again. Its small files are copied to results/default_job/.
# Usage: bash benchmarks/verdict19/default_job.sh OUT [CORE]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(mkdir -p "$1" && cd "$1" && pwd)"
core="${2:-1}"
run="$out/default_job"
kept="$here/results/default_job"
[ -f "$kept/metrics.json" ] && { echo "done already: $kept"; exit 0; }
export OMP_NUM_THREADS=1
if [ -f "$run/config.yaml" ] && [ ! -f "$run/metrics.json" ]; then
  taskset -c "$core" python3 -m loracls train --resume "$run" >> "$out/default_job.log" 2>&1
elif [ ! -f "$run/metrics.json" ]; then
  /usr/bin/time -v taskset -c "$core" python3 -m loracls train --set threads=1 --set output_dir="$out" \
    --set run_name=default_job >> "$out/default_job.log" 2>&1
fi
mkdir -p "$kept"
cp "$run"/{metrics.json,train_log.jsonl,config.yaml,encoder.json} "$kept/"
[ -f "$run/ensemble.json" ] && cp "$run/ensemble.json" "$kept/"
tail -n 40 "$out/default_job.log" > "$kept/log_tail.txt"
echo "kept in $kept"
