# Helpers of the session scripts here (sourced): the output folder and two functions.
O=${OUT:-/tmp/out}; mkdir -p $O
run() {  # run FOLDER VAR=VALUE...: tools/run_gpu.sh with those settings, its output in FOLDER
  local dir=$O/$1; shift
  env "$@" OUT=$dir bash tools/run_gpu.sh > $dir.txt 2>&1
  echo "$dir: exit $?"
}
rows() {  # the benchmark rows of a run's log, the table's tile fields left out
  grep -hE "^\| (snap|comp|chunk)|rror" $1 | sort -u \
    | sed 's/num_warps=4 num_stages=1 n_cols=64 block_c=128 prep_warps=4 //' | cut -c1-220
}
