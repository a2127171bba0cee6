#!/usr/bin/env bash
# End-to-end rehearsal of one verl line with assertions: fresh run to step 2 (ckpt), resume to step 3, merge.
# Usage: rehearse_line.sh 071|091   (needs the env cluster on $WEBSHOP_URL, default :36113)
set -euo pipefail
S=/work/scratch-rehearse; L=$1; R=$S/run$L
case $L in 071) PY=/work/main/.venv/bin/python;; 091) PY=/work/main/.venv-verl09/bin/python;; esac
rm -rf $R; mkdir -p $R
t0=$(date +%s)
$S/run$L.sh 2 > $R/run_a.log 2>&1 || { echo "FAIL run to step 2"; tail -30 $R/run_a.log; exit 1; }
t1=$(date +%s)
test -d $R/ckpt/global_step_2/actor || { echo "FAIL no global_step_2"; exit 1; }
$S/run$L.sh 3 > $R/run_b.log 2>&1 || { echo "FAIL resume"; tail -30 $R/run_b.log; exit 1; }
t2=$(date +%s)
grep -q "Resuming from $R/ckpt/global_step_2\|Resuming from .*global_step_2" $R/run_b.log || { echo "FAIL no resume line"; exit 1; }
grep -q "step:3 " $R/run_b.log || { echo "FAIL no step 3"; exit 1; }
test -d $R/ckpt/global_step_3/actor || { echo "FAIL no global_step_3"; exit 1; }
(cd $R && $PY -m verl.model_merger merge --backend fsdp --local_dir ckpt/global_step_3/actor --target_dir merged > merge.log 2>&1)
$PY -c "from transformers import AutoModelForCausalLM as A; A.from_pretrained('$R/merged')" 2>/dev/null || { echo "FAIL merged model does not load"; exit 1; }
t3=$(date +%s)
# weight sync: checksums pushed to the rollout servers (first run's last == resumed run's first)
last_a=$(grep -o "checksum=[0-9.]*" $R/run_a.log | tail -1); first_b=$(grep -o "checksum=[0-9.]*" $R/run_b.log | head -1)
[ "$last_a" = "$first_b" ] || { echo "FAIL resumed weights differ: $last_a vs $first_b"; exit 1; }
echo "OK verl line $L: run $((t1-t0))s resume $((t2-t1))s merge $((t3-t2))s; synced weights after resume: $first_b"
grep -o "training/rollout_probs_diff_mean:[^ ]*" $R/run_b.log | tail -1 || true
