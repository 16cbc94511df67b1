#!/bin/bash
# Session 33, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session33_ncu.sh
# The compiled draft-tree tests, then ncu (short metric list) on the conv and SSM launches of
# one B=32 call of 16 rows (capacity 16): compact chain and tree, snapshot chain, tree
# (refold) and tree (reload, tree_recompute=0). (Session 33 ran it without -p no:benchmark:
# its pytest line stopped at an INTERNALERROR.)
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $O/device.txt
git log -1 --format='commit %H %s' >> $O/device.txt 2>/dev/null
timeout -k 10 240 python3 -m pytest -q -m gpu tests/test_tree.py -p no:cacheprovider -p no:benchmark -n 4 \
  > $O/gpu_tests_tree.log 2>&1
echo "gpu tests exit $?"; tail -3 $O/gpu_tests_tree.log
N=gpu__time_duration.sum,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,\
sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,\
dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,\
smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,\
smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio
i=0
for spec in "compact" "compact --tree" "snapshot" "snapshot --tree" \
            "snapshot --tree --tiles=64:4:64:tree_recompute=0"; do
  i=$((i+1))
  echo "=== ncu $i: $spec" | tee $O/ncu_$i.txt
  timeout -k 5 75 ncu --clock-control none --kernel-name regex:'m2v_(conv|ssm)' --launch-skip 2 \
    --launch-count 2 --metrics $N python3 tools/profile_call.py --mode=$spec --batch=32 \
    --rows=16 --capacity=16 --calls=1 >> $O/ncu_$i.txt 2>&1
  grep -E "m2v_|gpu__time|inst_exec|issue_active|warps_active|registers|dram__|stalled" $O/ncu_$i.txt \
    | sed -E 's/ +/ /g' | cut -c1-110
done
