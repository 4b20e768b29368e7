"""``field`` has one notation in every problem document: dotted keys and [index]."""

from __future__ import annotations

import pytest

from ropeserve.errors import InvalidInput, field_path


@pytest.mark.parametrize(
    ("raised", "shown"),
    [
        ("/config/rope_scaling/rope_type", "config.rope_scaling.rope_type"),
        ("/intent/engines/0", "intent.engines[0]"),
        ("/config/a~1b/c~0d", "config.a/b.c~d"),
        ("rows[0].segments[1]", "rows[0].segments[1]"),
        ("rope.rope_type", "rope.rope_type"),
        ("content-length", "content-length"),
    ],
)
def test_json_pointers_are_shown_as_dotted_paths(raised: str, shown: str) -> None:
    assert field_path(raised) == shown
    assert InvalidInput("bad", field=raised).to_problem()["field"] == shown
