#!/usr/bin/env python
"""Disaggregated prefill + decode over loopback HTTP on SmolLM2-135M, for every method the runtime runs:
greedy output token-identical to one process, and the bytes shipped per request by part against the
arithmetic below.

For each shipped artifact (plain, n-gram, draft model, EAGLE, EAGLE-3): a prefill server
(``--role prefill``) and a decode server (``--role decode``) in this process, each with its own
runtime and caches; the shipped prompts go to the decode server with the official ``openai`` client;
each answer must equal the one-process answer (the runtime's batch API, batch 1 = ``specc run``).
Bytes: the decode server's ``specc:disagg_payload_bytes_total{part}`` over the requests, and the
arithmetic: target KV = 2 · layers · kv_heads · head_dim · 4 B per prompt token (fp32 cache); EAGLE
seed = the head's KV (2 · kv_heads · head_dim · 4 B per prompt token) + its hidden state (H · 4 B) +
top-1 probability and index + position; Llama-3-8B's figure (a 4096-wide bf16 hidden state,
8 KB per request) for scale.

    OMP_NUM_THREADS=1 python tools/bench_disagg.py --limit 6 --max-new-tokens 32
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PRESETS = ("smollm2_plain", "smollm2_ngram", "smollm2_draft_model", "smollm2_eagle", "smollm2_eagle3",
           "smollm2_eagle3_tree", "smollm2_medusa", "smollm2_dflash", "smollm2_dspark")


def artifact(preset: str) -> Path:
    (found,) = sorted((ROOT / "generated").glob(f"{preset}-*"))
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", nargs="+", default=list(PRESETS))
    ap.add_argument("--limit", type=int, default=6, help="shipped prompts (round-robin over categories)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    import openai

    from specc import methods
    from specc.runtime.prompts import encode_prompt, read_prompts, select, shipped_prompts_path
    from specc.runtime.request import Request, SamplingParams
    from specc.serve.server import BackgroundServer, load_server_state

    records = select(read_prompts(shipped_prompts_path()), args.limit)
    ok = True
    print(f"{'method':<12} {'identical':>9} {'prompt tok':>10} {'KV B/req':>10} {'KV B/tok':>9} {'seed B/req':>10} "
          f"{'seed arith':>10} {'total B/req':>11} {'drafts':>7}")
    for preset in args.presets:
        art = artifact(preset)
        pre = load_server_state(art, role="prefill")
        dec = load_server_state(art, role="decode", prefill_url="http://127.0.0.1:1")  # set below
        rt = dec.runtime
        reqs = [Request(prompt_ids=encode_prompt(r, rt.tokenizer), params=SamplingParams(max_new_tokens=args.max_new_tokens))
                for r in records]
        one = rt.generate(reqs, batch_size=1)
        t0 = time.time()
        with BackgroundServer(pre) as p_srv:
            dec.prefill.url = p_srv.url
            with BackgroundServer(dec) as d_srv:
                async def go():
                    c = openai.AsyncOpenAI(base_url=d_srv.url + "/v1", api_key="none", max_retries=0, timeout=3600)
                    try:
                        return await asyncio.gather(*(c.chat.completions.create(
                            model=dec.model_name, messages=r.messages or [{"role": "user", "content": r.prompt}],
                            max_tokens=args.max_new_tokens, temperature=0) for r in records))
                    finally:
                        await c.close()
                res = asyncio.run(go())
                m = dec.metrics.render().decode()
        same = sum(r.choices[0].message.content == o.text and r.usage.completion_tokens == len(o.token_ids)
                   for r, o in zip(res, one))
        ok &= same == len(records)

        def part(name):
            return sum(float(l.rsplit(" ", 1)[1]) for l in m.splitlines()
                       if l.startswith("specc:disagg_payload_bytes_total") and f'part="{name}"' in l)
        n = len(records)
        prompt_tokens = sum(len(r.prompt_ids) for r in reqs)
        c = rt.target.config
        kv_tok = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4
        seed_arith = 0.0
        kind = methods.get(rt.states[0].spec.method).seed
        if kind == "hidden_topk":
            h = rt.drafter.model.cfg
            seed_arith = (2 * h.num_key_value_heads * h.head_dim * 4 * prompt_tokens + n * (h.hidden_size * 4 + 4 + 8 + 8)) / n
        elif kind == "target_hidden":  # fp32 target hidden states at each layer the drafter reads, per prompt token
            seed_arith = len(rt.ctx.hidden_layers) * c.hidden_size * 4 * prompt_tokens / n
        kv, seed = part("kv"), part("seed")
        assert kv == kv_tok * prompt_tokens, (kv, kv_tok * prompt_tokens)
        assert abs(seed / n - seed_arith) < 1e-6, (seed / n, seed_arith)
        total = kv + seed + part("tokens") + part("generator")
        method = rt.states[0].spec.method
        print(f"{method:<12} {same:>4}/{n:<4} {prompt_tokens / n:>10.1f} {kv / n:>10.0f} {kv_tok:>9} {seed / n:>10.0f} "
              f"{seed_arith:>10.0f} {total / n:>11.0f} {rt.metrics.num_drafts:>7}   ({time.time() - t0:.0f} s)",
              flush=True)
    print("arithmetic for scale: Llama-3-8B EAGLE hidden state = 4096 bf16 = 8192 B per request; "
          "its KV = 2 * 32 layers * 8 kv heads * 128 * 2 B = 131072 B per prompt token")
    print("disaggregated == one process:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
