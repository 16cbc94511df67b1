#!/bin/bash
# Session 44's calls, from the repository root: OUT=/tmp/out bash benchmarks/results/commands_next/session44.sh STAGE...
# Runs session43.sh's stages one after another (each packs $OUT/STAGE.tgz); predictions:
# ../session44/README.md.
D=$(dirname "$0")
for s in "$@"; do
  echo "== $s $(date -u +%H:%M:%S)"
  bash $D/session43.sh $s
done
echo "== end $(date -u +%H:%M:%S)"
