"""CUDA tests: skipped without a device; they reuse the kernel parity cases of tests/unit/kernels (on pytest's
``pythonpath``, pyproject.toml)."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
