"""Fixtures shared by every lane: a rendered corpus, a tiny recipe run and a tiny adapter, one place each.

Helpers that are not fixtures live in ``tests/support/`` (on ``sys.path`` through pytest's ``pythonpath``):
``routes`` (each route's test clip, the published recipes), ``runs`` (a shipped tiny recipe shrunk to a few
steps), ``corpora`` (hand-made canonical clips), ``route_contract``, ``play_fixtures``, ``native_fixtures``.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Tests import the installed package, never the checkout's folders by their top-level names: `python -m pytest` and
# pytest-xdist's workers put the working directory first on sys.path, so take it out before any test imports
# (kernels/__init__.py also steps aside for Hugging Face's `kernels` when it is imported as `kernels`).
sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != ROOT]
if (
    getattr(sys.modules.get("kernels"), "__file__", None)
    and Path(sys.modules["kernels"].__file__).parent == ROOT / "kernels"
):
    del sys.modules["kernels"]

from routes import ROUTES  # noqa: E402  (after the path is fixed)


@pytest.fixture(params=sorted(ROUTES))
def route(request) -> str:
    """Each registered route in turn."""
    return request.param


@pytest.fixture(scope="session")
def render_corpus(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``render_corpus(clips=3, frames=9, width=48, height=32, fps=8.0, seed=0, **synth)``: a corpus of rendered
    worlds (``solarwm data synth``), rendered once per session for each distinct setting. Read it, never write it:
    copy it (``copy_corpus``) for a test that changes it."""
    from solarwm.data.sources.synthetic import synth_corpus

    made: dict[tuple, Path] = {}

    def render(
        clips: int = 3, frames: int = 9, width: int = 48, height: int = 32, fps: float = 8.0, seed: int = 0, **synth
    ) -> Path:
        key = (clips, frames, width, height, fps, seed, tuple(sorted(synth.items())))
        if key not in made:
            out = tmp_path_factory.mktemp("rendered") / "corpus"
            synth_corpus(out, clips=clips, frames=frames, width=width, height=height, fps=fps, seed=seed, **synth)
            made[key] = out
        return made[key]

    return render


@pytest.fixture
def copy_corpus(tmp_path: Path) -> Callable[[Path], Path]:
    """``copy_corpus(src)``: a private copy of a corpus under this test's ``tmp_path``, for a test that writes."""

    def copy(src: Path) -> Path:
        dst = tmp_path / "corpus"
        shutil.copytree(src, dst)
        return dst

    return copy


@pytest.fixture
def tiny_recipe(tmp_path: Path) -> Callable[..., Path]:
    """``tiny_recipe(recipe="tiny_bid.yaml", corpus=None, **adapter_init)``: a shipped tiny recipe, 2 steps on 3
    rendered 9-frame clips, writing under this test's ``tmp_path`` (``runs.tiny_recipe``)."""
    from runs import tiny_recipe as make

    def build(
        recipe: str = "tiny_bid.yaml", corpus: Path | None = None, root: Path | None = None, **adapter_init
    ) -> Path:
        return make(root or tmp_path / Path(recipe).stem, recipe, corpus, **adapter_init)

    return build


@pytest.fixture
def tiny_adapter() -> Callable[..., object]:
    """``tiny_adapter(route="wan22_ti2v_5b", perturbed=True)``: its tiny preset, seeded (``routes.tiny_adapter``)."""
    from routes import tiny_adapter as make

    def build(route: str = "wan22_ti2v_5b", perturbed: bool = True) -> object:
        return make(route, perturbed)

    return build
