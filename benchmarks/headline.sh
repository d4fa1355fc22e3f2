#!/usr/bin/env bash
# The whole benchmark series: README's headline table and every table of
# benchmarks/README.md, with their raw files in OUTDIR.
#
#   benchmarks/headline.sh [OUTDIR]      # default benchmarks/results/latest; after `make test`
#   ONLY="np2 train-comm2" benchmarks/headline.sh /tmp/out    # some steps only
#
# unison, Gloo (torch.distributed) and OpenMPI (mpi4py) are measured one after the other
# in each step, so every ratio compares figures from the same minutes. Run it on a quiet
# machine with nothing else running: the series waits for a 1-minute load average below
# 0.3 before it starts and, before each step, for the load to fall below 0.3 per core
# (the threshold of `unison bench`'s own warning) with the CPUs at least 95 % idle over
# three seconds. Each step's log records the load around it. The two-host step needs
# root (network namespaces) and is skipped otherwise.
set -u
OUT=${1:-benchmarks/results/latest}
mkdir -p "$OUT"
[ -x .venv/bin/unison ] && export PATH=$PWD/.venv/bin:$PATH
CORES=$(nproc)
load1() { cut -d' ' -f1 /proc/loadavg; }
idle_pct() {  # percentage of CPU time idle over three seconds
  local a b
  a=($(head -1 /proc/stat)); sleep 3; b=($(head -1 /proc/stat))
  local idle=$(( (b[4] + b[5]) - (a[4] + a[5]) )) total=0 i
  for i in 1 2 3 4 5 6 7 8; do total=$(( total + b[i] - a[i] )); done
  echo $(( 100 * idle / (total > 0 ? total : 1) ))
}
quiet() {  # $1: the load average to wait for
  while awk -v t="$1" '{exit !($1 >= t)}' /proc/loadavg; do sleep 5; done
  while [ "$(idle_pct)" -lt 95 ]; do sleep 2; done
}
step() {
  local name=$1; shift
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  quiet "$(awk -v c="$CORES" 'BEGIN {print 0.3 * c}')"
  echo "== $name: $*  (load before $(load1))"
  { echo "# $name: $*"; echo "# load before: $(cat /proc/loadavg)"; } > "$OUT/$name.txt"
  timeout 1800 "$@" >> "$OUT/$name.txt" 2>&1 || echo "   $name failed (exit $?): see $OUT/$name.txt"
  echo "# load after: $(cat /proc/loadavg)" >> "$OUT/$name.txt"
}
[ -n "${ONLY:-}" ] || quiet 0.3
echo "series start: load $(cat /proc/loadavg), $(nproc) CPUs, $(python -c 'import platform; print(platform.processor() or platform.machine())')"
OPS=all_reduce,broadcast,all_gather,reduce_scatter
SIZES=8,64K,1M,16M
step calib unison bench --calibrate
# the collectives on one host (README's table; the rows behind OpenMPI and Gloo)
step np2 unison bench -np 2 --ops $OPS --sizes $SIZES --compare gloo,mpi --json "$OUT/np2.json"
step np4 unison bench -np 4 --ops $OPS --sizes $SIZES --compare gloo,mpi --json "$OUT/np4.json"
# the 256 MiB rows: all_gather at np=2, all_reduce at np=4
step big2 unison bench -np 2 --ops all_gather --sizes 256M --compare gloo,mpi --json "$OUT/big2.json"
step big4 unison bench -np 4 --ops all_reduce --sizes 256M --compare gloo,mpi --json "$OUT/big4.json"
step lists2 unison bench -np 2 --ops all_reduce,all_gather,all_gather_list,reduce_scatter,reduce_scatter_list \
  --sizes 8 --compare gloo,mpi --json "$OUT/lists2.json"
# the floors behind the rows that trail OpenMPI: the single-copy all_gather forced, and
# the least a Python process spends on an 8-byte all-reduce (no unison code)
step forced2 unison bench -np 2 --ops all_gather --sizes 1M,256M --algo all_gather:cma \
  --json "$OUT/forced2.json"
step forced4 unison bench -np 4 --ops all_gather --sizes 1M --algo all_gather:cma \
  --json "$OUT/forced4.json"
step floor2 python benchmarks/floor.py --np 2 --calls 20000
step floor4 python benchmarks/floor.py --np 4 --calls 5000
# TCP on loopback: unison's TCP transport against Gloo and OpenMPI held to TCP
step tcp2 env UNISON_TRANSPORT=tcp unison bench -np 2 --ops $OPS --sizes 8,64K,1M,16M \
  --compare gloo,mpi --json "$OUT/tcp2.json"
# the floor under them: what one Python process on each side pushes through loopback TCP
step tcp-floor python benchmarks/tcp_floor.py --sizes 8,64K,1M,16M
# ... and the rooted collectives without the signature confirmation (desync detection's
# extra exchange), to show what that promise costs on TCP
step tcp2-nocheck env UNISON_TRANSPORT=tcp UNISON_CHECK_MISMATCH=0 unison bench -np 2 \
  --ops broadcast --sizes 8,64K,1M --compare gloo --json "$OUT/tcp2-nocheck.json"
# k busy loops beside the job
step busy python benchmarks/busy_cpu.py --np 2 4 --hogs 1 2 4 --json "$OUT/busy.json"
# training steps: Horovod API and DDP over unison against DDP over Gloo, interleaved
step train-comm2 env LAYERS=12 unison run -np 2 python benchmarks/hvd_train_ab.py 30
step train-comm4 env LAYERS=12 unison run -np 4 python benchmarks/hvd_train_ab.py 20
step train-conv2 env MODEL=conv unison run -np 2 python benchmarks/hvd_train_ab.py 20
step train-conv4 env MODEL=conv unison run -np 4 python benchmarks/hvd_train_ab.py 8
step tf2 bash -c 'for i in 1 2; do
  unison run -np 2 python examples/tensorflow2_synthetic_benchmark.py --num-iters 3
  python examples/tensorflow2_synthetic_benchmark.py --mode mwms --np 2 --num-iters 3; done'
step launchers2 python benchmarks/ddp_step_launchers.py -np 2
# set-up and teardown
step setup2 unison run -np 2 python benchmarks/setup_times.py --reps 15
step setup4 unison run -np 4 python benchmarks/setup_times.py --reps 10
# two hosts in network namespaces over a veth pair (root)
if [ "$(id -u)" = 0 ]; then
  step twohosts env PYTHONPATH=. python benchmarks/two_hosts.py --links unshaped,10gbit,1gbit \
    -n 0 --out "$OUT/twohosts"  # -n 0: unison bench's iterations per size (200 up to 64 KiB)
fi
# the cost model against what was measured
step simulate bash -c "for f in $OUT/np2.json $OUT/np4.json $OUT/big2.json $OUT/big4.json; do unison simulate --validate \$f; done"
echo "series end: load $(cat /proc/loadavg)"
if [ -s "$OUT/np2.json" ]; then python benchmarks/tables.py --headline "$OUT/np2.json"; fi
