"""The GPU rotation path reads nothing back from the device (no host synchronisation per call).

Device memory is played by the ``meta`` device: its tensors have no data, so any read-back (``.item()``,
``.tolist()``, ``int(t)``, ``.cpu()``) raises. On top, a torch-function mode records every read-back-shaped
call (``item``, ``tolist``, ``aminmax``, ``int``/``bool``/``float``, ``cpu``, ``numpy``) on a non-CPU tensor.
The Triton launches are recorded instead of run (the kernels' arithmetic is tested under the interpreter).
Runs without a GPU and without ``TRITON_INTERPRET``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

pytest.importorskip("triton")

from ropeserve.config import from_explicit  # noqa: E402
from ropeserve.errors import InvalidInput, ServiceError  # noqa: E402
from ropeserve.kernels import MropeSpec, RotationSpec, triton_rope  # noqa: E402
from ropeserve.rope.tables import MAX_POSITION, TableCache  # noqa: E402
from ropeserve.serving import REQUIRED_TENSORS, RotationOptions, RotationService, SafetensorsPayload  # noqa: E402
from ropeserve.settings import Settings  # noqa: E402

META = torch.device("meta")
PARAMS = from_explicit({"rope_theta": 10_000.0, "head_dim": 64})
MROPE_PARAMS = from_explicit({"rope_theta": 1e6, "head_dim": 32, "mrope_section": [4, 6, 6], "model_type": "qwen2_vl"})
READ_BACKS = {"item", "tolist", "aminmax", "__int__", "__bool__", "__float__", "__index__", "cpu", "numpy"}


class DeviceReadBacks(TorchFunctionMode):
    """Records read-back-shaped calls whose tensor arguments include a non-CPU tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", str(func))
        if name in READ_BACKS and any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in args):
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


class RecordedKernel:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args, **constants)`` is recorded, not run."""

    def __init__(self) -> None:
        self.launches: list[tuple[tuple[int, ...], tuple[Any, ...]]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        return lambda *args, **constants: self.launches.append((grid, args))


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> dict[str, RecordedKernel]:
    recorded = {"one": RecordedKernel(), "batch": RecordedKernel()}
    monkeypatch.setattr(triton_rope, "_rope_kernel", recorded["one"])
    monkeypatch.setattr(triton_rope, "_rope_batch_kernel", recorded["batch"])
    return recorded


@pytest.fixture
def read_backs() -> Iterator[DeviceReadBacks]:
    with DeviceReadBacks() as mode:
        yield mode
    assert mode.calls == []


def qk(layout: str = "flat", tokens: int = 6, head_dim: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    shapes = {"flat": [(tokens, 4 * head_dim), (tokens, 2 * head_dim)], "bhtd": [(2, 4, tokens, head_dim)] * 2}
    q_shape, k_shape = shapes[layout]
    return torch.empty(q_shape, dtype=torch.bfloat16, device=META), torch.empty(
        k_shape, dtype=torch.bfloat16, device=META
    )


@pytest.mark.parametrize("inplace", [True, False])
@pytest.mark.parametrize(
    "positions",
    [
        torch.arange(6),
        torch.tensor([0, 5, 300_000, 7, 9, 1]),
        torch.tensor([-3, 0, 1, 2, 3, 4]),
        torch.arange(6).to(META),
    ],
    ids=["in-table", "past-row-cap", "negative", "on-device"],
)
def test_triton_call_reads_nothing_back(
    positions: torch.Tensor, inplace: bool, kernels: dict[str, RecordedKernel], read_backs: DeviceReadBacks
) -> None:
    table = TableCache().get(PARAMS, None, META)
    q, k = qk()
    triton_rope.rotate_triton(q, k, positions, table, RotationSpec(64, "flat"), inplace=inplace)
    assert len(kernels["one"].launches) == 1


def test_triton_mrope_call_reads_nothing_back(kernels: dict[str, RecordedKernel], read_backs: DeviceReadBacks) -> None:
    table = TableCache().get(MROPE_PARAMS, None, META)
    q, k = qk("bhtd", head_dim=32)
    spec = RotationSpec(32, "bhtd", "neox", MropeSpec.of(MROPE_PARAMS))
    triton_rope.rotate_triton(q, k, torch.randint(0, 90, (3, 2, 6)), table, spec, inplace=True)
    assert len(kernels["one"].launches) == 1


def test_triton_batch_reads_nothing_back(kernels: dict[str, RecordedKernel], read_backs: DeviceReadBacks) -> None:
    table = TableCache().get(PARAMS, None, META)
    items = [(*qk(tokens=tokens), torch.arange(tokens), RotationSpec(64, "flat")) for tokens in (3, 6, 9)]
    triton_rope.rotate_triton_many(items, table)
    assert len(kernels["batch"].launches) == 1 and kernels["one"].launches == []


def meta_service() -> RotationService:
    return RotationService(Settings(access_log=False), META, TableCache(), kernel="triton")


def payload(tokens: int, positions: torch.Tensor | None = None) -> SafetensorsPayload:
    """A decoded request as the service sees it: host tensors (views of the request body)."""
    tensors = {
        "q": torch.zeros(tokens, 4 * 64, dtype=torch.bfloat16),
        "k": torch.zeros(tokens, 2 * 64, dtype=torch.bfloat16),
        "positions": torch.arange(tokens) if positions is None else positions,
    }
    assert set(REQUIRED_TENSORS) <= set(tensors)
    return SafetensorsPayload(tensors, {})


@pytest.mark.parametrize("jobs", [1, 3])
def test_service_rotation_path_reads_nothing_back(
    jobs: int, kernels: dict[str, RecordedKernel], read_backs: DeviceReadBacks
) -> None:
    """prepare (staging to the device) and run (the worker's kernel call) on 'device' tensors: one launch."""
    service = meta_service()
    options = RotationOptions(PARAMS, layout="flat")
    prepared = [service.prepare(payload(4 + job), options) for job in range(jobs)]
    results = service.run(prepared)
    assert [q.device for q, _ in results] == [META] * jobs
    assert len(kernels["batch" if jobs > 1 else "one"].launches) == 1


@pytest.mark.parametrize(
    "bad", [[0, -1, 2], [0, MAX_POSITION + 1, 2], [0, 2**63 - 1, 1]], ids=["negative", "max+1", "int64"]
)
def test_out_of_range_positions_are_refused_before_any_device_work(
    bad: list[int], kernels: dict[str, RecordedKernel]
) -> None:
    service = meta_service()
    with pytest.raises(ServiceError) as raised:
        service.prepare(payload(3, torch.tensor(bad)), RotationOptions(PARAMS, layout="flat"))
    assert 400 <= raised.value.status < 500 and raised.value.field == "positions"
    assert kernels["one"].launches == []


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64, torch.float32], ids=str)
def test_triton_refuses_non_integer_positions_before_reading_them(
    dtype: torch.dtype, kernels: dict[str, RecordedKernel]
) -> None:
    """Positions of a wrong dtype are an InvalidInput (a 4xx), not an error of the host-side range read."""
    table = TableCache().get(PARAMS, None, META)
    q, k = qk()
    positions = torch.zeros(6, dtype=dtype)
    with pytest.raises(InvalidInput) as raised:
        triton_rope.rotate_triton(q, k, positions, table, RotationSpec(64, "flat"))
    assert raised.value.field == "positions"
    with pytest.raises(InvalidInput):
        triton_rope.rotate_triton_many([(q, k, positions, RotationSpec(64, "flat"))] * 2, table)
    assert kernels["one"].launches == [] and kernels["batch"].launches == []


def test_warm_up_compiles_the_single_and_the_batch_kernel_per_dtype(
    kernels: dict[str, RecordedKernel], read_backs: DeviceReadBacks
) -> None:
    meta_service().warm_up()
    assert len(kernels["one"].launches) == 2 and len(kernels["batch"].launches) == 2
