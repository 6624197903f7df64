#!/usr/bin/env python3
"""Plots tools/scalebench.sh results: goodput against servers, with linear.

usage: scalebench_plot.py RESULTS.jsonl OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__.strip())
    try:
        with open(argv[1]) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        sys.exit(f"scalebench_plot: cannot read results {argv[1]}: {e}")
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
