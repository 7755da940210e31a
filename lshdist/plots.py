"""PNG plots of an evaluation, after the paper's Fig. 2 (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: one record of `lshdist.evaluation.evaluate` or `sweep`
Record = dict[str, Any]


def _plt() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (matplotlib is untyped here)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_bits(records: list[Record], scan_records: list[Record], path: Path) -> None:
    """Accuracy vs b and % searched vs b, L2 and ML, with the scans' accuracy as lines."""
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for name, color in (("L2", "tab:blue"), ("ML", "tab:red")):
        rs = [r for r in records if r["setting"] == f"{name}-hash"]
        b = [r["value"] for r in rs]
        a1.plot(b, [100 * r["knn_accuracy"] for r in rs], "o-", color=color, label=f"{name} hash")
        a2.plot(b, [100 * r["fraction_searched"] for r in rs], "o-", color=color,
                label=f"{name} hash")
        sc = [r for r in scan_records if r["setting"] == f"{name}-scan" and r["k"] == rs[0]["k"]]
        if sc:
            a1.axhline(100 * sc[0]["knn_accuracy"], ls="--", color=color, label=f"{name} scan")
    a1.set_xlabel("bits b")
    a1.set_ylabel(f"{records[0]['k']}-NN accuracy (%)")
    a1.legend()
    a2.set_xlabel("bits b")
    a2.set_ylabel("% of database searched")
    a2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_recall(records: list[Record], path: Path) -> None:
    """Recall@k vs % searched over one swept parameter."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4))
    for name, color in (("L2", "tab:blue"), ("ML", "tab:red")):
        rs = [r for r in records if r["setting"] == f"{name}-hash"]
        ax.plot([100 * r["fraction_searched"] for r in rs], [r["recall_at_k"] for r in rs], "o-",
                color=color, label=f"{name} hash")
        for r in rs:
            ax.annotate(f"{r['param']}={r['value']}",
                        (100 * r["fraction_searched"], r["recall_at_k"]), fontsize=7)
    ax.set_xlabel("% of database searched")
    ax.set_ylabel(f"recall@{records[0]['recall_k']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
