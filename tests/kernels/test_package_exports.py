"""`specc.kernels` imports its exports on first use (so the torch-free `specc.kernels.variants` loads without
torch), and each exported name stays the function whatever was imported first: `block_verify` is both a
submodule and the function the package exports, and importing the submodule first (as a compiled artifact's
generated block kernel does, `from specc.kernels.block_verify import block_verify_torch`) must not leave the
package's `block_verify` bound to the module, which the runtime's block-rule stage would then call."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CODE = r"""
import sys, types
import specc.kernels.block_verify  # the submodule first, before any name of the package is read
from specc.kernels import block_verify
import specc.kernels as K
import specc.runtime.stages as stages
assert isinstance(sys.modules["specc.kernels.block_verify"], types.ModuleType)
for f in (block_verify, K.block_verify, stages.block_verify):
    assert isinstance(f, types.FunctionType) and f.__name__ == "block_verify", f
assert block_verify is K.block_verify is stages.block_verify is sys.modules["specc.kernels.block_verify"].block_verify
from specc.kernels import *  # noqa: F403
assert isinstance(block_verify, types.FunctionType)
assert set(K.__all__) <= set(dir(K)), sorted(set(K.__all__) - set(dir(K)))
print("OK")
"""


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=str(REPO))


def test_an_exported_name_stays_the_function_when_its_submodule_was_imported_first():
    proc = _run(CODE)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_variants_and_cost_tables_load_without_torch():
    proc = _run("import sys, specc.kernels.variants, specc.predict.cost, specc.kernels; print('torch' in sys.modules)")
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stdout + proc.stderr
