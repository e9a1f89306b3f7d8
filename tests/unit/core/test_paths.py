"""The path rules: paths from clients stay under the data root, messages name paths
relative to it, and a tree of any depth can be removed."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from maskops_core.paths import (
    RELATIVE_PATH_PATTERN,
    check_client_path,
    disk_problem,
    relative_data_path,
    relative_to_root,
    remove_tree,
)

ACCEPTED = ["shapes/train.json", "a", "./a/b", "a\\b", "x..y/z", "..a"]
REFUSED = ["", ".", "./", "/etc/passwd", "../x", "a/../../b", "a\\..\\b", "C:x", "a\x00b"]


@pytest.mark.parametrize("value", ACCEPTED)
def test_relative_paths_inside_the_data_root_are_accepted(value: str) -> None:
    assert relative_data_path(value) == value
    assert re.match(RELATIVE_PATH_PATTERN, value)


@pytest.mark.parametrize("value", REFUSED)
def test_paths_leaving_the_data_root_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match="relative to the data root"):
        relative_data_path(value)
    # The OpenAPI pattern is the same rule for the client's own checks.
    assert not re.match(RELATIVE_PATH_PATTERN, value)


def test_absolute_paths_only_inside_the_operators_folders(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    weights.mkdir()
    check_client_path(str(weights / "r50.pth"), allowed_dirs=[weights])
    with pytest.raises(ValueError, match=re.escape(f"or inside {weights}")):
        check_client_path(str(weights / ".." / "secret.pth"), allowed_dirs=[weights])
    with pytest.raises(ValueError, match=r"relative to the data root$"):
        check_client_path("/etc/passwd")
    check_client_path("jobs/3/model.pth")


def test_messages_name_paths_relative_to_the_root(tmp_path: Path) -> None:
    root = tmp_path / "data"
    text = f"resuming from {root}/jobs/5/model.pth; root is {root}; sibling {root}-old/x"
    assert relative_to_root(text, root) == (
        f"resuming from jobs/5/model.pth; root is .; sibling {root}-old/x"
    )


def test_the_root_named_through_a_link_is_made_relative_too(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    assert relative_to_root(f"{real}/jobs/1 and {link}/jobs/2", link) == "jobs/1 and jobs/2"


def test_disk_problem_names_the_setting(tmp_path: Path) -> None:
    assert disk_problem(tmp_path / "not" / "yet", 0) == "ok"
    problem = disk_problem(tmp_path, 1 << 62)
    assert "MASKOPS_MIN_FREE_DISK_BYTES" in problem and "MASKOPS_DATA_ROOT" in problem


def test_remove_tree_removes_a_tree_deeper_than_path_max(tmp_path: Path) -> None:
    top = tmp_path / "top"
    top.mkdir()
    # 1,500 levels of 9-character names: past both PATH_MAX and Python's recursion limit
    # (built one level at a time relative to the last, as no full path can be opened).
    fd = os.open(top, os.O_RDONLY)
    try:
        for _ in range(1500):
            os.mkdir("directory", dir_fd=fd)
            inner = os.open("directory", os.O_RDONLY, dir_fd=fd)
            os.close(os.open("file", os.O_CREAT | os.O_WRONLY, dir_fd=inner))
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    remove_tree(top)
    assert not top.exists()
    remove_tree(top)  # already gone: no error


def test_remove_tree_never_follows_links(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "file").write_text("keep me")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "to-kept").symlink_to(kept)
    remove_tree(tree)
    assert (kept / "file").read_text() == "keep me" and not tree.exists()
    (tmp_path / "link").symlink_to(kept)
    with pytest.raises(OSError, match="symbolic link"):
        remove_tree(tmp_path / "link")
