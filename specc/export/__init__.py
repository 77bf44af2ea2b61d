"""Plan -> SGLang / vLLM launch settings. Never imports torch.

``to_sglang(plan) -> SGLangLaunch`` (:mod:`specc.export.sglang`) and ``to_vllm(plan) -> VLLMLaunch``
(:mod:`specc.export.vllm`) use the same plan -> engine mapping as the rule tables in
:mod:`specc.rules`, so a plan that passes ``specc check --engine X`` exports to settings engine X
accepts.
"""
from specc.export.sglang import SGLangLaunch, to_sglang  # noqa: F401
from specc.export.vllm import VLLMLaunch, to_vllm  # noqa: F401


def export(plan, engine: str):
    """Launch settings for ``engine`` (``sglang`` or ``vllm``).

    Raises:
        KeyError: any other engine (``specc`` plans are compiled, not exported).
        PlanError: the plan has no equivalent on that engine.
    """
    return {"sglang": to_sglang, "vllm": to_vllm}[engine](plan)
