"""Text names only what exists: every repository file that the docs, the recipe headers, `pyproject.toml`'s
comments, shell comments and the code's docstrings and comments name is there; every test they name (a test file with
`::test_name`, or a bare `test_<x>.py`) is there; every relative link and `../` path of a page resolves inside the
repository; the README's `solarwm data|camera <verb>`s are CLI verbs; the results index lists every dated page.

Full paths are checked literally, from the repository root (a page's links from the page). A bare test file name
names no folder, so it is looked up by name under tests/. A path next to "deleted", "removed" or "git history" on
the same line is named as history and not checked.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from pathlib import Path
from typing import Iterable, Iterator

import pytest

from solarwm.cli import GROUPS

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
README = ROOT / "README.md"
# The repository's top-level folders; a reference is a path that starts with one of them.
TOP = ("backbones", "benchmarks", "callbacks", "datamodules", "docs", "examples", "experiments", "kernels", "recipes",
       "solarwm", "tests")
# Folders of outputs, environments and copies, never scanned.
SKIP_DIRS = {".git", ".github", "runs", "outputs", "node_modules", "__pycache__", "shared", ".venv", "venv",
             "build", "dist", ".ruff_cache", ".pytest_cache"}
CODE_DIRS = ("solarwm", "backbones", "datamodules", "callbacks", "kernels", "benchmarks", "examples", "experiments",
             "tests")
FILE_EXT = ("py", "md", "yaml", "yml", "sh", "json", "jsonl", "toml", "png", "html", "npz", "txt", "js", "css")

# A repository path: a top-level folder, then path characters, ending in a word character; optionally a test name.
_REF = re.compile(rf"(?<![\w./~$-])((?:{'|'.join(TOP)})/[\w./-]*\w)(::[\w:]+)?")
# A bare test file name (no folder), optionally with a test name.
_BARE_TEST = re.compile(r"(?<![\w./-])(test_\w+\.py)(::[\w:]+)?")
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
_UP = re.compile(r"`(\.\./[^`\s]+)`")  # a backticked path relative to the page
_HISTORY = re.compile(r"deleted|removed|git history", re.I)
_PLACEHOLDER = re.compile(r"(^|/)(X|N|FILE|DIR|OUT|NAME|PATH|STAGE|CLIP|ROUTE)(\.|/|$)")


def _walk(*patterns: str) -> list[Path]:
    """Repository files whose name matches one of ``patterns`` (suffixes), outside SKIP_DIRS, *.egg-info and any
    virtual environment (a folder with a ``pyvenv.cfg``, whatever its name)."""
    out = []
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.endswith(".egg-info")
                         and not (Path(d) / x / "pyvenv.cfg").is_file())
        out += [Path(d) / f for f in sorted(files) if f.endswith(patterns)]
    return out


MARKDOWN = _walk(".md")
RECIPES = [p for p in _walk(".yaml", ".yml") if p.is_relative_to(ROOT / "recipes")]
SHELL = _walk(".sh")
CODE = [p for p in _walk(".py") if p.relative_to(ROOT).parts[0] in CODE_DIRS]
TEST_FILES = {p.name: p for p in _walk(".py") if p.is_relative_to(ROOT / "tests")}


def _comments(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, comment text) of a YAML, TOML or shell file; a `#` inside quotes is not a comment."""
    for i, line in enumerate(path.read_text().splitlines(), 1):
        quote = None
        for j, ch in enumerate(line):
            if quote:
                quote = None if ch == quote else quote
            elif ch in "\"'":
                quote = ch
            elif ch == "#":
                yield i, line[j + 1:]
                break


def _code_text(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of every module, class and function docstring and every comment of a Python file."""
    text = path.read_text()
    if not (_REF.search(text) or _BARE_TEST.search(text)):
        return  # nothing to check: skip the parse (it is most of this test's time)
    tree = ast.parse(text, filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                for k, line in enumerate(value.value.splitlines()):
                    yield first.lineno + k, line
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string[1:]


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    if path.suffix == ".py":
        return _code_text(path)
    if path.suffix == ".md":
        return enumerate(path.read_text().splitlines(), 1)
    return _comments(path)


def _defines(test_file: Path, names: str) -> bool:
    """Whether ``test_file`` defines every name of ``::a::b`` (a test function, or a class and its method)."""
    text = test_file.read_text()
    return all(re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(n)}\b", text, re.M)
               for n in names.strip(":").split("::"))


def _is_pattern(path: str, after: str) -> bool:
    """A placeholder or a name, not a path: `tests/FILE.py`, `tests/<lane>/...`, `recipes/tiny_*.yaml`, `a/{b,c}`,
    `a/b...`; `solarwm/WorldModel-v0` is a Gymnasium id."""
    return (bool(_PLACEHOLDER.search(path)) or after[:1] in ("*", "<", "{", "…", "$") or after.startswith("..")
            or bool(re.fullmatch(r"solarwm/\w+-v\d+", path)))


def problems(path: Path, lines: Iterable[tuple[int, str]] | None = None) -> list[str]:
    """Every reference of ``path`` (or of its ``lines``) that names nothing: ``"file:line: what"``."""
    rel = path.relative_to(ROOT)
    out = []
    for n, line in _lines(path) if lines is None else lines:
        if _HISTORY.search(line):
            continue
        where = f"{rel}:{n}"
        for m in _REF.finditer(line):
            ref, test = m.group(1), m.group(2)
            if _is_pattern(ref, line[m.end(1):]):
                continue
            target = ROOT / ref
            if ref.rsplit(".", 1)[-1] in FILE_EXT or "." not in ref.rsplit("/", 1)[-1]:
                if not target.exists():
                    out.append(f"{where}: {ref} does not exist")
                elif test and not _defines(target, test):
                    out.append(f"{where}: {ref} has no {test.strip(':')}")
        for m in _BARE_TEST.finditer(line):
            name, test = m.group(1), m.group(2)
            if name not in TEST_FILES:
                out.append(f"{where}: no test file {name} under tests/")
            elif test and not _defines(TEST_FILES[name], test):
                out.append(f"{where}: {name} has no {test.strip(':')}")
        if path.suffix == ".md":
            for target in _LINK.findall(line) + _UP.findall(line):
                if "://" in target or target.startswith("mailto:"):
                    continue
                resolved = (path.parent / target).resolve()
                if not resolved.is_relative_to(ROOT):
                    out.append(f"{where}: {target} points outside the repository")
                elif not resolved.exists():
                    out.append(f"{where}: {target} does not resolve")
    return out


@pytest.mark.parametrize("files", [
    pytest.param(MARKDOWN, id="markdown"),
    pytest.param(RECIPES, id="recipe-comments"),
    pytest.param([ROOT / "pyproject.toml"], id="pyproject-comments"),
    pytest.param(SHELL, id="shell-comments"),
    pytest.param(CODE, id="docstrings-and-comments"),
])
def test_named_files_and_tests_exist(files: list[Path]) -> None:
    assert files, "nothing found to check"
    found = [p for f in files for p in problems(f)]
    assert not found, "stale references:\n" + "\n".join(found)


def test_the_checker_finds_what_it_should() -> None:
    # A regex that matches nothing passes everything: the scan must see the README's references, and a probe page
    # of stale references, placeholders and history must give exactly the stale ones.
    refs = {m.group(1) for _, line in _lines(README) for m in _REF.finditer(line)}
    assert {"recipes/tiny_bid.yaml", "examples/three_stages.sh"} <= refs, sorted(refs)
    probe = ("`recipes/nope.yaml`, tests/project/test_docs_references.py::test_nope, test_nope_at_all.py, "
             "[a](../../outside.md), `../nope.md`, recipes/tiny_*.yaml, `tests/<lane>/x.py`, recipes/X.yaml, "
             "tests/project/test_docs_references.py::test_readme_verbs_exist, tests/FILE.py, `solarwm/WorldModel-v0`, "
             "docs/NOPE.md")
    found = problems(ROOT / "docs" / "probe.md", [(1, probe), (2, "recipes/gone.yaml (deleted)")])
    assert [f.split(": ", 1)[1] for f in found] == [
        "recipes/nope.yaml does not exist",
        "tests/project/test_docs_references.py has no test_nope",
        "docs/NOPE.md does not exist",
        "no test file test_nope_at_all.py under tests/",
        "../../outside.md points outside the repository",
        "../nope.md does not resolve",
    ], found


def test_readme_verbs_exist() -> None:
    text = README.read_text()
    used = set(re.findall(r"solarwm (data|camera) ([a-z_-]+)", text))
    assert used, "the README shows no data or camera verb"
    unknown = sorted(f"{group} {verb}" for group, verb in used if verb not in GROUPS[group])
    assert not unknown, f"README names verbs the CLI does not have: {unknown}"


def test_results_index_lists_every_page() -> None:
    index = (ROOT / "docs" / "results" / "README.md").read_text()
    pages = sorted(p.name for p in (ROOT / "docs" / "results").glob("20*.md"))
    assert pages, "docs/results has no dated page"
    unlisted = [name for name in pages if f"({name})" not in index]
    assert not unlisted, f"docs/results/README.md does not list: {unlisted}"
    bad = [name for name in pages if not re.fullmatch(r"20\d\d-(0[1-9]|1[0-2])-[a-z0-9-]+\.md", name)]
    assert not bad, f"results pages must be named YYYY-MM-<topic>.md: {bad}"
