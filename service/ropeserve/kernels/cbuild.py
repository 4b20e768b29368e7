"""Build the C kernel (``csrc/rope_cpu.c``) with the host's C compiler, once, into a cached shared library.

The library is compiled for this CPU (``-march=native``) without fused multiply-adds (``-ffp-contract=off``),
keyed by a hash of the source, the flags, the compiler and the CPU, and written atomically to the cache
directory (``ROPESERVE_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/ropeserve``, else ``~/.cache/ropeserve``). A
library is only built into and loaded from a directory that this user owns and nobody else can write
(``build_dir``; otherwise a private temporary one). Without a compiler ``load_library`` reports why and the
kernel registry falls back to the torch kernels.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SOURCE = Path(__file__).with_name("csrc") / "rope_cpu.c"
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-std=gnu11", "-fPIC", "-shared")
COMPILE_TIMEOUT_S = 120
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildResult:
    """The loaded library, or None and why not."""

    library: ctypes.CDLL | None
    detail: str


def cache_dir() -> Path:
    """Where built libraries live (see the module docstring)."""
    configured = os.environ.get("ROPESERVE_KERNEL_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ropeserve"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc"))


def _cpu_identity() -> str:
    """CPU model and feature flags (``-march=native`` output differs across them)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = [line for line in lines if line.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(wanted))


def _build_key(compiler: str, source: bytes) -> str:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    material = b"\0".join([source, " ".join(FLAGS).encode(), version.encode(), _cpu_identity().encode()])
    return hashlib.sha256(material).hexdigest()[:20]


def _private(directory: Path) -> bool:
    """Whether ``directory`` (created 0700 when missing) is a real directory that only this user can write:
    a library is loaded from there, so nobody else may be able to plant one."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = directory.lstat()
    except OSError:
        return False
    owned = stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022
    return owned and os.access(directory, os.W_OK)


def build_dir() -> Path:
    """The cache directory when it is private (see ``_private``), else a per-user one under the temporary
    directory, else a fresh private temporary directory (no reuse across processes then)."""
    for candidate in (cache_dir(), Path(tempfile.gettempdir()) / f"ropeserve-{os.getuid()}"):
        if _private(candidate):
            return candidate
    return Path(tempfile.mkdtemp(prefix="ropeserve-kernels-"))


def _compile(compiler: str, target: Path) -> None:
    """Compile SOURCE into ``target`` through a temporary file (concurrent builders never see half a file)."""
    fd, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run(
            [compiler, *FLAGS, "-o", partial, str(SOURCE)],
            check=True,
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
        )
        os.replace(partial, target)
    finally:
        Path(partial).unlink(missing_ok=True)


@cache
def load_library() -> BuildResult:
    """The C kernel library, built on first use (seconds) and loaded from the cache after that."""
    compiler = _compiler()
    if compiler is None:
        return BuildResult(None, "no C compiler (cc or $CC) on PATH")
    try:
        target = build_dir() / f"rope_cpu-{_build_key(compiler, SOURCE.read_bytes())}.so"
        if target.is_file():
            return BuildResult(ctypes.CDLL(str(target)), f"loaded {target}")
        _compile(compiler, target)
        return BuildResult(ctypes.CDLL(str(target)), f"built {target}")
    except (OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", None) or str(error)
        log.warning("C rotation kernel unavailable: %s", detail)
        return BuildResult(None, f"build failed: {detail}")
