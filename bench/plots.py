"""Latency distributions side by side, one line per mode: empirical CDFs saved as PNG.

matplotlib is imported only when a plot is drawn (the ``bench`` extra); every scenario runs
without it under ``--no-plots``, as the smoke test in ``make test`` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

# One color per mode in every plot, so the figures read alike.
COLORS = {
    "direct": "#2c7bb6",
    "naive proxy": "#d7191c",
    "trio-gateway": "#1a9641",
}
FALLBACK_COLORS = ("#7b3294", "#fdae61", "#555555", "#e66101")


def cdf_panels(
    path: Path,
    title: str,
    panels: Sequence[tuple[str, str, Mapping[str, Sequence[float]]]],
    *,
    log_x: bool = False,
) -> Path:
    """One figure, one panel per (panel title, x label, {series name: values}); each series an
    empirical CDF. Values are plotted in the unit they are given in."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    for ax, (panel_title, xlabel, series) in zip(axes[0], panels, strict=True):
        for i, (name, values) in enumerate(series.items()):
            if not values:
                continue
            ordered = sorted(values)
            n = len(ordered)
            ys = [(k + 1) / n for k in range(n)]
            color = COLORS.get(name, FALLBACK_COLORS[i % len(FALLBACK_COLORS)])
            ax.step(ordered, ys, where="post", label=f"{name} (n={n:,})", color=color)
        ax.set_title(panel_title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("fraction ≤ x")
        ax.set_ylim(0, 1.01)
        if log_x:
            # Linear below 1 (gaps of 0: chunks that came in one read), logarithmic above.
            ax.set_xscale("symlog", linthresh=1.0)
            ax.set_xlim(left=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
