"""The runtime package reads execution plans, never plans: importing every ``specc.runtime`` module,
and verifying and loading a compiled artifact, pulls in neither ``specc.plan`` nor Hydra/OmegaConf."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CODE = r"""
import importlib, pkgutil, sys
import specc.runtime
for m in pkgutil.iter_modules(specc.runtime.__path__):
    importlib.import_module("specc.runtime." + m.name)
from specc.runtime.artifact import load_artifact
art = load_artifact(sys.argv[1])
assert art.ir.states and art.kernels, "artifact did not load"
bad = sorted(m for m in sys.modules if m == "hydra" or m.startswith(("specc.plan", "hydra.", "omegaconf")))
print("BAD", bad)
sys.exit(1 if bad else 0)
"""


def test_runtime_imports_no_plan_or_hydra():
    art = sorted((REPO / "generated").glob("smollm2_adaptive-*"))[0]
    proc = subprocess.run([sys.executable, "-c", CODE, str(art)], capture_output=True, text=True, timeout=300,
                          cwd=str(REPO))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "BAD []" in proc.stdout
