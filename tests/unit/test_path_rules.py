"""One rule keeps a client-given path inside the folder it is joined to, links followed."""

from __future__ import annotations

from pathlib import Path

import pytest

from maskops.path_rules import PathEscape, confine, leaves_by_text


@pytest.mark.parametrize(
    "name", ["/etc/passwd", "\\etc", "a/../../b", "a\\..\\b", "..", "C:/x", "c:x", "a\x00b"]
)
def test_a_name_that_leaves_by_its_text_is_refused_before_any_lookup(
    name: str, tmp_path: Path
) -> None:
    assert leaves_by_text(name)
    with pytest.raises(PathEscape):
        confine(tmp_path / "missing", name)


@pytest.mark.parametrize("name", ["a.png", "sub/a.png", "sub\\a.png", "./a", "", "sub/a:b.png"])
def test_a_relative_name_stays(name: str, tmp_path: Path) -> None:
    assert not leaves_by_text(name)
    assert confine(tmp_path, name).is_relative_to(tmp_path.resolve())


def test_a_link_out_of_the_folder_is_refused_and_one_inside_is_followed(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (tmp_path / "out").symlink_to(outside, target_is_directory=True)
    (tmp_path / "real").mkdir()
    (tmp_path / "in").symlink_to(tmp_path / "real", target_is_directory=True)
    with pytest.raises(PathEscape):
        confine(tmp_path, "out/x.png")
    assert confine(tmp_path, "in/x.png") == (tmp_path / "real" / "x.png").resolve()


def test_a_link_loop_is_an_os_error_not_an_escape(tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises((OSError, RuntimeError)):
        confine(tmp_path, "loop/x")
