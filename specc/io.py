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
builds a tree from them (OmegaConf, Hydra) expands them. It also bounds the nesting depth (checked on
the parser's event stream first, which is iterative, so a 10,000-deep document is refused before the
recursive composer sees it) and the length of every scalar. :func:`load_json` parses JSON with the
depth Python's decoder can reach reported as an error, not a ``RecursionError``.

The path checks (:func:`check_input_file`, :func:`check_input_dir`, :func:`check_output_file`,
:func:`check_output_dir`) let a command refuse an input that is missing or unreadable, or an output
it cannot write, before it does any work; :func:`path_problem` bounds a path's text by this
machine's ``PATH_MAX`` and ``NAME_MAX``.

Nothing here imports torch.
"""
from __future__ import annotations

import errno
import json
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Optional, Tuple, Type, Union

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


def _pathconf(name: str, default: int) -> int:
    try:
        return int(os.pathconf("/", name))
    except (OSError, ValueError):
        return default


#: This machine's limits on a path (``pathconf(3)`` of ``/``; Linux: 4096 and 255 bytes).
PATH_MAX = _pathconf("PC_PATH_MAX", 4096)
NAME_MAX = _pathconf("PC_NAME_MAX", 255)
#: Deepest nesting of mappings and lists a plan, config-group file or training recipe may have,
#: aliases expanded. The deepest shipped plan nests 6 levels (``schedule.buckets.<B>.candidates``);
#: OmegaConf and Hydra recurse a few frames per level and fail near 80.
YAML_MAX_DEPTH = 32
#: Longest scalar (characters) in a plan, group file or recipe: the longest values they hold are file
#: paths, which the kernel caps at :data:`PATH_MAX`.
YAML_MAX_SCALAR = PATH_MAX

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


def expanded_shape(node) -> Tuple[float, int]:
    """``(nodes, depth)`` of a PyYAML node graph when every alias is copied at each use (what
    building a tree from it costs), counted in time linear in the number of distinct nodes:
    ``nodes`` is ``inf`` for a recursive alias (a node that contains itself); ``depth`` counts the
    nested mappings and lists (a scalar alone is depth 0)."""
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
            children = kids(n)
            memo[key] = (1 + sum(memo[id(c)][0] for c in children), 1 + max(memo[id(c)][1] for c in children))
            open_.discard(key)
            continue
        if key in memo:
            continue
        if key in open_:
            return float("inf"), 0
        children = kids(n)
        if not children:
            memo[key] = (1, 0 if isinstance(n, yaml.ScalarNode) else 1)
            continue
        open_.add(key)
        stack.append((n, True))
        for c in children:
            if id(c) in open_:
                return float("inf"), 0
            if id(c) not in memo:
                stack.append((c, False))
    return memo[id(node)]


def expanded_size(node) -> float:
    """Nodes a PyYAML node graph expands to (:func:`expanded_shape`); ``inf`` for a recursive alias."""
    return expanded_shape(node)[0]


def _check_yaml_events(text: str, where: str, max_nodes: int, max_depth: int, max_scalar: int,
                       error: Type[SpeccError]) -> None:
    """Walk the parser's events (iterative, libyaml's C parser where PyYAML has it): refuse nesting
    deeper than ``max_depth``, a scalar longer than ``max_scalar`` characters and more than
    ``max_nodes`` written nodes, each at its line, before anything builds a tree. YAML syntax errors
    propagate as ``yaml.YAMLError``."""
    import yaml

    loader = yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader
    depth = nodes = 0
    for ev in yaml.parse(text, Loader=loader):
        if isinstance(ev, (yaml.ScalarEvent, yaml.AliasEvent, yaml.CollectionStartEvent)):
            nodes += 1
            if nodes > max_nodes:
                raise error(f"{where}:{ev.start_mark.line + 1}: more than the {max_nodes:,} values a plan or recipe "
                            f"may hold; is this the right file?")
        if isinstance(ev, yaml.CollectionStartEvent):
            depth += 1
            if depth > max_depth:
                raise error(f"{where}:{ev.start_mark.line + 1}: mappings and lists nest more than {max_depth} levels "
                            f"deep (the most a plan or recipe may nest; the shipped ones nest at most 6); "
                            f"flatten the structure")
        elif isinstance(ev, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(ev, yaml.ScalarEvent) and len(ev.value) > max_scalar:
            raise error(f"{where}:{ev.start_mark.line + 1}: a value of {len(ev.value):,} characters, over the "
                        f"{max_scalar:,} a plan or recipe value may have (PATH_MAX, the longest file path this "
                        f"machine takes); shorten it")


def compose_yaml_bounded(text: str, where: str, *, max_nodes: int = YAML_MAX_NODES,
                         max_depth: int = YAML_MAX_DEPTH, max_scalar: int = YAML_MAX_SCALAR,
                         error: Type[SpeccError] = SpeccError):
    """``yaml.compose(text)`` (SafeLoader) of a document within bounds: at most ``max_depth``
    nested mappings and lists and ``max_nodes`` nodes, aliases expanded (checked on the node graph
    without expanding), and no scalar over ``max_scalar`` characters (checked on the event stream
    first, so nothing deep reaches the recursive composer). Returns the root node (None for an
    empty document).

    Raises:
        ``yaml.YAMLError``: the text does not parse (the caller reports its line).
        ``error``: a bound is exceeded, naming ``where``, the line where it can be told, and the bound.
    """
    import yaml

    _check_yaml_events(text, where, max_nodes, max_depth, max_scalar, error)
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is None:
        return None
    n, depth = expanded_shape(root)
    if n <= max_nodes and depth > max_depth:
        raise error(f"{where}: YAML aliases nest mappings and lists {depth} levels deep, more than the "
                    f"{max_depth} a plan or recipe may nest; write the values out instead of nesting aliases")
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


# --------------------------------------------------------------------------------------------------
# JSON


def load_json(text: Union[str, bytes], where: str, *, error: Type[Exception] = SpeccError) -> Any:
    """``json.loads(text)`` with nesting deeper than Python's decoder recurses
    (``sys.getrecursionlimit()`` levels, where it would raise ``RecursionError``) reported as
    ``error`` naming ``where``. Invalid JSON raises ``json.JSONDecodeError`` (a ``ValueError``) as
    ``json.loads`` does, for the caller's own message."""
    try:
        return json.loads(text)
    except RecursionError:
        raise error(f"{where}: JSON arrays or objects nest deeper than the {sys.getrecursionlimit():,} levels "
                    f"this reader follows; is this the right file?") from None


# --------------------------------------------------------------------------------------------------
# Paths checked before a command works


def path_problem(path: PathLike) -> Optional[str]:
    """Why ``path`` cannot name a file on this machine, or None: an empty path, a NUL byte, more than
    :data:`PATH_MAX` bytes, or a component over :data:`NAME_MAX` bytes (the kernel's
    ``ENAMETOOLONG``; ``pathconf(3)``)."""
    text = os.fsencode(path)
    if not text:
        return "is empty"
    if b"\0" in text:
        return "holds a NUL byte"
    if len(text) >= PATH_MAX:
        return f"is {len(text):,} bytes long, over this machine's PATH_MAX of {PATH_MAX}"
    longest = max(text.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        return (f"has a component of {len(longest):,} bytes, over this machine's NAME_MAX of {NAME_MAX} "
                f"({os.fsdecode(longest[:40])}...)")
    return None


def _shown(path: PathLike) -> str:
    text = os.fspath(path)
    return text if len(text) <= 120 else f"{text[:100]}... ({len(text):,} characters)"


def _stat(path: PathLike, flag: str, error: Type[SpeccError]) -> Optional[os.stat_result]:
    """``os.stat(path)``, None when nothing is there; ``error`` for a path that cannot name a file
    or cannot be looked up."""
    problem = path_problem(path)
    if problem:
        raise error(f"{flag} {_shown(path)}: the path {problem}; give a shorter path")
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    except OSError as exc:
        raise error(f"{flag} {_shown(path)}: cannot look it up ({exc.strerror or exc})") from None


def check_input_file(path: PathLike, flag: str, *, error: Type[SpeccError] = SpeccError) -> None:
    """Refuse ``path`` unless it is an existing, readable regular file (``flag`` names the option in
    the message). Raises ``error``."""
    st = _stat(path, flag, error)
    if st is None:
        raise error(f"{flag} {_shown(path)}: no such file; give the path of an existing file")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{flag} {_shown(path)}: is {file_kind(st.st_mode)}, not a regular file; give the path of a file")
    if not os.access(path, os.R_OK):
        raise error(f"{flag} {_shown(path)}: is not readable (permissions); give a file you can read")


def check_input_dir(path: PathLike, flag: str, *, error: Type[SpeccError] = SpeccError) -> None:
    """Refuse ``path`` unless it is an existing directory this process can list and enter.
    Raises ``error``."""
    st = _stat(path, flag, error)
    if st is None:
        raise error(f"{flag} {_shown(path)}: no such directory; give the path of an existing directory")
    if not stat.S_ISDIR(st.st_mode):
        raise error(f"{flag} {_shown(path)}: is {file_kind(st.st_mode)}, not a directory; give a directory")
    if not os.access(path, os.R_OK | os.X_OK):
        raise error(f"{flag} {_shown(path)}: is not readable (permissions); give a directory you can read")


def _probe_dir(directory: str, flag: str, shown: str, error: Type[SpeccError]) -> None:
    """Create and remove a file in ``directory``: the only test of writability that cannot be wrong
    (``os.access`` answers yes for read-only mounts and ``/proc``)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".specc-probe-", dir=directory)
    except OSError as exc:
        raise error(f"{flag} {shown}: cannot write into {directory} ({exc.strerror or exc}); give a path in a "
                    f"writable folder") from None
    os.close(fd)
    os.unlink(probe)


def _existing_ancestor(path: PathLike) -> str:
    """The nearest ancestor of ``path`` (itself excluded) that exists."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    return parent


def check_output_dir(path: PathLike, flag: str, *, parents: bool = True,
                     error: Type[SpeccError] = SpeccError) -> None:
    """Refuse ``path`` as an output directory unless files can be written into it: an existing
    directory where a probe file can be created, or a path whose nearest existing ancestor is such
    a directory (the command creates the rest; without ``parents`` only ``path`` itself may be
    missing, its folder must exist). Leaves nothing behind. Raises ``error``."""
    shown = _shown(path)
    st = _stat(path, flag, error)
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise error(f"{flag} {shown}: is {file_kind(st.st_mode)}, not a directory; give a directory "
                        f"(it is created if missing)")
        _probe_dir(os.fspath(path), flag, shown, error)
        return
    parent = _existing_ancestor(path) if parents else os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        what = "is not a directory" if os.path.lexists(parent) else "does not exist"
        raise error(f"{flag} {shown}: the folder {parent} {what}; create it first or give a path in a writable "
                    f"folder")
    _probe_dir(parent, flag, shown, error)


def check_output_file(path: PathLike, flag: str, *, parents: bool = False,
                      error: Type[SpeccError] = SpeccError) -> None:
    """Refuse ``path`` as an output file unless it can be written: not a directory, FIFO or device,
    in an existing writable folder (with ``parents``: a folder :func:`check_output_dir` accepts, the
    command creating the missing ones). Leaves nothing behind that was not there. Raises ``error``."""
    shown = _shown(path)
    st = _stat(path, flag, error)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise error(f"{flag} {shown}: is a directory; give a file name in it")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise error(f"{flag} {shown}: is {file_kind(st.st_mode)}; give the name of a regular file")
    if st is not None and not os.access(path, os.W_OK):
        raise error(f"{flag} {shown}: is not writable (permissions); give another file name")
    parent = os.path.dirname(os.path.abspath(path))
    if parents:
        check_output_dir(parent, flag, error=error)
        return
    if not os.path.isdir(parent):
        what = "is not a directory" if os.path.lexists(parent) else "does not exist"
        raise error(f"{flag} {shown}: the folder {parent} {what}; create it first or give a path in an "
                    f"existing folder")
    _probe_dir(parent, flag, shown, error)
