"""The docs and the benchmarks' READMEs point at files that exist, and docs/README.md lists every
page: each ``docs/....md`` and ``bench/...`` path that README.md, docs/*.md, bench/**/README.md
and jaxpar's docstrings mention is in the repository, and so is each ``results/...`` file a bench
folder's README names relative to its folder."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.api

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BENCH = ROOT / "bench"

# A path: docs/NAME.md, or bench/ then path characters; {a,b} lists expand (memory.{json,md}).
PATH = re.compile(r"(?<![\w/.])(docs/[\w\-]+\.md|bench/[\w\-./{},]*[\w}/])(?![\w\-/*{]|\.\w)")
RELATIVE_RESULT = re.compile(r"(?<![\w/.])(results/[\w\-./{},]*[\w}/])(?![\w\-/*{]|\.\w)")
# Outputs a documented command writes that were merged and deliberately not kept.
NOT_KEPT = {
    "bench/fidelity/results/lc_resnet50.json",
    "bench/fidelity/results/lc_gpt2_124m.json",
}


def expand(path: str) -> list[str]:
    """`a/{x,y}.md` -> `a/x.md`, `a/y.md` (one brace group)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path.rstrip(".,/")]
    return [path[: m.start()] + alt + path[m.end() :] for alt in m.group(1).split(",")]


def docstrings() -> dict[str, str]:
    """Every docstring and comment of jaxpar/, keyed by file."""
    out = {}
    for p in sorted((ROOT / "jaxpar").rglob("*.py")):
        src = p.read_text()
        tree = ast.parse(src)
        texts = [
            ast.get_docstring(node, clean=False) or ""
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        texts += [line.split("#", 1)[1] for line in src.splitlines() if "#" in line]
        out[str(p.relative_to(ROOT))] = "\n".join(texts)
    return out


def documents() -> dict[str, str]:
    files = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted(BENCH.glob("**/README.md"))]
    return {str(p.relative_to(ROOT)): p.read_text() for p in files}


def missing_paths(texts: dict[str, str]) -> list[str]:
    missing = []
    for where, text in texts.items():
        for found in PATH.findall(text):
            for path in expand(found):
                if path.rstrip("/") in ("bench", "docs") or path in NOT_KEPT:
                    continue
                if not (ROOT / path).exists():
                    missing.append(f"{where}: {path}")
    return missing


def test_paths_in_the_docs_and_readmes_exist():
    assert not missing_paths(documents())


def test_paths_in_jaxpar_docstrings_exist():
    assert not missing_paths(docstrings())


def test_bench_readmes_name_their_own_results():
    missing = []
    for readme in sorted(BENCH.glob("*/README.md")):
        for found in RELATIVE_RESULT.findall(readme.read_text()):
            for path in expand(found):
                if not (readme.parent / path).exists():
                    missing.append(f"{readme.relative_to(ROOT)}: {path}")
    assert not missing


def test_the_index_lists_every_docs_page():
    index = (DOCS / "README.md").read_text()
    listed = set(re.findall(r"^- \[[\w\-]+\.md\]\(([\w\-]+\.md)\)", index, re.M))
    pages = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert listed == pages


def test_every_bench_folder_has_a_readme_and_is_in_the_index():
    index = (BENCH / "README.md").read_text()
    folders = sorted(p.name for p in BENCH.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders
    for name in folders:
        assert (BENCH / name / "README.md").exists(), name
        assert f"`{name}/`" in index, f"bench/README.md does not list {name}/"
