"""`solarwm data select`: sort clips into xhigh / high / rejected under a versioned per-owner policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from solarwm.data.accounting import account, outcome
from solarwm.data.contract import ClipError, iter_clip_dirs, read_meta, update_meta
from solarwm.data.policy.engine import Selection, evaluate
from solarwm.data.policy.spec import Policy, PolicyError, load_policy
from solarwm.data.policy.table import flatten_meta, pose_unit_errors, read_metrics_table, records_to_table, write_tiers

DEFAULT_POLICY = "recipes/policies/solarwm-v1.yaml"
_REPO_ROOT = Path(__file__).resolve().parents[3]


def _resolve_policy(path: str) -> Path:
    """A relative policy path is read from the working directory, else from the repository root."""
    candidate = Path(path)
    if not candidate.is_absolute() and not candidate.exists() and (_REPO_ROOT / candidate).exists():
        return _REPO_ROOT / candidate
    return candidate


def select_corpus(policy: Policy, corpus: str | Path) -> tuple[Selection, dict[str, Any]]:
    """Select every clip of a corpus and write ``selection`` into each meta.json.

    Clips with a failed stage are not selected, only counted; unreadable meta.json files are
    listed. Returns the selection and the counts of skipped clips.
    """
    records, folders, previous, unreadable, failed = [], [], [], [], 0
    for folder in iter_clip_dirs(corpus):
        try:
            doc = read_meta(folder)
        except ClipError as err:
            unreadable.append(str(err))
            continue
        if outcome(doc) == "failed":
            failed += 1
            continue
        record = flatten_meta(doc)
        if not isinstance(record.get("clip_id"), str):
            record["clip_id"] = folder.name
        records.append(record)
        folders.append(folder)
        previous.append(doc.get("selection"))
    table, row_errors = records_to_table(records)
    selection = evaluate(policy, table, row_errors)
    tiers = selection.table.column("tier").to_pylist()
    reasons = selection.table.column("reasons").to_pylist()
    for folder, before, tier, why in zip(folders, previous, tiers, reasons):
        record = {"policy": policy.name, "version": policy.version, "tier": tier, "reasons": why}

        def write(doc: dict[str, Any], record: dict[str, Any] = record) -> None:
            doc["selection"] = record

        if before != record:  # a rerun rewrites nothing that is current
            update_meta(folder, write)
    return selection, {"failed_not_selected": failed, "unreadable": unreadable}


def select_command(
    corpus: str | None = None,
    metrics: str | None = None,
    out: str | None = None,
    policy: str = DEFAULT_POLICY,
) -> int:
    """Assign each clip a tier (xhigh, high, rejected) and its failed gates under a per-owner policy.

    Args:
        corpus: Corpus folder; each clip's meta.json gets ``selection: {policy, version, tier, reasons}``.
        metrics: Metrics parquet, one row per clip (``clip_id``, ``owner`` and policy columns).
        out: Tiers parquet to write (``clip_id``, ``owner``, ``tier``, ``reasons``); required with --metrics.
        policy: Policy YAML (paper Table 3).
    """
    from solarwm.util.errors import print_error

    if (corpus is None) == (metrics is None):
        return print_error("data select", "give exactly one of --corpus DIR or --metrics TABLE.parquet")
    if metrics is not None and out is None:
        return print_error("data select", "--metrics needs --out TIERS.parquet")
    try:
        rules = load_policy(_resolve_policy(policy))  # validated before any clip is touched
        if corpus is not None:
            selection, skipped = select_corpus(rules, corpus)
            summary = {**selection.summary(), **skipped, "accounting": account(corpus).line()}
        else:
            table = read_metrics_table(metrics)
            selection = evaluate(rules, table, pose_unit_errors(table))
            summary = selection.summary()
        if out is not None:
            summary["out"] = str(write_tiers(selection.table, out))
    except (PolicyError, FileNotFoundError, ValueError) as err:
        return print_error("data select", err)
    print(json.dumps(summary, indent=1))
    return 0
