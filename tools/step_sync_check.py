"""Host reads of the runtime's decode step, on small random models (no downloads).

Runs a few decode steps of each configuration (plain, n-gram, suffix, draft model; greedy, and the
draft model under the standard rule with sampled requests) and checks that the step reads the device
once (``specc.runtime.step.StepIO.download``):

* on CUDA, each step runs under ``torch.cuda.set_sync_debug_mode("error")`` with that one read let
  through: any other synchronising call (``.item()``, ``.tolist()``, a blocking copy) raises, and the
  configuration is reported as failing with the error;
* on the CPU (where nothing synchronises) it prints the host reads each step makes
  (``specc.runtime.testing.count_host_reads``, the models' CPU-only fast paths excluded) and fails
  a configuration above ``--max-reads`` (2: the step's read of its results and the CPU's ragged
  shape).

Usage: ``python tools/step_sync_check.py [--device cuda|cpu] [--steps N] [--max-reads N]``.
Exit status 1 when a configuration fails, else 0.
"""
from __future__ import annotations

import argparse
import sys
import traceback
from typing import Callable, Dict, List, Tuple

import torch

from specc.methods.draft_model.drafter import DraftModelDrafter
from specc.methods.ngram.drafter import NgramDrafter
from specc.methods.suffix.drafter import SuffixDrafter
from specc.runtime import step as S
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec
from specc.runtime.testing import CPU_FAST_PATHS, count_host_reads, perturbed_copy, tiny_llama

PROMPTS = [[5, 6, 7, 5, 6, 7, 5, 6], [1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 9, 8, 7, 9, 8, 7, 10]]


def _specs(method: str, k: int, rule: str = "greedy", sampling: str = "greedy") -> List[StateSpec]:
    return [StateSpec(f"b{b}_k{k}_{rule}", method, b, k, num_draft_tokens=k + 1, verify_rule=rule,
                      draft_sampling=sampling) for b in (1, 4)]


def configurations(device: torch.device) -> Dict[str, Callable[[], Tuple[Runtime, float]]]:
    """name -> builder of ``(runtime, request temperature)`` on ``device``."""
    def target():
        return tiny_llama(seed=0).to(device)

    def rt(t, drafter, specs):
        return Runtime(t, None, drafter, specs, max_model_len=128, eos_token_ids=[], device=device)

    def draft_model(rule: str, sampling: str, temperature: float):
        t = target()
        return rt(t, DraftModelDrafter(perturbed_copy(t, 0.03, seed=1).to(device), 64),
                  _specs("draft_model", 3, rule, sampling)), temperature

    return {
        "plain": lambda: (rt(target(), None, [StateSpec(f"b{b}_k0", "none", b, 0, num_draft_tokens=1) for b in (1, 4)]), 0.0),
        "ngram": lambda: (rt(target(), NgramDrafter(1, 3), _specs("ngram", 3)), 0.0),
        "suffix": lambda: (rt(target(), SuffixDrafter(max_tree_depth=8, max_cached_requests=64), _specs("suffix", 3)), 0.0),
        "draft_model": lambda: draft_model("greedy", "greedy", 0.0),
        "draft_model_sampled": lambda: draft_model("standard", "probabilistic", 1.0),
    }


def check(name: str, build, device: torch.device, steps: int, max_reads: int) -> bool:
    """Run ``steps`` decode steps of configuration ``name``; print what each read; True when it passed."""
    runtime, temperature = build()
    reqs = [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=4 * steps, temperature=temperature,
                                                        seed=i if temperature else None))
            for i, p in enumerate(PROMPTS)]
    runtime.reset(batch_size=len(reqs))
    for r in reqs:
        runtime.submit(r)
    per_step: List[int] = []
    sites: Dict[str, int] = {}
    orig_step, orig_download = S.decode_step, runtime.io.download
    failure = None

    def allowed_download(t):  # the step's one read: let it through the sync check
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)
        try:
            return orig_download(t)
        finally:
            torch.cuda.set_sync_debug_mode(mode)

    def checked(rt, batch):
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("error")
            try:
                orig_step(rt, batch)
            finally:
                torch.cuda.set_sync_debug_mode(0)
            per_step.append(1)
        else:
            with count_host_reads(ignore=CPU_FAST_PATHS) as reads:
                orig_step(rt, batch)
            per_step.append(reads.count)
            for k, v in reads.by_site().items():
                sites[k] = sites.get(k, 0) + v

    S.decode_step = checked
    if device.type == "cuda":
        runtime.io.download = allowed_download
    try:
        while runtime.has_work() and len(per_step) < steps:
            runtime.step()
    except Exception:  # a synchronising call under "error", or a failing step
        failure = traceback.format_exc(limit=6)
    finally:
        S.decode_step = orig_step
        runtime.io.download = orig_download
    ok = failure is None and bool(per_step) and max(per_step) <= max_reads
    what = "sync check (one read let through per step)" if device.type == "cuda" else "host reads per step"
    print(f"{name}: {len(per_step)} decode steps, {what}: {per_step} -> {'ok' if ok else 'FAIL'}")
    for site, n in sorted(sites.items(), key=lambda x: -x[1]):
        print(f"    {n / max(1, len(per_step)):.2f}/step  {site}")
    if failure:
        print("    " + failure.replace("\n", "\n    "))
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=6, help="decode steps per configuration (default 6)")
    ap.add_argument("--max-reads", type=int, default=2, help="host reads allowed per step on the CPU (default 2)")
    ap.add_argument("--only", nargs="*", help="configurations to run (default: all)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("step_sync_check: --device cuda but torch.cuda.is_available() is False; use --device cpu",
              file=sys.stderr)
        return 2
    torch.manual_seed(0)
    torch.set_num_threads(1)
    configs = configurations(device)
    names = args.only or list(configs)
    unknown = [n for n in names if n not in configs]
    if unknown:
        print(f"step_sync_check: unknown configuration(s) {unknown}; choose from {list(configs)}", file=sys.stderr)
        return 2
    results = {n: check(n, configs[n], device, args.steps, args.max_reads) for n in names}
    failed = [n for n, ok in results.items() if not ok]
    print(f"step_sync_check on {device}: {len(results) - len(failed)}/{len(results)} ok" +
          (f"; failing: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
