"""Kernel registry, selection by device, and input validation shared by all kernels."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from kernel_cases import Case, build

from ropeserve.errors import InvalidInput
from ropeserve.kernels import KERNELS, RotationSpec, cbuild, compiled, get_kernel, rotate_qk, select_kernel
from ropeserve.kernels import registry as kernel_registry


def test_registry_lists_the_four_kernels() -> None:
    assert {"native", "fused", "c", "triton"} <= set(KERNELS)
    assert all(info.description for info in KERNELS.values())


def test_cpu_selects_the_c_kernel_where_it_builds() -> None:
    assert select_kernel("cpu") == "c"
    assert select_kernel(torch.device("cpu")) == "c"


@pytest.fixture
def fresh_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """An empty kernel cache directory, with the build and symbol caches cleared before and after."""
    monkeypatch.setenv("ROPESERVE_KERNEL_CACHE", str(tmp_path))
    cbuild.load_library.cache_clear()
    compiled.c_function.cache_clear()
    yield tmp_path
    cbuild.load_library.cache_clear()
    compiled.c_function.cache_clear()


def test_without_a_compiler_cpu_falls_back_to_fused(fresh_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", str(fresh_build / "no-such-cc"))
    assert cbuild.load_library().detail.startswith("no C compiler")
    assert select_kernel("cpu") == "fused"
    problem = build(Case())
    expected = get_kernel("native")(problem.q, problem.k, problem.positions, problem.table, problem.spec)
    actual = get_kernel("c")(problem.q, problem.k, problem.positions, problem.table, problem.spec)
    assert torch.equal(actual[0], expected[0])


def test_the_c_library_is_built_once_then_loaded_from_the_cache(fresh_build: Path) -> None:
    first = cbuild.load_library()
    assert first.library is not None and first.detail.startswith("built")
    assert len(list(fresh_build.glob("rope_cpu-*.so"))) == 1
    cbuild.load_library.cache_clear()
    second = cbuild.load_library()
    assert second.library is not None and second.detail.startswith("loaded")


@pytest.mark.parametrize("make", ["world-writable", "a file"])
def test_a_cache_directory_others_can_write_is_never_used(
    make: str, fresh_build: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library is loaded from the cache: a directory anyone can write (or a non-directory) is skipped."""
    shared = fresh_build / "shared"
    if make == "a file":
        shared.write_text("not a directory")
    else:
        shared.mkdir()
        shared.chmod(0o777)
    monkeypatch.setenv("ROPESERVE_KERNEL_CACHE", str(shared))
    monkeypatch.setattr(cbuild.tempfile, "gettempdir", lambda: str(fresh_build / "tmp"))
    directory = cbuild.build_dir()
    assert directory == fresh_build / "tmp" / f"ropeserve-{os.getuid()}"
    assert directory.stat().st_mode & 0o777 == 0o700
    result = cbuild.load_library()
    assert result.library is not None and str(directory) in result.detail


def test_a_failing_build_reports_the_compiler_error(fresh_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = fresh_build / "broken.c"
    broken.write_text("this is not C;\n")
    monkeypatch.setattr(cbuild, "SOURCE", broken)
    result = cbuild.load_library()
    assert result.library is None and "build failed" in result.detail and "error" in result.detail
    assert not list(fresh_build.glob("*.so")), "no partial library is left behind"


def test_cuda_selects_triton_when_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "triton" else real_find_spec(name)
    )
    assert select_kernel("cuda") == "triton"
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real_find_spec(name)
    )
    assert select_kernel("cuda") == "fused"


def test_unknown_device_type_falls_back_to_native() -> None:
    assert select_kernel("meta") == "native"


def test_unknown_kernel_name_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="fused"):
        get_kernel("nope")


def test_rotate_qk_dispatches_to_the_selected_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = build(Case())
    calls: list[str] = []

    def spy(*args: object, **kwargs: object) -> tuple[torch.Tensor, None]:
        calls.append("spy")
        return problem.q, None

    monkeypatch.setattr(kernel_registry, "get_kernel", lambda name: spy if name == "c" else get_kernel(name))
    rotate_qk(problem.q, problem.k, problem.positions, problem.table, problem.spec)
    assert calls == ["spy"]
    native = rotate_qk(problem.q, problem.k, problem.positions, problem.table, problem.spec, kernel="native")
    assert native[0].shape == problem.q.shape


BAD_INPUTS = {
    "q head_dim": ("q", lambda p: (p.q[..., :-2], p.k, p.positions, p.spec)),
    "k tokens": ("k", lambda p: (p.q, p.k[:, :, :-1], p.positions, p.spec)),
    "k dtype": ("k", lambda p: (p.q, p.k.double(), p.positions, p.spec)),
    "q dtype": ("q", lambda p: (p.q.double(), None, p.positions, p.spec)),
    "float positions": ("positions", lambda p: (p.q, p.k, p.positions.float(), p.spec)),
    "positions tokens": ("positions", lambda p: (p.q, p.k, p.positions[:, :-1], p.spec)),
    "positions batch": ("positions", lambda p: (p.q, p.k, p.positions.repeat(2, 1), p.spec)),
    "rotary beyond head": ("rotary_dim", lambda p: (p.q[..., :16], p.k[..., :16], p.positions, RotationSpec(16))),
}


@pytest.mark.parametrize("kernel", ["native", "fused", "c"])
@pytest.mark.parametrize("bad", list(BAD_INPUTS))
def test_invalid_inputs_name_the_tensor(kernel: str, bad: str) -> None:
    field, mutate = BAD_INPUTS[bad]
    problem = build(Case())
    q, k, positions, spec = mutate(problem)
    with pytest.raises(InvalidInput) as raised:
        get_kernel(kernel)(q, k, positions, problem.table, spec)
    assert raised.value.field == field


def test_mrope_needs_three_position_rows() -> None:
    problem = build(Case(rope="qwen2vl"))
    with pytest.raises(InvalidInput) as raised:
        get_kernel("fused")(problem.q, problem.k, problem.positions[0], problem.table, problem.spec)
    assert raised.value.field == "positions"
