"""What a ``specc train`` stage needs, checked before it does any work (no model, no data loaded,
torch not imported unless ``--device cuda`` asks for a GPU):

* the recipes load (:mod:`specc.train.recipe`: structure, fields, ranges, names);
* every input exists and is readable: the prompt files a ``distill`` reads, the token shards a
  ``fit`` or ``vocab`` reads, the ``training.json`` a ``render`` reads, the ``--init-from``
  checkpoint (a directory with ``config.json``);
* every output can be written: ``--cache-dir``, the recipe's ``prompt_dir`` (prompts, shards),
  ``--out`` or the recipe's ``out`` (:func:`specc.io.check_output_dir` creates and removes a probe
  file: ``os.access`` says yes for read-only mounts and ``/proc``);
* ``--shard-of`` against the recipe's split;
* the distillation batch (``--gen-batch`` or the recipe's ``gen_batch``) against this machine's
  memory: :func:`distill_bytes` estimates the peak from the target's shape, read from its
  checkpoint header, and the largest batch that fits is named in the error.

Each failure is a :class:`specc.train.recipe.RecipeError` (exit 2) naming the option or field, the
bound and the fix.
"""
from __future__ import annotations

import pathlib
from typing import Optional, Tuple

from specc.errors import SpeccError
from specc.io import check_input_dir, check_input_file, check_output_dir, human_size
from specc.train import recipe as R

#: Tokens of one prefill forward in :func:`specc.train.distill.answer_stream` (its default bound).
PREFILL_TOKENS = 8192
#: Bytes per value the estimate counts: fp32, the widest dtype distillation runs the target in.
FP32 = 4


def distill_bytes(shape, batch: int, positions: int) -> Tuple[int, str]:
    """Peak bytes of distilling with ``batch`` cache rows of ``positions`` positions each through a
    target of ``shape`` (:class:`specc.predict.deploy_cost.ModelShape`), counted in fp32 from the code that
    runs: the larger of

    * the dtype probe (:func:`specc.device.pick_dtype` over :func:`specc.train.recipe.decode_shapes`:
      each product's fp32 operands, their bf16 copies, and the largest fp32 result), and
    * the run (:func:`specc.train.distill.answer_stream`): the weights dequantized to fp32, the KV
      cache of every row (``2 · layers · kv_heads · head_dim`` values per position), a decode
      step's logits (``batch · vocab``, and their argmax pass) and a prefill forward's activations
      (:data:`PREFILL_TOKENS` tokens through the widest projections).

    Returns ``(bytes, the terms in words)``."""
    shapes = R.decode_shapes(shape, batch)
    probe = sum((m * k + k * n) * (FP32 + 2) for m, k, n in shapes) + max(m * n for m, _, n in shapes) * FP32
    weights = shape.param_count() * FP32
    kv = int(shape.kv_bytes_per_token(FP32)) * positions * batch
    logits = 2 * batch * shape.vocab * FP32
    prefill = PREFILL_TOKENS * (3 * shape.hidden + 3 * shape.intermediate) * FP32
    run = weights + kv + logits + prefill
    words = (f"weights {human_size(weights)} + KV cache {human_size(kv)} ({positions} positions per row) + logits "
             f"{human_size(logits)} + prefill {human_size(prefill)}; the dtype probe {human_size(probe)}")
    return max(run, probe), words


def device_budget(device: str) -> Tuple[int, int]:
    """``(budget, available)`` bytes for the run: this machine's (:func:`specc.limits.memory_budget`)
    or, for ``cuda``, the same share of the GPU's free memory. Raises RecipeError for ``cuda``
    without a CUDA device."""
    from specc import limits

    if device != "cuda":
        return limits.memory_budget()
    import torch

    if not torch.cuda.is_available():
        raise R.RecipeError("--device cuda: no CUDA device is available (use --device cpu)")
    free = int(torch.cuda.mem_get_info()[0])
    return int(limits.MEMORY_SHARE * free), free


def check_gen_batch(data: R.DataRecipe, batch: int, flag: str, device: str) -> None:
    """Refuse a distillation batch whose :func:`distill_bytes` exceeds the memory budget of
    ``device`` (:func:`device_budget`), naming ``flag``, the estimate, the memory and the largest
    batch that fits (:func:`specc.limits.check_fits`). Raises RecipeError."""
    from specc.limits import check_fits

    shape = R.target_shape(data)
    positions = data.max_prompt_tokens + data.max_new_tokens + 1
    words = distill_bytes(shape, batch, positions)[1]
    check_fits(flag, batch, lambda n: distill_bytes(shape, n, positions)[0],
               f"distilling that many prompts at a time: {words}", error=R.RecipeError,
               budget=device_budget(device))


def _data_stage(stage: str, data: R.DataRecipe, cache: pathlib.Path, args) -> None:
    """The checks of ``corpora`` / ``prompts`` / ``distill`` (and of ``all``'s data stages)."""
    prompts = R.prompt_dir(data)
    where = f"recipe {getattr(data, '_path', data.name)}: prompt_dir"
    if stage in ("corpora", "all"):
        check_output_dir(pathlib.Path(cache) / "corpora", "--cache-dir", error=R.RecipeError)
    check_output_dir(prompts, where, error=R.RecipeError)
    if stage not in ("distill", "all"):
        return
    parts = [args.part] if getattr(args, "part", None) else list(R.PARTS)
    for part in parts if stage == "distill" else ():
        f = prompts / f"{part}.jsonl.gz"
        if not f.is_file():
            raise R.RecipeError(f"{f} does not exist; run `specc train prompts {data.name}` first")
        check_input_file(f, f"{part} prompts", error=R.RecipeError)
        if getattr(args, "shard_of", None):
            R.shard_of(args.shard_of, max(1, int((data.split or {}).get(part, 1))), data.name, part)
    gen = getattr(args, "gen_batch", None)
    check_gen_batch(data, gen or data.gen_batch, "--gen-batch" if gen else
                    f"recipe {getattr(data, '_path', data.name)}: gen_batch", getattr(args, "device", "cpu"))


def check_stage(stage: str, recipe_name: Optional[str], cache: pathlib.Path, args) -> None:
    """Everything ``specc train STAGE RECIPE`` needs, before it starts (module docstring).

    Raises:
        RecipeError / SpeccError: the first problem, naming the option or recipe field and the fix.
    """
    if stage in ("corpora", "prompts", "distill"):
        _data_stage(stage, R.load_data_recipe(recipe_name or "smollm2_specbench"), cache, args)
        return
    if recipe_name is None:
        raise SpeccError(f"`specc train {stage}` needs a drafter recipe (a name under conf/train/ or a .yaml path)")
    _fit_options(stage, args)  # the options' own paths first: they need no recipe
    fit = R.load_fit_recipe(recipe_name)
    data = R.load_data_recipe(fit.data)
    if not getattr(args, "out", None):
        _out(stage, R.out_dir(fit, args), f"recipe {fit._path}: out")
    if stage == "all":
        _data_stage("all", data, cache, args)
    elif stage in ("fit", "vocab"):
        R.token_dirs(fit, data)
    if getattr(args, "device", "cpu") == "cuda":
        device_budget("cuda")


def _fit_options(stage: str, args) -> None:
    """``--out`` and ``--init-from`` of a drafter stage."""
    if getattr(args, "out", None):
        _out(stage, R.repo_path(args.out), "--out")
    init = getattr(args, "init_from", None)
    if init:
        check_input_dir(init, "--init-from", error=R.RecipeError)
        check_input_file(pathlib.Path(init) / "config.json", "--init-from", error=R.RecipeError)


def _out(stage: str, out: pathlib.Path, flag: str) -> None:
    """The drafter's directory: read by ``render`` (its ``training.json``), written by the others."""
    if stage == "render":
        check_input_dir(out, flag, error=R.RecipeError)
        check_input_file(out / "training.json", flag, error=R.RecipeError)
    else:
        check_output_dir(out, flag, error=R.RecipeError)
