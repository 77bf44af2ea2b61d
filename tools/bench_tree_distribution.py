#!/usr/bin/env python
"""Tree rejection sampling against the shortcut rule, side by side: the total variation between the
runtime's sampled tokens and the target's exact distribution (enumerated), for the trees and settings
of ``tests/runtime/test_tree_distribution.py`` (a 16-token random target, a perturbed copy as the drafter,
the first four generated tokens, temperature 0.5 and 1.0, top-p 0.9).

Prints, per tree and temperature, the max TV over the four token positions of the exact rule
(``specc.kernels.tree_rejection_verify``) and of the shortcut ("accept each sibling with
min(1, p(x)/q(x)) against the node's original p, bonus from p without the tried siblings",
``specc.runtime.testing.shortcut_tree_rejection``), and the acceptance by depth.

Usage: ``OMP_NUM_THREADS=1 nice -n 19 python tools/bench_tree_distribution.py [--requests 65536]``.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1 << 16)
    args = ap.parse_args(argv)
    import torch

    from specc.runtime import stages
    from specc.runtime.testing import perturbed_copy, shortcut_tree_rejection, tiny_llama
    import test_tree_distribution as T
    from test_distribution_runtime import empirical_marginals, exact_marginals, tv

    torch.set_num_threads(1)
    target = tiny_llama(seed=3, vocab_size=16, num_layers=1, hidden_size=32, max_model_len=32, std=0.5)
    draft = perturbed_copy(target, noise=0.05, seed=4)
    exact_rule = stages.tree_rejection_verify
    print(f"{args.requests} requests per cell; TV = max over the first 4 generated tokens\n")
    print("| tree | T | exact rule TV | shortcut TV | acceptance by depth (exact rule) |\n|---|---|---|---|---|")
    for tree in sorted(T.TREES):
        for temp in (0.5, 1.0):
            exact = exact_marginals(target, temp, 0.9)
            stages.tree_rejection_verify = exact_rule
            rt = T._runtime(target, draft, tree, seed=17)
            good = float(tv(empirical_marginals(rt, temp, 0.9, n=args.requests), exact).max())
            acc = [round(a, 3) for a in rt.metrics.acceptance_per_pos]
            stages.tree_rejection_verify = shortcut_tree_rejection
            bad = float(tv(empirical_marginals(T._runtime(target, draft, tree, seed=17), temp, 0.9, n=args.requests),
                           exact).max())
            print(f"| {tree} | {temp} | {good:.4f} | {bad:.4f} | {acc} |", flush=True)
    stages.tree_rejection_verify = exact_rule


if __name__ == "__main__":
    main()
