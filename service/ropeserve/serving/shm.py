"""Shared-memory regions for clients on the same host (after Triton's system shared-memory extension).

A client creates a POSIX shared-memory object (``/dev/shm/<key>``), registers it once under a name, and then names
tensors in it (region, byte offset, shape, dtype) instead of sending their bytes. A region belongs to the
credential that registered it; another credential neither sees nor uses it.

Safety: names and keys are plain tokens (no paths; keys start with the configured prefix); the object is opened
with O_NOFOLLOW, must be a regular file at least ``byte_size`` long, and is mapped once (read-only when
registered so). Before every use the size and link count are checked again (``fstat``), so a client that
truncated or unlinked its object gets a 409 instead of the server touching pages that no longer exist (the
SIGBUS that would kill the process). A mapping is never closed while a tensor may view it: unregistering drops the
registry's reference and the pages go when the last view does. Registry calls run on the event loop.
"""

from __future__ import annotations

import math
import mmap
import os
import re
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ropeserve.errors import Conflict, InvalidInput, LimitExceeded, NotFound

SHM_DIRECTORY = Path("/dev/shm")
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
KEY_PATTERN = re.compile(r"/?[A-Za-z0-9_.-]{1,200}")
MAX_REGION_BYTES = 1 << 40
TENSOR_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int32": torch.int32,
    "int64": torch.int64,
}


@dataclass(frozen=True)
class TensorRef:
    """A tensor in a region: ``shape`` elements of ``dtype`` from byte ``offset`` (C order)."""

    region: str
    offset: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * TENSOR_DTYPES[self.dtype].itemsize

    def span(self) -> tuple[str, int, int]:
        return self.region, self.offset, self.offset + self.nbytes

    def describe(self) -> dict[str, Any]:
        return {"region": self.region, "offset": self.offset, "shape": list(self.shape), "dtype": self.dtype}


@dataclass
class Region:
    """One registered object: its descriptor (kept for ``fstat``) and its mapping of ``byte_size`` bytes."""

    owner: str
    name: str
    key: str
    byte_size: int
    read_only: bool
    fd: int
    mapping: mmap.mmap
    closed: bool = field(default=False)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "byte_size": self.byte_size, "read_only": self.read_only}

    def check_usable(self) -> None:
        """409 when the client unlinked or shrank the object since it registered it (checked before each use)."""
        status = os.fstat(self.fd)
        if status.st_nlink == 0:
            raise Conflict(
                f"region '{self.name}': the object '{self.key}' was unlinked; register it again", field=self.name
            )
        if status.st_size < self.byte_size:
            raise Conflict(
                f"region '{self.name}': the object '{self.key}' is now {status.st_size} bytes, "
                f"shorter than the registered {self.byte_size}",
                field=self.name,
            )

    def view(self, ref: TensorRef, field_name: str, writable: bool) -> torch.Tensor:
        """A tensor viewing ``ref``'s bytes (shape and bounds checked; 422 naming ``field_name``)."""
        if writable and self.read_only:
            raise InvalidInput(
                f"region '{self.name}' was registered read-only; it cannot hold an answer", field=field_name
            )
        dtype = TENSOR_DTYPES[ref.dtype]
        if ref.offset % dtype.itemsize:
            raise InvalidInput(
                f"offset {ref.offset} is not a multiple of {dtype.itemsize} ({ref.dtype})", field=field_name
            )
        if ref.offset + ref.nbytes > self.byte_size:
            raise InvalidInput(
                f"bytes {ref.offset}..{ref.offset + ref.nbytes} lie outside region '{self.name}' "
                f"({self.byte_size} bytes)",
                field=field_name,
            )
        if ref.numel == 0:
            return torch.empty(ref.shape, dtype=dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only mappings: never written (checked above)
            flat = torch.frombuffer(self.mapping, dtype=dtype, count=ref.numel, offset=ref.offset)
        return flat.view(ref.shape)

    def close(self) -> None:
        """Forget the object: close the descriptor; the mapping goes with its last view (never unmapped under one)."""
        if not self.closed:
            self.closed = True
            os.close(self.fd)


class RegionRegistry:
    """Regions by owner (credential) and name, at most ``max_per_owner`` each."""

    def __init__(self, max_per_owner: int, key_prefix: str, directory: Path = SHM_DIRECTORY) -> None:
        self.max_per_owner, self.key_prefix, self.directory = max_per_owner, key_prefix, directory
        self.by_owner: dict[str, dict[str, Region]] = {}

    def register(self, owner: str, name: str, key: str, byte_size: int, read_only: bool = False) -> Region:
        """Open and map ``key``; registering the same name, key, size and mode again returns the existing region."""
        _check_name(name)
        path = self._path(key)
        owned = self.by_owner.setdefault(owner, {})
        existing = owned.get(name)
        if existing is not None:
            if (existing.key, existing.byte_size, existing.read_only) == (key, byte_size, read_only):
                return existing
            raise Conflict(f"region '{name}' is already registered with other key, size or mode", field="name")
        if len(owned) >= self.max_per_owner:
            raise LimitExceeded(
                f"{len(owned)} regions are registered; unregister one first", field="name", limit=self.max_per_owner
            )
        region = _open_region(owner, name, key, path, byte_size, read_only)
        owned[name] = region
        return region

    def regions(self, owner: str) -> list[Region]:
        return list(self.by_owner.get(owner, {}).values())

    def get(self, owner: str, name: str) -> Region:
        """The owner's region ``name``, checked usable; another owner's region is reported as not registered."""
        region = self.by_owner.get(owner, {}).get(name)
        if region is None:
            raise NotFound(f"no region '{name}' is registered by this client", field="region")
        region.check_usable()
        return region

    def unregister(self, owner: str, name: str) -> None:
        region = self.by_owner.get(owner, {}).pop(name, None)
        if region is None:
            raise NotFound(f"no region '{name}' is registered by this client", field="name")
        region.close()

    def close_all(self) -> None:
        for owned in self.by_owner.values():
            for region in owned.values():
                region.close()
        self.by_owner.clear()

    def _path(self, key: str) -> Path:
        if not KEY_PATTERN.fullmatch(key) or key.strip("/") in (".", ".."):
            raise InvalidInput(
                f"key {key!r} is not a POSIX shared-memory name ([A-Za-z0-9_.-], one optional leading /)", field="key"
            )
        bare = key.lstrip("/")
        if not bare.startswith(self.key_prefix):
            raise InvalidInput(
                f"key must start with '{self.key_prefix}' (the service's shared-memory prefix)", field="key"
            )
        return self.directory / bare


def _check_name(name: str) -> None:
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidInput(f"name {name!r}: 1 to 64 of [A-Za-z0-9_.-]", field="name")


def _open_region(owner: str, name: str, key: str, path: Path, byte_size: int, read_only: bool) -> Region:
    flags = (os.O_RDONLY if read_only else os.O_RDWR) | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise NotFound(f"no shared-memory object '{key}' on this host", field="key") from None
    except OSError as error:
        raise InvalidInput(f"shared-memory object '{key}' cannot be opened: {error.strerror}", field="key") from None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise InvalidInput(f"'{key}' is not a shared-memory object", field="key")
        if status.st_size < byte_size:
            raise InvalidInput(
                f"'{key}' has {status.st_size} bytes, fewer than byte_size {byte_size}", field="byte_size"
            )
        prot = mmap.PROT_READ if read_only else mmap.PROT_READ | mmap.PROT_WRITE
        mapping = mmap.mmap(fd, byte_size, flags=mmap.MAP_SHARED, prot=prot)
    except BaseException:
        os.close(fd)
        raise
    return Region(owner, name, key, byte_size, read_only, fd, mapping)


def check_disjoint(refs: dict[str, TensorRef], same_allowed: set[frozenset[str]]) -> None:
    """422 when two named tensors overlap in one region (pairs in ``same_allowed`` may coincide exactly)."""
    names = sorted(refs)
    for index, name_a in enumerate(names):
        for name_b in names[index + 1 :]:
            (region_a, start_a, end_a), (region_b, start_b, end_b) = refs[name_a].span(), refs[name_b].span()
            if region_a != region_b or start_a >= end_b or start_b >= end_a:
                continue
            if frozenset((name_a, name_b)) in same_allowed and (start_a, end_a) == (start_b, end_b):
                continue
            raise InvalidInput(f"'{name_a}' and '{name_b}' overlap in region '{region_a}'", field=name_b)
