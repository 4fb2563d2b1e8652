#!/usr/bin/env bash
# Run on the GPU host from the repository root: GPU tests, then the server benchmarks.
set -u
. benchmarks/host_env.sh
OUT=${OUT:-/tmp/netgain-out}; mkdir -p "$OUT"
cd benchmarks
step() { echo "=== $*"; "$@" 2>&1 | tee -a "$OUT/log.txt" | tail -n 25; }
for s in ${STEPS:-smoke tests span efficiency frontend overhead loadgen}; do
  case $s in
    smoke) step python3 gpu_smoke.py ;;
    tests) (cd .. && step python3 -m pytest -q -m gpu -p no:cacheprovider tests/) ;;
    span) step python3 bench_span_accuracy.py --device cuda --model image --batch 64 ;;
    span_graphs) step python3 bench_span_accuracy.py --device cuda --model image --batch 64 --cuda-graphs ;;
    efficiency) step python3 bench_gpu_efficiency.py --device cuda --batch 64 --models image,text ;;
    efficiency_text1) step python3 bench_gpu_efficiency.py --device cuda --batch 64 --models text --items 1 --servers 1,2 ;;
    efficiency_bf16) step python3 bench_gpu_efficiency.py --device cuda --batch 64 --dtype bfloat16 --models image,text ;;
    overhead) step python3 bench_overhead.py --device cuda --client-procs 4 --trials 1 ;;
    overhead_null) step python3 bench_overhead.py --device cuda --client-procs 4 --trials 3 --models null ;;
    overhead5) step python3 bench_overhead.py --device cuda --client-procs 4 --trials 5 --models null ;;
    overhead_null7) step python3 bench_overhead.py --device cuda --client-procs 4 --trials 7 --models null ;;
    overhead_sbs) step python3 bench_overhead.py --device cuda --client-procs 4 --trials 4 --models null,image --side-by-side ;;
    overhead_image) step python3 bench_overhead.py --device cuda --client-procs 4 --trials 3 --models image --server-cores 8 ;;
    loadgen) step timeout 280 python3 bench_loadgen.py --servers 8 --workers 1,8 --duration 5 ;;
    loadgen_doc) step timeout 400 python3 bench_loadgen.py --servers 8 --workers 1 --duration 5 --overload-rate 16000 --fractions 0.6,0.8 ;;
    loadgen_fid) step timeout 200 python3 bench_loadgen.py --servers 8 --workers 1 --duration 5 --fractions 0.2,0.4,0.6,0.8 ;;
    loadgen_http) step timeout 500 python3 bench_loadgen.py --servers 4 --workers 1 --duration 5 --protocols netgain,oip-http,http-json --canned --overload-rate 16000 --fractions 0.4,0.8 ;;
    graphs) (cd .. && step python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_server_gpu.py -k graphs) ;;
    reference) (cd .. && step bash benchmarks/reference.sh) ;;
    frontend) step python3 bench_frontend.py --servers 8,12 --client-procs 4 ;;
    *) echo "unknown step $s" ;;
  esac
done
