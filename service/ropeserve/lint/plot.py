"""PNG of an ``ExplainReport`` spectrum (matplotlib, imported only here; install the ``plot`` extra)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ropeserve.lint.explain import ExplainReport


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def plot_spectrum(report: ExplainReport, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError as error:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'ropeserve[plot]'") from error
    finite = [b for b in report.bands if math.isfinite(b.scaled_wavelength) and math.isfinite(b.wavelength)]
    figure, axes = pyplot.subplots(figsize=(9, 5), dpi=110)
    indices = [b.index for b in finite]
    axes.plot(indices, [b.wavelength for b in finite], "o-", markersize=3, label="unscaled wavelength")
    axes.plot(
        indices, [b.scaled_wavelength for b in finite], "s-", markersize=3, label=f"{report.rope_type} wavelength"
    )
    axes.axhline(
        report.original_context, color="tab:green", linestyle="--", label=f"original {report.original_context:,}"
    )
    if report.trained_context not in (report.original_context, report.requested_context):
        axes.axhline(
            report.trained_context, color="tab:purple", linestyle="-.", label=f"trained {report.trained_context:,}"
        )
    axes.axhline(
        report.requested_context, color="tab:red", linestyle=":", label=f"requested {report.requested_context:,}"
    )
    if report.ramp is not None:
        axes.axvspan(
            report.ramp.low, report.ramp.high, color="tab:orange", alpha=0.15, label=f"{report.ramp.kind} ramp"
        )
    unseen = [b.index for b in finite if b.regime == "unseen angles"]
    if unseen:
        axes.scatter(
            unseen,
            [b.scaled_wavelength for b in finite if b.regime == "unseen angles"],
            color="tab:red",
            zorder=3,
            s=18,
            label="unseen angles at requested length",
        )
    axes.set_yscale("log")
    axes.set_xlabel("frequency index i (channel pair)")
    axes.set_ylabel("wavelength 2π / inv_freq (tokens)")
    axes.set_title(
        f"{report.model_type or 'model'} [{report.layer_type}]: θ={report.rope_theta:g}, "
        f"rotary {report.rotary_dim}/{report.head_dim}"
    )
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
