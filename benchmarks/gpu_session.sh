#!/usr/bin/env bash
# Every GPU figure and check in ONE device call, at most about 5 minutes on an H200 (each part has a time cap):
#   1. tests/gpu (Triton parity incl. the batch entry point, no host sync under sync-debug "error", CUDA graph
#      replay, pinned staging)
#   2. benchmarks/gpu_check.py: parity, bandwidth as a multiple of a device copy (transformers eager,
#      torch.compile, Triton in/out of place, host positions, batch), host cost per call, tile sweep
#   3. benchmarks/bench_rotation.py over HTTP with the service on CUDA: 64 MiB end to end against a bare TCP
#      echo of the same bytes, and batching on/off
# Logs go to $OUT (the device tool's folder that comes back) or ./gpu-session-out. Needs .whl/ from
# benchmarks/device_wheels.sh (carried: the device lacks fastapi, pydantic & co.). The exact call is in README.md,
# "GPU figures".
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-session-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if [ -d .whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/service:$PWD/clients/python/src${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 ROPESERVE_DEVICE=cuda
status=0
part() {  # part NAME SECONDS COMMAND...: run with a time cap, log to $OUT/NAME.log, remember a failure
  local name=$1 cap=$2
  shift 2
  echo "== $name (cap ${cap}s): $*"
  local started=$SECONDS
  timeout "$cap" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - started))s"
  [ "$rc" -eq 0 ] || status=1
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
part gpu_tests 100 $PY -m pytest tests/gpu -q -x -p no:cacheprovider -n 8
part gpu_check 150 $PY benchmarks/gpu_check.py --budget-s 80
part http_cuda 50 $PY benchmarks/bench_rotation.py --skip-in-process --rounds 5 --batching-rounds 1
exit $status
