#!/usr/bin/env bash
# benchmarks/reference.sh across several calls of limited length (a GPU host lent minutes at a
# time): unpack the run directories an earlier call left, run the steps until SECONDS are up
# (compare reuses every finished run, so a cut step resumes where it stopped), then pack every run
# directory again, whatever finished. From the repository root:
#   REF_STEPS=text DURATION= SWEEP= bash benchmarks/reference_resume.sh PARTS_DIR OUT_DIR [SECONDS]
# PARTS_DIR: runs.tgz.part-* of the last call (none the first time); OUT_DIR gets the new parts
# (15 MiB each, the span logs left out: capacities and prices come from requests.parquet, only the
# bottleneck's per-process interpreter rule reads them) and reference.sh's files.
# DURATION and SWEEP set but empty keep compare's own defaults; unset, 5 s runs and 3 s steps.
set -u
parts=${1:?PARTS_DIR}; out=${2:?OUT_DIR}; budget=${3:-540}
export REF=${REF:-/tmp/reference} OUT=$out
mkdir -p "$REF" "$out"
if ls "$parts"/runs.tgz.part-* >/dev/null 2>&1; then
  cat "$parts"/runs.tgz.part-* | tar xzf - -C "$REF" || exit 1
  echo "resumed from $(ls "$parts"/runs.tgz.part-* | wc -l) part(s)"
fi
DURATION=${DURATION-5} SWEEP=${SWEEP-3} timeout -s INT -k 15 "$budget" bash benchmarks/reference.sh
rc=$?
rm -f "$out"/runs.tgz.part-*
(cd "$REF" && tar czf - --exclude='spans.jsonl*' .) | split -b 15m - "$out/runs.tgz.part-"
ls -la "$out"
exit $rc
