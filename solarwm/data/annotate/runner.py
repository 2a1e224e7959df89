"""Run annotation stages over a corpus: per-clip tasks, any executor, resume, accounting.

The unit of work is ``annotate_clip(clip_dir, stages, config)``: a pure top-level function of
picklable arguments returning a JSON-serialisable ``ClipResult``. All state lives in the
clip's ``meta.json`` (one atomic ``update_meta`` per finished stage), so:

* a rerun skips every stage already ``ok`` at the same version (idempotent), and a killed run
  resumes where it stopped — finished clips and stages stay finished;
* any executor of ``solarwm.data.executor.map_tasks`` can run the tasks, and each gives the same
  record: the stages run with pinned threads (``solarwm.util.threads``). A cluster executor
  needs only that every worker sees the corpus folder at the same path (shared filesystem), has this package
  installed, and—for model stages—has the checkpoint paths readable; two tasks must never annotate the same
  clip at once (one task per clip folder).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from solarwm.data.accounting import account
from solarwm.data.annotate.registry import with_stage_options
from solarwm.data.annotate.stages import (
    STAGES,
    AnnotateConfig,
    AnnotateConfigError,
    ClipContext,
    Stage,
    StageSkipped,
    default_stages,
)
from solarwm.data.annotate.visual import MetricError
from solarwm.data.contract import ClipError, iter_clip_dirs, read_meta, update_meta
from solarwm.data.executor import map_tasks
from solarwm.data.kinds import value_matches
from solarwm.util.threads import pinned_threads

# Top-level keys a stage may write outside ``metrics``; ``caption`` also rewrites prompt.txt.
TOP_LEVEL_KEYS = ("caption",)


@dataclass
class ClipResult:
    """What happened to one clip: per stage ``ok`` | ``cached`` | ``skipped`` | ``failed``, and the errors."""

    clip: str
    stages: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def _error_text(e: BaseException) -> str:
    """``check: detail`` for our named errors, ``Type: message`` otherwise."""
    if isinstance(e, (ClipError, MetricError)):
        return f"{e.check}: {e.detail}"
    return f"{type(e).__name__}: {e}"


def _apply(doc: dict[str, Any], name: str, record: dict[str, Any], values: dict[str, Any]) -> None:
    """Write one stage's record and keys into ``doc``, dropping keys its previous run wrote."""
    prov = doc.setdefault("provenance", {})
    stages = prov.setdefault("stages", {})
    metrics = doc.setdefault("metrics", {})
    for key in (stages.get(name) or {}).get("keys", []):
        if key not in TOP_LEVEL_KEYS:
            metrics.pop(key, None)
    for key, value in values.items():
        if key in TOP_LEVEL_KEYS:
            doc[key] = value
        else:
            metrics[key] = value
    stages[name] = record


def annotate_clip(clip_dir: str, stages: list[str], config: AnnotateConfig) -> ClipResult:
    """Run ``stages`` on one clip folder, recording each outcome in its ``meta.json``; never raises for bad clips.

    Every executor runs this function, and it runs the stages with pinned threads
    (`solarwm.util.threads.pinned_threads`): a metric a gate thresholds must not depend on how many
    threads the executor's worker happens to have.
    """
    with pinned_threads():
        return _annotate_clip(clip_dir, stages, config)


def _annotate_clip(clip_dir: str, stages: list[str], config: AnnotateConfig) -> ClipResult:
    folder = Path(clip_dir)
    result = ClipResult(clip=folder.name)
    try:
        meta = read_meta(folder)
    except ClipError as e:
        for name in stages:
            result.stages[name], result.errors[name] = "failed", _error_text(e)
        return result
    ctx = ClipContext(folder, meta)
    for name in stages:
        stage = STAGES[name]
        version = stage.version(config)
        previous = meta.get("provenance", {}).get("stages", {}).get(name)
        if previous and previous.get("status") == "ok" and previous.get("version") == version:
            result.stages[name] = "cached"
            continue
        values: dict[str, Any] = {}
        try:
            values = stage.run(ctx, config)
            _check_declared(stage, values)
            record = {"status": "ok", "version": version, "keys": sorted(values)}
        except StageSkipped as e:
            record = {"status": "skipped", "version": version, "reason": str(e)}
        except Exception as e:  # a bad clip fails its stage, never the run
            record = {"status": "failed", "version": version, "error": _error_text(e)}
            result.errors[name] = record["error"]
        result.stages[name] = record["status"]
        if previous == record and not values:
            continue  # same skip/failure as last time: leave meta.json untouched
        try:
            meta = update_meta(folder, lambda doc: _apply(doc, name, record, values))
        except (ClipError, OSError) as e:
            result.stages[name], result.errors[name] = "failed", f"meta_write: {e}"
            return result
        ctx.meta = meta
    return result


def _check_declared(stage: Stage, values: dict[str, Any]) -> None:
    """Raise ``MetricError`` if a stage wrote a key it does not declare, or a value of another kind."""
    wrong = [
        f"{k} (undeclared)" if k not in stage.keys else f"{k} (not {stage.keys[k]})"
        for k, v in sorted(values.items())
        if k not in stage.keys or not value_matches(stage.keys[k], v)
    ]
    if wrong:
        raise MetricError(f"{stage.name}.keys", ", ".join(wrong))


def _annotate_task(task: tuple[str, list[str], AnnotateConfig]) -> ClipResult:
    """``annotate_clip`` on one ``(clip_dir, stages, config)`` tuple, the shape executors pass."""
    return annotate_clip(*task)


def run_annotate(
    corpus: str | Path,
    stages: list[str],
    config: AnnotateConfig,
    workers: int = 1,
    executor: str = "process",
    ray_address: str | None = None,
) -> list[ClipResult]:
    """Annotate every clip of ``corpus`` with a tqdm progress bar on ``executor`` (see `map_tasks`)."""
    config.check(stages)
    dirs = [str(d) for d in iter_clip_dirs(corpus)]
    results: list[ClipResult] = []
    tasks = [(d, stages, config) for d in dirs]
    for i, outcome in map_tasks(_annotate_task, tasks, executor, workers, desc="annotate", ray_address=ray_address):
        if isinstance(outcome, BaseException):  # a crashed worker loses only its clip's unfinished stages
            name = Path(dirs[i]).name
            outcome = ClipResult(name, {s: "failed" for s in stages}, {s: f"worker: {outcome!r}" for s in stages})
        results.append(outcome)
    return sorted(results, key=lambda r: r.clip)


def summarize(corpus: str | Path, stages: list[str], results: list[ClipResult]) -> dict[str, Any]:
    """The printed JSON summary: per-stage outcome counts, failed clips with stage and error, accounting."""
    counts = {s: {k: 0 for k in ("ok", "cached", "skipped", "failed")} for s in stages}
    failed = []
    for r in results:
        for s, status in r.stages.items():
            counts[s][status] += 1
        failed += [{"clip": r.clip, "stage": s, "error": err} for s, err in sorted(r.errors.items())]
    acc = account(corpus)
    return {
        "command": "annotate",
        "corpus": str(corpus),
        "stages": list(stages),
        "clips": len(results),
        "per_stage": counts,
        "failed": failed,
        "accounting": acc.to_dict(),
        "results": [asdict(r) for r in results],
    }


def _split_stages(stages: list[str] | str | None) -> list[str] | None:
    """Accept ``["a", "b"]``, ``["a,b"]`` or ``"a,b"``."""
    if stages is None:
        return None
    items = [stages] if isinstance(stages, str) else list(stages)
    return [s.strip() for item in items for s in item.split(",") if s.strip()]


@with_stage_options
def annotate_command(
    corpus: str,
    stages: list[str] | None = None,
    workers: int = 1,
    device: str = "cpu",
    executor: str = "process",
    ray_address: str | None = None,
    **options: Any,
) -> int:
    """Annotate a corpus of canonical clips with metric, camera and caption stages (paper §5.2, §5.4).

    The stage options below come from the registered stages (solarwm.data.annotate.stages).

    Args:
        corpus: corpus folder of clip folders.
        stages: stages to run ({stages}); default: every stage its options enable (a stage that needs
            weights or an endpoint, such as dover or vlm, only when they are given).
        workers: worker processes (Ray: CPUs of the local Ray); 1 runs in-process with the process executor.
        device: torch device for the model stages.
        executor: where the per-clip tasks run: process (local pool) or ray.
        ray_address: Ray cluster to join (e.g. auto, ray://head:10001); default: a local Ray of `workers` CPUs.
    """
    try:
        config = AnnotateConfig(device=device, **options)
        chosen = _split_stages(stages)
        if chosen is None:
            chosen = default_stages(config)
        results = run_annotate(corpus, chosen, config, workers, executor, ray_address)
    except (AnnotateConfigError, FileNotFoundError) as e:
        from solarwm.util.errors import print_error

        return print_error("data annotate", e)
    summary = summarize(corpus, chosen, results)
    print(summary["accounting"]["line"], file=sys.stderr)
    print(json.dumps(summary, indent=1))
    return 0
