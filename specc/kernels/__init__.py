"""Sampling and verification kernels: each rule has a plain-torch reference and a Triton kernel of the
same signature (`backend="torch" | "triton" | "auto"`); randomness comes in as tensors
(`draw_randomness`) so both give identical tokens from identical inputs.

Triton kernels live in `specc.kernels.verify_triton` (greedy, standard) and
`specc.kernels.block_verify_triton` (block verification) and are imported only when used.
"""

from specc.kernels.sampling import VerifyRandomness, draw_randomness, greedy_rows, process_logits
from specc.kernels.block_verify import block_verify
from specc.kernels.verify import VerifyOutput, greedy_verify, rejection_verify, resolve_backend, synthetic_verify

__all__ = [
    "VerifyOutput",
    "VerifyRandomness",
    "block_verify",
    "draw_randomness",
    "greedy_rows",
    "greedy_verify",
    "process_logits",
    "rejection_verify",
    "resolve_backend",
    "synthetic_verify",
]
