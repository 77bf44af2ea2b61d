"""``--hardware`` of ``specc check`` and ``specc tune``: which device the figures are for.

A value is one of:

* a shipped hardware profile's name (``conf/hardware/<name>.yaml``: cpu, h100, h200);
* a hardware profile YAML file of the same keys (``bandwidth_bytes_per_s``, ``peak_flops``,
  ``memory_bytes``, ...; :func:`specc.predict.cost.load_hardware_profile`);
* a cost table JSON that ``specc profile`` (or ``specc tune``) measured on a device
  (``specc-cost-table/1``, :func:`specc.predict.cost.load_cost_table`). Its device maps to a shipped
  profile for the roofline and memory figures: ``cpu`` to cpu, a CUDA device whose name holds a
  profile's name (``NVIDIA H200`` → h200) to that profile.

:func:`parse_hardware` checks the value before any work and returns a :class:`HardwareChoice`; a
bad value is a SpeccError naming the flag and listing the shipped profiles. Torch-free.
"""
from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from specc.errors import PlanError, SpeccError


def shipped_profiles() -> List[str]:
    """The shipped hardware profiles' names (``conf/hardware/*.yaml``)."""
    from specc.predict.cost import HARDWARE_DIR

    return sorted(p.stem for p in HARDWARE_DIR.glob("*.yaml"))


@dataclass(frozen=True)
class HardwareChoice:
    """A checked ``--hardware``: ``profile`` is what ``schedule.hardware`` takes (a shipped name or a
    profile YAML path), ``name`` the profile's own name, ``cost_table`` the cost table JSON given
    (None for a profile), ``value`` the text as given."""

    value: str
    profile: str
    name: str
    cost_table: Optional[str] = None


def _usage(flag: str) -> str:
    return (f"give a shipped profile ({', '.join(shipped_profiles())}), a hardware profile YAML file (keys as in "
            f"conf/hardware/h100.yaml) or a cost table JSON written by `specc profile`")


def parse_hardware(value: str, flag: str = "--hardware") -> HardwareChoice:
    """Check ``flag VALUE`` (see the module docstring). Raises SpeccError naming ``flag`` and the shipped
    profiles: an unknown name (with the closest names), a missing file, a malformed profile or cost
    table, a cost table of a device no shipped profile describes."""
    from specc.predict import cost

    text = str(value).strip()
    names = shipped_profiles()
    if not text:
        raise SpeccError(f"{flag}: empty; {_usage(flag)}")
    if text in names:
        return HardwareChoice(value=text, profile=text, name=cost.load_hardware_profile(text).name)
    path = Path(text).expanduser()
    if not path.suffix:
        close = difflib.get_close_matches(text.lower(), names, n=2)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise SpeccError(f"{flag} {text}: no such hardware profile{hint}; {_usage(flag)}")
    if not path.is_file():
        raise SpeccError(f"{flag} {text}: no such file; {_usage(flag)}")
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            hw = cost.load_hardware_profile(str(path))
        except PlanError as exc:
            raise SpeccError(f"{flag} {text}: {str(exc).replace('schedule.hardware: ', '')}") from None
        return HardwareChoice(value=text, profile=str(path), name=hw.name)
    if path.suffix.lower() == ".json":
        try:
            cost.load_cost_table(str(path))
            data = json.loads(path.read_text())
        except (PlanError, OSError, ValueError) as exc:
            raise SpeccError(f"{flag} {text}: not a cost table ({str(exc).replace('schedule.cost_table: ', '')}); "
                             f"{_usage(flag)}") from None
        profile = profile_of_table(data)
        if profile is None:
            raise SpeccError(f"{flag} {text}: a cost table of {data.get('device_name') or data.get('device')!r}, "
                             f"which no shipped profile describes; pass a hardware profile YAML for it, or one of "
                             f"{', '.join(names)}")
        return HardwareChoice(value=text, profile=profile, name=profile, cost_table=str(path))
    raise SpeccError(f"{flag} {text}: neither a profile name, a .yaml profile nor a .json cost table; {_usage(flag)}")


def profile_of_table(data: dict) -> Optional[str]:
    """The shipped profile describing the device a cost table was measured on: ``cpu`` for a CPU
    table, else the profile whose name appears in the CUDA device's name; None when none does."""
    if data.get("device") == "cpu":
        return "cpu"
    device_name = str(data.get("device_name") or "").lower()
    for name in shipped_profiles():
        if name != "cpu" and name in device_name:
            return name
    return None


def local_hardware() -> Optional[HardwareChoice]:
    """The GPU profile measured on this machine, if any: the newest CUDA cost table in specc's cache
    (``$SPECC_CACHE_DIR/cost_tables``, where ``specc profile`` / ``specc tune`` tables are kept;
    :func:`specc.tune.tables.table_dirs`) whose device a shipped profile describes; None without one.
    Unreadable files are skipped."""
    from specc.tune.tables import table_dirs

    cache = table_dirs()[1]
    found = []
    for f in sorted(cache.glob("*.json")) if cache.is_dir() else []:
        try:
            data = json.loads(f.read_text())
            mtime = f.stat().st_mtime
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(data, dict) and data.get("device") == "cuda":
            profile = profile_of_table(data)
            if profile is not None:
                found.append((mtime, str(f), profile))
    if not found:
        return None
    _, path, profile = max(found)
    return HardwareChoice(value=path, profile=profile, name=profile, cost_table=path)
