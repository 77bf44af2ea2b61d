"""Multi-adapter LoRA on the target (PEFT layout): each request's adapter applies to its own rows of
the target's prefill and verify forwards; greedy output with an adapter equals plain greedy decoding
of the target with that adapter merged into its weights (W + s·B·A), with and without speculation,
several adapters in one batch; the drafter never sees adapter deltas; admission keeps at most
``max_loras_per_batch`` distinct adapters live; malformed adapters are refused naming the problem.
On the real SmolLM2 (slow): equality with ``peft`` + ``transformers`` with the adapter merged."""
from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import save_file

from specc.methods.draft_model.drafter import DraftModelDrafter
from specc.methods.ngram.drafter import NgramDrafter
from specc.errors import CheckpointError, PlanError
from specc.runtime.engine import Runtime
from specc.runtime.lora import LoraSet, load_adapter, load_lora_set, parse_adapter_specs
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec
from specc.runtime.testing import perturbed_copy, reference_greedy, tiny_llama

PROMPTS = [[5, 6, 7], [1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 9, 8, 7, 9, 8], [3, 3, 3, 20, 21, 22, 23]]
MODULES = {"q_proj": (32, 32), "k_proj": (16, 32), "v_proj": (16, 32), "o_proj": (32, 32),
           "gate_proj": (64, 32), "up_proj": (64, 32), "down_proj": (32, 64)}  # (out, in) of tiny_llama


def write_adapter(path, seed, modules=("q_proj", "v_proj", "o_proj", "down_proj"), r=4, alpha=8, layers=2,
                  std=0.3, extra=None):
    """A PEFT-layout LoRA adapter for ``tiny_llama`` with random A and B (non-zero deltas)."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(layers):
        for m in modules:
            out, inp = MODULES[m]
            block = "self_attn" if m in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            key = f"base_model.model.model.layers.{i}.{block}.{m}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(r, inp, generator=g) * std
            tensors[f"{key}.lora_B.weight"] = torch.randn(out, r, generator=g) * std
    tensors.update(extra or {})
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": list(modules), "bias": "none",
        "fan_in_fan_out": False, "use_rslora": False, "task_type": "CAUSAL_LM"}))
    return path


def merged(target, adapter):
    """A copy of ``target`` with the adapter merged into its fused weights: the oracle."""
    m = copy.deepcopy(target)
    m.max_batch_size = m.max_seq_len = 0
    c = m.config
    q, kv, inter = c.q_size, c.kv_size, c.intermediate_size
    where = {"q_proj": ("attn", "wqkv", 0, q), "k_proj": ("attn", "wqkv", q, q + kv),
             "v_proj": ("attn", "wqkv", q + kv, q + 2 * kv), "o_proj": ("attn", "wo", 0, c.hidden_size),
             "gate_proj": ("ffn", "w13", 0, inter), "up_proj": ("ffn", "w13", inter, 2 * inter),
             "down_proj": ("ffn", "w2", 0, c.hidden_size)}
    with torch.no_grad():
        for (layer, module), (A, B) in adapter.weights.items():
            block, lin, o0, o1 = where[module]
            w = getattr(getattr(m.layers[layer], block), lin).weight
            w[o0:o1] += adapter.scale * (B @ A)
    return m.use_cpu_fast()


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_llama(seed=0, vocab_size=64, num_layers=2)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora")
    return {"a": write_adapter(d / "a", 1), "b": write_adapter(d / "b", 2, modules=("k_proj", "gate_proj", "up_proj"))}


def _runtime(target, drafter, method, k, adapters, max_loras=None):
    specs = [StateSpec(f"b{b}_k{k}", method, b, k, num_draft_tokens=k + 1 if k else 0) for b in (1, 4)]
    rt = Runtime(target, None, drafter, specs, max_model_len=96, eos_token_ids=[])
    entries = [f"{n}={p}" for n, p in adapters.items()]
    lora = load_lora_set(entries, target, rt.max_rows, max_loras)
    rt.attach_lora(lora)
    return rt, lora


@pytest.mark.parametrize("method,k", [("none", 0), ("ngram", 3), ("draft_model", 3)])
def test_greedy_with_adapters_equals_merged_greedy(target, adapters, method, k):
    """Requests with adapter a, adapter b and none in one batch; each equals its own merged model."""
    oracles = {None: target}
    for name, path in adapters.items():
        oracles[name] = merged(target, load_adapter(name, path, target.config))
    refs = {(name, i): reference_greedy(oracles[name], p, 14) for name in oracles for i, p in enumerate(PROMPTS)}
    assert refs[("a", 0)] != refs[(None, 0)] or refs[("a", 1)] != refs[(None, 1)]  # the adapter matters
    drafter = {"none": None, "ngram": NgramDrafter(1, 3),
               "draft_model": DraftModelDrafter(perturbed_copy(target, 0.02, 1), 64)}[method]
    rt, lora = _runtime(target, drafter, method, k, adapters)
    try:
        names = [None, "a", "b", "a", "b", None, "a", None]
        reqs = [Request(prompt_ids=PROMPTS[i % 4], params=SamplingParams(max_new_tokens=14), adapter=n)
                for i, n in enumerate(names)]
        outs = rt.generate(reqs, batch_size=4)
        for i, (n, o) in enumerate(zip(names, outs)):
            assert o.token_ids == refs[(n, i % 4)], (i, n)
    finally:
        lora.detach()


def test_drafter_never_sees_adapter_deltas(target, adapters):
    """The target's embedding and LM head (what EAGLE heads borrow) are untouched by the hooks while a
    row holds an adapter, and a model copied from the target after attaching computes the base model."""
    ids = torch.tensor([[1, 2, 3]])
    h = torch.randn(1, 3, 32)
    head, emb = target.lm_head(h), target.embed(ids)
    rt, lora = _runtime(target, None, "none", 0, adapters)
    try:
        rt.generate([Request(prompt_ids=[1, 2, 3], params=SamplingParams(max_new_tokens=3), adapter="a")])
        lora.assign_row(0, "a")  # as while that request decodes
        assert torch.equal(target.lm_head(h), head) and torch.equal(target.embed(ids), emb)
        twin = copy.deepcopy(target)
        twin.max_batch_size = twin.max_seq_len = 0
        twin.use_cpu_fast()
        adapted = reference_greedy(target, PROMPTS[1], 10)  # row 0 holds adapter a: the target is adapted
        copied = reference_greedy(twin, PROMPTS[1], 10)
    finally:
        lora.detach()
    base = reference_greedy(target, PROMPTS[1], 10)
    assert copied == base
    assert adapted == reference_greedy(merged(target, load_adapter("a", adapters["a"], target.config)),
                                       PROMPTS[1], 10)


def test_max_loras_per_batch_limits_live_adapters(target, adapters):
    rt, lora = _runtime(target, NgramDrafter(1, 3), "ngram", 3, adapters, max_loras=1)
    try:
        rt.reset(4)
        names = ["a", "b", "a", None, "b", "a"]
        for i, n in enumerate(names):
            rt.submit(Request(prompt_ids=PROMPTS[i % 4], params=SamplingParams(max_new_tokens=6), adapter=n))
        seen = 0
        while rt.has_work():
            rt.step()
            live = {rt.batch.rows[r].request.adapter for r in rt.batch.live_rows()} - {None}
            assert len(live) <= 1
            seen += 1
        assert seen > 0 and rt.metrics.num_requests == 6
    finally:
        lora.detach()


def test_bad_adapters_are_refused(target, tmp_path):
    with pytest.raises(PlanError, match="NAME=PATH"):
        parse_adapter_specs(["nopath"])
    with pytest.raises(PlanError, match="twice"):
        parse_adapter_specs(["a=/x", "a=/y"])
    with pytest.raises(CheckpointError, match="PEFT adapter directory"):
        load_adapter("x", tmp_path / "missing", target.config)
    emb = write_adapter(tmp_path / "emb", 3, extra={
        "base_model.model.model.embed_tokens.lora_A.weight": torch.zeros(4, 64)})
    with pytest.raises(CheckpointError, match="embeddings or the LM head"):
        load_adapter("emb", emb, target.config)
    wrong = write_adapter(tmp_path / "wrong", 4)
    cfg = json.loads((wrong / "adapter_config.json").read_text())
    cfg["r"] = 8
    (wrong / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="do not fit the target"):
        load_adapter("wrong", wrong, target.config)
    dora = write_adapter(tmp_path / "dora", 5)
    cfg = json.loads((dora / "adapter_config.json").read_text())
    cfg["use_dora"] = True
    (dora / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="use_dora"):
        load_adapter("dora", dora, target.config)
