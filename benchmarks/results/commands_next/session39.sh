#!/bin/bash
# For the next session, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session39.sh CALL
# Each case writes under $OUT (lib.sh: `run`, `rows`). Predictions: ../session38/README.md ("Next").
#   h200tree: on an H200 only (check nvidia-smi first): slot_rates.py at S=16 (the plain and
#             the write-only streams against the copy floor), then the tree suite, snapshot,
#             B=32, 16 nodes against 16-row chains, with tree_cache=1 and tree_recompute=0 as
#             variants (~5 min).
#   b1:       B=1 bf16 defaults (32-row P tiles at B=1 since session 38) at R=20,37,72,136,
#             against the table's 64-row tiles and narrower ones (16:2, 16:4, 32:2), and
#             float32 at R=20,37 on 32- and 64-row tiles (~4 min).
#   pncu:     where a B=1 bf16 prefill's time goes (issue 22's three goals): the device
#             timeline of R=4096, 512 (chunked) and 37 (serial) from the profiler
#             (tools/trace_call.py --prefill: every kernel, XLA's too, and the gaps), then
#             ncu of the Pallas kernels (~4 min).
#   btie:     bf16 prefills of B=8 sequences, serial against chunked at R=40..264: whether the
#             B=1 threshold (dispatch.MIN_CHUNKED_ROWS_BF16, 160 body rows) holds at B=8 (~3 min).
#   suite:    the whole GPU suite (16 workers, 540 s).
#   headab:   the conv head launch merged into the body conv: chunked bf16 prefill at R=512
#             and 4096 and the ragged suite, new / old / new (~4 min).
#   copies:   XLA's large copies in a B=1 prefill's compiled step at R=512 and 4096, and the
#             timeline, to name the `memcpy128` event (~2 min).
#   order:    (needs out_order.patch applied) the output kernel's launch order (out_order 1: row blocks
#             side by side) against the table's at R=4096 and 512 (chunk_sweep), then ncu of
#             the output kernel in both orders at R=512 (~4 min).
set -u
D=$(dirname "$0")
source "$D/lib.sh"
case "${1:-h200tree}" in
h200tree)
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout -k 5 150 python3 $D/slot_rates.py --slots=16 --json=$O/slot_rates_s16.json \
    > $O/slot_rates_s16.txt 2>&1
  grep -v Warn $O/slot_rates_s16.txt | head -9
  run tree M2V_STAGES=tree M2V_LIMIT_TREE=240 M2V_BENCH_ARGS="--tree_modes=snapshot \
--batches=32 --tree_sizes=16 --tree_variant_chains \
--tree_tiles=64:4:64:tree_cache=1,64:4:64:tree_recompute=0"
  rows $O/tree/tree.log
  ;;
b1)
  PYTHONPATH=$PWD timeout -k 5 150 python3 benchmarks/bench.py --suites=prefill \
    --lengths=20,37,72,136 --prefill_cases=serial --serial_tiles=64:4:64,16:2:64,16:4:64,32:2:64 \
    --out=$O/b1_bf16.json > $O/b1_bf16.log 2>&1
  grep -hE "^\| snap" $O/b1_bf16.log | cut -c1-150
  PYTHONPATH=$PWD timeout -k 5 120 python3 benchmarks/bench.py --suites=prefill --dtype=float32 \
    --lengths=20,37 --prefill_cases=serial --serial_tiles=32:4:64 \
    --out=$O/b1_f32.json > $O/b1_f32.log 2>&1
  grep -hE "^\| snap" $O/b1_f32.log | cut -c1-150
  ;;
pncu)
  for R in 4096 512 37; do
    PYTHONPATH=$PWD timeout -k 5 90 python3 tools/trace_call.py --prefill --mode=snapshot \
      --batch=1 --rows=$R --calls=2 --steps=3 --show=60 > $O/ptrace_r$R.log 2>&1
    grep -vE "^[IW]1|Warn" $O/ptrace_r$R.log | grep -A12 "per call"
  done
  for spec in "4096 --chunked" "512 --chunked" "37 --nochunked"; do
    set -- $spec
    PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 100 ncu --clock-control none \
      --kernel-name regex:m2v --launch-skip 0 --launch-count 40 \
      --metrics gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread,launch__grid_size,dram__bytes.sum \
      python3 tools/profile_call.py --prefill $2 --mode=snapshot --batch=1 --rows=$1 --calls=1 \
      > $O/pncu_r$1.log 2>&1
    echo "R=$1"; grep -E "^  m2v|gpu__time" $O/pncu_r$1.log | paste - - | awk '{print $1, $(NF)}' | sort | uniq -c | head -30
  done
  ;;
btie)
  PYTHONPATH=$PWD timeout -k 5 200 python3 benchmarks/bench.py --suites=prefill --prefill_batch=8 \
    --lengths=40,72,136,264 --prefill_cases=serial,chunked --out=$O/btie.json > $O/btie.log 2>&1
  rows $O/btie.log
  ;;
order)
  T=128:64:4:1:64:4:16:3:4:1:1:32:256:4:64:1:100
  for R in 4096 512; do
    PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 150 python3 \
      benchmarks/bench.py --suites=chunk_sweep --chunk_rows=$R --chunk_variants=$T:1 \
      --out=$O/order_r$R.json > $O/order_r$R.txt 2>&1
    rows $O/order_r$R.txt
  done
  for o in 0 1; do
    PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 100 ncu --clock-control none \
      --kernel-name regex:m2v_chunk_out --launch-skip 0 --launch-count 2 \
      --metrics gpu__time_duration.sum,sm__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active \
      python3 tools/profile_call.py --prefill --chunked --chunk_tiles=$T:$o --mode=snapshot \
      --batch=1 --rows=512 --calls=1 > $O/ncu_order$o.log 2>&1
    echo "out_order=$o"; grep -E "^  m2v|dram__|gpu__time|lts__|warps_active|inst_exec" $O/ncu_order$o.log
  done
  ;;
copies)  # what the prefill's `memcpy128` is: XLA's copies in the compiled step, then the timeline
  for R in 512 4096; do
    PYTHONPATH=$PWD timeout -k 5 120 python3 tools/trace_call.py --prefill --mode=snapshot \
      --batch=1 --rows=$R --calls=1 --steps=2 --show=40 --copies > $O/copies_r$R.log 2>&1
    grep -E "^hlo|memcpy|per call" $O/copies_r$R.log | cut -c1-400
  done
  ;;
headab)  # the body conv taking each opening block's taps from the conv state (no head launch),
         # against the two launches: new, old (conv_head_merge.patch reverted), new
  P=$D/conv_head_merge.patch
  for turn in new1 old new2; do
    [ $turn = old ] && { patch -p1 -R < $P > /dev/null || exit 1; }
    [ $turn = new2 ] && { patch -p1 < $P > /dev/null || exit 1; }
    PYTHONPATH=$PWD timeout -k 5 150 python3 benchmarks/bench.py --suites=prefill,ragged \
      --lengths=512,4096 --prefill_cases=chunked --out=$O/headab_$turn.json \
      > $O/headab_$turn.log 2>&1
    echo "$turn"; grep -hE "^\| (snap|comp|chunk|packed|one|ragged)" $O/headab_$turn.log | sed -E "s/n=\[[^]]*\]//; s/n=\([^)]*\)//" | cut -c1-170
  done
  ;;
suite)
  run suite M2V_STAGES=gpu_tests M2V_TEST_WORKERS=16 M2V_LIMIT_GPU_TESTS=${LIMIT:-540}
  grep -E "passed|failed|FAILED|ERROR|=== gpu|s call" $O/suite.txt | tail -25
  ;;
esac
