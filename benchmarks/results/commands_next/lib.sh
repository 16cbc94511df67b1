# Helpers of the session scripts here (sourced): the output folder and the functions below.
O=${OUT:-/tmp/out}; mkdir -p $O
# Bolt's bf16 table entry before session 48 (fused_y) as a ChunkTiles text (each field at most once: edit a field it has, append one it lacks).
TB=chunk=128:block_p=64:state_heads=16:state_stages=3:fused_pass=1:out_rows=128:out_cols=32:out_acum=1:out_stages=3:out_warps=8
run() {  # run FOLDER VAR=VALUE...: tools/run_gpu.sh with those settings, its output in FOLDER
  local dir=$O/$1; shift
  env "$@" OUT=$dir bash tools/run_gpu.sh > $dir.txt 2>&1
  echo "$dir: exit $?"
}
rows() {  # the benchmark rows of a run's log, the table's tile fields left out
  grep -hE "^\| (snap|comp|chunk)|rror" $1 | sort -u \
    | sed 's/num_warps=4 num_stages=1 n_cols=64 block_c=128 prep_warps=4 //' | cut -c1-220
}
sweep() {  # sweep DIR NAME ROWS VARIANTS: chunk_sweep rows (the table first, then each variant; PREC: more bench flags)
  PYTHONPATH=$PWD timeout -k 5 ${T:-200} python3 benchmarks/bench.py --suites=chunk_sweep ${PREC} \
    --chunk_rows=$3 --chunk_variants=$4 --chunk_batch=${BATCH:-1} --out=$1/$2.json > $1/$2.log 2>&1
  echo "$2"; grep -hE "^\| c|rror" $1/$2.log | sed "s/block_p=64 num_warps.*state_stages=3//" \
    | cut -c1-230
}
ncu_out() {  # ncu_out DIR NAME: ncu of the first output launch, B=1 bf16 snapshot R=512 (none with fused_y)
  PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 90 ncu --clock-control none \
    --kernel-name regex:m2v_chunk_out --launch-skip 0 --launch-count 1 --metrics \
gpu__time_duration.sum,launch__registers_per_thread,sm__inst_executed.sum,dram__bytes.sum,\
sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,\
launch__occupancy_limit_registers,smsp__warp_issue_stalled_barrier_per_warp_active.pct,\
smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct \
    python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=${NCU_ROWS:-512} \
    --calls=1 > $1/ncu_out_$2.log 2>&1
  echo "ncu $2"; grep -vE "^I1|WARN" $1/ncu_out_$2.log | grep -E "m2v|  [a-z]" | tail -10
}
ncu_k() {  # ncu_k DIR NAME REGEX ROWS: ncu of the first launch matching REGEX, B=1 bf16 snapshot
  # (NCU_MORE: more metrics, each after a comma; PROFILE_ARGS: more profile_call flags)
  PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 5 ${NCU_S:-90} ncu --clock-control none \
    --kernel-name regex:$3 --launch-skip 0 --launch-count 1 --metrics \
gpu__time_duration.sum,launch__registers_per_thread,sm__inst_executed.sum,dram__bytes.sum,\
sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,\
launch__occupancy_limit_registers,smsp__warp_issue_stalled_barrier_per_warp_active.pct,\
smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,\
smsp__warp_issue_stalled_short_scoreboard_per_warp_active.pct,\
smsp__warp_issue_stalled_wait_per_warp_active.pct,\
smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct${NCU_MORE} \
    python3 tools/profile_call.py --prefill --mode=snapshot --batch=1 --rows=$4 \
    ${PROFILE_ARGS} --calls=1 > $1/ncu_$2.log 2>&1
  echo "ncu $2"; grep -vE "^I1|WARN" $1/ncu_$2.log | grep -E "m2v|  [a-z]|rror" | tail -18
}
serg() {  # serg NAME LENGTHS: the B=1 bf16 serial prefill at LENGTHS (SER_S seconds at most)
  # into $S; the stage $s's results so far packed after each run (a run cut off keeps them)
  PYTHONPATH=$PWD timeout -k 5 ${SER_S:-90} python3 benchmarks/bench.py --suites=prefill \
    --lengths=$2 --prefill_cases=serial --out=$S/$1.json > $S/$1.log 2>&1
  echo "$1"; grep -hE "^\| snap|rror" $S/$1.log | cut -c1-120
  tar czf ${OUT:-/tmp/out}/$s.tgz -C /tmp ${S#/tmp/}; }
ser() {  # ser DIR NAME: the prefill suite's chunked case, B=1 bf16, R=512 and 4096
  PYTHONPATH=$PWD timeout -k 5 100 python3 benchmarks/bench.py --suites=prefill \
    --prefill_batch=1 --lengths=512,4096 --prefill_cases=chunked --out=$1/$2.json \
    > $1/$2.log 2>&1
  echo "$2"; grep -hE "^\| (snap|chunk)" $1/$2.log | cut -c1-100
}
timeline() {  # timeline DIR ROWS: the B=1 bf16 snapshot prefill's kernels, XLA's HLO beside them
  mkdir -p $1/hlo_r$2
  XLA_FLAGS="--xla_dump_to=$1/hlo_r$2 --xla_dump_hlo_as_text --xla_dump_hlo_pass_re=NONE_XX" \
    PYTHONPATH=$PWD timeout -k 5 90 python3 tools/trace_call.py --prefill --mode=snapshot \
    --batch=1 --rows=$2 --calls=1 --steps=3 --show=80 > $1/trace_r$2.log 2>&1
  find $1/hlo_r$2 -type f ! -name '*after_optimizations.txt' -delete
  echo "R=$2"; grep -E "^\||per call" $1/trace_r$2.log | cut -c1-100
}
gpu_tests() {  # gpu_tests DIR K SECONDS: the compiled GPU tests matching K, the log's tail
  M2V_STAGES=gpu_tests M2V_GPU_TESTS_K="$2" M2V_LIMIT_GPU_TESTS=$3 OUT=$1 \
    bash tools/run_gpu.sh > $1/run.txt 2>&1
  tail -3 $1/gpu_tests.log
}
ab() {  # ab DIR PATCH: `ser` with the patch applied, without, with, without; left applied
  patch -p1 < $2 > /dev/null || return 1
  ser $1 new
  patch -p1 -R < $2 > /dev/null || return 1
  ser $1 old
  patch -p1 < $2 > /dev/null || return 1
  ser $1 new2
  patch -p1 -R < $2 > /dev/null || return 1
  ser $1 old2
  patch -p1 < $2 > /dev/null
}
P=()          # the patches a stage has applied, in order (on, off, undo)
on() { patch -p1 --dry-run < $1 > /dev/null && patch -p1 < $1 > /dev/null && P+=("$1"); }  # whole or not at all
off() { patch -p1 -R < $1 > /dev/null && unset 'P[${#P[@]}-1]'; }
undo() { local i; for ((i=${#P[@]}-1; i>=0; i--)); do patch -p1 -R < "${P[i]}" > /dev/null; done; P=(); }
