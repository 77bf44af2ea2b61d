"""Load a compiled artifact (``specc compile``'s ``generated/<plan>-<hash>/``), verifying it first.

Order matters: the manifest is parsed and checked, the sha256 of every listed file is verified,
unlisted files are refused, and the artifact's name is recomputed from the execution plan the
manifest holds and the generated programs (:func:`specc.ir.artifact_hash`: an edited manifest or
program no longer matches its name), all BEFORE
anything from the artifact is imported. An artifact is identified by that content, not by the name
of its directory: one renamed, copied or moved by hand loads (its content is checked the same way)
and everything that reports it uses :attr:`Artifact.name`. Each kernel module is then executed from the exact bytes
that were hashed (read once, hashed, compiled), so a file swapped between the check and the import
cannot run, and no ``__pycache__`` is read or written.

The manifest is the one source the runtime reads: the execution plan
(:class:`specc.ir.ExecutionPlan`, :attr:`Artifact.ir`); ``plan.yaml`` is hashed but never parsed, and
nothing here imports ``specc.plan``, Hydra or torch (the kernel modules import torch).
"""
from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import os
import re
import stat
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Tuple

import specc
from specc import ir as ir_mod
from specc.errors import ArtifactError
from specc.io import ARTIFACT_FILE_LIMIT, ARTIFACT_TOTAL_LIMIT, file_kind, human_size, read_inside

MANIFEST = "manifest.json"
PLAN_FILE = "plan.yaml"
FORMAT_VERSION = 4
"""The artifact format this loader reads (``specc.compiler.codegen.FORMAT_VERSION`` writes it)."""
SUPPORTED_FORMAT_VERSIONS = (FORMAT_VERSION,)
_REQUIRED_KEYS = ("format_version", "specc_version", "name", "plan_name", "plan_hash",
                  "runtime", "states", "trees", "kernels", "files")
_SAFE_REL = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
_load_counter = itertools.count()


@dataclass(frozen=True)
class Artifact:
    """A verified, loaded artifact.

    Attributes:
        path: the artifact directory.
        manifest: the parsed ``manifest.json``.
        kernels: kernel variant name → its module (``kernels/<name>.py``).
        ir: the execution plan the manifest holds (:class:`specc.ir.ExecutionPlan`).
    """

    path: Path
    manifest: Dict[str, Any]
    kernels: Dict[str, types.ModuleType]
    ir: "ir_mod.ExecutionPlan" = None  # type: ignore[assignment]

    @property
    def name(self) -> str:
        """The artifact's identity, ``<plan>-<hash>``: the manifest's name, which :func:`load_artifact`
        recomputed from the content (:func:`check_name`). The directory's own name is not part of it:
        an artifact renamed, copied or moved by hand is the same artifact, and reports name it so."""
        return str(self.manifest["name"])

    @property
    def states(self) -> List[Dict[str, Any]]:
        """The manifest's per-state records, in order: ``name``, ``parameters`` (the
        ``StateSpec`` fields), ``kernels`` (role → variant name), ``tree`` (key into
        :attr:`trees` or None), ``programs`` and ``constants`` (:class:`specc.ir.StateIR`)."""
        return list(self.manifest["states"])

    @property
    def trees(self) -> Dict[str, Dict[str, Any]]:
        """Static trees compiled once (:func:`specc.compiler.trees.compile_tree`), by key."""
        return dict(self.manifest["trees"])

    def tree_of(self, entry: Mapping[str, Any]) -> Any:
        """The compiled static tree of a state entry, or None."""
        key = entry.get("tree")
        return None if key is None else self.manifest["trees"][key]


def _fix(path: Path, manifest: Mapping[str, Any] | None = None) -> str:
    """The fix to print: which plan to re-compile (the manifest's plan name when it is readable)."""
    plan = manifest.get("plan_name") if isinstance(manifest, Mapping) else None
    which = f"plan {plan!r}" if isinstance(plan, str) and plan.isidentifier() else "its plan"
    return (f"re-run `specc compile PLAN` for {which} and use the directory it prints "
            f"(generated files must not be edited by hand)")


def read_manifest(path: Path) -> Dict[str, Any]:
    """Parse and shape-check ``path/manifest.json``.

    Raises:
        ArtifactError: the directory or manifest is missing, is not valid JSON (e.g. truncated),
            lacks a key, has an unsupported format version, or lists an unsafe file path.
    """
    path = Path(path)
    if not path.is_dir():
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        raise ArtifactError(f"artifact {path} {what}; compile one with `specc compile PLAN` "
                            f"and pass the directory it prints")
    mpath = path / MANIFEST
    if not os.path.lexists(mpath):
        raise ArtifactError(f"{mpath} is missing, so {path} is not a complete artifact; "
                            f"{_fix(path)}")
    try:
        text = str(read_inside(path, MANIFEST, ARTIFACT_FILE_LIMIT, "artifact file", text=True,
                               error=ArtifactError))
    except ArtifactError as exc:
        raise ArtifactError(f"{exc}; {_fix(path)}") from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{mpath} is not valid JSON (truncated or edited? {exc.msg} at line "
                            f"{exc.lineno}); {_fix(path)}") from None
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{mpath} is not a JSON object; {_fix(path)}")
    if manifest.get("format_version") not in SUPPORTED_FORMAT_VERSIONS:
        raise ArtifactError(f"{mpath}: artifact format {manifest.get('format_version')!r} is not one this "
                            f"specc reads (format {FORMAT_VERSION}: the manifest is the execution plan); "
                            f"recompile with specc compile: {_fix(path, manifest)}")
    missing = [k for k in _REQUIRED_KEYS if k not in manifest]
    if missing:
        raise ArtifactError(f"{mpath} lacks {', '.join(missing)}; {_fix(path, manifest)}")
    files = manifest["files"]
    if not isinstance(files, dict) or not files:
        raise ArtifactError(f"{mpath}: 'files' must map file names to hashes; {_fix(path, manifest)}")
    for rel, digest in files.items():
        if (not isinstance(rel, str) or not _SAFE_REL.match(rel) or ".." in rel.split("/")
                or rel == MANIFEST or not isinstance(digest, str) or not digest.startswith("sha256:")):
            raise ArtifactError(f"{mpath}: bad file entry {rel!r}: {digest!r}; {_fix(path, manifest)}")
    return manifest


def verify_files(path: Path, manifest: Mapping[str, Any]) -> Dict[str, bytes]:
    """Check every file the manifest lists against its sha256, and that no other file is present.

    ``__pycache__`` directories are ignored (never read: modules are executed from verified bytes).

    Returns:
        artifact-relative path → the verified bytes.
    Raises:
        ArtifactError: naming the first missing, changed (or truncated) or unexpected file, with the fix.
    """
    path = Path(path)
    listed = manifest["files"]
    contents: Dict[str, bytes] = {}
    _check_tree(path, manifest)
    total = 0
    for rel in sorted(listed):
        fpath = path / rel
        if not os.path.lexists(fpath):
            raise ArtifactError(f"artifact file {fpath} is missing; {_fix(path, manifest)}")
        try:
            data = bytes(read_inside(path, rel, ARTIFACT_FILE_LIMIT, "artifact file", error=ArtifactError))
        except ArtifactError as exc:
            raise ArtifactError(f"{exc}; {_fix(path, manifest)}") from None
        total += len(data)
        if total > ARTIFACT_TOTAL_LIMIT:
            raise ArtifactError(f"artifact {path}: its files add up to more than the "
                                f"{human_size(ARTIFACT_TOTAL_LIMIT)} limit of an artifact; {_fix(path, manifest)}")
        actual = "sha256:" + hashlib.sha256(data).hexdigest()
        if actual != listed[rel]:
            raise ArtifactError(f"artifact file {fpath} was changed or truncated after compile (sha256 "
                                f"{actual[7:19]}…, manifest says {listed[rel][7:19]}…); {_fix(path, manifest)}")
        contents[rel] = data
    return contents


def _check_tree(path: Path, manifest: Mapping[str, Any]) -> None:
    """Every entry below the artifact directory is a real directory or a regular file the manifest
    lists (``__pycache__`` directories are skipped, never read): no symbolic link, device, FIFO or
    socket, and no unlisted file. Walks without following links (``os.walk(followlinks=False)``
    and ``lstat``). Raises ArtifactError naming the first offending entry."""
    listed = manifest["files"]
    count = 0
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(dirnames) + sorted(filenames):
            p = Path(dirpath) / name
            count += 1
            if count > 100_000:
                raise ArtifactError(f"artifact {path}: holds more than 100000 entries; {_fix(path, manifest)}")
            try:
                mode = os.lstat(p).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise ArtifactError(f"artifact file {p} is {file_kind(mode)}; an artifact holds only regular "
                                    f"files inside its directory; {_fix(path, manifest)}")
            rel = p.relative_to(path).as_posix()
            if rel != MANIFEST and rel not in listed:
                raise ArtifactError(f"artifact file {p} is not listed in {MANIFEST}; remove it, or "
                                    f"{_fix(path, manifest)}")


def _exec_module(name: str, fpath: Path, source: bytes) -> types.ModuleType:
    """Execute verified ``source`` as a fresh module ``name`` whose ``__file__`` is ``fpath``.

    The spec comes from ``importlib.util.spec_from_file_location`` (so ``__file__``, ``__spec__`` and
    tracebacks point at the file), but the code run is compiled from ``source``, the bytes whose hash
    was checked; the module is registered in ``sys.modules`` under its unique name (dataclasses and
    Triton's ``jit`` look modules up there)."""
    spec = importlib.util.spec_from_file_location(name, fpath)
    if spec is None:
        raise ArtifactError(f"cannot make a module spec for {fpath}")
    module = importlib.util.module_from_spec(spec)
    code = compile(source, str(fpath), "exec", dont_inherit=True)
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def load_artifact(path: str | Path) -> Artifact:
    """Verify and load the artifact at ``path``.

    Steps: parse ``manifest.json``; check the specc version it was compiled with equals this
    specc's; verify every file's sha256 and refuse unlisted files; check ``plan.yaml``'s hash equals
    the manifest's ``plan_hash``; recompute the artifact's name from the manifest's content and the
    hashed files (:func:`check_name`) and check the shape of every state and kernel entry; then
    import each kernel module (unique module names ``_specc_artifact_<n>.kernels.<name>``, so two
    artifacts, or the same one loaded twice, never share modules).

    Returns:
        :class:`Artifact`.
    Raises:
        ArtifactError: a missing/truncated/invalid manifest, a specc version mismatch, a missing,
            changed or extra file, a manifest edited after compile (its content no longer hashes to
            its name), a malformed state or kernel entry, or a kernel module that fails to import —
            each naming the file and the fix ("re-run specc compile ...").
    """
    path = Path(path)
    manifest = read_manifest(path)
    if manifest["specc_version"] != specc.__version__:
        raise ArtifactError(f"{path} was compiled by specc {manifest['specc_version']}, this is specc "
                            f"{specc.__version__}; {_fix(path, manifest)}")
    contents = verify_files(path, manifest)
    if PLAN_FILE not in contents:
        raise ArtifactError(f"{path / MANIFEST} does not list {PLAN_FILE}; {_fix(path, manifest)}")
    plan_digest = "sha256:" + hashlib.sha256(contents[PLAN_FILE]).hexdigest()
    if plan_digest != manifest["plan_hash"]:
        raise ArtifactError(f"{path / PLAN_FILE} does not match the manifest's plan_hash; {_fix(path, manifest)}")
    check_name(path, manifest, contents)
    check_entries(path, manifest)
    try:
        eplan = ir_mod.ExecutionPlan.from_dict(manifest)
    except (ArtifactError, KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{path / MANIFEST}: not an execution plan of this specc ({exc}); "
                            f"{_fix(path, manifest)}") from None
    prefix = f"_specc_artifact_{next(_load_counter)}"
    kernels: Dict[str, types.ModuleType] = {}
    for entry in manifest["kernels"]:
        name, rel = _entry(entry, path, manifest, "kernel")
        kernels[name] = _import(f"{prefix}.kernels.{name}", path, rel, contents, manifest)
    return Artifact(path=path, manifest=manifest, kernels=kernels, ir=eplan)


def check_name(path: Path, manifest: Mapping[str, Any], contents: Mapping[str, bytes]) -> None:
    """The manifest's ``name`` must be ``<plan_name>-<hash>`` with the hash
    :func:`specc.ir.artifact_hash` of the execution plan the manifest holds (:data:`specc.ir.IR_KEYS`)
    and the generated programs (``kernels/*.py``, their verified bytes): one check covers every
    fact the runtime reads, so an edit of any of them is refused.

    Raises:
        ArtifactError: naming ``manifest.json`` and the fix."""
    mpath = path / MANIFEST
    plan_name = manifest["plan_name"]
    if not (isinstance(plan_name, str) and plan_name.isidentifier()):
        raise ArtifactError(f"{mpath}: plan_name {plan_name!r} is not an identifier; {_fix(path, manifest)}")
    sources = {rel: data for rel, data in contents.items() if rel.startswith("kernels/")}
    expected = f"{plan_name}-{ir_mod.artifact_hash(manifest, sources, manifest['format_version'], manifest['specc_version'])}"
    if manifest["name"] != expected:
        raise ArtifactError(f"{mpath}: name = {manifest['name']!r} is not the hash of the manifest's content (the execution plan) and the "
                            f"generated programs ({expected!r}): manifest.json was edited after compile; "
                            f"{_fix(path, manifest)}")


def check_entries(path: Path, manifest: Mapping[str, Any]) -> None:
    """Shape of the ``states`` and ``kernels`` entries: each state has an identifier ``name``, a
    ``parameters`` mapping naming itself, ``kernels`` naming kernel entries, and a ``tree`` key of
    ``trees`` (or null); each kernel an identifier name whose module is a hashed file.

    Raises:
        ArtifactError: naming the entry and the fix."""
    mpath = path / MANIFEST
    states, kernels, tree_table = manifest["states"], manifest["kernels"], manifest["trees"]
    if not isinstance(states, list) or not states or not isinstance(kernels, list) or not isinstance(tree_table, dict):
        raise ArtifactError(f"{mpath}: 'states' must be a non-empty list, 'kernels' a list and 'trees' a mapping; "
                            f"{_fix(path, manifest)}")
    known = {_entry(k, path, manifest, "kernel")[0] for k in kernels}
    for i, e in enumerate(states):
        ok = (isinstance(e, dict) and isinstance(e.get("name"), str) and e["name"].isidentifier()
              and isinstance(e.get("parameters"), dict) and e["parameters"].get("name") == e["name"]
              and isinstance(e.get("kernels"), dict) and set(e["kernels"].values()) <= known
              and (e.get("tree") is None or e.get("tree") in tree_table))
        if not ok:
            raise ArtifactError(f"{mpath}: bad state entry states[{i}] ({str(e)[:120]}); {_fix(path, manifest)}")


def _entry(entry: Any, path: Path, manifest: Mapping[str, Any], kind: str) -> Tuple[str, str]:
    name = entry.get("name") if isinstance(entry, dict) else None
    rel = entry.get("module") if isinstance(entry, dict) else None
    if (not isinstance(name, str) or not name.isidentifier() or rel != f"kernels/{name}.py"
            or rel not in manifest["files"]):
        raise ArtifactError(f"{path / MANIFEST}: bad {kind} entry {entry!r}; {_fix(path, manifest)}")
    return name, rel


def _import(modname: str, path: Path, rel: str, contents: Mapping[str, bytes],
            manifest: Mapping[str, Any]) -> types.ModuleType:
    try:
        return _exec_module(modname, path / rel, contents[rel])
    except ArtifactError:
        raise
    except Exception as exc:  # the generated module itself is broken: say which, not a deep traceback
        raise ArtifactError(f"importing {path / rel} failed: {type(exc).__name__}: {exc}; "
                            f"{_fix(path, manifest)}") from exc
