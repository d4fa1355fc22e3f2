#!/usr/bin/env bash
# quiet series: each step starts only when the 1-minute load is below 0.3
# usage: series.sh OUTDIR  (run from /work/main, nothing else running)
set -u
OUT=$1; mkdir -p "$OUT"; LOG=$OUT/series.log
B=/work/main/.venv/bin; export PATH=$B:$PATH
load() { cut -d' ' -f1-3 /proc/loadavg; }
waitq() { while awk '{exit !($1>=0.3)}' /proc/loadavg; do sleep 5; done; }
step() { local name=$1; shift; waitq; echo "### $name start $(date -u +%H:%M:%S) load $(load)" >> $LOG
  timeout 900 "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  echo "### $name end $(date -u +%H:%M:%S) rc $rc load $(load)" >> $LOG; }
B8="--ops all_reduce,broadcast,all_gather,reduce_scatter --sizes 8,1M,16M,256M --compare gloo,mpi"
step calib unison bench --calibrate
cp ~/.cache/unison/*.json "$OUT/linkmodel.json" 2>/dev/null || true
step np2-run1 unison bench -np 2 $B8 --json "$OUT/np2-run1.json"
step floor2 python docs/evidence/issue-11-floor.py --np 2 --calls 20000
step np4 unison bench -np 4 $B8 --json "$OUT/np4.json"
step floor4 python docs/evidence/issue-11-floor.py --np 4 --calls 5000 --modes yield
step steady2 unison run -np 2 python docs/evidence/issue-11-hvd-steady-ab.py
step steady4 unison run -np 4 python docs/evidence/issue-11-hvd-steady-ab.py
step ddp2c unison run -np 2 python examples/pytorch_synthetic_benchmark.py --mode both --ddp-backend both --comm-bound --latency 2000
echo "### done $(date -u +%H:%M:%S)" >> $LOG
# second pass (09:22-09:33, same tree): the spread of the bench runs, the training step
# interleaved, the np=4 waiting policy
step np2-run2 unison bench -np 2 $B8 --json "$OUT/np2-run2.json"
step np4-run2 unison bench -np 4 $B8 --json "$OUT/np4-run2.json"
step trainab unison run -np 2 python docs/evidence/issue-11-hvd-train-ab.py 30
step np4ab env N=2000 B=10 WHO=1 unison run -np 4 python docs/evidence/issue-11-np4-ab.py
# third pass (after the bench learnt the barrier): the 8-byte barrier against the peers
step barrier2 unison bench -np 2 --ops barrier --sizes 8 --compare gloo,mpi --json "$OUT/barrier2.json"
step barrier4 unison bench -np 4 --ops barrier --sizes 8 --compare gloo,mpi --json "$OUT/barrier4.json"
