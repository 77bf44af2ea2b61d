"""Test-session setup shared by every test module.

Triton reads ``TRITON_INTERPRET`` when it is first imported, so it is set here, before any test
imports triton: on a machine without CUDA every Triton kernel runs in the interpreter.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
torch.manual_seed(0)
