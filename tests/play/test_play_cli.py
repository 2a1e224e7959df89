"""`solarwm play`'s bad input ends in one line and exit 2; its defaults point at the shipped assets."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from solarwm.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_a_missing_or_bidirectional_adapter_is_one_line(tmp_path, capsys):
    assert main(["play", "--adapter", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("solarwm play: error:") and "no adapter.json" in err and "\n" not in err
    assert main(["play", "--adapter", str(ROOT / "recipes/weights/tiny_base4")]) == 2
    assert "needs a causal model" in capsys.readouterr().err


def test_the_shipped_defaults_exist_and_fit_the_tiny_recipe():
    from PIL import Image

    from solarwm.loading import DEFAULT_ADAPTER, DEFAULT_CAPTION, DEFAULT_FIRST_FRAME

    image = np.asarray(Image.open(DEFAULT_FIRST_FRAME))
    assert image.shape == (32, 32, 3) and image.std() > 10  # a rendered world, not a blank frame
    assert DEFAULT_ADAPTER == "recipes/weights/tiny_causal" and DEFAULT_CAPTION
    assert (ROOT / "solarwm/play/static/index.html").is_file()


def test_the_page_and_the_default_frame_are_package_data():
    import tomllib

    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert {"solarwm.play", "solarwm.envs"} <= set(tool["packages"])
    patterns = tool["package-data"]["solarwm.play"]
    shipped = {
        str(p.relative_to(ROOT / "solarwm/play")) for pattern in patterns for p in (ROOT / "solarwm/play").glob(pattern)
    }
    assert {"static/index.html", "default_first_frame.png"} <= shipped
