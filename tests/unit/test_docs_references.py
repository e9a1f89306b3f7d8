"""Every repository path the documentation and the code's comments cite exists.

Scanned: README.md and docs/*.md (paths, bare ``*.md`` names and relative links), the
``dev`` script, CI, compose, Dockerfiles and shell scripts, and the comments and docstrings
of the Python files under maskops/, services/ and bench/. A citation is a path starting at the
repository root (``services/...``, ``bench/...``, ``docs/...``, ``tests/...``, ...), a path
inside a package (``maskops/export/graph.py``, ``maskops_api/cache/job_cache.py``: looked up
at the root and under services/*/), or a ``NAME.md`` file name. Globs must match at least one file.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README_LIMIT = 15_000
# Package paths are looked up from the repository root (the engine, maskops/) and from each
# service folder (services/api/maskops_api/, ...).
PACKAGE_ROOTS = [REPO, *sorted(path for path in (REPO / "services").iterdir() if path.is_dir())]
ROOTS = ("services", "bench", "docs", "tests", "migrations", "openapi", "model_repository", ".ci")
PACKAGES = ("maskops", "maskops_api", "maskops_core", "maskops_worker", "maskops_serve")
_TAIL = r"(?:/[\w.*?{}-]+)+/?"
ROOT_PATH = re.compile(rf"(?<![\w/.~$-])((?:{'|'.join(re.escape(r) for r in ROOTS)}){_TAIL})")
# Inside a package only a file name with its extension, or a folder/, is a citation
# ("maskops/torchvision" is prose).
PACKAGE_PATH = re.compile(
    rf"(?<![\w/.~$-])((?:{'|'.join(PACKAGES)})(?:/[\w.-]+)*(?:/[\w-]+\.[a-z]+\b|/(?!\w)))"
)
MD_NAME = re.compile(r"(?<![\w/.~$-])([\w-]+\.md)\b")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
SKIPPED_DIRS = {".venv", ".git", "build", "node_modules", "__pycache__", ".mypy_cache"}


def _markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _text_files() -> list[Path]:
    """Non-Python files whose whole text is read: scripts, CI, compose, Dockerfiles."""
    files = [REPO / "dev", REPO / ".ci" / "run", REPO / "docker-compose.yml"]
    for folder in ("services", "bench"):
        files += sorted((REPO / folder).rglob("Dockerfile"))
        files += sorted((REPO / folder).rglob("*.sh"))
    return [path for path in files if path.is_file() and not _skipped(path)]


def _python_files() -> list[Path]:
    folders = ("maskops", "services", "bench")
    files = [path for folder in folders for path in sorted((REPO / folder).rglob("*.py"))]
    return [path for path in files if not _skipped(path) and not path.name.endswith("_pb2.py")]


@cache
def _markdown_names() -> frozenset[str]:
    names: set[str] = set()
    for _folder, dirs, files in os.walk(REPO):
        dirs[:] = [name for name in dirs if name not in SKIPPED_DIRS]
        names.update(name for name in files if name.endswith(".md"))
    return frozenset(names)


def _skipped(path: Path) -> bool:
    return bool(SKIPPED_DIRS & set(path.relative_to(REPO).parts))


def comments_and_docstrings(source: str) -> str:
    """The comments and the string statements (docstrings) of a Python source."""
    parts = [
        token.string
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            parts.append(node.value.value)
    return "\n".join(parts)


def _exists(relative: str, base: Path) -> bool:
    relative = relative.rstrip("/")
    if any(char in relative for char in "*?[{"):
        return any(base.glob(relative.replace("{", "*").replace("}", "")))
    return (base / relative).exists()


def citations(text: str, source: Path) -> Iterator[tuple[str, bool]]:
    """(citation, exists) for every repository path ``text`` (from ``source``) cites."""
    for match in ROOT_PATH.finditer(text):
        path = match.group(1).rstrip(".")
        yield path, _exists(path, REPO)
    for match in PACKAGE_PATH.finditer(text):
        path = match.group(1).rstrip(".")
        yield path, any(_exists(path, root) for root in PACKAGE_ROOTS)
    for match in MD_NAME.finditer(text):
        name = match.group(1)
        yield name, (source.parent / name).exists() or name in _markdown_names()
    if source.suffix == ".md":
        for match in MD_LINK.finditer(text):
            target, _, anchor = match.group(1).partition("#")
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            page = source.parent / target if target else source
            if target:
                yield target, page.exists()
            if anchor and page.suffix == ".md" and page.exists():
                yield f"{target}#{anchor}", anchor in anchors(page.read_text())


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation dropped,
    spaces as hyphens)."""
    headings = re.findall(r"(?m)^#{1,6} +(.+?) *$", markdown)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def _missing(paths: list[Path], read: bool) -> list[str]:
    missing = []
    for path in paths:
        text = path.read_text(errors="replace")
        if not read:
            text = comments_and_docstrings(text)
        for cited, exists in citations(text, path):
            if not exists:
                missing.append(f"{path.relative_to(REPO)}: {cited}")
    return sorted(set(missing))


def test_markdown_cites_only_files_in_the_repository() -> None:
    missing = _missing(_markdown_files(), read=True)
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)


def test_scripts_cite_only_files_in_the_repository() -> None:
    missing = _missing(_text_files(), read=True)
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)


def test_code_comments_cite_only_files_in_the_repository() -> None:
    missing = _missing(_python_files(), read=False)
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)


def test_readme_is_short_and_links_every_doc() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.encode()) < README_LIMIT
    docs = sorted(path.name for path in (REPO / "docs").glob("*.md"))
    assert docs, "docs/ has no document"
    assert not [name for name in docs if f"](docs/{name})" not in readme]


@pytest.mark.parametrize(
    ("text", "cited"),
    [
        ("see ARCHITECTURE.md.", ["ARCHITECTURE.md"]),
        ("(`services/api/maskops_api/main.py`)", ["services/api/maskops_api/main.py"]),
        (
            "bench/results/*.json, maskops_api/main.py",
            ["bench/results/*.json", "maskops_api/main.py"],
        ),
        ("[a](docs/a.md#b) https://x.org/docs/y.md", ["docs/a.md", "docs/a.md"]),
        ("/tmp/demo/shards .maskops/data ./services maskops/torchvision", []),
        (
            "maskops/serving/ and maskops/export/graph.py.",
            ["maskops/serving/", "maskops/export/graph.py"],
        ),
    ],
)
def test_what_counts_as_a_citation(text: str, cited: list[str]) -> None:
    found = [path for path, _ in citations(text, REPO / "README.md")]
    assert sorted(found) == sorted(cited)


def test_a_missing_file_is_caught() -> None:
    found = dict(citations("see ARCHITECTURE.md and docs/nowhere.md", REPO / "README.md"))
    assert found == {"ARCHITECTURE.md": False, "docs/nowhere.md": False}
    found = dict(citations("[x](docs/pruning.md#no-such-heading)", REPO / "README.md"))
    assert found == {"docs/pruning.md": True, "docs/pruning.md#no-such-heading": False}


def test_anchors_follow_github() -> None:
    assert anchors("# Triton from PyPI (`maskops serve`, tests)\n## GPU hosts") == {
        "triton-from-pypi-maskops-serve-tests",
        "gpu-hosts",
    }


# The project's own tracker, reviews and sessions are outside the repository: a reader has
# none of them. Another project's issue (named on the same line) is a citation, not this.
OUTSIDE_REFERENCE = re.compile(
    r"\bissue ?#?\d+\b|\bthe issue's\b|\breviewer\b|notes of the session|session that ran",
    re.IGNORECASE,
)
OTHER_PROJECTS = re.compile(r"pytest-xdist|onnxruntime|pytorch/|torchvision|github\.com")


def test_the_repository_speaks_of_itself_alone() -> None:
    import subprocess

    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    found: list[str] = []
    for name in filter(None, (raw.decode() for raw in tracked)):
        path = REPO / name
        if name.endswith(".lock") or not path.is_file() or path == Path(__file__).resolve():
            continue
        try:
            lines = path.read_text().splitlines()
        except UnicodeDecodeError:
            continue
        found += [
            f"{name}:{number}: {line.strip()[:120]}"
            for number, line in enumerate(lines, 1)
            if OUTSIDE_REFERENCE.search(line) and not OTHER_PROJECTS.search(line)
        ]
    assert not found, "state the fact instead of citing the tracker:\n" + "\n".join(found)
