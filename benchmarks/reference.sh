#!/usr/bin/env bash
# The H200 reference result: netgain compare for the image and text models, a cold-start drill
# and a profile. Run from the repository root on a GPU host (benchmarks/gpu_run.sh reference).
# Prices assumed (USD/hour, see docs/reference/README.md): CPU baseline, a 16-vCPU
# general-purpose instance, 0.68; GPU treatment, one H200 GPU with its share of host, 3.50.
set -u
OUT=${OUT:-/tmp/netgain-out}
REF=${REF:-/tmp/reference}
mkdir -p "$REF"
archive() {  # after each step, so a cut-off run still returns what it finished
  (cd "$REF" && find . \( -path '*compare-*' -name 'report.*' \) -o -name 'drill.json' -o -name 'profile-summary.*' \
     | tar czf "$OUT/reference.tgz" -T -)
}
common=(--cpu-price-per-hour 0.68 --gpu-price-per-hour 3.50 --slo-p99-ms 100 --batch-sizes ${BATCHES:-1,32}
        --duration ${DURATION:-6} --warmup-s 2 --rate 50 --rates ${RATES:-50,400} --sweep-duration 6 --workers 2)
for step in ${REF_STEPS:-image text drill profile}; do
  case $step in
    image) python3 -m netgain.cli compare --model image "${common[@]}" --out "$REF/image" 2>&1 | tail -n 30 ;;
    text) python3 -m netgain.cli compare --model text --handler-option pad=fixed "${common[@]}" \
            --out "$REF/text" 2>&1 | tail -n 30 ;;
    image-bf16) python3 -m netgain.cli compare --model image --treatment-serve-args "--dtype bfloat16" \
            "${common[@]}" --out "$REF/image-bf16" 2>&1 | tail -n 30 ;;
    text-bf16) python3 -m netgain.cli compare --model text --handler-option pad=fixed \
            --treatment-serve-args "--dtype bfloat16" "${common[@]}" --out "$REF/text-bf16" 2>&1 | tail -n 30 ;;
    drill) python3 -m netgain.cli drill --model image --device cuda --repeats 2 --out "$REF/drill-image-cuda" \
            2>&1 | tail -n 12 ;;
    profile) python3 -m netgain.cli profile --model image --device cuda --rate 100 --duration 10 --batches 10 \
            --serve-args "--max-batch-size 32" --out "$REF/profile-image-cuda" 2>&1 | tail -n 30 ;;
    *) echo "unknown step $step" ;;
  esac
  archive
done
ls -la "$OUT"
