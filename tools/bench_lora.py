#!/usr/bin/env python
"""What a LoRA adapter does to speculation, measured: acceptance and τ on the shipped prompts with the
base SmolLM2-135M and with the shipped ``chitchat`` adapter (``tools/train_lora.py``), for the n-gram,
draft-model and EAGLE-3 plans, side by side in one run. The adapter changes the target and never the
drafter: the shared draft stays unchanged while the adapter moves the target distribution, so
acceptance is measured per adapter (SGLang 0.5.23 allows LoRA with EAGLE, EAGLE3, DFLASH and DSPARK:
sglang/srt/arg_groups/lora_hook.py:240-301). Greedy; batch ``--batch-size``.

    OMP_NUM_THREADS=1 python tools/bench_lora.py --limit 12 --max-new-tokens 48
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PRESETS = ("smollm2_ngram", "smollm2_draft_model", "smollm2_eagle3")
ADAPTER = "chitchat=pkg://specc/assets/adapters/smollm2_135m_chitchat"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", nargs="+", default=list(PRESETS))
    ap.add_argument("--adapter", default=ADAPTER, help="NAME=PATH of a PEFT adapter")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=4)
    args = ap.parse_args(argv)
    from specc.runtime.lora import load_lora_set
    from specc.runtime.loader import load_runtime
    from specc.runtime.prompts import encode_prompt, read_prompts, select, shipped_prompts_path
    from specc.runtime.request import Request, SamplingParams

    records = select(read_prompts(shipped_prompts_path()), args.limit)
    name = args.adapter.split("=", 1)[0]
    print(f"{len(records)} shipped prompts, {args.max_new_tokens} new tokens, greedy, batch {args.batch_size}")
    print(f"{'plan':<22} {'model':<10} {'acceptance':>10} {'tau':>6} {'per position':<28} {'tok/s':>6}")
    for preset in args.presets:
        (art,) = sorted((ROOT / "generated").glob(f"{preset}-*"))
        rt, _ = load_runtime(art)
        rt.attach_lora(load_lora_set([args.adapter], rt.target, rt.max_rows))
        for adapter in (None, name):
            reqs = [Request(prompt_ids=encode_prompt(r, rt.tokenizer),
                            params=SamplingParams(max_new_tokens=args.max_new_tokens), adapter=adapter) for r in records]
            rt.metrics = rt.new_metrics()
            t0 = time.perf_counter()
            rt.generate(reqs, batch_size=args.batch_size)
            m = rt.metrics
            per = ", ".join(f"{a:.2f}" for a in m.acceptance_per_pos)
            print(f"{preset:<22} {adapter or 'base':<10} {m.acceptance_rate:>10.3f} {m.tau:>6.2f} [{per:<26}] "
                  f"{m.num_output_tokens / (time.perf_counter() - t0):>6.1f}", flush=True)
        rt.lora.detach()
    return 0


if __name__ == "__main__":
    sys.exit(main())
