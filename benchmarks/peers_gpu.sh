#!/usr/bin/env bash
# Peers side by side on a GPU host without network access: one interpreter for PyTriton and
# LitServe made from folders of wheels (the host's own torch, Pillow and CUDA serve all three
# servers), then bench_peers.py. Run from the repository root:
#   PEER_WHEELS=DIR bash benchmarks/peers_gpu.sh install   # repeatable: one folder at a time
#   bash benchmarks/peers_gpu.sh run [bench_peers.py flags]
# The wheels: `pip download --only-binary=:all: --python-version 3.12 --platform manylinux_2_35_x86_64
# ... nvidia-pytriton==0.7.0 litserve==0.2.19 'numpy<2'` (PyTriton pins numpy below 2), less what
# the host has already; PyTriton's wheel alone is 55 MB, so they may come in two folders.
set -u
PEERS=${PEERS_DIR:-/tmp/peers}
case ${1:-run} in
  install)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$PEERS/site" "${PEER_WHEELS:?PEER_WHEELS=a folder of wheels}"/*.whl || exit 1
    ls "$PEERS/site" | grep -ci dist-info | sed 's/^/packages in the peers interpreter: /' ;;
  run)
    shift
    mkdir -p "$PEERS"
    # The peers' packages first (numpy 1.x for PyTriton), then whatever the caller set.
    # PyTriton outside a site-packages folder takes itself for an editable install and misses its
    # bundled libraries (tritonserver's libcudart among them): name them on the library path.
    printf '#!/bin/sh\nPYTHONPATH=%s${PYTHONPATH:+:$PYTHONPATH} LD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec python3 "$@"\n' \
      "$PEERS/site" "$PEERS/site/nvidia_pytriton.libs" > "$PEERS/python"
    chmod +x "$PEERS/python"
    python3 benchmarks/bench_peers.py --device cuda --triton-python "$PEERS/python" \
      --litserve-python "$PEERS/python" --out "${PEERS_OUT:-/tmp/peers-out}" "$@" ;;
  *) echo "usage: peers_gpu.sh install|run [bench_peers.py flags]" >&2; exit 2 ;;
esac
