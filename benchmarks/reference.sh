#!/usr/bin/env bash
# The H200 reference result: netgain compare for the image and text models, a cold-start drill
# and a profile. Run from the repository root on a GPU host (benchmarks/gpu_run.sh reference).
# Prices assumed (on-demand list prices, USD/hour, stated in docs/reference/README.md):
#   CPU baseline: a 16-vCPU general-purpose instance 0.68; GPU treatment: one H200 share 3.50.
set -u
OUT=${OUT:-/tmp/netgain-out}
REF=${REF:-/tmp/reference}
mkdir -p "$REF"
common=(--cpu-price-per-hour 0.68 --gpu-price-per-hour 3.50 --slo-p99-ms 100 --batch-sizes 1,32
        --duration 8 --warmup-s 2 --rate 50 --rates 50,150,400 --sweep-duration 6 --workers 2)
python3 -m loadgen.cli compare --model image "${common[@]}" --out "$REF/image" 2>&1 | tail -n 40
python3 -m loadgen.cli compare --model text --handler-option pad=fixed "${common[@]}" --out "$REF/text" 2>&1 | tail -n 40
python3 -m loadgen.cli drill --model image --device cuda --repeats 3 --out "$REF/drill-image-cuda" 2>&1 | tail -n 12
python3 -m loadgen.cli profile --model image --device cuda --rate 200 --duration 12 --batches 20 \
  --serve-args "--max-batch-size 32" --out "$REF/profile-image-cuda" 2>&1 | tail -n 30
# Keep the reports, not the raw rows: one archive comes back.
(cd "$REF" && find . \( -path '*compare-*' -name 'report.*' \) -o -name 'drill.json' -o -name 'profile-summary.*' \
   | tar czf "$OUT/reference.tgz" -T -)
ls -la "$OUT"
