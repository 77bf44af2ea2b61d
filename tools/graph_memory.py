#!/usr/bin/env python
"""Measure the CUDA-graph memory of a plan's captured states and compare it with the prediction
``specc explain`` prints (:func:`specc.predict.deploy_cost.graph_memory`, engine ``specc``).

    python tools/graph_memory.py smollm2_eagle3 schedule.capture_batch_sizes=[1,8,32,64]
    python tools/graph_memory.py smollm2_eagle3 verify.rule=standard verify.draft_sampling=probabilistic \\
        schedule.capture_batch_sizes=[8,64] --json /tmp/graph_memory.json

On CUDA (the default) it builds the plan's runtime with every state captured
(``SpecRuntimeState.capture`` records the device memory each capture takes: the graph's private pool,
``torch.cuda.memory_reserved`` grown during capture, and the peak of the tensors allocated in it,
``torch.cuda.max_memory_allocated`` above the level before), then prints per state the prediction
(from the loaded target's own shape, the runtime's cache length and dtype), the measured pool and
peak, and their ratios; the pool is what the KV cache loses, so it is the one judged. With
``--device cpu`` it traces each state's program allocations instead
(:func:`specc.runtime.memory.program_peak_bytes`) and judges that peak. Exit status 1 when a state
whose prediction is at least ``--min-mib`` misses by more than ``--tolerance`` (default 20 %), or the
states' total does; 2 when the plan cannot run or CUDA was asked for and is missing.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--tolerance", type=float, default=0.20)
    ap.add_argument("--min-mib", type=float, default=32.0,
                    help="states predicted below this are reported, not judged (allocator granularity)")
    ap.add_argument("--json", default=None, help="write the per-state numbers here")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = ap.parse_args()

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("graph_memory: CUDA is not available; this check runs on a GPU (tools/gpu_check), or pass "
              "--device cpu to trace the programs' allocations", file=sys.stderr)
        return 2
    cuda = args.device == "cuda"
    from specc.compiler import codegen
    from specc.predict import deploy_cost
    from specc.predict.analyze import lower_plan
    from specc.predict.deploy_cost import ModelShape
    from specc.plan.load import load_plan
    from specc.check import resolve
    from specc.compiler.build import plan_runtime
    from specc.runtime.loader import load_models

    loaded = load_plan(args.plan, [*args.overrides, f"runtime.device={args.device}"])
    plan, violations = resolve(loaded.plan, "specc")
    errors = [v for v in violations if v.severity == "error"]
    if errors:
        for v in errors:
            print(f"error: [{v.rule}] {v.message}", file=sys.stderr)
        return 2
    low = lower_plan(plan)
    max_steps = max(s.num_steps for s in low.states)
    spec = codegen.runtime_section(plan, low.schedule.as_dict(), max_steps)
    target, tokenizer, drafter, dev = load_models(spec, args.device, max_steps)
    rt = plan_runtime(plan, target, tokenizer, drafter, device=dev, use_cuda_graphs=cuda,
                      max_model_len=plan.target.max_model_len)
    c = target.config
    shape = ModelShape(hidden=c.hidden_size, layers=c.num_layers, heads=c.num_heads, kv_heads=c.num_kv_heads,
                       head_dim=c.head_dim, intermediate=c.intermediate_size, vocab=c.vocab_size,
                       embed_vocab=c.vocab_size, tied=c.tie_word_embeddings, source="the loaded target")
    dtype_bytes = torch.empty((), dtype=target.norm.weight.dtype).element_size()
    hidden_out = len(getattr(drafter, "hidden_layers", ()) or ())
    rows, total_pred, total_pool = [], 0, 0
    failed = False
    device_name = torch.cuda.get_device_name(dev) if cuda else "cpu (allocations traced by the profiler)"
    print(f"{device_name}; target {c.num_layers}L H{c.hidden_size} V{c.vocab_size} "
          f"{target.norm.weight.dtype}; cache {rt.cache_len} slots; {rt.load_report()}")
    print(f"{'state':32s} {'predicted':>12s} {'pool':>12s} {'peak':>12s} {'pool/pred':>9s} {'peak/pred':>9s}")
    for st in rt.states:
        pred = deploy_cost.graph_memory("specc", st.spec, shape, None, dtype_bytes, rt.cache_len,
                                        hidden_outputs=hidden_out).bytes
        if cuda:
            pool, peak = st.graph_pool_bytes, st.graph_peak_bytes
        else:
            from specc.runtime.memory import program_peak_bytes

            peak = program_peak_bytes(st)
            pool = peak  # no pool on a CPU: the traced peak is what a capture would record
        judged = pred >= args.min_mib * (1 << 20)
        ok = (not judged) or abs(pool - pred) <= args.tolerance * pred
        failed |= not ok
        total_pred += pred
        total_pool += pool
        rows.append({"state": st.spec.name, "predicted": pred, "pool": pool, "peak": peak, "judged": judged, "ok": ok})
        print(f"{st.spec.name:32s} {pred / 2**20:10.1f}Mi {pool / 2**20:10.1f}Mi {peak / 2**20:10.1f}Mi "
              f"{pool / pred:9.3f} {peak / pred:9.3f}{'' if ok else '  MISS'}{'' if judged else '  (small)'}")
    total_ok = abs(total_pool - total_pred) <= args.tolerance * total_pred
    failed |= not total_ok
    print(f"{'total':32s} {total_pred / 2**20:10.1f}Mi {total_pool / 2**20:10.1f}Mi {'':12s} "
          f"{total_pool / total_pred:9.3f}{'' if total_ok else '  MISS'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"plan": args.plan, "overrides": args.overrides,
                                               "device": device_name, "states": rows,
                                               "total_predicted": total_pred, "total_pool": total_pool}, indent=1))
    print(f"graph memory within {args.tolerance:.0%}: {'no' if failed else 'yes'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
