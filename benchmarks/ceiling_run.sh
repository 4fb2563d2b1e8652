#!/usr/bin/env bash
# On the GPU host, from the repository root: bench_ceiling.py for the models named (default image).
set -u -o pipefail
. benchmarks/host_env.sh
# Each model's whole output is also kept, in CEILING_OUT (default runs/ceiling) as MODEL.txt.
out=${CEILING_OUT:-runs/ceiling}
mkdir -p "$out"
failed=""
# Server on cores 0-9, the load generator on the rest (one worker per core, 64 connections each).
# image: the default layout against 3 frontends + 7 pre-processing processes (auto gave 2 + 8 on one
# H100 host, 3 + 7 on another: it follows one item's pre-processing time at start-up);
# image-gpudecode: the default against the device process alone on a core (does the batched nvJPEG
# call's CPU side, in the device process, wait for cores shared with 8 frontends?);
# resnet50: the default against the device process alone on a core and against one CUDA graph
# launch per batch (its time per batch grew with the load on the cores it shared);
# image-loop: the default (uvloop's event loop in the frontends) against asyncio's, with the
# pre-processing ceiling measured again beside busy load cores;
# image-pin, resnet50-pin: each pre-processing process on a core of its own, as the ceiling's loop runs
# (in the server the same pre-processing cost ~35 % more core time per item than in that loop).
C="--duration 6 --warmup-s 2 --step 0.1 --pre-seconds 3"
for m in "${@:-image}"; do
  { case $m in
    image) timeout -s INT ${LIMIT:-560} python3 benchmarks/bench_ceiling.py --model image --device cuda --batch 32 --start 0.35 $C --step 0.05 \
             --variant "" --variant "--workers 3 --pre-processes 7" ;;
    image-loop) timeout -s INT ${LIMIT:-560} python3 benchmarks/bench_ceiling.py --model image --device cuda --batch 32 --start 0.5 $C --step 0.05 \
             --busy-neighbours --variant "" --variant "--event-loop asyncio" ;;
    image-pin) timeout -s INT ${LIMIT:-560} python3 benchmarks/bench_ceiling.py --model image --device cuda --batch 32 --start 0.4 $C --step 0.05 \
             --variant "" --variant=--pin-pre-processes ;;
    resnet50-pin) timeout -s INT ${LIMIT:-560} python3 benchmarks/bench_ceiling.py --model resnet50 --device cuda --batch 32 --start 0.4 $C \
             --variant=--cuda-graphs --variant "--cuda-graphs --pin-pre-processes" ;;
    image-gpudecode) timeout -s INT ${LIMIT:-560} python3 benchmarks/bench_ceiling.py --model image --handler-option decode=gpu --device cuda --batch 32 --start 0.2 $C --step 0.08 \
             --variant "" --variant "--device-cores 1" ;;
    text) timeout -s INT ${LIMIT:-560} python3 benchmarks/bench_ceiling.py --model text --handler-option pad=fixed --device cuda --batch 64 --start 0.4 $C --step 0.05 \
             --variant "" --variant "--device-cores 0" ;;
    resnet50) timeout -s INT ${LIMIT:-560} python3 benchmarks/bench_ceiling.py --model resnet50 --device cuda --batch 32 --start 0.3 $C \
             --variant "" --variant "--device-cores 1" --variant=--cuda-graphs ;;
    image-cpu) timeout -s INT 560 python3 benchmarks/bench_ceiling.py --model image --device cpu --server-cores 12 --batch 8 --start 0.3 $C ;;
    text-cpu) timeout -s INT 560 python3 benchmarks/bench_ceiling.py --model text --device cpu --server-cores 12 --batch 8 --queue-delay-ms 10 --start 0.3 $C ;;
    *) timeout -s INT 560 python3 benchmarks/bench_ceiling.py $m ;;
  esac; } 2>&1 | tee "$out/${m//[^A-Za-z0-9._-]/_}.txt"
  rc=$?
  [ $rc -eq 0 ] || failed="$failed $m (exit $rc$([ $rc -eq 124 ] && echo ': LIMIT cut its sweep short'))"
done
[ -z "$failed" ] || { echo "ceiling_run.sh: not completed:$failed" >&2; exit 1; }
