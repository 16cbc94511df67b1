#!/bin/bash
# For the next session, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session38.sh CALL
# Each case writes under $OUT (lib.sh: `run`, `rows`). Predictions: ../session37/README.md.
#   slot:   commands_next/slot_rates.py: the snapshot slot stream alone (one state read, 16 or 8
#           written, B=32) by XLA and Pallas against the copy floor (~2 min).
#   ystore: the y tile stores (y_tile_store.patch, landed in session 37) against a copy of the
#           package with the patch reversed, in turn twice: B=1 serial prefills at R=20..136;
#           B=1 tiles (32-row P tiles, 64-channel conv programs); then ncu of gated R=8
#           verify calls at B=32 in both modes (~7 min).
#   evict:  the snapshot slot stores with an L2 evict-first hint (evict_first.patch, applied
#           here), chains and trees at B=32, R=16 (~3 min).
#   stages: the chunked prefill's bf16 fused pass with state_stages 3 against the table's 2.
#   f32tie: float32 activations, the serial path against the chunked ("highest") one at
#           R=72..512: where dispatch.MIN_CHUNKED_ROWS (400) should sit for them (~3 min).
#   suite:  the whole GPU suite (16 workers, 540 s).
set -u
D=$(dirname "$0")
source "$D/lib.sh"
case "${1:-slot}" in
slot)
  for s in 16 8; do
    timeout -k 5 150 python3 $D/slot_rates.py --slots=$s --json=$O/slot_rates_s$s.json \
      > $O/slot_rates_s$s.txt 2>&1
    grep -v Warn $O/slot_rates_s$s.txt | head -7
  done
  ;;
ystore)
  rm -rf /tmp/m2v_old && mkdir -p /tmp/m2v_old && cp -r m2v_jax benchmarks tools /tmp/m2v_old/
  P=$PWD/$D/y_tile_store.patch
  (cd /tmp/m2v_old && { git apply -R $P || patch -R -p1 < $P; }) || exit 1
  for turn in 1 2; do
    for tree in "$PWD" /tmp/m2v_old; do
      tag=$( [ "$tree" = "$PWD" ] && echo new || echo old )
      (cd $tree && PYTHONPATH=$tree timeout -k 5 100 python3 benchmarks/bench.py --suites=prefill \
        --lengths=20,37,50,100,136 --prefill_cases=serial \
        --out=$O/prefill_${tag}_$turn.json > $O/prefill_${tag}_$turn.log 2>&1)
      echo "$tag $turn"; grep -hE "^\| snap" $O/prefill_${tag}_$turn.log | cut -c1-90
    done
  done
  # B=1 tiles on the new code: two SSM programs a head, and conv programs of 64 channels
  PYTHONPATH=$PWD timeout -k 5 120 python3 benchmarks/bench.py --suites=prefill \
    --lengths=37,136 --prefill_cases=serial \
    --serial_tiles=32:4:64,64:4:64:block_c=64,32:4:64:block_c=64 \
    --out=$O/prefill_tiles.json > $O/prefill_tiles.log 2>&1
  grep -hE "^\| snap" $O/prefill_tiles.log | cut -c1-150
  for tree in "$PWD" /tmp/m2v_old; do
    tag=$( [ "$tree" = "$PWD" ] && echo new || echo old )
    for mode in compact snapshot; do
      (cd $tree && PYTHONPATH=$tree XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 100 ncu \
        --clock-control none --kernel-name regex:m2v_ssm --launch-skip 1 --launch-count 1 \
        --metrics gpu__time_duration.sum,sm__inst_executed.sum,launch__registers_per_thread \
        python3 tools/profile_call.py --mode=$mode --batch=32 --calls=1 --z \
        > $O/ncu_z_${mode}_$tag.log 2>&1)
      echo "$tag $mode"; grep -E "gpu__time|inst_exec|registers" $O/ncu_z_${mode}_$tag.log
    done
  done
  ;;
evict)
  git apply $D/evict_first.patch || patch -p1 < $D/evict_first.patch || exit 1
  run evict M2V_STAGES=tree M2V_LIMIT_TREE=170 M2V_BENCH_ARGS="--tree_modes=snapshot \
--batches=32 --tree_sizes=16 --tree_variant_chains --tree_tiles=64:4:64:evict_first=1"
  rows $O/evict/tree.log
  git apply -R $D/evict_first.patch || patch -R -p1 < $D/evict_first.patch
  ;;
stages)
  V=128:64:4:1:64:4:16:2:4:1:1:32:256:4:64:1,128:64:4:1:64:4:16:3:4:1:1:32:256:4:64:1
  PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 200 python3 \
    benchmarks/bench.py --suites=chunk_sweep --chunk_variants=$V --out=$O/chunk_sweep.json \
    > $O/chunk_sweep.txt 2>&1
  rows $O/chunk_sweep.txt
  ;;
f32tie)  # float32 activations: the serial path against the chunked one ("highest" by default)
  PYTHONPATH=$PWD timeout -k 5 200 python3 benchmarks/bench.py --suites=prefill --dtype=float32 \
    --lengths=72,136,264,400,512 --prefill_cases=serial,chunked --out=$O/f32tie.json \
    > $O/f32tie.log 2>&1
  rows $O/f32tie.log
  ;;
suite)
  run suite M2V_STAGES=gpu_tests M2V_TEST_WORKERS=16 M2V_LIMIT_GPU_TESTS=${LIMIT:-540}
  grep -E "passed|failed|FAILED|ERROR|=== gpu|s call" $O/suite.txt | tail -25
  ;;
esac
