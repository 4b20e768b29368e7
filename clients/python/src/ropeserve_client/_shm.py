"""``transport="shm"``: rotations through POSIX shared memory, for a client on the server's host.

The client creates objects under ``/dev/shm`` (mode 0600: the server must run as the same user, or root),
registers each once with the server, copies q, k and positions into one, and the server rotates q and k there in
place. The result tensors are views on that memory: no copy back. A region is reused only once no result views it
any more (its mapping's reference count says so); while results are kept, new regions are made, at most
``MAX_REGIONS`` registered at a time (the oldest busy one is then unregistered and unlinked; its results stay
valid: a mapping outlives its name). ``close()`` of the client unregisters and unlinks them all.
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ropeserve_client._endpoints import register_region, unregister_region
from ropeserve_client._operations import Operation, drop_none, parse_json

__all__ = ["Region", "ShmCall", "ShmPool", "stage"]

SHM_DIRECTORY = Path("/dev/shm")
KEY_PREFIX = "ropeserve_client_"
MAX_REGIONS = 8
ALIGN = 64
GRANULE = 1 << 20
"""Region sizes are rounded up to whole MiB, so that nearby sizes reuse one region."""
ROTATED = ("q", "k")
_NUMPY_NAMES = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16", np.dtype(np.int64): "int64"}


@dataclass
class Region:
    """One shared-memory object made by this client: its mapping, and whether this server knows it."""

    name: str
    size: int
    mapping: mmap.mmap
    registered: bool = False
    in_use: bool = False
    """Taken by a call in progress (results not yet made): not free, whatever the reference count says."""
    idle_refcount: int = 0
    """``sys.getrefcount(mapping)`` when nothing but this region holds the mapping."""

    @property
    def key(self) -> str:
        return KEY_PREFIX + self.name

    def free(self) -> bool:
        return not self.in_use and sys.getrefcount(self.mapping) <= self.idle_refcount

    def register(self) -> Operation[dict[str, Any]]:
        return register_region(self.name, "/" + self.key, self.size)

    def unregister(self) -> Operation[dict[str, Any]]:
        return unregister_region(self.name)

    def unlink(self) -> None:
        (SHM_DIRECTORY / self.key).unlink(missing_ok=True)


def _new_region(size: int) -> Region:
    name = f"{os.getpid()}_{uuid.uuid4().hex[:12]}"
    region = Region(name, size, _create_mapping(KEY_PREFIX + name, size))
    region.idle_refcount = sys.getrefcount(region.mapping)  # the region's own reference and the call's argument
    return region


def _create_mapping(key: str, size: int) -> mmap.mmap:
    """A new object ``/dev/shm/<key>`` of ``size`` bytes (0600), mapped shared."""
    fd = os.open(SHM_DIRECTORY / key, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


@dataclass
class ShmPool:
    """The client's regions, newest last (safe to share between threads)."""

    regions: list[Region] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, size: int) -> tuple[Region, list[Region]]:
        """A free region of at least ``size`` bytes (made if needed), marked in use until the call ends
        (``ShmCall.release``), and the regions retired to stay in bounds."""
        with self.lock:
            region, retired = self._take(size)
            region.in_use = True
            return region, retired

    def _take(self, size: int) -> tuple[Region, list[Region]]:
        fitting = [region for region in self.regions if region.size >= size and region.free()]
        if fitting:
            region = min(fitting, key=lambda item: item.size)
            self.regions.remove(region)
            self.regions.append(region)
            return region, []
        retired = []
        while len(self.regions) >= MAX_REGIONS:
            idle = [region for region in self.regions if region.free()]
            retired.append(idle[0] if idle else self.regions[0])
            self.regions.remove(retired[-1])
        region = _new_region(-(-size // GRANULE) * GRANULE)
        self.regions.append(region)
        return region, retired

    def drain(self) -> list[Region]:
        """Forget every region (the caller unregisters them); unlinks their objects."""
        regions, self.regions = self.regions, []
        for region in regions:
            region.unlink()
        return regions


@dataclass
class ShmCall:
    """One rotation staged in a region: the operations to send and the views that become the result."""

    region: Region
    retired: list[Region]
    operation: Operation[dict[str, Any]]
    views: dict[str, Any]
    backend: Literal["torch", "numpy"]

    def release(self) -> None:
        """The call is over: the region is free again once no result views it."""
        self.region.in_use = False

    def finish(self, answer: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(tensors, metadata)``: the rotated q/k (views on the region) and the server's metadata."""
        tensors = {name: self.views[name] for name in ROTATED if name in self.views}
        if self.backend == "numpy":
            tensors = {name: _as_numpy(view) for name, view in tensors.items()}
        return tensors, dict(answer.get("metadata", {}))


def stage(
    pool: ShmPool, path: str, tensors: Mapping[str, Any], params: Mapping[str, Any], backend: Literal["torch", "numpy"]
) -> ShmCall:
    """Copy ``tensors`` (q, optional k, positions; torch tensors or numpy arrays) into a region and build the
    JSON rotation request that names them (answered in place)."""
    arrays = {name: _contiguous(value) for name, value in tensors.items() if value is not None}
    offsets, end = {}, 0
    for name, array in arrays.items():
        offsets[name] = end
        end += -(-_nbytes(array) // ALIGN) * ALIGN
    region, retired = pool.take(max(end, 1))
    try:
        views = {name: _copy_into(region.mapping, offsets[name], array) for name, array in arrays.items()}
    except BaseException:
        region.in_use = False
        raise
    refs = {
        name: {"region": region.name, "offset": offsets[name], "shape": list(array.shape), "dtype": _dtype_name(array)}
        for name, array in arrays.items()
    }
    body = {"params": drop_none(params), **refs}
    operation = Operation("POST", path, parse_json, json=body)
    return ShmCall(region, retired, operation, views, backend)


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _contiguous(value: Any) -> Any:
    if _is_torch(value):
        return value.detach().cpu().contiguous()
    return np.ascontiguousarray(value)


def _nbytes(array: Any) -> int:
    return int(array.numel() * array.element_size()) if _is_torch(array) else int(array.nbytes)


def _dtype_name(array: Any) -> str:
    if _is_torch(array):
        return str(array.dtype).removeprefix("torch.")
    name = _NUMPY_NAMES.get(array.dtype, str(array.dtype))
    return name


def _copy_into(mapping: mmap.mmap, offset: int, array: Any) -> Any:
    """A view of ``array``'s shape and dtype at ``offset`` in ``mapping``, holding a copy of it."""
    if _is_torch(array):
        import torch

        view = torch.frombuffer(mapping, dtype=array.dtype, count=array.numel(), offset=offset).view(array.shape)
        view.copy_(array)
        return view
    target = np.frombuffer(mapping, dtype=array.dtype, count=array.size, offset=offset).reshape(array.shape)
    target[...] = array
    return target


def _as_numpy(view: Any) -> Any:
    """numpy results: numpy views as they are; torch views as numpy (bfloat16 widened to float32, a copy)."""
    if not _is_torch(view):
        return view
    import torch

    return view.float().numpy() if view.dtype == torch.bfloat16 else view.numpy()
