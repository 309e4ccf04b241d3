"""Scenario F's figures (``bench/fleet.py``), drawn from its rows.

- ``fleet.png``: TTFT empirical CDF per run, and the clients' prefix-cache hit rate per turn
  of a conversation;
- ``fleet-load.png``: each replica's running + waiting sequences over time, one panel per run
  (1 s rolling mean of the 50 ms samples), with the kill, restart and return marked.

matplotlib is imported only here, as in ``bench/plots.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

COLORS = {
    "ideal": "#555555",
    "round_robin": "#d7191c",
    "least_loaded": "#fdae61",
    "affinity": "#1a9641",
    "affinity_opening": "#2c7bb6",
    "affinity_kill": "#7b3294",
}
EXTRA_COLORS = ("#a6611a", "#018571", "#e66101", "#5e3c99")
REPLICA_COLORS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02")


def _color(run: str, i: int) -> str:
    return COLORS.get(run, EXTRA_COLORS[i % len(EXTRA_COLORS)])


def _rolling(values: Sequence[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_fleet(directory: Path, rows: Sequence[dict[str, Any]], turns: int) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, (ttft_ax, turn_ax) = plt.subplots(1, 2, figsize=(11.5, 4.2))
    for i, row in enumerate(rows):
        color = _color(row["run"], i)
        values = sorted(t * 1000 for t in row["ttfts_s"])
        if values:
            n = len(values)
            ttft_ax.step(
                values,
                [(k + 1) / n for k in range(n)],
                where="post",
                color=color,
                label=f"{row['label']} (p50 {values[n // 2]:,.0f} ms)",
            )
        rates = row["hit_rate_by_turn"]
        xs = [k + 1 for k, r in enumerate(rates) if r is not None]
        ys = [r * 100 for r in rates if r is not None]
        turn_ax.plot(xs, ys, marker="o", markersize=3, color=color, label=row["label"])
    ttft_ax.set_xscale("log")
    ttft_ax.set_title("time to first token (client, streaming)", fontsize=10)
    ttft_ax.set_xlabel("ms (log scale)")
    ttft_ax.set_ylabel("fraction ≤ x")
    ttft_ax.set_ylim(0, 1.01)
    ttft_ax.grid(True, alpha=0.3)
    ttft_ax.legend(fontsize=7, loc="lower right")
    turn_ax.set_title("prefix-cache hit rate per turn (cached / prompt tokens)", fontsize=10)
    turn_ax.set_xlabel("turn of the conversation")
    turn_ax.set_ylabel("% of prompt tokens from cache")
    turn_ax.set_xticks(range(1, turns + 1))
    turn_ax.set_ylim(0, 101)
    turn_ax.grid(True, alpha=0.3)
    turn_ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("F, fleet routing: TTFT and prefix-cache hits by policy", fontsize=11)
    fig.tight_layout()
    path = directory / "fleet.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

    n = len(rows)
    cols = 2 if n > 1 else 1
    nrows = (n + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(6.0 * cols, 2.8 * nrows), squeeze=False)
    for ax, row in zip(axes.flat, rows, strict=False):
        series = row["load_series"]
        ts = series["t_s"]
        interval = (ts[-1] - ts[0]) / max(len(ts) - 1, 1) if len(ts) > 1 else 0.05
        window = max(1, round(1.0 / interval)) if interval > 0 else 1
        for r, name in enumerate(series["replicas"]):
            values = [float(sample[r] or 0) for sample in series["loads"]]
            ax.plot(
                ts,
                _rolling(values, window),
                color=REPLICA_COLORS[r % len(REPLICA_COLORS)],
                linewidth=1,
                label=name.rsplit(":", 1)[-1],
            )
        kill = row.get("kill")
        if kill:
            top = ax.get_ylim()[1]
            for key, text, style, height in (
                ("kill_t_s", "killed", "-", 0.95),
                ("out_of_rotation_t_s", "out of rotation", ":", 0.85),
                ("ready_t_s", "restarted", "--", 0.95),
                ("back_in_rotation_t_s", "back in rotation", ":", 0.85),
            ):
                if kill.get(key) is not None:
                    ax.axvline(kill[key], color="black", linestyle=style, linewidth=0.8)
                    ax.text(kill[key], top * height, f" {text}", fontsize=6)
        spread = row["load"]["max_over_mean"]
        spread_text = f"{spread:.2f}" if spread is not None else "n/a"
        ax.set_title(f"{row['label']}: max/mean {spread_text}", fontsize=9)
        ax.set_xlabel("s")
        ax.set_ylabel("running + waiting")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6, loc="upper right", title="port", title_fontsize=6)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.suptitle(
        "F, fleet routing: sequences per replica over time (1 s rolling mean)", fontsize=11
    )
    fig.tight_layout()
    path = directory / "fleet-load.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths
