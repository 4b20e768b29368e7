"""Load scenarios as data: how many users are active at each second, and what each scenario checks.

Shared by ``locustfile.py`` (its ``LoadTestShape`` follows :func:`users_at`) and ``run.py`` (the report plots the
same curve and applies the scenario's checks). Every scenario is bounded in users and in time.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MAX_USERS", "SCENARIOS", "Scenario", "users_at"]

MAX_USERS = 256
RAMP_S = 3.0


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    max_duration_s: int
    think_time_s: tuple[float, float]
    """Pause range between one user's requests (0, 0: closed loop at full speed)."""
    expects_rejections: bool = False
    """Overload: 429 answers are the expected outcome, not failures of the run."""


SCENARIOS: dict[str, Scenario] = {
    "steady": Scenario("steady", "ramp to N users in 3 s, hold", 600, (0.005, 0.02)),
    "spike": Scenario("spike", "N/4 users, N for the middle fifth of the run, back to N/4", 600, (0.005, 0.02)),
    "overload": Scenario(
        "overload", "N users with no think time: the server must shed load with 429, never 5xx", 600, (0.0, 0.0), True
    ),
    "soak": Scenario("soak", "N users held for a long bounded run; watch drift", 3600, (0.01, 0.05)),
}


def users_at(scenario: str, elapsed_s: float, users: int, duration_s: float) -> int:
    """Active users ``elapsed_s`` seconds into a run of ``duration_s`` seconds (0 once it is over)."""
    if elapsed_s >= duration_s:
        return 0
    if scenario == "spike":
        base = max(1, users // 4)
        in_spike = 0.4 * duration_s <= elapsed_s < 0.6 * duration_s
        return users if in_spike else base
    ramp = min(RAMP_S, duration_s / 10)
    if elapsed_s < ramp:
        return max(1, round(users * (elapsed_s + 1) / (ramp + 1)))
    return users
