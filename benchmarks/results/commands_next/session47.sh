#!/bin/bash
# Session 47's calls, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session47.sh STAGE...
# Each stage packs its outputs into $OUT/STAGE.tgz. Predictions: ../session47/README.md.
#   e1: `side_stream.patch` (a prefill's verify tail on XLA's second stream, beside the last
#       output kernel): the JAX version and compute_on's signature; the timeline at R=512
#       with it (HLO beside); the prefill suite's chunked case new, old, new, old; the
#       timeline at R=512 without it; then the compiled tests of the prefill paths
#       (E1_TEST_S seconds, default 110; call 1 ran at 150). Leaves the tree as it found
#       it (a patch still applied when a stage exits early is reversed: `on`, `undo`).
#   e2: over `side_stream.patch`, `side_cb.patch` (the C·Bᵀ launch on the second stream too,
#       beside the fused pass, which sums its own acum again): the prefill suite's chunked
#       case new, old, new, old (old: side_stream alone); the timelines at R=512 and 4096
#       with both. Leaves the tree as it found it.
#   e3: `streams.patch` (`ChunkTiles.streams`, 2 by default: C·Bᵀ and the verify tail's
#       launches on the second stream; call 2 ran it as the working tree): chunk_sweep B=1
#       bf16 at R=512 and 4096, the table (two streams) and streams=1 (the sweep drops the
#       repeats); the timeline at R=512; the compiled prefill tests; the timeline at R=4096.
#   x1: `out_exp2.patch` (the output kernel's loaded-sum weights as one PTX ex2.approx of
#       a_t - b_s, log2(dt) folded into b): the prefill suite's chunked case new, old, new,
#       old; ncu of the output kernel (R=512) with it; the compiled prefill tests with it;
#       ncu without it. Leaves the tree as it found it.
#   p1: stream_probe.py (two independent kernels, the second in a compute_on region),
#       as is and with XLA's latency-hiding scheduler asked for.
D=$(dirname "$0")
. $D/lib.sh   # TB, ser, timeline, sweep, ab, gpu_tests, on, off, undo
for s in "$@"; do
  echo "== $s $(date -u +%H:%M:%S)"
  case $s in
  e1)
    S=/tmp/s47_e1; rm -rf $S; mkdir -p $S/side $S/head $S/ab
    ( trap 'undo; tar czf ${OUT:-/tmp/out}/e1.tgz -C /tmp s47_e1' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      python3 -c "import jax, inspect; from jax.experimental import compute_on as c; \
print(jax.__version__, inspect.signature(c.compute_on))" 2>&1 | tail -1
      on $D/side_stream.patch || exit 1
      timeline $S/side 512
      grep -hE "async-start|async-done|copy-start| copy\(" \
        $S/side/hlo_r512/*jit_many*after_opt* 2> /dev/null | cut -c1-200 | head -20
      off $D/side_stream.patch || exit 1
      ab $S/ab $D/side_stream.patch && P+=($D/side_stream.patch) || exit 1
      off $D/side_stream.patch || exit 1
      timeline $S/head 512
      on $D/side_stream.patch || exit 1
      gpu_tests $S "prefill or packed or ragged or segment" ${E1_TEST_S:-110} )
    ;;
  e2)
    S=/tmp/s47_e2; rm -rf $S; mkdir -p $S/both $S/ab
    ( trap 'undo; tar czf ${OUT:-/tmp/out}/e2.tgz -C /tmp s47_e2' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      on $D/side_stream.patch || exit 1
      ab $S/ab $D/side_cb.patch && P+=($D/side_cb.patch) || exit 1
      for R in 512 4096; do timeline $S/both $R; done )
    ;;
  e3)
    S=/tmp/s47_e3; rm -rf $S; mkdir -p $S
    ( trap 'undo; tar czf ${OUT:-/tmp/out}/e3.tgz -C /tmp s47_e3' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      on $D/streams.patch || exit 1
      for R in 512 4096; do
        T=${E3_T:-120} sweep $S streams_r$R $R "$TB:streams=1,$TB,$TB:streams=1"
      done
      timeline $S 512
      gpu_tests $S "prefill or packed or ragged or segment" ${E3_TEST_S:-150}
      timeline $S 4096 )
    ;;
  p1)
    S=/tmp/s47_p1; rm -rf $S; mkdir -p $S
    ( trap 'tar czf ${OUT:-/tmp/out}/p1.tgz -C /tmp s47_p1' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      PYTHONPATH=$PWD timeout -k 5 90 python3 $D/stream_probe.py 2>&1 | grep -v "^I1" \
        | tee $S/probe.log
      XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true PYTHONPATH=$PWD timeout -k 5 90 \
        python3 $D/stream_probe.py 2>&1 | grep -v "^I1" | tee $S/probe_lhs.log )
    ;;
  x1)
    S=/tmp/s47_x1; rm -rf $S; mkdir -p $S/ab
    ( trap 'undo; tar czf ${OUT:-/tmp/out}/x1.tgz -C /tmp s47_x1' EXIT
      nvidia-smi --query-gpu=name --format=csv,noheader
      ab $S/ab $D/out_exp2.patch && P+=($D/out_exp2.patch) || exit 1
      ncu_out $S new
      gpu_tests $S "prefill or packed or ragged or segment" ${X1_TEST_S:-150}
      off $D/out_exp2.patch || exit 1
      ncu_out $S old )
    ;;
  *) echo "unknown stage $s" >&2; exit 2 ;;
  esac
done
echo "== end $(date -u +%H:%M:%S)"
