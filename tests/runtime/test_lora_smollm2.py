"""LoRA on the real SmolLM2-135M: greedy output with an adapter equals ``peft`` + ``transformers`` with
the same adapter merged (``merge_and_unload``), and equals plain greedy with the adapter under
EAGLE-3 speculation. Adapters: one ``peft`` makes here (random, non-zero deltas on every projection)
and the shipped ``smollm2_135m_chitchat`` when present."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.serve_support import load_smollm2
from specc import methods
from specc.runtime.engine import Runtime
from specc.runtime.lora import load_lora_set
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec

pytestmark = pytest.mark.slow
SHIPPED = Path(__file__).resolve().parents[2] / "specc/assets/adapters/smollm2_135m_chitchat"
PROMPTS = ["What is the capital of France?", "How are you doing today?"]
N = 16


@pytest.fixture(scope="module")
def smollm2():
    torch.set_num_threads(1)
    return load_smollm2(max_model_len=512)


@pytest.fixture(scope="module")
def random_adapter(smollm2, tmp_path_factory):
    import peft

    from specc.models.hf_loader import to_transformers

    target, _ = smollm2
    torch.manual_seed(0)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, task_type="CAUSAL_LM",
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = peft.get_peft_model(to_transformers(target), cfg)
    with torch.no_grad():  # peft's random B is large for a 135M model: keep the output readable
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(0.05)
    out = tmp_path_factory.mktemp("peft") / "random"
    model.save_pretrained(str(out))
    return out


def _peft_merged_greedy(target, adapter_dir, ids):
    import peft

    from specc.models.hf_loader import to_transformers

    model = peft.PeftModel.from_pretrained(to_transformers(target), str(adapter_dir)).merge_and_unload().eval()
    out, past, x = [], None, torch.tensor([ids])
    with torch.no_grad():  # plain argmax steps (generate's processors would suppress EOS under min_new_tokens)
        for _ in range(N):
            res = model(input_ids=x, past_key_values=past, use_cache=True)
            past = res.past_key_values
            tok = int(res.logits[0, -1].argmax())
            out.append(tok)
            x = torch.tensor([[tok]])
    return out


def _runtime(target, tok, method, adapter_dir, k=3):
    drafter = None
    if method != "none":
        spec = {"method": {"name": method}, "draft": {"path": "pkg://specc/assets/drafters/smollm2_135m_eagle3"}}
        drafter = methods.build_drafter(method, spec, target, tok, "cpu", target.config.max_model_len)
    kk = 0 if method == "none" else k
    rt = Runtime(target, tok, drafter, [StateSpec(f"b2_k{kk}", method, 2, kk, num_draft_tokens=kk + 1 if kk else 0)],
                 max_model_len=400, eos_token_ids=[])
    lora = load_lora_set([f"ad={adapter_dir}"], target, rt.max_rows)
    rt.attach_lora(lora)
    return rt, lora


@pytest.mark.parametrize("which", ["random", "shipped"])
def test_adapter_greedy_equals_peft_merged_and_speculation(smollm2, random_adapter, which):
    target, tok = smollm2
    adapter_dir = random_adapter if which == "random" else SHIPPED
    if which == "shipped" and not (SHIPPED / "adapter_model.safetensors").is_file():
        pytest.skip("the shipped adapter is not built (tools/train_lora.py)")
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]
    want = [_peft_merged_greedy(target, adapter_dir, ids) for ids in prompts]
    reqs = [Request(prompt_ids=ids, params=SamplingParams(max_new_tokens=N), adapter=a)
            for ids in prompts for a in ("ad", None)]
    for method in ("none", "eagle3"):
        rt, lora = _runtime(target, tok, method, adapter_dir)
        try:
            outs = rt.generate(reqs, batch_size=2)  # one adapted and one base request per batch
        finally:
            lora.detach()
        adapted = [o.token_ids for o in outs[0::2]]
        assert adapted == want, (method, [tok.decode(t) for t in adapted], [tok.decode(t) for t in want])
        base = [o.token_ids for o in outs[1::2]]
        assert base != adapted
