#!/usr/bin/env bash
# The H200 reference result: netgain compare for the image and text models (Poisson and a bursty
# trace), each GPU bottleneck checked by removing it, a cold-start drill and a profile. Run from
# the repository root on a GPU host: REF_STEPS="text image resnet50 bert-base" bash benchmarks/reference.sh
# Steps image-bursty/text-bursty replay a synthesized gamma trace (CV 3); text-azure the Azure LLM
# inference trace 2023 (code), downloaded to $AZURE_CODE (AzurePublicDataset, data/AzureLLMInferenceTrace_code.csv).
# Step warmup: benchmarks/bench_warmup.py (what a batch size first seen while serving costs); step
# layout: benchmarks/bench_cpu_layout.py on the treatment device (channels-last convolutions).
# Prices assumed (USD/hour, see docs/reference/README.md): CPU baseline, a 16-vCPU
# general-purpose instance, 0.68; GPU treatment, one H200 GPU with its share of host, 3.50.
set -u -o pipefail  # a compare that fails fails its step, through tee and tail
. benchmarks/host_env.sh
OUT=${OUT:-/tmp/netgain-out}
REF=${REF:-/tmp/reference}
DEV=${TREATMENT_DEVICE:-cuda}
mkdir -p "$REF" "$OUT"
archive() {  # after each step, so a cut-off run still returns what it finished
  (cd "$REF" && find . \( -name 'report.*' -path '*compare-*' \) -o -name 'drill.json' -o -name 'profile-summary.*' \
     -o -name '*.txt' -o -name 'trace-*' -o -name 'server.log' | tar czf "$OUT/reference.tgz" -T -)
}
# Defaults only: model, prices, SLO. DURATION/SWEEP shorten the runs (say so beside the figures).
common=(--cpu-price-per-hour 0.68 --gpu-price-per-hour 3.50 --slo-p99-ms 100 --treatment-device "$DEV")
[ -n "${DURATION:-}" ] && common+=(--duration "$DURATION" --warmup-s 2)
[ -n "${SWEEP:-}" ] && common+=(--sweep-duration "$SWEEP")
image=(--model image)
text=(--model text)
cmp() {  # name, compare flags...; progress appends, so a compare resumed over calls keeps every call's lines
  local name=$1; shift
  echo "=== $(date -u +%FT%TZ) $name" >>"$REF/$name.progress.txt"
  python3 -m netgain.cli compare "$@" "${common[@]}" --out "$REF/$name" 2>>"$REF/$name.progress.txt" \
    | tee "$REF/$name.txt" | tail -n 40
}
failed=()
for step in ${REF_STEPS:-text image resnet50 bert-base}; do
  echo "=== $step $(date -u +%T)"
  case $step in
    image|text|resnet50|bert-base) cmp "$step" --model "$step" ;;
    image-bursty|text-bursty)
      m=${step%-bursty}
      python3 -m netgain.cli trace synth --arrival gamma --cv 3 --rate 200 --duration 40 --seed 0 \
        --out "$REF/trace-gamma-cv3.csv" >/dev/null
      if [ "$m" = image ]; then cmp "$step" "${image[@]}" --trace "$REF/trace-gamma-cv3.csv"
      else cmp "$step" "${text[@]}" --trace "$REF/trace-gamma-cv3.csv"; fi ;;
    text-azure)  # a public production trace (docs/traces.md): its shape at a mean of 200 req/s
      python3 -m netgain.cli trace import "${AZURE_CODE:-runs/public/AzureLLMInferenceTrace_code.csv}" \
        --format azure-llm-2023 --out "$REF/trace-azure-code.csv" >/dev/null &&
      python3 -m netgain.cli trace rescale "$REF/trace-azure-code.csv" --rate 200 \
        --out "$REF/trace-azure-code-200.csv" >/dev/null &&
      cmp "$step" "${text[@]}" --trace "$REF/trace-azure-code-200.csv" ;;
    confirm-image) python3 benchmarks/bench_confirm.py "$REF/image" --model image --device "$DEV" \
        2>&1 | tee "$REF/confirm-image.txt" | tail -n 12 ;;
    confirm-text) python3 benchmarks/bench_confirm.py "$REF/text" --model text --handler-option pad=fixed \
        --device "$DEV" 2>&1 | tee "$REF/confirm-text.txt" | tail -n 12 ;;
    drill) python3 -m netgain.cli drill --model image --device "$DEV" --repeats 2 --out "$REF/drill-image-cuda" \
        2>&1 | tail -n 12 ;;
    profile) python3 -m netgain.cli profile --model image --device "$DEV" --rate 100 --duration 10 --batches 10 \
        --serve-args "--max-batch-size 32" --out "$REF/profile-image-cuda" 2>&1 | tail -n 30 ;;
    warmup) python3 benchmarks/bench_warmup.py --models image,resnet50,bert-base,text --device "$DEV" \
        --max-batch 64 --threads 4 2>&1 | tee "$REF/warmup.txt" | tail -n 12 ;;
    layout) python3 benchmarks/bench_cpu_layout.py --device "$DEV" --models image,resnet50 --batches 1,4,16,64 \
        --threads 4 --reps 20 2>&1 | tee "$REF/layout.txt" | tail -n 12 ;;
    *) echo "unknown step $step"; false ;;
  esac
  [ $? -eq 0 ] || failed+=("$step")
  archive
done
ls -la "$OUT"
[ ${#failed[@]} -eq 0 ] || { echo "reference.sh: failed steps: ${failed[*]}" >&2; exit 1; }
