#!/usr/bin/python3
"""Renders `strata bench finetune --plot FILE`: host, pinned and device memory over time for each
strategy, one panel per kind of memory, from the data file the command writes (FILE.json).

Usage: plot_memory.py DATA.json OUT.png   (Debian's /usr/bin/python3 has matplotlib)
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")  # no display: write the file only
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"strata": "#1f77b4", "strata-overlap": "#17becf", "deepspeed-defaults": "#d62728",
          "deepspeed-pinned": "#ff7f0e", "deepspeed-tuned": "#9467bd"}


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        data = json.load(f)
    panels = [("host", 1, "host memory (GB)"), ("pinned", 2, "pinned (GB)"),
              ("device", 3, "device (GB)")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 8), sharex=True)
    for strategy in data["strategies"]:
        series = strategy["series"]
        if not series:
            continue
        t = [p[0] for p in series]
        name = strategy["name"]
        for ax, (label, column, _) in zip(axes, panels):
            ax.plot(t, [p[column] / 1e9 for p in series], label=name,
                    color=COLORS.get(name), linewidth=1.2)
        peak = strategy.get("peak_host_bytes", 0) / 1e9
        axes[0].axhline(peak, color=COLORS.get(name), linestyle=":", linewidth=0.8)
    for ax, (_, _, ylabel) in zip(axes, panels):
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[0].legend(loc="upper right")
    axes[0].set_title(data.get("title", "strata bench finetune"))
    axes[-1].set_xlabel("seconds since the worker started (each strategy in its own process)")
    fig.tight_layout()
    fig.savefig(argv[2], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
