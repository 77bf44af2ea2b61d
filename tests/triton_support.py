"""Shared setup of the Triton kernel tests (imported before anything imports triton).

triton 3.9 picks interpret vs compile when a function is jitted, and jits its standard library
(``tl.max``, ``tl.argmax``) at ``import triton``: without CUDA, ``TRITON_INTERPRET=1`` must be in the
environment before triton is first imported. If another test module imported triton before that,
this process cannot interpret kernels; each kernel test module then runs once in a fresh process
(:func:`fresh_process_test`) instead.
"""
import os
import subprocess
import sys

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

from specc.kernels.verify_triton import interpreter_ready  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
IN_PROCESS = DEVICE == "cuda" or interpreter_ready()
needs_triton = pytest.mark.skipif(not IN_PROCESS, reason="triton imported without TRITON_INTERPRET; see test_in_fresh_process")


def fresh_process_test(path: str, timeout: int):
    """A test that runs the test module ``path`` in a fresh pytest process with TRITON_INTERPRET=1
    (skipped when the kernels run in this process); ``timeout`` in seconds."""

    @pytest.mark.skipif(IN_PROCESS, reason="kernels run in this process")
    def test_in_fresh_process():
        env = dict(os.environ, TRITON_INTERPRET="1")
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path],
                              env=env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]

    return test_in_fresh_process
