# syntax=docker/dockerfile:1
# ropeserve image: one uvicorn worker per container, non-root, health-checked; scale with replicas.
#
#   CPU (default):  docker build -t ropeserve:0.1.0-cpu .
#   CUDA:           docker build -t ropeserve:0.1.0-cuda --build-arg VARIANT=cuda \
#                     --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04 .
#   Podman/Buildah: podman build -t ropeserve:0.1.0-cpu .   (OCI format: no SHELL, every RUN is POSIX sh)
#
# Every Python package comes from requirements/$VARIANT.lock, pinned with sha256 hashes (scripts/lock writes it),
# so two builds install the same files. The CPU lock pins torch's CPU-only wheel from TORCH_INDEX_URL (a mirror
# works: the hashes are checked, not the host); everything else comes from PIP_INDEX_URL. The final stage copies
# only the virtual environment and keeps a C compiler: the CPU rotation kernel is compiled for the host's CPU at
# start-up (-march=native, so it cannot be built into the image), and triton builds its launcher at run time.

ARG BASE_IMAGE=python:3.11-slim-bookworm

# ---- base: a Python interpreter and a C compiler on the chosen base image (nvidia/cuda images ship neither) ----
FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# POSIX sh only (Buildah and Podman ignore SHELL in their default OCI format). Package versions come from the
# base image's distribution release; pinning them here would break on every base. $packages is split on purpose.
# hadolint ignore=DL3008,SC2086
RUN set -eu; \
    packages=""; \
    command -v python3 >/dev/null || packages="python3 python3-venv python3-dev"; \
    command -v cc >/dev/null || packages="$packages gcc libc6-dev"; \
    if [ -n "$packages" ]; then \
      apt-get update \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $packages \
      && rm -rf /var/lib/apt/lists/*; \
    fi

# ---- build: the virtual environment from the lock file, then ropeserve itself without dependencies ----
FROM base AS build
ARG VARIANT=cpu
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY requirements/ ./requirements/
RUN set -eu; \
    if [ "$VARIANT" = cpu ]; then set -- --extra-index-url "$TORCH_INDEX_URL"; else set --; fi; \
    pip install --no-cache-dir --require-hashes --no-deps --only-binary=:all: \
      --index-url "$PIP_INDEX_URL" "$@" -r "requirements/${VARIANT}.lock"
COPY pyproject.toml README.md ./
COPY service ./service
RUN pip install --no-cache-dir --no-deps --no-build-isolation /src

# ---- runtime: the final, small image ----
FROM base AS runtime
# OCI labels: VERSION follows pyproject.toml; pass the commit and repository URL at build time
# (--build-arg REVISION=$(git rev-parse HEAD) --build-arg SOURCE=$(git remote get-url origin)).
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="ropeserve" \
      org.opencontainers.image.description="Reference service for RoPE position encodings" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
RUN groupadd --system --gid 10001 ropeserve \
    && useradd --system --uid 10001 --gid ropeserve --create-home --home-dir /home/ropeserve \
       --shell /usr/sbin/nologin ropeserve
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    ROPESERVE_HOST=0.0.0.0 \
    ROPESERVE_PORT=8000 \
    ROPESERVE_DEVICE=auto \
    TRITON_CACHE_DIR=/tmp/triton \
    ROPESERVE_KERNEL_CACHE=/tmp/ropeserve-kernels
WORKDIR /home/ropeserve
USER 10001:10001
EXPOSE 8000
# Readiness, not liveness: compose's depends_on service_healthy should wait for warm-up. Sends the
# bearer token when one is configured, so it also works with ROPESERVE_AUTH_PROTECT_PROBES=true.
HEALTHCHECK --interval=10s --timeout=4s --start-period=60s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request as u; t = os.environ.get('ROPESERVE_AUTH_TOKEN'); u.urlopen(u.Request('http://127.0.0.1:%s/health/ready' % os.environ.get('ROPESERVE_PORT', '8000'), headers={'Authorization': 'Bearer ' + t} if t else {}), timeout=3)"]
STOPSIGNAL SIGTERM
CMD ["ropeserve", "serve"]
