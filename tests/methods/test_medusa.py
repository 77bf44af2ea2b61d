"""Medusa heads: the published layouts (FasterDecoding, vLLM, vLLM with the target's LM head shared)
load into the same heads, mismatches are refused with the file and the fix, the drafter's chains and
static trees take head d-1's rank-r candidate at depth d, and greedy output through the runtime equals
plain greedy decoding (chains and several static trees, batch 1 and 4, greedy and standard rules)."""
from __future__ import annotations

import json

import pytest
import torch

from specc.methods.base import BatchView, DraftSampling, PrefillChunk, StaticTree, TreeRequest
from specc.methods.medusa.drafter import MedusaDrafter, build_drafter
from specc.errors import CheckpointError, PlanError
from specc.compiler.lower import state_name
from specc.methods.medusa.model import MedusaConfig, MedusaModel, load_medusa_heads, save_medusa_heads
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec
from specc.compiler.trees import compile_tree, normalize_choices

from tests.test_eagle_support import one_thread  # noqa: F401  (autouse fixture)
from tests.test_eagle_support import H, V, naive_greedy, tiny_target


def random_heads(target, num_heads=4, layers=1, seed=0, own=False, scale=0.3) -> MedusaModel:
    cfg = MedusaConfig(num_heads=num_heads, num_layers=layers, hidden_size=H, vocab_size=V, fc_bias=True,
                       shared_lm_head=not own)
    m = MedusaModel(cfg, target.lm_head, own_lm_heads=own)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=g))
    return m.eval()


def _write_fasterdecoding(model, d, fmt="pt", prefix=""):
    d.mkdir(parents=True, exist_ok=True)
    sd = {}
    L = model.cfg.num_layers
    for k in range(model.cfg.num_heads):
        for j in range(L):
            sd[f"{prefix}{k}.{j}.linear.weight"] = model.blocks[k][j].linear.weight.detach().clone()
            sd[f"{prefix}{k}.{j}.linear.bias"] = model.blocks[k][j].linear.bias.detach().clone()
        sd[f"{prefix}{k}.{L}.weight"] = model.lm_heads[k].weight.detach().clone()
    if fmt == "pt":
        torch.save(sd, d / "medusa_lm_head.pt")
    else:
        from safetensors.torch import save_file
        save_file(sd, str(d / "medusa_lm_head.safetensors"))
    (d / "config.json").write_text(json.dumps({"medusa_num_heads": model.cfg.num_heads,
                                               "medusa_num_layers": L, "base_model_name_or_path": "tiny"}))
    return d


def _same(a: MedusaModel, b: MedusaModel):
    h = torch.randn(3, H, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(a.logits(h), b.logits(h))


@pytest.mark.parametrize("fmt,prefix", [("pt", ""), ("safetensors", "medusa_head.")])
def test_fasterdecoding_layout_loads(tmp_path, fmt, prefix):
    target = tiny_target()
    heads = random_heads(target, 3, 2, own=True)
    loaded = load_medusa_heads(_write_fasterdecoding(heads, tmp_path / "fd", fmt, prefix), target.config, target.lm_head)
    assert loaded.cfg.num_heads == 3 and loaded.cfg.num_layers == 2 and not loaded.cfg.shared_lm_head
    _same(loaded, heads)


@pytest.mark.parametrize("own", [True, False])
def test_vllm_layout_round_trip(tmp_path, own):
    target = tiny_target()
    heads = random_heads(target, 4, 1, own=own)
    files = save_medusa_heads(heads, tmp_path / "v")
    assert files == ["config.json", "model.safetensors"]
    cfg = json.loads((tmp_path / "v" / "config.json").read_text())
    assert cfg["model_type"] == "medusa" and cfg["num_heads"] == 4 and cfg["original_lm_head"] == (not own)
    from safetensors.torch import load_file
    keys = set(load_file(str(tmp_path / "v" / "model.safetensors")))
    assert "blocks.0.layers.0.weight" in keys and "blocks.3.layers.0.bias" in keys
    assert ("lm_heads.0.weight" in keys) == own and "lm_head.weight" not in keys  # the shared head is the target's
    _same(load_medusa_heads(tmp_path / "v", target.config, target.lm_head), heads)


def test_vllm_original_lm_head_stored_in_the_file(tmp_path):
    """vLLM's original_lm_head checkpoints store one shared head (as lm_head or lm_heads.0)."""
    from safetensors.torch import save_file
    target = tiny_target()
    heads = random_heads(target, 2, 1)
    d = tmp_path / "o"
    save_medusa_heads(heads, d)
    sd = {k: v for k, v in __import__("safetensors.torch", fromlist=["load_file"]).load_file(
        str(d / "model.safetensors")).items()}
    w = torch.randn(V, H, generator=torch.Generator().manual_seed(3))
    save_file(dict(sd, **{"medusa_heads.lm_heads.0.weight": w}), str(d / "model.safetensors"))
    loaded = load_medusa_heads(d, target.config, target.lm_head)
    assert loaded.lm_head is not None and torch.equal(loaded.lm_head.weight, w)


def test_mismatches_are_refused(tmp_path):
    target = tiny_target()
    heads = random_heads(target, 2, 1)
    d = tmp_path / "m"
    save_medusa_heads(heads, d)
    cfg = json.loads((d / "config.json").read_text())
    for key, value, msg in (("hidden_size", H + 1, "hidden_size"), ("vocab_size", V + 1, "vocab_size"),
                            ("truncated_vocab_size", V // 2, "truncated_vocab_size"), ("num_heads", 3, "missing")):
        (d / "config.json").write_text(json.dumps(dict(cfg, **{key: value})))
        with pytest.raises(CheckpointError, match=msg):
            load_medusa_heads(d, target.config, target.lm_head)
    (d / "config.json").write_text("{")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_medusa_heads(d, target.config, target.lm_head)
    (d / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        load_medusa_heads(d, target.config, target.lm_head)
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="no weights"):
        load_medusa_heads(tmp_path / "e", target.config, target.lm_head)


def test_plan_deeper_than_the_heads_is_refused(tmp_path):
    target = tiny_target()
    save_medusa_heads(random_heads(target, 2, 1), tmp_path / "h")
    spec = {"method": {"name": "medusa", "num_steps": 3}, "draft": {"path": str(tmp_path / "h")}}
    with pytest.raises(PlanError, match="2 Medusa heads"):
        build_drafter(spec, target)
    with pytest.raises(PlanError, match="draft.path"):
        build_drafter({"method": {"name": "medusa"}, "draft": None}, target)


# ------------------------------------------------------------------------- proposals

def _prefilled(target, heads, b=2):
    drafter = MedusaDrafter(heads, target.config.num_layers, target.norm)
    drafter.setup(b, 64, torch.device("cpu"))
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, V, (b, 6), generator=g)
    pos = torch.arange(6).expand(b, 6)
    target.setup_cache(b, 64)
    with torch.no_grad():
        _, hidden = target.forward(ids, pos, hidden_layers=drafter.hidden_layers)
        h_final = target.norm(hidden[0][:, -1])
    tokens = torch.zeros(b, 64, dtype=torch.int64)
    tokens[:, :6] = ids
    batch = BatchView(tokens=tokens, seq_lens=torch.full((b,), 7), active=torch.ones(b, dtype=torch.bool),
                      prompt_lens=torch.full((b,), 6), max_draft=torch.full((b,), 8),
                      temperature=torch.ones(b), top_p=torch.ones(b), top_k=torch.zeros(b, dtype=torch.int64),
                      trash_slot=63)
    drafter.prefill(batch, PrefillChunk(input_ids=ids, positions=pos, cache_slots=pos.clone(),
                                        rows=torch.ones(b, dtype=torch.bool), target_hidden=hidden))
    return drafter, batch, h_final


@pytest.mark.parametrize("mode", ["greedy", "probabilistic"])
def test_static_tree_takes_each_heads_ranked_candidates(mode):
    target = tiny_target(seed=1)
    heads = random_heads(target, 3, 1, seed=2)
    drafter, batch, h = _prefilled(target, heads)
    tc = normalize_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1]])
    st = StaticTree.from_buffers(compile_tree(tc), torch.device("cpu"))
    noise = torch.empty(2, st.num_nodes, V).exponential_(generator=torch.Generator().manual_seed(5))
    prop = drafter.propose_tree(batch, TreeRequest(3, 3, st.num_nodes, st), DraftSampling(mode, noise))
    with torch.no_grad():
        logits = heads.logits(h)  # [B, 3, V]
    from specc.kernels import process_logits
    q = process_logits(logits, batch.temperature, batch.top_k, batch.top_p)
    index = {(): 0, **{p: i + 1 for i, p in enumerate(tc)}}
    for b in range(2):
        for p in tc:
            d, parent = len(p), index[p[:-1]]
            if mode == "greedy":
                want = logits[b, d - 1].topk(3).indices[p[-1]]
            else:
                want = torch.div(q[b, d - 1], noise[b, parent]).topk(3).indices[p[-1]]
            assert int(prop.tokens[b, index[p] - 1]) == int(want), (b, p)
        if mode == "probabilistic":
            for node in range(st.num_nodes):  # q of node n's children: head depth(n)
                d = int(st.depths[node])
                if d < 3:
                    torch.testing.assert_close(prop.probs[b, node], q[b, d])
    assert prop.parents.tolist()[0] == st.parents.tolist()


# ------------------------------------------------------------------------- through the runtime

TREES = {"chain": None,
         "binary": ((0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)),
         "medusa_like": ((0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (0, 0, 0), (0, 1, 0),
                         (0, 0, 0, 0))}


@pytest.mark.parametrize("rule", ["greedy", "standard"])
@pytest.mark.parametrize("b", [1, 4])
@pytest.mark.parametrize("tree", sorted(TREES))
def test_medusa_greedy_equals_plain_greedy(tree, b, rule):
    target = tiny_target(seed=7)
    heads = random_heads(target, 4, 1, seed=8, scale=0.1)
    tc = normalize_choices(TREES[tree]) if TREES[tree] else None
    k = max(len(p) for p in tc) if tc else 3
    w = len(tc) + 1 if tc else k + 1
    topk = max(max(p) for p in tc) + 1 if tc else 1
    spec = StateSpec(name=state_name(b, k, topk, w, rule, "greedy", tc is None, tc), method="medusa", batch_size=b,
                     num_steps=k, topk=topk, num_draft_tokens=w, verify_rule=rule, parallel=tc is None,
                     tree_choices=tc)
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, V, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()
               for _ in range(5)]
    rt = Runtime(target, None, MedusaDrafter(heads, target.config.num_layers, target.norm), [spec],
                 max_model_len=128, eos_token_ids=[])
    outs = rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=15)) for p in prompts],
                       batch_size=b)
    for p, o in zip(prompts, outs):
        assert o.token_ids == naive_greedy(target, p, 15)
