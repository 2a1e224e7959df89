"""The test tree's own rules: every test file in a lane folder with its conftest, and no two test files sharing a
name (pytest's default import mode imports each test file by its bare name)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
NOT_LANES = {"support", "fixtures", "__pycache__"}


def lanes() -> list[Path]:
    """The lane folders: every folder of tests/ but the helpers' and the data files'."""
    return sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name not in NOT_LANES)


def test_every_test_file_is_in_a_lane() -> None:
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not loose, f"move these into a lane folder (tests/README.md lists them): {loose}"


def test_every_lane_has_a_conftest() -> None:
    missing = [p.name for p in lanes() if not (p / "conftest.py").is_file()]
    assert not missing, f"lanes without a conftest.py: {missing}"


def test_no_two_test_files_share_a_name() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert not [n for n, k in names.items() if k > 1], (
        f"test files with the same name: {[n for n, k in names.items() if k > 1]}"
    )


def test_the_readme_lists_every_lane() -> None:
    readme = (TESTS / "README.md").read_text()
    missing = [p.name for p in lanes() if f"tests/{p.name}/" not in readme]
    assert not missing, f"tests/README.md does not list the lanes {missing}"


def test_the_repository_root_is_not_an_import_path() -> None:
    """tests/conftest.py takes the root off sys.path: its kernels/ folder must not shadow Hugging Face's kernels."""
    import importlib.util
    import os
    import sys

    root = TESTS.parent
    assert all(Path(p or os.getcwd()).resolve() != root for p in sys.path)
    spec = importlib.util.find_spec("kernels")
    assert spec is None or Path(spec.origin or "").parent != root / "kernels"
