"""specc.io: bounded, type-checked reads and bounded YAML alias expansion."""
from __future__ import annotations

import io
import os

import pytest
import yaml

from specc.errors import SpeccError
from specc.io import (compose_yaml_bounded, expanded_size, read_bounded, read_inside, read_stdin_bounded,
                      read_stream_bounded)


def test_read_bounded_reads_regular_files_up_to_the_limit(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("héllo")
    assert read_bounded(f, 6, "test file") == "héllo"
    assert read_bounded(f, 6, "test file", text=False) == "héllo".encode()
    with pytest.raises(SpeccError, match=r"test file .*a.txt: is 6 B, over the 5 B limit"):
        read_bounded(f, 5, "test file")


@pytest.mark.parametrize("kind, words", [("dir", "a directory"), ("fifo", "FIFO"), ("dev", "character device"),
                                         ("missing", "no such file"), ("binary", "not UTF-8")])
def test_read_bounded_refuses_what_is_not_a_regular_text_file(tmp_path, kind, words):
    path = {"dir": tmp_path, "dev": "/dev/zero", "missing": tmp_path / "nope"}.get(kind, tmp_path / "x")
    if kind == "fifo":
        os.mkfifo(path)
    if kind == "binary":
        path.write_bytes(b"\xff\xfe")
    with pytest.raises(SpeccError, match=words):
        read_bounded(path, 1 << 20, "test file")


def test_read_bounded_can_refuse_a_link(tmp_path):
    (tmp_path / "real").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert read_bounded(tmp_path / "link", 10, "f") == "x"
    with pytest.raises(SpeccError, match="symbolic link"):
        read_bounded(tmp_path / "link", 10, "f", follow_symlinks=False)


def test_read_inside_follows_no_link_below_the_root(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f.py").write_bytes(b"ok")
    assert read_inside(root, "sub/f.py", 10, "artifact file") == b"ok"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f.py").write_bytes(b"evil")
    (root / "linkdir").symlink_to(outside)
    with pytest.raises(SpeccError, match="is a symbolic link; every folder of it must be a real directory"):
        read_inside(root, "linkdir/f.py", 10, "artifact file")
    (root / "sub" / "g.py").symlink_to(outside / "f.py")
    with pytest.raises(SpeccError, match="g.py: is a symbolic link"):
        read_inside(root, "sub/g.py", 10, "artifact file")
    with pytest.raises(SpeccError, match="must stay inside"):
        read_inside(root, "../outside/f.py", 10, "artifact file")
    # the root itself may be reached through a link (a user's symlinked artifact directory)
    (tmp_path / "rootlink").symlink_to(root)
    assert read_inside(tmp_path / "rootlink", "sub/f.py", 10, "artifact file") == b"ok"


def test_streams_are_read_up_to_the_limit():
    assert read_stream_bounded(io.BytesIO(b"abc"), 3, "body") == b"abc"
    with pytest.raises(SpeccError, match="body: more than the 2 B limit"):
        read_stream_bounded(io.BytesIO(b"abc"), 2, "body")
    assert read_stdin_bounded(10, stream=io.StringIO("\ufeffhi\n")) == "hi\n"


def test_alias_expansion_is_counted_without_expanding():
    bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    bomb += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 12)]
    node = yaml.compose("\n".join(bomb))
    assert expanded_size(node) > 10 ** 12
    assert expanded_size(yaml.compose("a: &x [1, *x]")) == float("inf")  # a node containing itself
    assert expanded_size(yaml.compose("a: 1\nb: [1, 2]")) == 7  # map, a, 1, b, seq, 1, 2
    with pytest.raises(SpeccError, match="alias bomb"):
        compose_yaml_bounded("\n".join(bomb), "bomb.yaml")
    with pytest.raises(SpeccError, match="recursive alias"):
        compose_yaml_bounded("a: &x [1, *x]", "rec.yaml")
    assert compose_yaml_bounded("", "empty.yaml") is None
