"""The user docs name only what exists: every `solarwm data|camera <verb>` the README shows is a CLI verb,
every repository path it names in backticks is a file or folder, and the results pages' links resolve."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from solarwm.cli import GROUPS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# Paths in backticks that start with one of the repository's top-level folders; placeholders (<name>, X, *,
# {a,b}) are patterns, not paths.
_PATH = re.compile(r"`((?:recipes|examples|benchmarks|docs|tests|backbones|solarwm)/[^`\s]+)`")
_PATTERN_CHARS = set("<>*{}")
# Files that commands name, in code blocks too: `--config recipes/x.yaml`, `bash examples/x.sh`, `python benchmarks/x.py`.
_FILE = re.compile(r"(?<![\w/<])((?:recipes|examples|benchmarks)/[\w./-]+\.(?:yaml|sh|py|md))")
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def _is_pattern(path: str) -> bool:
    return bool(_PATTERN_CHARS & set(path)) or bool(re.search(r"(^|/)X(\.|/|$)", path))


def test_readme_verbs_exist() -> None:
    text = README.read_text()
    used = set(re.findall(r"solarwm (data|camera) ([a-z_-]+)", text))
    assert used, "the README shows no data or camera verb"
    unknown = sorted(f"{group} {verb}" for group, verb in used if verb not in GROUPS[group])
    assert not unknown, f"README names verbs the CLI does not have: {unknown}"


def test_readme_paths_exist() -> None:
    text = README.read_text()
    paths = {p.rstrip(".,;:") for p in _PATH.findall(text)} | set(_FILE.findall(text))
    checked = [p for p in paths if not _is_pattern(p) and not p.startswith("solarwm/WorldModel")]
    assert len(checked) >= 10, f"too few paths found to check: {checked}"
    missing = sorted(p for p in checked if not (ROOT / p).exists())
    assert not missing, f"README names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", sorted((ROOT / "docs" / "results").glob("*.md")) + [ROOT / "recipes/weights/README.md"],
                         ids=lambda p: p.name if p.parent.name == "results" else "weights/README.md")
def test_results_links_resolve(page: Path) -> None:
    text = page.read_text()
    links = [link for link in _LINK.findall(text) if "://" not in link]
    missing = sorted(link for link in links if not (page.parent / link).exists())
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"
    paths = [p.rstrip(".,;:") for p in _PATH.findall(text)]
    gone = sorted(p for p in paths if not _is_pattern(p) and not (ROOT / p).exists()
                  and p != "recipes/weights/tiny_base/")  # the deleted base, named as history
    assert not gone, f"{page.relative_to(ROOT)} names paths that do not exist: {gone}"


def test_results_index_lists_every_page() -> None:
    index = (ROOT / "docs" / "results" / "README.md").read_text()
    pages = sorted(p.name for p in (ROOT / "docs" / "results").glob("20*.md"))
    assert pages, "docs/results has no dated page"
    unlisted = [name for name in pages if f"({name})" not in index]
    assert not unlisted, f"docs/results/README.md does not list: {unlisted}"
    bad = [name for name in pages if not re.fullmatch(r"20\d\d-(0[1-9]|1[0-2])-[a-z0-9-]+\.md", name)]
    assert not bad, f"results pages must be named YYYY-MM-<topic>.md: {bad}"
