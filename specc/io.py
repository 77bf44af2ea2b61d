"""Bounded, type-checked file reading: the one way specc reads a file a user (or anyone who can
write to an artifact directory) hands it.

A file is opened only if it is a regular file, and read with a size limit, so a path naming
``/dev/zero``, a FIFO, a directory or a multi-gigabyte file gives a clear error instead of a hang, a
``MemoryError`` or the machine running out of memory. The open uses ``O_NONBLOCK`` (opening a FIFO
for reading otherwise blocks until a writer appears) and the type is checked on the open
descriptor with ``fstat`` (no window between the check and the read). The size is checked before
reading and the read itself stops at ``limit + 1`` bytes (a file that grows meanwhile is refused
too).

:func:`read_inside` additionally confines a read to a directory: every component of the relative
path is opened with ``O_NOFOLLOW`` relative to the previous directory's descriptor, so no symbolic
link — to a file outside the directory, a device or a FIFO — is ever followed (artifact files).

:func:`read_stream_bounded` reads a stream (an HTTP request body, a pipe) and
:func:`read_stdin_bounded` standard input, each up to a limit. :func:`compose_yaml_bounded`
parses YAML to a node graph and refuses documents whose aliases expand to more than a bounded
number of nodes ("billion laughs"): PyYAML's composer shares aliased nodes, but every consumer that
builds a tree from them (OmegaConf, Hydra) expands them.

Nothing here imports torch.
"""
from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path
from typing import Iterable, Optional, Type, Union

from specc.errors import SpeccError

KiB = 1 << 10
MiB = 1 << 20

#: Limits per kind of file (bytes). A plan is a few KiB; the shipped prompt set ~40 KiB; a generated
#: artifact file a few KiB; a checkpoint's config.json / tokenizer_config.json well under 1 MiB.
PLAN_LIMIT = 1 * MiB
PROMPTS_LIMIT = 64 * MiB
ARTIFACT_FILE_LIMIT = 16 * MiB
ARTIFACT_TOTAL_LIMIT = 256 * MiB
COST_TABLE_LIMIT = 16 * MiB
CONFIG_JSON_LIMIT = 16 * MiB
RUN_JSON_LIMIT = 64 * MiB
LAUNCH_FILE_LIMIT = 4 * MiB  # a launch script / Kubernetes or compose YAML for `specc import`
REQUEST_BODY_LIMIT = 16 * MiB
#: Most nodes a YAML plan may expand to (aliases counted at every use). A preset has ~100.
YAML_MAX_NODES = 100_000

PathLike = Union[str, os.PathLike]


def human_size(n: int) -> str:
    """``n`` bytes as ``"16 MiB"`` / ``"512 KiB"`` / ``"12 B"`` (powers of 1024)."""
    for unit, div in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", KiB)):
        if n >= div:
            v = n / div
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def file_kind(mode: int) -> str:
    """A short name for the file type in ``st_mode`` (for messages)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def _read_fd(fd: int, display: str, limit: int, what: str, error: Type[SpeccError]) -> bytes:
    """Check that the open ``fd`` is a regular file of at most ``limit`` bytes and read it."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {display}: is {file_kind(st.st_mode)}, not a regular file; "
                    f"give the path of a regular file")
    if st.st_size > limit:
        raise error(f"{what} {display}: is {human_size(st.st_size)}, over the {human_size(limit)} limit "
                    f"for a {what}; is this the right file?")
    chunks = []
    total = 0
    while True:
        chunk = os.read(fd, min(1 * MiB, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise error(f"{what} {display}: grew past the {human_size(limit)} limit for a {what} while "
                        f"being read")
    return b"".join(chunks)


def _decode(data: bytes, display: str, what: str, error: Type[SpeccError]) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = f"{what} {display}" if display else what
        raise error(f"{where}: not UTF-8 text (byte {exc.start}: {exc.reason}); give UTF-8 text") from None


def _os_error(exc: OSError, display: str, what: str, error: Type[SpeccError]) -> SpeccError:
    if exc.errno == errno.ENOENT:
        return error(f"{what} {display}: no such file")
    if exc.errno == errno.ELOOP:
        return error(f"{what} {display}: is a symbolic link, which is not allowed here; "
                     f"give the path of a regular file")
    return error(f"{what} {display}: cannot read ({exc.strerror or exc})")


def read_bounded(path: PathLike, limit: int, what: str, *, text: bool = True,
                 error: Type[SpeccError] = SpeccError, follow_symlinks: bool = True
                 ) -> Union[str, bytes]:
    """Read ``path`` if it is a regular file of at most ``limit`` bytes.

    Args:
        path: the file. Symbolic links are followed unless ``follow_symlinks`` is False (then a
            link as the last component is refused).
        limit: the most bytes accepted (see the ``*_LIMIT`` constants).
        what: what the file is, for messages (``"plan file"``, ``"prompts file"``).
        text: decode as UTF-8 (``str``); else return ``bytes``.
        error: the :class:`specc.errors.SpeccError` subclass to raise.
    Returns:
        the content, ``str`` or ``bytes``.
    Raises:
        ``error``: missing, unreadable, not a regular file (directory, FIFO, device, socket), larger
            than ``limit`` (before reading anything), or not UTF-8 — each naming the file and the
            limit. Never blocks on a FIFO.
    """
    display = str(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(os.fspath(path), flags)
    except OSError as exc:
        raise _os_error(exc, display, what, error) from None
    try:
        data = _read_fd(fd, display, limit, what, error)
    except OSError as exc:
        raise _os_error(exc, display, what, error) from None
    finally:
        os.close(fd)
    return _decode(data, display, what, error) if text else data


def read_inside(root: PathLike, rel: str, limit: int, what: str, *, text: bool = False,
                error: Type[SpeccError] = SpeccError) -> Union[str, bytes]:
    """Read ``root/rel`` where every component of ``rel`` must be a real directory or (last) a
    regular file inside ``root``: no symbolic link is followed anywhere below ``root``, no ``..``.

    Each component is opened relative to its parent's descriptor with ``O_NOFOLLOW`` (and the
    file with ``O_NONBLOCK``), so a link swapped in between checks is refused by the kernel.

    Raises:
        ``error``: as :func:`read_bounded`, plus a symbolic link or ``..`` in ``rel``.
    """
    parts = [p for p in str(rel).split("/") if p not in ("", ".")]
    display = str(Path(root) / rel)
    if not parts or ".." in parts:
        raise error(f"{what} {display}: path must stay inside {root}")
    cloexec = getattr(os, "O_CLOEXEC", 0)
    try:
        dfd = os.open(os.fspath(root), os.O_RDONLY | os.O_DIRECTORY | cloexec)
    except OSError as exc:
        raise _os_error(exc, str(root), "directory of the", error) from None
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | cloexec, dir_fd=dfd)
            except OSError as exc:
                sub = str(Path(root).joinpath(*parts[:i + 1]))
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    try:
                        kind = file_kind(os.lstat(sub).st_mode)
                    except OSError:
                        kind = "not a directory"
                    raise error(f"{what} {display}: {sub} is {kind}; every folder of it must be a real "
                                f"directory inside {root}") from None
                raise _os_error(exc, display, what, error) from None
            os.close(dfd)
            dfd = nfd
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | cloexec, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise error(f"{what} {display}: is a symbolic link; files here must be regular files "
                            f"inside {root}") from None
            raise _os_error(exc, display, what, error) from None
        try:
            data = _read_fd(fd, display, limit, what, error)
        except OSError as exc:
            raise _os_error(exc, display, what, error) from None
        finally:
            os.close(fd)
    finally:
        os.close(dfd)
    return _decode(data, display, what, error) if text else data


def read_stream_bounded(stream, limit: int, what: str, *, error: Type[SpeccError] = SpeccError) -> bytes:
    """Read a binary stream (an HTTP request body, a pipe) to its end, refusing more than ``limit``
    bytes: at most ``limit + 1`` bytes are ever read, so memory stays bounded whatever the sender
    does. Text streams without a ``buffer`` are read as characters and encoded (a close bound).

    Raises:
        ``error``: more than ``limit`` bytes, or the stream cannot be read.
    """
    try:
        buf = getattr(stream, "buffer", stream)
        data = buf.read(limit + 1)
        if isinstance(data, str):
            data = data.encode("utf-8")
    except (OSError, ValueError) as exc:
        raise error(f"cannot read {what}: {exc}") from None
    if len(data) > limit:
        raise error(f"{what}: more than the {human_size(limit)} limit; pass a smaller input")
    return data


def read_stdin_bounded(limit: int, what: str = "standard input", *,
                       error: Type[SpeccError] = SpeccError, stream=None) -> str:
    """Read standard input (``stream`` or ``sys.stdin``) as UTF-8 text, up to ``limit`` bytes
    (:func:`read_stream_bounded`); a leading byte-order mark is dropped.

    Raises:
        ``error``: more than ``limit`` bytes, not UTF-8, or unreadable.
    """
    data = read_stream_bounded(sys.stdin if stream is None else stream, limit, what, error=error)
    return _decode(data, "", what, error).lstrip("\ufeff") if data else ""


# --------------------------------------------------------------------------------------------------
# YAML with bounded alias expansion


def expanded_size(node) -> float:
    """Nodes a PyYAML node graph expands to when every alias is copied at each use (what building
    a tree from it costs), counted in time linear in the number of distinct nodes; ``inf`` for a
    recursive alias (a node that contains itself)."""
    import yaml

    def kids(n):
        if isinstance(n, yaml.MappingNode):
            return [x for kv in n.value for x in kv]
        if isinstance(n, yaml.SequenceNode):
            return list(n.value)
        return []

    memo: dict = {}
    open_: set = set()
    stack = [(node, False)]
    while stack:
        n, done = stack.pop()
        key = id(n)
        if done:
            memo[key] = 1 + sum(memo[id(c)] for c in kids(n))
            open_.discard(key)
            continue
        if key in memo:
            continue
        if key in open_:
            return float("inf")
        children = kids(n)
        if not children:
            memo[key] = 1
            continue
        open_.add(key)
        stack.append((n, True))
        for c in children:
            if id(c) in open_:
                return float("inf")
            if id(c) not in memo:
                stack.append((c, False))
    return memo[id(node)]


def compose_yaml_bounded(text: str, where: str, *, max_nodes: int = YAML_MAX_NODES,
                         error: Type[SpeccError] = SpeccError):
    """``yaml.compose(text)`` (SafeLoader), refusing a document whose aliases expand to more than
    ``max_nodes`` nodes. Returns the root node (None for an empty document).

    Raises:
        ``yaml.YAMLError``: the text does not parse (the caller reports its line).
        ``error``: the expansion bound is exceeded, naming ``where`` and the bound.
    """
    import yaml

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is None:
        return None
    n = expanded_size(root)
    if n > max_nodes:
        size = "a recursive alias (a node containing itself)" if n == float("inf") else f"{n:,} nodes"
        raise error(f"{where}: YAML aliases expand to {size}, more than the {max_nodes:,} nodes a plan "
                    f"may have (an alias bomb?); write the values out instead of nesting aliases")
    return root


def check_yaml_files(paths: Iterable[PathLike], what: str = "plan file", *,
                     error: Type[SpeccError] = SpeccError) -> None:
    """Read each existing file of ``paths`` with :func:`read_bounded` (``PLAN_LIMIT``) and check its
    alias expansion with :func:`compose_yaml_bounded`; YAML syntax errors are left to the caller."""
    import yaml

    for p in paths:
        text = read_bounded(p, PLAN_LIMIT, what, error=error)
        try:
            compose_yaml_bounded(str(text), str(p), error=error)
        except yaml.YAMLError:
            pass
