"""docs/operations.md stays in step with the settings and the metrics it documents."""

from __future__ import annotations

import re

from deploy_tools import REPO

from ropeserve.metrics import Metrics
from ropeserve.settings import Settings

DOC = (REPO / "docs/operations.md").read_text()


def test_every_setting_is_documented_and_nothing_else() -> None:
    documented = set(re.findall(r"^\| `(ROPESERVE_[A-Z0-9_]+)` \|", DOC, re.MULTILINE))
    assert documented == {f"ROPESERVE_{name.upper()}" for name in Settings.model_fields}


def test_every_metric_is_documented() -> None:
    documented = set(re.findall(r"^\| `(ropeserve_[a-z0-9_]+)` \|", DOC, re.MULTILINE))
    families = Metrics().registry.collect()
    exposed = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in families
        if family.name.startswith("ropeserve_")
    }
    assert documented == exposed


def test_runtime_metrics_are_documented() -> None:
    assert "`process_*`" in DOC and "`python_*`" in DOC
