#!/usr/bin/env bash
# Download, into .whl/ (git-ignored), the wheels the service needs on the GPU machine that its image lacks
# (fastapi, starlette, pydantic, pydantic-settings, uvicorn, their own needs, and opentelemetry-api, which
# fastapi imports), at the versions of this checkout's .venv, built for the device's Python 3.12 on x86-64.
# Run here before the device call that runs benchmarks/gpu_session.sh (see README, "GPU figures").
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(fastapi starlette pydantic pydantic-core pydantic-settings python-dotenv uvicorn annotated-types
          typing-inspection typing-extensions opentelemetry-api)
pins=$(.venv/bin/python - "${PACKAGES[@]}" <<'PY'
import importlib.metadata as metadata
import sys

print(" ".join(f"{name}=={metadata.version(name)}" for name in sys.argv[1:]))
PY
)
mkdir -p .whl
# shellcheck disable=SC2086
.venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl $pins
ls .whl
