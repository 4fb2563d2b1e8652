#!/usr/bin/env bash
# On the GPU host, from the repository root: bench_ceiling.py for the models named (default image).
# Locust and grpcio-health-checking/-reflection matching the host's grpcio travel as wheels in .whl/.
set -u
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
for m in "${@:-image}"; do
  case $m in
    image) timeout 560 python3 benchmarks/bench_ceiling.py --model image --device cuda --batch 32 --server-cores 12 ;;
    text) timeout 560 python3 benchmarks/bench_ceiling.py --model text --handler-option pad=fixed --device cuda --batch 64 --server-cores 12 ;;
    *) timeout 560 python3 benchmarks/bench_ceiling.py $m ;;
  esac
done
