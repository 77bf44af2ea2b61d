"""Where ``specc tune`` finds a device cost table: the shipped tables (``specc/data/cost_tables``),
then specc's cache (``$SPECC_CACHE_DIR/cost_tables``, default ``~/.cache/specc/cost_tables``), one
matched on the CPU model name, thread count and target checkpoint. Torch-free.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Optional

from specc.device import cpu_name  # noqa: F401  (the name a CPU cost table is matched on)
from specc.errors import SpeccError


def table_dirs() -> List[Path]:
    """Where device cost tables are looked for: the shipped ones, then specc's cache."""
    cache = Path(os.environ.get("SPECC_CACHE_DIR") or Path.home() / ".cache" / "specc") / "cost_tables"
    return [Path(__file__).resolve().parent.parent / "data" / "cost_tables", cache]


def find_table(target_path: str, threads: int, device: str = "cpu") -> Optional[str]:
    """A cost table profiled for ``target_path`` on this CPU model with ``threads`` threads (shipped
    or cached), or None. A table names its plan; the plan's target must be ``target_path``."""
    from specc.plan.load import load_plan

    name = cpu_name()
    for d in table_dirs():
        for f in sorted(d.glob("*.json")) if d.is_dir() else []:
            try:
                data = json.loads(f.read_text())
            except (OSError, ValueError, RecursionError):  # not a table this search can use
                continue
            if data.get("device") != device or data.get("device_name") != name or data.get("threads") != threads:
                continue
            tpath = data.get("target")
            if tpath is None and data.get("plan"):
                try:
                    tpath = load_plan(str(data["plan"])).plan.target.path
                except SpeccError:
                    continue
            if tpath == target_path:
                return str(f)
    return None
