#!/bin/bash
# Session 29: `TileConfig.launches=1`, a verify call (0 < R <= capacity) as one launch whose
# conv programs precede each sequence's SSM programs (they load their state, then wait on a
# per-sequence counter). Two device calls of ~6-8 minutes, from the repository root:
#   OUT=/tmp/out bash benchmarks/results/commands_next/session29_one_launch.sh call1
#   OUT=/tmp/out bash benchmarks/results/commands_next/session29_one_launch.sh call2
# call1: the compiled one-launch tests (bitwise against two launches); the loop suite with the
#   compact variants launches=1 at block_p 64 and 32 timed interleaved beside the table's two
#   launches; ncu of the compact one launch at B=32. It ran at 494e749: `launches` was
#   reverted after it, so call1 needs `benchmarks/results/patches/one_launch.patch` applied.
# call2 (rewritten after call 1 measured the one launch slower): the loop suite (B=8-128, the
#   default window) of the tree and of a copy with bf16_truncated_parts.patch (the state's
#   bf16 parts by truncation: no F2F), in turn twice; ncu of the patched compact SSM kernel;
#   the patched copy's GPU canaries and Bolt bitwise/bound tests.
set -u
O=${OUT:-/tmp/out}; mkdir -p $O
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
M=gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
loop() {  # loop NAME SECONDS ARGS...: the loop suite, its table rows kept
  local n=$1 s=$2; shift 2
  echo "=== $n $(date -u +%T)"
  timeout -k 5 $s python3 benchmarks/bench.py --suites=loop --batches=1,8,32,128 --windows=32 \
    --vary_batches= "$@" --out=$O/$n.json 2>&1 | grep -E "^\||Error|error" | tee $O/$n.txt
}
ncu_one() {  # ncu_one MODE: the one launch of the call after the warm-up, B=32
  echo "=== ncu $1 $(date -u +%T)"
  timeout -k 5 100 ncu --clock-control none --kernel-name regex:m2v_verify --launch-skip 1 \
    --launch-count 1 --metrics $M python3 tools/profile_call.py --mode=$1 --batch=32 --calls=1 \
    --tiles=64:4:64:launches=1 2>&1 | grep -E "m2v_|  [a-z_]+__" | sed 's/  */ /g' \
    | tee $O/ncu_$1.txt
}
case ${1:-} in
  call1)
    echo "=== tests $(date -u +%T)"
    timeout -k 5 150 python3 -m pytest -q -m gpu tests/test_compact.py -k one_launch 2>&1 \
      | tail -5 | tee $O/tests.txt
    loop loop_variants 260 --loop_tiles=64:4:64:launches=1,32:4:64:launches=1
    ncu_one compact ;;
  call2)
    B2=/tmp/m2v_truncated; rm -rf $B2; mkdir -p $B2 && cp -r m2v_jax $B2/ \
      && (cd $B2 && patch -s -p1 < $OLDPWD/benchmarks/results/commands_next/bf16_truncated_parts.patch) \
      || exit 1
    for i in 1 2; do
      loop loop_tree_$i 110 --batches=8,32,128 --windows=
      PYTHONPATH=$B2:$PWD loop loop_truncated_$i 110 --batches=8,32,128 --windows=
    done
    echo "=== ncu truncated $(date -u +%T)"
    PYTHONPATH=$B2:$PWD timeout -k 5 100 ncu --clock-control none --kernel-name regex:m2v_ssm \
      --launch-skip 1 --launch-count 1 --metrics $M python3 tools/profile_call.py --mode=compact \
      --batch=32 --calls=1 2>&1 | grep -E "m2v_|  [a-z_]+__" | sed 's/  */ /g' \
      | tee $O/ncu_truncated.txt
    echo "=== tests truncated $(date -u +%T)"
    PYTHONPATH=$B2:$PWD timeout -k 5 150 python3 -m pytest -q -m gpu tests/test_gpu.py \
      -k "canary or bitwise or float32_bound or one_call" 2>&1 | tail -4 \
      | tee $O/tests_truncated.txt ;;
  *) echo "usage: $0 call1|call2"; exit 2 ;;
esac
echo "=== done $(date -u +%T)"
