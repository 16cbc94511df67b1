#!/bin/bash
# Session 43's calls, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session43.sh CALL
# Outputs go to /tmp/s43_CALL and are packed into $OUT/CALL.tgz (also when a case stops early).
# Predictions: ../session43/README.md.
#   t1: B=1 bf16 snapshot prefill timelines (per kernel, one prefill a step) at R=512 and
#       4096, with XLA's optimized HLO of each step dumped (the fusions' names in the timeline
#       are the HLO's), to find what the small XLA kernels around the Pallas launches compute;
#       then the chunked prefill at R=512 and 4096 with and without `static_slots.patch` (the
#       slot table of a layout the host knows built on the host: the working tree has it),
#       new, old, new, and R=512's timeline without it.
#   p1: the fused pass in N tiles (`ChunkTiles.pass_cols` 64 and 32 of dstate 128, and 64
#       with two load stages) against the table (whole state rows), chunk_sweep B=1 bf16 at
#       R=4096 and 512; then ncu of the fused pass at R=512, the table and pass_cols=64.
#   p2: p1's sweep again (its third variant named state_stages twice, so p1's sweeps did not
#       run), without and with `pass_b_ahead.patch` (the fused pass also loads the next
#       chunk's B before this chunk's work): the table, pass_cols 64 and 32, at R=4096, 512
#       (P2_ROWS: those lengths).
#   t2: t1 in less time: the A/B first (new, old, new), then R=512's timeline without and
#       with the patch.
#   t3: t2's A/B alone (new, old, new), for a short call.
#   s1: ncu with source counters (stall reasons by SASS line) of the fused pass and the output
#       kernel at R=512 (B=1 bf16 snapshot, the first launch of each): where a chunk's step
#       of the pass waits, and a column block of the output kernel.
#   w1: `pass_weights.patch` (each slot's decay weights exp(acum_L - acum) dt and decay
#       exp(acum_L) computed once in XLA beside the processed dt, loaded by the fused pass and
#       the chunk-states kernel instead of a scan and a reduction a chunk): the chunked
#       prefill at R=512 and 4096, old, new, old; then ncu of the first fused pass launch at
#       R=512 with and without it.
#   g1: the compiled GPU tests of the chunked prefill (prefill, packed, chunk, segment).
set -u
D=$(dirname "$0")
S=/tmp/s43_$1; rm -rf $S; mkdir -p $S
trap 'tar czf ${OUT:-/tmp/out}/$1.tgz -C /tmp s43_$1' EXIT
trace() {  # trace NAME ROWS: the B=1 bf16 snapshot prefill's timeline, XLA's HLO beside it
  mkdir -p $S/hlo_$1
  XLA_FLAGS="--xla_dump_to=$S/hlo_$1 --xla_dump_hlo_as_text --xla_dump_hlo_pass_re=NONE_XX" \
    PYTHONPATH=$PWD timeout -k 5 90 python3 tools/trace_call.py --prefill --mode=snapshot \
    --batch=1 --rows=$2 --calls=1 --steps=3 --show=80 > $S/trace_$1.log 2>&1
  find $S/hlo_$1 -type f ! -name '*after_optimizations.txt' -delete
  echo "$1"; grep -E "^\||per call" $S/trace_$1.log | cut -c1-100
}
ser() {  # ser NAME: the prefill suite's chunked case, B=1 bf16, R=512 and 4096
  PYTHONPATH=$PWD timeout -k 5 100 python3 benchmarks/bench.py --suites=prefill \
    --prefill_batch=1 --lengths=512,4096 --prefill_cases=chunked --out=$S/$1.json \
    > $S/$1.log 2>&1
  echo "$1"; grep -hE "^\| (snap|chunk)" $S/$1.log | cut -c1-100
}
V=chunk=128:block_p=64:state_heads=16:state_stages=3:fused_pass=1   # the table's
sweep() {  # sweep NAME ROWS VARIANTS: chunk_sweep rows (the table first, then each variant)
  PYTHONPATH=$PWD timeout -k 5 ${T:-110} python3 benchmarks/bench.py --suites=chunk_sweep \
    --chunk_rows=$2 --chunk_variants=$3 --out=$S/$1.json > $S/$1.log 2>&1
  echo "$1"; grep -hE "^\| c|rror" $S/$1.log | sed "s/block_p=64 num_warps.*state_stages=3//" \
    | cut -c1-220
}
case "$1" in
p1)
  nvidia-smi --query-gpu=name --format=csv,noheader
  for R in 4096 512; do
    sweep cols_r$R $R $V:pass_cols=64,$V:pass_cols=32,$V:pass_cols=64:state_stages=2
  done
  T=m2v_jax/kernels/tiles.py
  cp $T $S/tiles.py.orig
  for t in table cols64; do
    cp $S/tiles.py.orig $T
    [ $t = cols64 ] && { sed -i "s/block_p=64, fused_pass=1, state_stages=3)/block_p=64, fused_pass=1, state_stages=3, pass_cols=64)/" $T
      grep -q "pass_cols=64)" $T || { echo "sed failed"; cp $S/tiles.py.orig $T; exit 1; }; }
    PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 90 ncu --clock-control none \
      --kernel-name regex:m2v_chunk_states_pass --launch-skip 0 --launch-count 1 --metrics \
gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size,\
sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum,dram__bytes.sum,\
smsp__issue_active.avg.pct_of_peak_sustained_active,\
smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct \
      python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=512 --calls=1 \
      > $S/ncu_pass_$t.log 2>&1
    echo "ncu $t"; grep -vE "^I1|WARN" $S/ncu_pass_$t.log | grep -E "m2v|  [a-z]" | tail -10
  done
  cp $S/tiles.py.orig $T && rm $S/tiles.py.orig
  ;;
p2)
  nvidia-smi --query-gpu=name --format=csv,noheader
  for turn in plain bahead; do
    [ $turn = bahead ] && { patch -p1 < $D/pass_b_ahead.patch > /dev/null || exit 1; }
    for R in ${P2_ROWS:-4096 512}; do
      T=100 sweep cols_${turn}_r$R $R $V:pass_cols=64,$V:pass_cols=32
    done
    [ $turn = bahead ] && patch -p1 -R < $D/pass_b_ahead.patch > /dev/null
  done
  ;;
t2|t3)
  nvidia-smi --query-gpu=name --format=csv,noheader
  ser new
  patch -p1 -R < $D/static_slots.patch > /dev/null || exit 1
  ser old
  [ $1 = t2 ] && trace old_r512 512
  patch -p1 < $D/static_slots.patch > /dev/null || exit 1
  ser new2
  [ $1 = t2 ] && trace r512 512
  ;;
s1)
  nvidia-smi --query-gpu=name --format=csv,noheader; ncu --version | tail -1
  for k in m2v_chunk_states_pass m2v_chunk_out; do
    PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 120 ncu --clock-control none \
      --kernel-name regex:$k --launch-skip 0 --launch-count 1 --section WarpStateStats \
      --section SourceCounters --section LaunchStats --section Occupancy -o $S/$k -f \
      python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=512 --calls=1 \
      > $S/ncu_$k.log 2>&1
    timeout -k 5 60 ncu -i $S/$k.ncu-rep --page source --csv --print-source sass \
      > $S/${k}_sass.csv 2> $S/${k}_sass.err
    timeout -k 5 60 ncu -i $S/$k.ncu-rep --page details > $S/${k}_details.txt 2>&1
    echo "$k"; grep -E "Registers|Warp Cycles|Achieved Occ|Stall|Duration" $S/${k}_details.txt | head -12
    python3 - $S/${k}_sass.csv <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]).read().splitlines()[1:]))   # line 1: the kernel
if not rows:
  sys.exit("no rows")
key = next((k for k in rows[0] if "Warp Stall Sampling (All" in k), None)
print("columns:", [k for k in rows[0]][:12])
if key:
  top = sorted(rows, key=lambda r: -float((r[key] or "0").replace(",", "")))[:25]
  for r in top:
    print(r[key], "|", r.get("Source", "")[:90])
PY
  done
  ;;
w1)
  nvidia-smi --query-gpu=name --format=csv,noheader
  P=$D/pass_weights.patch
  ser old
  patch -p1 < $P > /dev/null || exit 1
  ser new
  patch -p1 -R < $P > /dev/null || exit 1
  ser old2
  for turn in old new; do
    [ $turn = new ] && { patch -p1 < $P > /dev/null || exit 1; }
    PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 90 ncu --clock-control none \
      --kernel-name regex:m2v_chunk_states_pass --launch-skip 0 --launch-count 1 --metrics \
gpu__time_duration.sum,launch__registers_per_thread,sm__inst_executed.sum,\
sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,\
smsp__warp_issue_stalled_barrier_per_warp_active.pct,\
smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct \
      python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=512 --calls=1 \
      > $S/ncu_pass_$turn.log 2>&1
    [ $turn = new ] && patch -p1 -R < $P > /dev/null
    echo "ncu $turn"; grep -vE "^I1|WARN" $S/ncu_pass_$turn.log | grep -E "m2v|  [a-z]" | tail -8
  done
  ;;
g1)
  nvidia-smi --query-gpu=name --format=csv,noheader
  M2V_STAGES=gpu_tests M2V_GPU_TESTS_K="prefill or packed or chunk or segment" \
    M2V_LIMIT_GPU_TESTS=330 OUT=$S bash tools/run_gpu.sh > $S/run.txt 2>&1
  tail -5 $S/gpu_tests.log
  ;;
t1)
  nvidia-smi --query-gpu=name --format=csv,noheader
  for R in 512 4096; do trace r$R $R; done
  ser new
  patch -p1 -R < $D/static_slots.patch > /dev/null || exit 1
  ser old; trace old_r512 512
  patch -p1 < $D/static_slots.patch > /dev/null || exit 1
  ser new2
  ;;
esac
