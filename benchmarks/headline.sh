#!/usr/bin/env bash
# Reproduces README's headline table and the raw files of benchmarks/results/.
#
#   benchmarks/headline.sh [OUTDIR]      # from the repository root, after `make test`
#
# Each step waits until the 1-minute load average is below 0.3: run it on a quiet machine
# with nothing else running (figures from a busy machine say little). unison, Gloo
# (torch.distributed) and OpenMPI (mpi4py) are measured one after the other in each run,
# twice at np=2, so the spread between runs can be read beside the figures.
set -u
OUT=${1:-benchmarks/results}
mkdir -p "$OUT"
[ -x .venv/bin/unison ] && export PATH=$PWD/.venv/bin:$PATH
waitq() { while awk '{exit !($1>=0.3)}' /proc/loadavg; do sleep 5; done; }
step() {
  local name=$1; shift
  waitq
  echo "== $name: $*"
  timeout 900 "$@" > "$OUT/$name.txt" 2>&1 || echo "   $name failed (exit $?): see $OUT/$name.txt"
}
OPS="--ops all_reduce,broadcast,all_gather,reduce_scatter --sizes 8,1M,16M,256M --compare gloo,mpi"
step calib unison bench --calibrate
step np2-run1 unison bench -np 2 $OPS --json "$OUT/np2-run1.json"
step np2-run2 unison bench -np 2 $OPS --json "$OUT/np2-run2.json"
step np4 unison bench -np 4 $OPS --json "$OUT/np4.json"
step barrier2 unison bench -np 2 --ops barrier --compare gloo,mpi --json "$OUT/barrier2.json"
step floor2 python benchmarks/floor.py --np 2 --calls 20000
step ddp2c unison run -np 2 python examples/pytorch_synthetic_benchmark.py \
  --mode both --ddp-backend both --comm-bound --latency 2000
step trainab unison run -np 2 python benchmarks/hvd_train_ab.py 30
python benchmarks/tables.py --headline "$OUT/np2-run1.json" "$OUT/np2-run2.json"
