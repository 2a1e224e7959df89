"""Corpus and release reports (paper §5.7, Figures 4 and 5): PNG figures and one HTML page.

``report_command`` reads either a corpus (each clip's ``meta.json``) or a raw-wds release
(its index, each row's ``manifest.json`` member and ``release.json`` for the clips that were
not packed) and writes into ``out``:

- ``owners_by_tier.png``     clips per owner by tier (Figure 4's table and bars)
- ``length_by_tier.png``     clips per length bin by tier (Figure 5: <81, 81–152, 153–956, ≥957)
- ``rejection_reasons.png``  failed-gate counts per owner (owners × reasons)
- ``metrics_<owner>.png``    each numeric metric's distribution per tier, with the policy's
                             kept (solid) and xhigh (dashed) thresholds drawn on it
- ``index.html``             the figures, their tables and the accounting line
- ``report.json``            the same tables as data
"""

from __future__ import annotations

import html
import json
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never open a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from solarwm.data.accounting import account, outcome  # noqa: E402
from solarwm.data.contract import ClipError, iter_clip_dirs, read_meta  # noqa: E402
from solarwm.data.index import read_index, read_member  # noqa: E402
from solarwm.data.policy.spec import COLUMNS, NUMBER, Policy, load_policy  # noqa: E402
from solarwm.data.policy.table import flatten_meta  # noqa: E402
from solarwm.data.release import INDEX_PATH, SUMMARY_PATH  # noqa: E402
from solarwm.util.atomic import atomic_path, atomic_write_text  # noqa: E402

# Outcome columns in display order, and their colours (Figure 4/5 palette: high teal, xhigh green, rejected grey).
OUTCOME_ORDER = ("kept-xhigh", "kept-high", "rejected", "failed", "pending")
COLOURS = {
    "kept-xhigh": "#8fd18f",
    "kept-high": "#1f7f7f",
    "rejected": "#a0a0a0",
    "failed": "#d9534f",
    "pending": "#f0ad4e",
}
# Figure 5's length bins: [lo, hi) in frames.
LENGTH_BINS: tuple[tuple[str, int, float], ...] = (
    ("<81", 0, 81),
    ("81–152", 81, 153),
    ("153–956", 153, 957),
    ("≥957", 957, math.inf),
)


def _corpus_records(corpus: Path) -> tuple[list[dict], str]:
    """One record per clip of a corpus: owner, outcome, num_frames, reasons, flat metrics."""
    records = []
    for folder in iter_clip_dirs(corpus):
        try:
            meta = read_meta(folder)
        except ClipError:  # an unreadable clip is a failed one, as in the accounting
            records.append({"owner": "unknown", "outcome": "failed", "reasons": [], "flat": {}})
            continue
        reasons = (meta.get("selection") or {}).get("reasons")
        records.append(
            {
                "owner": meta["provenance"].get("owner", "unknown"),
                "outcome": outcome(meta),
                "reasons": list(reasons) if isinstance(reasons, list) else [],
                "flat": flatten_meta(meta),
            }
        )
    return records, account(corpus).line()


def _release_records(release: Path) -> tuple[list[dict], str]:
    """One record per clip of a release: packed rows from their manifests, the rest from release.json."""
    rows = read_index(release / INDEX_PATH, release)
    records = []
    for row in rows:
        manifest = json.loads(read_member(row, "manifest_member", release))
        records.append(
            {
                "owner": row["dataset"],
                "outcome": "rejected" if row["kept_tier"] == "rejected" else f"kept-{row['kept_tier']}",
                "reasons": list(manifest.get("reasons", [])),
                "flat": flatten_meta({**manifest, "clip_id": row["sample_id"]}),
            }
        )
    summary_path = release / SUMMARY_PATH
    line = ""
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        line = summary.get("accounting", "")
        for clip in summary.get("not_packed", []):
            flat = {"num_frames": clip["num_frames"]} if clip.get("num_frames") is not None else {}
            records.append({"owner": clip["owner"], "outcome": clip["outcome"], "reasons": [], "flat": flat})
    return records, line


def _tables(records: list[dict]) -> dict[str, Any]:
    """Owner × outcome, length bin × outcome, and owner × reason counts."""
    by_owner: dict[str, Counter] = defaultdict(Counter)
    by_length: dict[str, Counter] = {name: Counter() for name, _, _ in LENGTH_BINS}
    reasons: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        by_owner[r["owner"]][r["outcome"]] += 1
        n = r["flat"].get("num_frames")
        if isinstance(n, int) and not isinstance(n, bool):
            name = next(name for name, lo, hi in LENGTH_BINS if lo <= n < hi)
            by_length[name][r["outcome"]] += 1
        if r["outcome"] == "rejected":
            reasons[r["owner"]].update(r["reasons"])
    return {
        "by_owner": dict(sorted(by_owner.items())),
        "by_length": by_length,
        "reasons": dict(sorted(reasons.items())),
    }


def _save(fig: plt.Figure, path: Path) -> None:
    """Save a figure atomically and close it."""
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)


def _stacked_bars(table: dict[str, Counter], title: str, xlabel: str, path: Path) -> None:
    """Horizontal bars, one per category, stacked by outcome."""
    names = list(table)
    fig, ax = plt.subplots(figsize=(8, 0.45 * max(len(names), 2) + 1.2))
    left = [0] * len(names)
    for out in OUTCOME_ORDER:
        counts = [table[n][out] for n in names]
        if any(counts):
            ax.barh(names, counts, left=left, color=COLOURS[out], label=out)
            left = [a + b for a, b in zip(left, counts)]
    ax.invert_yaxis()
    ax.set_xlabel("clips")
    ax.set_ylabel(xlabel)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    _save(fig, path)


def _reasons_figure(reasons: dict[str, Counter], path: Path) -> None:
    """Owners × failed gates as an annotated count matrix."""
    owners = list(reasons)
    gates = sorted({g for c in reasons.values() for g in c})
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(gates) + 3), 0.5 * max(len(owners), 1) + 2.5))
    if not gates:
        ax.text(0.5, 0.5, "no rejected clips", ha="center", va="center")
        ax.set_axis_off()
    else:
        matrix = [[reasons[o][g] for g in gates] for o in owners]
        ax.imshow(matrix, cmap="Greys", aspect="auto")
        for i, row in enumerate(matrix):
            for j, v in enumerate(row):
                if v:
                    ax.text(j, i, str(v), ha="center", va="center", color="tab:red", fontsize=8)
        ax.set_xticks(range(len(gates)), gates, rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(len(owners)), owners)
    ax.set_title("rejection reasons (failed gates) by owner")
    _save(fig, path)


def _thresholds(policy: Policy | None, owner: str) -> dict[str, list[tuple[float, str]]]:
    """Per column, the (bound, rule) lines of the owner's single-column numeric gates (range, eq, ne)."""
    lines: dict[str, list[tuple[float, str]]] = defaultdict(list)
    if policy is None or owner not in policy.owners:
        return lines
    rules = policy.owners[owner]
    for rule, checks in (("kept", rules.kept), ("xhigh", rules.xhigh)):
        for check in checks:
            if len(check.columns) != 1:
                continue  # a gate on the mean of several columns has no line on any one of them
            if check.kind == "range":
                for bound in (check.min, check.max):
                    if bound is not None:
                        lines[check.columns[0]].append((float(bound), rule))
            elif check.kind in ("eq", "ne") and isinstance(check.value, (int, float)):
                lines[check.columns[0]].append((float(check.value), rule))
    return lines


def _metrics_figure(owner: str, records: list[dict], policy: Policy | None, path: Path) -> list[str]:
    """Histograms of every numeric policy column present for one owner, stacked by outcome; returns columns."""
    columns = [c for c, kind in COLUMNS.items() if kind == NUMBER and any(_finite(r["flat"].get(c)) for r in records)]
    if not columns:
        return []
    thresholds = _thresholds(policy, owner)
    ncols = min(3, len(columns))
    nrows = -(-len(columns) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.0 * nrows), squeeze=False)
    for ax, column in zip(axes.flat, columns):
        stacks, labels, colours = [], [], []
        for out in OUTCOME_ORDER:
            values = [r["flat"][column] for r in records if r["outcome"] == out and _finite(r["flat"].get(column))]
            if values:
                stacks.append(values)
                labels.append(out)
                colours.append(COLOURS[out])
        # bins span the data and the thresholds, so bars stay visible next to far-off bounds
        span = [v for vs in stacks for v in vs] + [b for b, _ in thresholds.get(column, [])]
        lo, hi = min(span), max(span)
        bins = np.linspace(lo, hi if hi > lo else lo + 1.0, 31)
        ax.hist(stacks, bins=bins, stacked=True, color=colours, label=labels)
        for bound, rule in thresholds.get(column, []):
            ax.axvline(
                bound,
                color="tab:red" if rule == "kept" else "tab:green",
                linestyle="-" if rule == "kept" else "--",
                linewidth=1.2,
            )
        ax.set_title(column, fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(columns) :]:
        ax.set_axis_off()
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.suptitle(f"{owner}: metric distributions (red: kept thresholds, green dashed: xhigh)")
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8, bbox_to_anchor=(0.5, 0.97))
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    _save(fig, path)
    return columns


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _html_table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _owner_rows(by_owner: dict[str, Counter]) -> list[list[Any]]:
    """Figure 4's table: All, High, xhigh, Kept (= high + xhigh), Rejected, Failed, Pending."""
    rows, total = [], Counter()
    for owner, c in by_owner.items():
        total.update(c)
        rows.append(
            [
                owner,
                sum(c.values()),
                c["kept-high"],
                c["kept-xhigh"],
                c["kept-high"] + c["kept-xhigh"],
                c["rejected"],
                c["failed"],
                c["pending"],
            ]
        )
    rows.append(
        [
            "Total",
            sum(total.values()),
            total["kept-high"],
            total["kept-xhigh"],
            total["kept-high"] + total["kept-xhigh"],
            total["rejected"],
            total["failed"],
            total["pending"],
        ]
    )
    return rows


def report_command(
    out: str, corpus: str | None = None, release: str | None = None, policy: str = "recipes/policies/solarwm-v1.yaml"
) -> int:
    """Write PNG figures and an HTML page summarising a corpus or a release (Figures 4 and 5).

    Args:
        out: output folder for the figures, index.html and report.json.
        corpus: a corpus folder (reads each clip's meta.json).
        release: a release root (reads raw-wds/index.jsonl.gz and the manifests).
        policy: selection policy YAML whose thresholds are drawn on the metric distributions.
    """
    if (corpus is None) == (release is None):
        raise ValueError("give exactly one of --corpus or --release")
    source = Path(corpus or release)
    records, accounting_line = _corpus_records(source) if corpus else _release_records(source)
    pol = load_policy(policy) if policy and Path(policy).exists() else None
    out_path = Path(out)
    out_path.mkdir(parents=True, exist_ok=True)
    tables = _tables(records)

    figures = ["owners_by_tier.png", "length_by_tier.png", "rejection_reasons.png"]
    _stacked_bars(tables["by_owner"], "clips per owner by tier (Figure 4)", "owner", out_path / figures[0])
    _stacked_bars(tables["by_length"], "clips per length bin by tier (Figure 5)", "frames", out_path / figures[1])
    _reasons_figure(tables["reasons"], out_path / figures[2])
    by_owner_records: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_owner_records[r["owner"]].append(r)
    metric_columns = {}
    for owner, recs in sorted(by_owner_records.items()):
        name = f"metrics_{owner}.png"
        columns = _metrics_figure(owner, recs, pol, out_path / name)
        if columns:
            figures.append(name)
            metric_columns[owner] = columns

    owner_header = ["owner", "all", "high", "xhigh", "kept", "rejected", "failed", "pending"]
    length_rows = [[name, sum(c.values())] + [c[o] for o in OUTCOME_ORDER] for name, c in tables["by_length"].items()]
    reason_rows = [[owner, gate, n] for owner, c in tables["reasons"].items() for gate, n in c.most_common()]
    policy_note = (
        f"Thresholds from policy {html.escape(pol.name)} {html.escape(pol.version)} ({html.escape(policy)})."
        if pol
        else f"Policy {html.escape(str(policy))} not found: distributions are drawn without thresholds."
    )
    metric_figures = "".join(
        f'<h3>{html.escape(o)}</h3><img src="{html.escape(f"metrics_{o}.png")}" alt="metrics of {html.escape(o)}">'
        for o in metric_columns
    )
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>SolarWM data report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}td:first-child{{text-align:left}}</style></head>
<body><h1>SolarWM data report</h1>
<p>Source: {html.escape(str(source))} ({"corpus" if corpus else "release"}), {len(records)} clips.</p>
<p><b>Accounting:</b> {html.escape(accounting_line)}</p>
<h2>Clips per owner by tier</h2>{_html_table(owner_header, _owner_rows(tables["by_owner"]))}
<img src="owners_by_tier.png" alt="clips per owner by tier">
<h2>Clip length by tier</h2>{_html_table(["frames", "all", *OUTCOME_ORDER], length_rows)}
<img src="length_by_tier.png" alt="clip length by tier">
<h2>Rejection reasons by owner</h2>{_html_table(["owner", "failed gate", "clips"], reason_rows)}
<img src="rejection_reasons.png" alt="rejection reasons by owner">
<h2>Metric distributions</h2><p>{policy_note}</p>
{metric_figures}
</body></html>
"""
    atomic_write_text(out_path / "index.html", page)
    summary = {
        "source": str(source),
        "kind": "corpus" if corpus else "release",
        "clips": len(records),
        "accounting": accounting_line,
        "policy": policy if pol else None,
        "by_owner": {o: dict(c) for o, c in tables["by_owner"].items()},
        "by_length": {b: dict(c) for b, c in tables["by_length"].items()},
        "reasons": {o: dict(c) for o, c in tables["reasons"].items()},
        "metric_columns": metric_columns,
        "figures": figures,
        "html": "index.html",
    }
    atomic_write_text(out_path / "report.json", json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print(json.dumps(summary, indent=2))
    return 0
