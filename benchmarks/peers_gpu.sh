#!/usr/bin/env bash
# Peers side by side on a GPU host without network access: one venv for PyTriton and
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
    # A venv over the host's packages: PyTriton finds its bundled libraries only from a site-packages
    # folder, and Triton's Python backend stub imports numpy and zmq from the venv it was started in.
    # The host's python3 may itself be a venv, whose packages (torch) --system-site-packages misses.
    if [ ! -x "$PEERS/venv/bin/python" ]; then
      python3 -m venv --system-site-packages "$PEERS/venv" || exit 1
      site='import site; print(site.getsitepackages()[0])'
      python3 -c "$site" > "$("$PEERS/venv/bin/python" -c "$site")/host-packages.pth" || exit 1
    fi
    # Without PYTHONPATH: pip would take a wheel found there (zmq in the carried Locust wheels) as installed.
    env -u PYTHONPATH "$PEERS/venv/bin/python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      "${PEER_WHEELS:?PEER_WHEELS=a folder of wheels}"/*.whl || exit 1
    "$PEERS/venv/bin/python" -m pip list 2>/dev/null | wc -l | sed 's/^/packages in the peers venv: /' ;;
  run)
    shift
    mkdir -p "$PEERS"
    python3 benchmarks/bench_peers.py --device cuda --triton-python "$PEERS/venv/bin/python" \
      --litserve-python "$PEERS/venv/bin/python" --out "${PEERS_OUT:-/tmp/peers-out}" "$@" ;;
  *) echo "usage: peers_gpu.sh install|run [bench_peers.py flags]" >&2; exit 2 ;;
esac
