"""Load a compiled artifact (``specc compile``'s ``generated/<plan>-<hash>/``), verifying it first.

Order matters (issue 4, item 3): the manifest is parsed and checked, the sha256 of every listed file
is verified, and unlisted files are refused, all BEFORE anything from the artifact is imported. Each
module is then executed from the exact bytes that were hashed (read once, hashed, compiled), so a
file swapped between the check and the import cannot run, and no ``__pycache__`` is read or written.

The resolved plan is rebuilt from the artifact's own ``plan.yaml`` (never the user's YAML: DESIGN.md
"the runtime never re-reads YAML") through the schema's structured merge
(``specc.plan.load.plan_from_dict``). Nothing here imports torch; the state and kernel modules may.
"""
from __future__ import annotations

import ast
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
from specc.errors import ArtifactError, PlanError
from specc.io import ARTIFACT_FILE_LIMIT, ARTIFACT_TOTAL_LIMIT, compose_yaml_bounded, file_kind, human_size, read_inside
from specc.plan.schema import Plan

MANIFEST = "manifest.json"
PLAN_FILE = "plan.yaml"
SUPPORTED_FORMAT_VERSIONS = (2,)
_REQUIRED_KEYS = ("format_version", "specc_version", "name", "plan_name", "plan_hash", "states",
                  "kernels", "files")
_SAFE_REL = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
_load_counter = itertools.count()


@dataclass(frozen=True)
class Artifact:
    """A verified, loaded artifact.

    Attributes:
        path: the artifact directory.
        manifest: the parsed ``manifest.json``.
        plan: the resolved ``Plan`` rebuilt from ``plan.yaml``.
        states: state name → its module (``states/<name>.py``), in manifest order.
        kernels: kernel variant name → its module (``kernels/<name>.py``).
    """

    path: Path
    manifest: Dict[str, Any]
    plan: Plan
    states: Dict[str, types.ModuleType]
    kernels: Dict[str, types.ModuleType]

    @property
    def state_entries(self) -> List[Dict[str, Any]]:
        """The manifest's per-state records: ``name``, ``module``, ``parameters``, ``kernels``
        (role → variant name) and ``prediction``."""
        return list(self.manifest["states"])


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
    missing = [k for k in _REQUIRED_KEYS if k not in manifest]
    if missing:
        raise ArtifactError(f"{mpath} lacks {', '.join(missing)}; {_fix(path, manifest)}")
    if manifest["format_version"] not in SUPPORTED_FORMAT_VERSIONS:
        raise ArtifactError(f"{mpath}: artifact format {manifest['format_version']!r} is not one this "
                            f"specc reads ({SUPPORTED_FORMAT_VERSIONS}); {_fix(path, manifest)}")
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


def plan_from_yaml(text: str, where: str) -> Plan:
    """Rebuild the typed ``Plan`` from an artifact's ``plan.yaml`` text via the schema's structured
    merge (``specc.plan.load.plan_from_dict``).

    Raises:
        ArtifactError: if the YAML does not parse or no longer fits the schema, naming ``where``.
    """
    import yaml

    from specc.plan.load import plan_from_dict

    try:
        compose_yaml_bounded(text, where, error=ArtifactError)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ArtifactError(f"{where} is not valid YAML ({exc}); re-run specc compile") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{where} is not a YAML mapping; re-run specc compile")
    try:
        return plan_from_dict(data)
    except PlanError as exc:
        raise ArtifactError(f"{where} does not fit this specc's plan schema ({exc}); "
                            f"re-run specc compile with this specc") from None


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
    the manifest's ``plan_hash`` and rebuild the ``Plan``; cross-check the manifest's own content
    against the hashed files without executing them (:func:`check_manifest_content`); then import each kernel module and each
    state module (unique module names ``_specc_artifact_<n>.<kind>.<name>``, so two artifacts, or
    the same one loaded twice, never share modules).

    Returns:
        :class:`Artifact`.
    Raises:
        ArtifactError: a missing/truncated/invalid manifest, a specc version mismatch, a missing,
            changed or extra file, a bad plan, a manifest whose content disagrees with the hashed
            files (e.g. edited ``states[i].parameters``), or a module that fails to import — each naming the
            file and the fix ("re-run specc compile ...").
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
    plan = plan_from_yaml(contents[PLAN_FILE].decode("utf-8"), str(path / PLAN_FILE))
    check_manifest_content(path, manifest, contents, plan)

    prefix = f"_specc_artifact_{next(_load_counter)}"
    kernels: Dict[str, types.ModuleType] = {}
    for entry in manifest["kernels"]:
        name, rel = _entry(entry, path, manifest, "kernel")
        kernels[name] = _import(f"{prefix}.kernels.{name}", path, rel, contents, manifest)
    states: Dict[str, types.ModuleType] = {}
    for entry in manifest["states"]:
        name, rel = _entry(entry, path, manifest, "state")
        states[name] = _import(f"{prefix}.states.{name}", path, rel, contents, manifest)
    if not states:
        raise ArtifactError(f"{path / MANIFEST} lists no candidate state; {_fix(path, manifest)}")
    return Artifact(path=path, manifest=manifest, plan=plan, states=states, kernels=kernels)


def module_literals(source: bytes, where: str) -> Dict[str, Any]:
    """The module-level ``NAME = <literal>`` assignments of a Python source, by parsing it with
    :mod:`ast` and :func:`ast.literal_eval` — nothing is executed. Assignments whose value is not a
    literal (e.g. ``NUM_STEPS = NUM_DRAFT_TOKENS - 1``) are left out.

    Raises:
        ArtifactError: the source does not parse (naming ``where``).
    """
    try:
        tree = ast.parse(source, filename=where)
    except (SyntaxError, ValueError) as exc:
        raise ArtifactError(f"{where} is not valid Python ({exc}); re-run specc compile") from None
    out: Dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
    return out


def _as_json(value: Any) -> Any:
    """``value`` as the manifest's JSON would hold it (tuples → lists), for comparison."""
    return json.loads(json.dumps(value))


def check_manifest_content(path: Path, manifest: Mapping[str, Any], contents: Mapping[str, bytes],
                           plan: Plan) -> None:
    """Cross-check what ``manifest.json`` says against the files whose sha256 it lists, so an edit to
    the manifest itself (which no hash covers) cannot go unnoticed. Run after :func:`verify_files`
    and before any import: the generated modules are parsed, never executed (:func:`module_literals`).

    Checks: ``plan_name`` equals ``plan.yaml``'s ``name``; ``name`` is ``<plan_name>-<hash>``; every
    ``states[i]``: ``name`` and ``parameters`` equal its module's ``STATE`` dict, ``kernels`` equals
    its ``KERNELS``; every ``kernels[i]``: ``name``/``family``/``constants`` equal its module's
    ``NAME``/``FAMILY``/constants; the ``states/`` and ``kernels/`` files hashed are exactly the
    entries' modules; and ``name``'s hash is :func:`specc.codegen.artifact_hash` of ``plan.yaml``,
    ``template_hash`` and ``specc_version`` (so those fields cannot be edited either). Not covered: ``states[i].prediction`` (advisory cost-model
    numbers, shown by ``report.md``; nothing at run time reads them).

    Raises:
        ArtifactError: naming ``manifest.json``, the field, the file it disagrees with and the fix.
    """
    mpath = path / MANIFEST

    def bad(field: str, other: str, said: Any, found: Any) -> ArtifactError:
        return ArtifactError(f"{mpath}: {field} = {said!r} disagrees with {path / other} ({found!r}); "
                             f"manifest.json was edited after compile — {_fix(path, manifest)}")

    if manifest["plan_name"] != plan.name:
        raise bad("plan_name", PLAN_FILE, manifest["plan_name"], plan.name)
    name = manifest["name"]
    if not (isinstance(name, str) and re.fullmatch(re.escape(plan.name) + r"-[0-9a-f]+", name)):
        raise bad("name", PLAN_FILE, name, f"{plan.name}-<hash>")
    states = manifest["states"]
    kernels = manifest["kernels"]
    if not isinstance(states, list) or not isinstance(kernels, list):
        raise ArtifactError(f"{mpath}: 'states' and 'kernels' must be lists; {_fix(path, manifest)}")
    for i, entry in enumerate(states):
        sname, rel = _entry(entry, path, manifest, "state")
        lits = module_literals(contents[rel], str(path / rel))
        state = lits.get("STATE")
        if not isinstance(state, dict):
            raise ArtifactError(f"{path / rel} defines no literal STATE dict; {_fix(path, manifest)}")
        if state.get("name") != sname:
            raise bad(f"states[{i}].name", rel, sname, state.get("name"))
        if _as_json(entry.get("parameters")) != _as_json(state):
            said, found = entry.get("parameters"), state
            if isinstance(said, dict):
                keys = sorted(k for k in set(said) | set(state) if _as_json(said.get(k)) != _as_json(state.get(k)))
                said = {k: said.get(k) for k in keys}
                found = {k: state.get(k) for k in keys}
            raise bad(f"states[{i}].parameters", rel, said, found)
        if "KERNELS" in lits and _as_json(entry.get("kernels")) != _as_json(lits["KERNELS"]):
            raise bad(f"states[{i}].kernels", rel, entry.get("kernels"), lits["KERNELS"])
    for folder, entries in (("states", states), ("kernels", kernels)):
        listed = {rel for rel in manifest["files"] if rel.startswith(folder + "/")}
        named = {e.get("module") for e in entries if isinstance(e, dict)}
        if listed != named:
            raise ArtifactError(f"{mpath}: '{folder}' entries {sorted(map(str, named))} do not match the "
                                f"{folder}/ files it hashes {sorted(listed)}; manifest.json was edited "
                                f"after compile — {_fix(path, manifest)}")
    template_digest = manifest.get("template_hash")
    if isinstance(template_digest, str) and template_digest.startswith("sha256:"):
        from specc.codegen import artifact_hash

        runtime = manifest.get("runtime")
        if not isinstance(runtime, dict):
            raise ArtifactError(f"{mpath}: no 'runtime' section (what the runtime reads: checkpoints, "
                                f"schedule); {_fix(path, manifest)}")
        expected = f"{plan.name}-{artifact_hash(contents[PLAN_FILE].decode('utf-8'), template_digest[7:], manifest['specc_version'], runtime=runtime)}"
        if name != expected:
            raise ArtifactError(f"{mpath}: name = {name!r} is not the hash of {path / PLAN_FILE}, the templates "
                                f"and the manifest's runtime section ({expected!r}); manifest.json or plan.yaml "
                                f"was edited after compile — {_fix(path, manifest)}")
    for i, entry in enumerate(kernels):
        kname, rel = _entry(entry, path, manifest, "kernel")
        lits = module_literals(contents[rel], str(path / rel))
        if lits.get("NAME") != kname:
            raise bad(f"kernels[{i}].name", rel, kname, lits.get("NAME"))
        if "family" in entry and lits.get("FAMILY") != entry["family"]:
            raise bad(f"kernels[{i}].family", rel, entry["family"], lits.get("FAMILY"))
        constants = entry.get("constants", {})
        if not isinstance(constants, dict):
            raise ArtifactError(f"{mpath}: kernels[{i}].constants must be a mapping; {_fix(path, manifest)}")
        for key, value in constants.items():
            if key not in lits or _as_json(lits[key]) != _as_json(value):
                raise bad(f"kernels[{i}].constants.{key}", rel, value, lits.get(key, "(not defined)"))


def _entry(entry: Any, path: Path, manifest: Mapping[str, Any], kind: str) -> Tuple[str, str]:
    name = entry.get("name") if isinstance(entry, dict) else None
    rel = entry.get("module") if isinstance(entry, dict) else None
    folder = "states" if kind == "state" else "kernels"
    if (not isinstance(name, str) or not name.isidentifier() or rel != f"{folder}/{name}.py"
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
