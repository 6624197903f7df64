#!/usr/bin/env python3
"""Plots tools/scalebench.sh results: goodput against servers, with linear;
or, with --train, test accuracy against seconds per consistency mode.

usage: scalebench_plot.py RESULTS.jsonl OUT.png
       scalebench_plot.py --train CURVES.jsonl OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_rows(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        sys.exit(f"scalebench_plot: cannot read results {path}: {e}")


def plot_training(curves, out):
    """curves: {"consistency", "target", "points": [[seconds, accuracy], ...]} per mode."""
    if not curves or not any(c["points"] for c in curves):
        sys.exit("scalebench_plot: no accuracy points to plot")
    fig, ax = plt.subplots(figsize=(6, 4))
    for c in curves:
        xs = [p[0] for p in c["points"]]
        ax.plot(xs, [p[1] for p in c["points"]], ".-", label=c["consistency"])
    target = curves[0]["target"]
    ax.axhline(target, linestyle="--", color="gray", label=f"target {target}")
    lows = [p[1] for c in curves for p in c["points"]]
    ax.set_ylim(max(0.0, min(min(lows), target - 0.05) - 0.01), min(1.0, max(max(lows), target) + 0.02))
    ax.set_xlabel("seconds of training (rank 0, without its evaluations)")
    ax.set_ylabel("test accuracy (rank 0's weights)")
    ax.set_title(curves[0].get("title", "time to accuracy"), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main(argv):
    if len(argv) == 4 and argv[1] == "--train":
        plot_training(read_rows(argv[2]), argv[3])
        return
    if len(argv) != 3:
        sys.exit(__doc__.strip())
    rows = read_rows(argv[1])
    plain = sorted((r for r in rows if not r["hot_partition"]), key=lambda r: r["servers"])
    hot = [r for r in rows if r["hot_partition"]]
    if not plain:
        sys.exit(f"{argv[1]}: no configuration without a hot partition to plot")
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r["servers"] for r in plain]
    ax.plot(xs, [r["goodput_gbps"] for r in plain], "o-", label="ShardPS")
    one = next((r["goodput_gbps"] for r in plain if r["servers"] == 1), None)
    if one is not None:
        ax.plot(xs, [one * x for x in xs], "--", color="gray", label="linear (servers x 1-server goodput)")
    for r in hot:
        ax.plot([r["servers"]], [r["goodput_gbps"]], "s", color="red",
                label=f"hot partition ({r['servers']} servers)")
    ax.set_xlabel("servers (each link %s)" % plain[0]["server_rate"])
    ax.set_ylabel("aggregate goodput, Gbit/s pushed")
    ax.set_title(f"{plain[0]['consistency']} push-pull of {plain[0]['bytes'] >> 20} MiB, {plain[0]['workers']} workers")
    ax.set_xticks(xs)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(argv[2], dpi=100)


if __name__ == "__main__":
    main(sys.argv)
