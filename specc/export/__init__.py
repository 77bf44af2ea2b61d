"""Plan -> SGLang / vLLM launch settings. Never imports torch.

``to_sglang(plan) -> SGLangLaunch`` (:mod:`specc.engines.sglang.exporter`) and ``to_vllm(plan) -> VLLMLaunch``
(:mod:`specc.engines.vllm.exporter`) use the same plan -> engine mapping as the rule tables in
:mod:`specc.check`, so a plan that passes ``specc check --engine X`` exports to settings engine X
accepts.
"""
from typing import List, Tuple

from specc.engines.sglang.exporter import SGLangLaunch, to_sglang  # noqa: F401
from specc.engines.vllm.exporter import VLLMLaunch, to_vllm  # noqa: F401


def export(plan, engine: str):
    """Launch settings for ``engine``: its package's ``export(plan)`` (:mod:`specc.engines`).

    Raises:
        KeyError: an unknown engine, or one without an exporter (``specc`` plans are compiled, not
            exported).
        PlanError: the plan has no equivalent on that engine.
    """
    from specc import engines

    fn = getattr(engines.get(engine), "export", None)
    if not callable(fn):
        raise KeyError(f"engine {engine!r} has no exporter; plans export to: {', '.join(engines.exporters())}")
    return fn(plan)


#: Plan keys holding model paths that an engine opens.
MODEL_PATH_KEYS = ("target.path", "draft.path")


def resolve_pkg_paths(plan) -> Tuple[object, List[str]]:
    """A copy of ``plan`` whose ``pkg://<package>/<relpath>`` model paths (``target.path``,
    ``draft.path``) are real filesystem paths, for engines that cannot read ``pkg://``.

    Resolution uses :func:`specc.models.resolve.resolve_model_path` (``importlib.util.find_spec``;
    neither the package nor torch is imported). Other paths (HF ids, files) are left as written.

    Returns:
        (plan copy, warnings): one warning per ``pkg://`` path that could not be resolved, naming
        the key and why; that key keeps its ``pkg://`` value. Never raises for a bad path.
    """
    from specc.errors import SpeccError
    from specc.models.resolve import PKG_SCHEME, resolve_model_path
    from specc.check.base import clone, get, set_key

    out = clone(plan)
    warnings: List[str] = []
    for key in MODEL_PATH_KEYS:
        value = get(out, key)
        if not isinstance(value, str) or not value.startswith(PKG_SCHEME):
            continue
        try:
            set_key(out, key, str(resolve_model_path(value)))
        except SpeccError as exc:
            warnings.append(f"{key}={value} cannot be resolved to a filesystem path ({exc}); SGLang/vLLM "
                            f"cannot open pkg:// paths: set {key} to a local path or a Hugging Face id")
    return out, warnings
