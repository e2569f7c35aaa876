"""The file caps of ``exec`` jobs (``limits.check_file_path``/``check_files``), which the host,
PID 1 and the job process all apply."""

from __future__ import annotations

import pytest
from sandpit.sandbox_images.runner import limits


@pytest.mark.parametrize("path", ["a", "a.txt", "dir/file.py", "a/b/c/d", "ünï/çødé.txt", ".hidden", "a..b",
                                  "x" * 255, "/".join(["d"] * limits.MAX_PATH_DEPTH)])
def test_relative_paths_are_accepted(path: str) -> None:
    assert limits.check_file_path(path) == path


@pytest.mark.parametrize(("path", "message"), [
    ("", "1 to"), ("/etc/passwd", "absolute"), ("../x", "'..'"), ("a/../../b", "'..'"), ("a/..", "'..'"),
    (".", "'.'"), ("./a", "'.'"), ("a//b", "empty"), ("a/", "empty"), ("a\x00b", "control"), ("a\nb", "control"),
    ("a\x7fb", "control"), ("a\\b", "backslash"), ("x" * 256, "255 bytes"), ("ü" * 128, "255 bytes"),
    ("/".join(["d"] * (limits.MAX_PATH_DEPTH + 1)), "deeper"), ("a" * (limits.MAX_PATH_CHARS + 1), "1 to"),
    ("\ud800", "not valid text"), (5, "not a string"), (None, "not a string"),
])
def test_hostile_paths_are_rejected(path: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        limits.check_file_path(path)


def test_file_sets() -> None:
    files = {"a.txt": "x", "d/b.txt": "ü" * 10}
    assert limits.check_files(files) is files
    assert limits.check_files({}) == {}
    for bad, message in [
        ([], "must be an object"), ({"a": b"bytes"}, "must be text"), ({"a": "\udc00"}, "not valid text"),
        ({f"f{i}": "" for i in range(limits.MAX_FILES + 1)}, "at most 64 files"),
        ({"big": "x" * (limits.MAX_FILE_BYTES + 1)}, "bytes; at most"),
        ({f"f{i}": "x" * limits.MAX_FILE_BYTES for i in range(3)}, "total"),
        ({"a": "", "a/b": ""}, "which is a file"), ({"a/b/c": "", "a/b": ""}, "which is a file"),
    ]:
        with pytest.raises(ValueError, match=message):
            limits.check_files(bad)
