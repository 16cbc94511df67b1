cd /tmp/tmp.MfMjPxPvQV/p
run() {  # run LABEL
  if [ $1 = nobytecode ]; then export PYTHONDONTWRITEBYTECODE=1; unset PYTHONPYCACHEPREFIX
  else unset PYTHONDONTWRITEBYTECODE; rm -rf /tmp/abcache; export PYTHONPYCACHEPREFIX=/tmp/abcache
       .venv/bin/python -c "import jax, jax.experimental.pallas.triton, numpy, pytest, m2v_jax"; fi
  s=$(date +%s.%N)
  .venv/bin/python -m pytest -q -n 2 --dist worksteal tests -p no:cacheprovider 2>&1 | tail -1
  e=$(date +%s.%N); echo "$1 $(date -u +%T) wall $(echo "$e - $s" | bc) s"
}
run nobytecode; run bytecode; run nobytecode; run bytecode
