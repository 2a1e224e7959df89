"""Every clip accounted for: ingested = kept-xhigh + kept-high + rejected + failed, per owner."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solarwm.data.contract import ClipError, iter_clip_dirs, read_meta

OUTCOMES = ("kept-xhigh", "kept-high", "rejected", "failed", "pending")


def failed_stages(meta: dict[str, Any]) -> list[tuple[str, str]]:
    """``(stage, error)`` of every stage recorded as failed in the clip's provenance."""
    stages = meta.get("provenance", {}).get("stages", {})
    return [(name, rec.get("error", "")) for name, rec in sorted(stages.items()) if rec.get("status") == "failed"]


def outcome(meta: dict[str, Any]) -> str:
    """A clip's place in the accounting: failed stage → ``failed``; else its tier; else ``pending``."""
    if failed_stages(meta):
        return "failed"
    tier = (meta.get("selection") or {}).get("tier")
    if tier in ("xhigh", "high"):
        return f"kept-{tier}"
    if tier == "rejected":
        return "rejected"
    return "pending"


@dataclass
class Accounting:
    """Per-owner outcome counts and the failed clips with their stage and error."""

    counts: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    failures: list[dict[str, str]] = field(default_factory=list)

    def add(self, owner: str, result: str, clip: str = "", stage: str = "", error: str = "") -> None:
        """Count one clip; failed clips are listed with their stage and error."""
        if result not in OUTCOMES:
            raise ValueError(f"unknown outcome {result!r}")
        self.counts[owner][result] += 1
        self.counts[owner]["ingested"] += 1
        if result == "failed":
            self.failures.append({"clip": clip, "owner": owner, "stage": stage, "error": error})

    def total(self) -> Counter:
        """Counts summed over owners."""
        out: Counter = Counter()
        for c in self.counts.values():
            out.update(c)
        return out

    def balanced(self) -> bool:
        """True when every clip has a final outcome (no ``pending``) and the sums match."""
        t = self.total()
        return t["pending"] == 0 and t["ingested"] == sum(t[o] for o in OUTCOMES if o != "pending")

    @staticmethod
    def _fmt(c: Counter) -> str:
        s = (
            f"ingested {c['ingested']} = kept-xhigh {c['kept-xhigh']} + kept-high {c['kept-high']} "
            f"+ rejected {c['rejected']} + failed {c['failed']}"
        )
        return s + (f" (+ pending {c['pending']})" if c["pending"] else "")

    def line(self) -> str:
        """The printable accounting line over all owners."""
        return self._fmt(self.total())

    def lines(self) -> list[str]:
        """One accounting line per owner, then the total."""
        return [f"{owner}: {self._fmt(c)}" for owner, c in sorted(self.counts.items())] + [f"total: {self.line()}"]

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable summary."""
        return {
            "per_owner": {o: {k: c[k] for k in ("ingested",) + OUTCOMES} for o, c in sorted(self.counts.items())},
            "total": {k: self.total()[k] for k in ("ingested",) + OUTCOMES},
            "balanced": self.balanced(),
            "line": self.line(),
            "failed": self.failures,
        }


def account(corpus_dir: str | Path) -> Accounting:
    """Account for every clip folder of a corpus from its ``meta.json``."""
    acc = Accounting()
    for folder in iter_clip_dirs(corpus_dir):
        try:
            meta = read_meta(folder)
        except ClipError as e:
            acc.add("unknown", "failed", folder.name, "read", str(e))
            continue
        owner = meta.get("provenance", {}).get("owner", "unknown")
        result = outcome(meta)
        stage, error = (failed_stages(meta) or [("", "")])[0]
        acc.add(owner, result, meta.get("clip_id", folder.name), stage, error)
    return acc
