# syntax=docker/dockerfile:1
# ropeserve image: one uvicorn worker per container, non-root, health-checked; scale with replicas.
#
#   CPU (default):  docker build -t ropeserve .
#   CUDA:           docker build -t ropeserve:cuda --build-arg VARIANT=cuda \
#                     --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04 .
#
# The CPU variant installs torch from the PyTorch CPU wheel index (no multi-GB CUDA build); the CUDA
# variant installs the CUDA wheel of the same torch version plus triton (the `gpu` extra). The final
# stage copies only the virtual environment (no pip cache or source tree) and keeps a C compiler: the CPU
# rotation kernel is compiled for the host's CPU at start-up (-march=native, so it cannot be built into the
# image) into ROPESERVE_KERNEL_CACHE, and triton builds its launcher at run time on CUDA.

ARG BASE_IMAGE=python:3.11-slim-bookworm

# ---- base: a Python interpreter on the chosen base image (nvidia/cuda images ship none) ----
FROM ${BASE_IMAGE} AS base
ARG VARIANT=cpu
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Versions come from the base image's distribution release; pinning them here would break on every base.
# hadolint ignore=DL3008
RUN packages=(); \
    command -v python3 >/dev/null || packages+=(python3 python3-venv python3-dev); \
    command -v cc >/dev/null || packages+=(gcc libc6-dev); \
    if [ "${#packages[@]}" -gt 0 ]; then \
      apt-get update \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${packages[@]}" \
      && rm -rf /var/lib/apt/lists/*; \
    fi

# ---- build: the virtual environment with torch and ropeserve ----
FROM base AS build
ARG VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_CUDA=cu128
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first, in its own layer: it is by far the largest and changes least often.
RUN if [ "$VARIANT" = cuda ]; then index="https://download.pytorch.org/whl/${TORCH_CUDA}"; \
    else index="https://download.pytorch.org/whl/cpu"; fi; \
    pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "$index"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY service ./service
RUN extra="server"; if [ "$VARIANT" = cuda ]; then extra="server,gpu"; fi; \
    pip install --no-cache-dir "/src[${extra}]"

# ---- runtime: the final, small image ----
FROM base AS runtime
ARG VARIANT=cpu
LABEL org.opencontainers.image.title="ropeserve" \
      org.opencontainers.image.description="Reference service for RoPE position encodings" \
      org.opencontainers.image.licenses="Apache-2.0"
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
