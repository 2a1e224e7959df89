"""A stage registered outside built-ins: its option reaches the command, its keys the policy, its value meta.json."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import yaml

from solarwm.cli import main
from solarwm.data.annotate.registry import AnnotateConfigError
from solarwm.data.annotate.stages import (
    STAGES,
    AnnotateConfig,
    ClipContext,
    Option,
    Stage,
    register_stage,
    stage_options,
    unregister_stage,
)
from solarwm.data.contract import iter_clip_dirs, read_meta
from solarwm.data.kinds import NUMBER
from solarwm.data.policy import COLUMNS, PolicyError, load_policy

KEY = "metrics.test_brightness"


def run_brightness(ctx: ClipContext, config: AnnotateConfig) -> dict[str, Any]:
    """Mean luma (0–255) of the clip times ``--brightness_gain``."""
    return {KEY: float(np.mean(ctx.frames())) * config.brightness_gain}


def check_brightness(config: AnnotateConfig) -> None:
    if not config.brightness_gain > 0:
        raise AnnotateConfigError(f"--brightness_gain must be positive, got {config.brightness_gain}")


BRIGHTNESS = Stage(
    "brightness",
    run_brightness,
    lambda c: f"1/gain:{c.brightness_gain}",
    {KEY: NUMBER},
    options=(Option("brightness_gain", float, 1.0, "factor applied to the mean luma of the clip."),),
    check=check_brightness,
    enabled_by_default=lambda c: False,
)


@pytest.fixture
def brightness() -> Iterator[Stage]:
    register_stage(BRIGHTNESS)
    try:
        yield BRIGHTNESS
    finally:
        unregister_stage(BRIGHTNESS.name)


@pytest.fixture
def corpus(render_corpus, copy_corpus) -> Path:
    return copy_corpus(render_corpus(clips=2, frames=9, width=48, height=32, fps=8.0, seed=4))


def annotate_help(capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(["data", "annotate", "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_a_registered_stage_is_an_option_a_column_and_a_key(
    brightness: Stage, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    text = annotate_help(capsys)
    assert "--brightness_gain BRIGHTNESS_GAIN" in text and "factor applied to the mean luma" in text
    stages_help = text.split("\n  --stages STAGES", 1)[1].split("\n  --workers", 1)[0]
    assert "vlm, brightness)" in " ".join(stages_help.split())  # listed among the stages, after the built-ins
    for builtin in (
        "--vlm_endpoint",
        "--vlm_model",
        "--vlm_api_key_env",
        "--vlm_max_retries",
        "--unimatch_checkpoint",
        "--dover_checkpoint",
        "--dover_options",
        "--device",
        "--executor",
        "--ray_address",
    ):
        assert builtin in text, builtin

    assert COLUMNS[KEY] == NUMBER
    policy = tmp_path / "bright.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "policy": "bright",
                "version": "1",
                "owners": {
                    "synthetic": {
                        "kept": [{"range": {"column": KEY, "min": 0}}],
                        "xhigh": [{"range": {"column": KEY, "min": 1e9}}],
                    }
                },
            }
        )
    )
    load_policy(policy)  # a gate on the new key is a valid policy entry

    assert main(["data", "annotate", "--corpus", str(corpus), "--stages", "brightness", "--brightness-gain", "2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["per_stage"]["brightness"]["ok"] == 2
    for clip in iter_clip_dirs(corpus):
        meta = read_meta(clip)
        frames = ClipContext(clip, meta).frames()
        assert meta["metrics"][KEY] == pytest.approx(2 * float(np.mean(frames)))
        assert meta["provenance"]["stages"]["brightness"] == {"status": "ok", "version": "1/gain:2.0", "keys": [KEY]}

    assert main(["data", "select", "--corpus", str(corpus), "--policy", str(policy)]) == 0
    assert json.loads(capsys.readouterr().out)["tiers"] == {"xhigh": 0, "high": 2, "rejected": 0}


def test_a_registered_stage_checks_its_options_and_is_off_by_default(
    brightness: Stage, corpus: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["data", "annotate", "--corpus", str(corpus), "--stages", "brightness", "--brightness_gain", "0"]) == 2
    assert "--brightness_gain must be positive, got 0.0" in capsys.readouterr().err
    assert main(["data", "annotate", "--corpus", str(corpus), "--stages", "saturation"]) == 0
    assert "brightness" not in json.loads(capsys.readouterr().out)["per_stage"]

    config = AnnotateConfig(brightness_gain=3.0)
    assert pickle.loads(pickle.dumps(config)) == config and config.brightness_gain == 3.0  # travels to workers
    assert dict(AnnotateConfig().options)["brightness_gain"] == 1.0  # the option's default


def test_names_options_and_kinds_are_refused_when_taken(brightness: Stage) -> None:
    import dataclasses

    with pytest.raises(AnnotateConfigError, match="a stage named 'brightness' is already registered"):
        register_stage(BRIGHTNESS)
    with pytest.raises(AnnotateConfigError, match="option 'brightness_gain' is already taken by stage 'brightness'"):
        register_stage(dataclasses.replace(BRIGHTNESS, name="brightness2", keys={}))
    with pytest.raises(AnnotateConfigError, match="option 'device' is already taken by the command"):
        register_stage(
            dataclasses.replace(BRIGHTNESS, name="brightness2", keys={}, options=(Option("device", str, "cpu", "x"),))
        )
    with pytest.raises(AnnotateConfigError, match=r"redeclares key\(s\) with another kind: metrics.saturation \(text"):
        register_stage(
            dataclasses.replace(BRIGHTNESS, name="brightness2", options=(), keys={"metrics.saturation": "text"})
        )
    with pytest.raises(AnnotateConfigError, match="unknown kind"):
        register_stage(dataclasses.replace(BRIGHTNESS, name="brightness2", options=(), keys={"metrics.x": "float"}))
    assert "brightness2" not in STAGES  # a refused stage leaves nothing behind


def test_unregistering_leaves_no_trace(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    register_stage(BRIGHTNESS)
    unregister_stage(BRIGHTNESS.name)
    assert "brightness" not in STAGES and "brightness_gain" not in stage_options() and KEY not in COLUMNS
    assert "--brightness_gain" not in annotate_help(capsys)
    with pytest.raises(AnnotateConfigError, match=r"unknown annotation option\(s\) \['brightness_gain'\]"):
        AnnotateConfig(brightness_gain=2.0)
    policy = tmp_path / "bright.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "policy": "bright",
                "version": "1",
                "owners": {"synthetic": {"kept": [{"range": {"column": KEY, "min": 0}}], "xhigh": []}},
            }
        )
    )
    with pytest.raises(PolicyError, match="unknown column 'metrics.test_brightness'"):
        load_policy(policy)
