#!/bin/bash
# Session 40's cases and the next session's, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session40.sh CALL
# Each case writes under $OUT (lib.sh: `run`, `rows`). Predictions: ../session40/README.md.
#   lead:     the serial (verify-kernel) bf16 prefill at lengths whose body ends in a partial
#             32-row segment that runs first (`lead` in verify_ssm.py: 0 < body % 32 < 24)
#             against lengths without one: B=8 R=360,392,400,416,424 and B=1
#             R=40,48,56,64,72,104,110; with `rem_last.patch` (that segment always last) at B=8
#             R=392,400,416, then without it again; ncu of the SSM launch at B=8 R=392 and 400
#             (~7 min).
#   seg:      the serial bf16 prefill with a body's partial segment run as the last whole
#             segment, its first rows left out (the library now; `overlap_last.patch` is that
#             change, reverted for the A/B): new B=8 R=392,400,416,424 and B=1
#             R=40,48,56,64,72,104,110, old then new again at B=8 R=400,416 and B=1 R=56,64;
#             then serial against chunked at B=1 R=136..216 and B=2/4/8 R=400..656 (~8 min).
#   ovl:      the overlapped last segment inside the loop against a copy after it
#             (`overlap_copy.patch`): B=8 R=392,400,424 and B=1 R=56,64,72, new/copy/new, and
#             ncu of the SSM launch at B=8 (~6 min).
#   convc:    B=1 bf16 serial prefill at R=20,37,72,136 with 16-64 conv channels a program.
#   dth:      `dt_heads.patch` applied (if it is not yet): B=1 serial prefill with the conv
#             launch's dt over 32 heads a program against 128 (one program, the library
#             now), 16 and 8; then the GPU tests of conv, tree, compact, bitwise, prefill
#             and pools (~6 min). Not run in session 40 (no device time left).
#   once:     `one_trip.patch` (a one-segment body in a loop of one trip) old/new/old at B=1
#             R=20,37,40 and B=8 R=37,40, then ncu of the B=1 R=37 SSM launch (~4 min).
#   btiles:   serial bf16 prefill at B=8 and 2, R=40..360, tiles 64:8:64 and 32:4:64
#             against the table's (~4 min).
#   h200tree: on an H200 as session39.sh h200tree; on an H100, ncu sections of the B=1 R=37
#             serial prefill's SSM and conv launches instead.
#   suite:    the whole GPU suite (16 workers, 540 s).
set -u
D=$(dirname "$0")
source "$D/lib.sh"
ser() {  # ser NAME BATCH LENGTHS [CASES]: the prefill suite's rows
  PYTHONPATH=$PWD timeout -k 5 ${T:-150} python3 benchmarks/bench.py --suites=prefill \
    --prefill_batch=$2 --lengths=$3 --prefill_cases=${4:-serial} --out=$O/$1.json ${5:-} \
    > $O/$1.log 2>&1
  echo "$1"; grep -hE "^\| (snap|chunk)" $O/$1.log | cut -c1-100
}
sncu() {  # sncu NAME BATCH ROWS: ncu of the serial prefill's SSM launch
  PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 100 ncu --clock-control none \
    --kernel-name regex:m2v_ssm --launch-skip 0 --launch-count 1 \
    --metrics gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum,dram__bytes.sum \
    python3 tools/profile_call.py --prefill --nochunked --mode=snapshot --batch=$2 --rows=$3 \
    --calls=1 > $O/$1.log 2>&1
  echo "$1"; grep -E "^  m2v|gpu__time|inst_exec|registers|warps_active|local_op|dram__" $O/$1.log
}
case "${1:-lead}" in
lead)
  for spec in "8 360,392,400,416,424" "1 40,48,56,64,72,104,110"; do
    set -- $spec
    PYTHONPATH=$PWD timeout -k 5 150 python3 benchmarks/bench.py --suites=prefill \
      --prefill_batch=$1 --lengths=$2 --prefill_cases=serial --out=$O/lead_b$1.json \
      > $O/lead_b$1.log 2>&1
    grep -hE "^\| snap" $O/lead_b$1.log | cut -c1-110
  done
  # rem_last.patch: the partial segment always last (scratch padded to its tile), old/new/old
  P=$D/rem_last.patch
  for turn in patched old2; do
    [ $turn = patched ] && { patch -p1 < $P > /dev/null || exit 1; }
    [ $turn = old2 ] && { patch -p1 -R < $P > /dev/null || exit 1; }
    PYTHONPATH=$PWD timeout -k 5 150 python3 benchmarks/bench.py --suites=prefill \
      --prefill_batch=8 --lengths=392,400,416 --prefill_cases=serial --out=$O/lead_$turn.json \
      > $O/lead_$turn.log 2>&1
    echo "$turn"; grep -hE "^\| snap" $O/lead_$turn.log | cut -c1-110
  done
  for R in 392 400; do
    PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 100 ncu --clock-control none \
      --kernel-name regex:m2v_ssm --launch-skip 0 --launch-count 1 \
      --metrics gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum,dram__bytes.sum \
      python3 tools/profile_call.py --prefill --nochunked --mode=snapshot --batch=8 --rows=$R \
      --calls=1 > $O/ncu_lead_r$R.log 2>&1
    echo "R=$R"; grep -E "^  m2v|gpu__time|inst_exec|registers|warps_active|local_op|dram__" $O/ncu_lead_r$R.log
  done
  ;;
seg)
  ser new_b8 8 392,400,416,424; ser new_b1 1 40,48,56,64,72,104,110
  P=$D/overlap_last.patch
  patch -p1 -R < $P > /dev/null || exit 1
  ser old_b8 8 400,416; ser old_b1 1 56,64
  patch -p1 < $P > /dev/null || exit 1
  ser new2_b8 8 400,416; ser new2_b1 1 56,64
  T=200 ser tie_b1 1 136,150,184,216 serial,chunked
  for B in 8 4 2; do T=200 ser tie_b$B $B 400,464,528,592,656 serial,chunked; done
  ;;
ovl)
  # The overlapped last segment in the loop (the library) against it as a copy after the loop
  # (`overlap_copy.patch`): new, copy, new; then ncu of both. Logs packed in ovl.tgz.
  O0=$O; O=$O/ovl; mkdir -p $O
  P=$D/overlap_copy.patch
  for turn in new copy new2; do
    [ $turn = copy ] && { patch -p1 < $P > /dev/null || exit 1; }
    [ $turn = new2 ] && { patch -p1 -R < $P > /dev/null || exit 1; }
    ser ${turn}_b8 8 392,400,424; ser ${turn}_b1 1 56,64,72
  done
  sncu ncu_new_b8_r400 8 400; sncu ncu_new_b8_r424 8 424
  patch -p1 < $P > /dev/null || exit 1
  sncu ncu_copy_b8_r400 8 400
  patch -p1 -R < $P > /dev/null || exit 1
  tar czf $O0/ovl.tgz -C $O0 ovl && rm -r $O
  ;;
convc)
  # B=1 bf16 serial prefill: the conv launch's channels per program (81 programs at 128)
  T=240 ser convc 1 20,37,72,136 serial --serial_tiles=32:4:64:block_c=32,32:4:64:block_c=32:prep_warps=1,32:4:64:block_c=64:prep_warps=2,32:4:64:block_c=16:prep_warps=1
  grep -hE "^\| snap" $O/convc.log | cut -c1-140
  ;;
dth)
  # The conv launch's dt in programs of dt_heads heads (32 with the patch; 128: one program)
  grep -q dt_heads m2v_jax/kernels/tiles.py || patch -p1 < $D/dt_heads.patch > /dev/null || exit 1
  T=200 ser dth 1 20,37,72,136 serial --serial_tiles=32:4:64:dt_heads=128,32:4:64:dt_heads=16,32:4:64:dt_heads=8
  grep -hE "^\| snap" $O/dth.log | sort -u | cut -c1-140
  run gpu M2V_STAGES=gpu_tests M2V_TEST_WORKERS=16 M2V_LIMIT_GPU_TESTS=${LIMIT:-230} \
    M2V_GPU_TESTS_K="conv or tree or compact or bitwise or prefill or pool"
  grep -E "passed|failed|FAILED|ERROR" $O/gpu.txt | tail -15
  ;;
once)
  # `one_trip.patch`: a body of one segment in a loop of one (opaque) trip. Old, new, old
  # at B=1 R=20,37,40 and B=8 R=37,40 (snapshot bf16 serial), then ncu at B=1 R=37.
  P=$D/one_trip.patch
  for turn in old new old2; do
    [ $turn = new ] && { patch -p1 < $P > /dev/null || exit 1; }
    [ $turn = old2 ] && { patch -p1 -R < $P > /dev/null || exit 1; }
    ser once_${turn}_b1 1 20,37,40; ser once_${turn}_b8 8 37,40
  done
  patch -p1 < $P > /dev/null || exit 1
  sncu ncu_once_b1_r37 1 37
  patch -p1 -R < $P > /dev/null || exit 1
  sncu ncu_old_b1_r37 1 37
  ;;
btiles)
  # Serial bf16 prefill bodies at B >= 2: 8 warps on 64-row P tiles, and 32-row tiles,
  # against the table's 64:4:64 (which spills offline: 192-464 bytes of stack)
  for B in 8 2; do
    T=240 ser btiles_b$B $B 40,136,264,360 serial --serial_tiles=64:8:64,32:4:64
  done
  ;;
h200tree)
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    bash $D/session39.sh h200tree
  else  # an H100: ncu sections of the B=1 R=37 serial prefill's two launches instead
    for k in m2v_ssm m2v_conv; do
      PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 120 ncu \
        --clock-control none --kernel-name regex:$k --launch-skip 0 --launch-count 1 \
        --section SpeedOfLight --section LaunchStats --section Occupancy \
        --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats \
        python3 tools/profile_call.py --prefill --nochunked --mode=snapshot --batch=1 \
        --rows=37 --calls=1 > $O/r37_$k.log 2>&1
      echo "$k"; grep -E "^  m2v|Duration|Registers|Achieved Occ|Theoretical Occ|Memory Through|DRAM Through|Compute \(SM\)|Issued Warp|No Eligible|Stall|Warp Cycles Per Issued|Block Limit|Waves" $O/r37_$k.log | head -40
    done
  fi
  ;;
suite)
  run suite M2V_STAGES=gpu_tests M2V_TEST_WORKERS=16 M2V_LIMIT_GPU_TESTS=${LIMIT:-540}
  grep -E "passed|failed|FAILED|ERROR|=== gpu|s call" $O/suite.txt | tail -25
  ;;
esac
