"""Exactness: greedy speculative output equals plain greedy output token for token.

Every method (κ = 0, ngram, draft_model) at κ ∈ {1, 3, 5}, batch 1 and batch 4, with prompts of
different lengths — a 1-token prompt among them — and a request whose max_new_tokens < κ + 1. The
oracle is `reference_greedy`, a token-by-token loop over `LlamaModel.forward` alone.
"""
import pytest
import torch

from specc.methods.draft_model.drafter import DraftModelDrafter
from specc.methods.ngram.drafter import NgramDrafter
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec
from specc.runtime.testing import perturbed_copy, quantized_copy, reference_greedy, tiny_llama

PROMPTS = [[5], [1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 9, 8, 7, 9, 8, 7, 10, 11, 12], [3] * 4 + list(range(20, 39))]
MAX_NEW = [14, 2, 24, 17]  # 2 < κ + 1 for κ >= 3 (and = κ + 1 for κ = 1)


@pytest.fixture(scope="module", params=["fp32", "native", "native-mixed", "native-f16", "native-bf16"])
def target(request):
    """The fp32 model, the same model with its weights in GGML codes (Q4_1 linears, Q8_0 head) run by
    the quantized kernels, a mixed one (v and down projections Q8_0, as Q4_K_M-style files mix
    types: q/k/v then run part by part), and its weights in fp16 / bf16 bytes (a safetensors checkpoint of
    that dtype run natively): exactness must hold for each kernel set."""
    torch.set_num_threads(1)
    model = tiny_llama(seed=0, vocab_size=64, num_layers=2)
    if request.param == "fp32":
        return model
    if request.param in ("native-f16", "native-bf16"):
        kind = "F16" if request.param == "native-f16" else "BF16"
        native = quantized_copy(model, type_name=kind, head_type=kind)
        assert native.c_layers and native.layers[0].attn.wqkv.parts[0].kind == kind.lower()
        return native
    mixed = {"v_proj.weight": "Q8_0", "down_proj.weight": "Q8_0"} if request.param == "native-mixed" else None
    native = quantized_copy(model, overrides=mixed)
    assert native.c_layers and (len(native.layers[0].attn.wqkv.parts) == 2) == bool(mixed)
    return native


@pytest.fixture(scope="module")
def draft(target):
    return perturbed_copy(target, noise=0.02, seed=1)


@pytest.fixture(scope="module")
def reference(target):
    return [reference_greedy(target, p, n) for p, n in zip(PROMPTS, MAX_NEW)]


def _requests():
    return [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=n), request_id=f"r{i}")
            for i, (p, n) in enumerate(zip(PROMPTS, MAX_NEW))]


def _drafter(method, draft):
    if method == "ngram":
        return NgramDrafter(1, 3)
    if method == "draft_model":
        return DraftModelDrafter(draft, draft.config.vocab_size)
    return None


def _runtime(target, drafter, k, method, rule="greedy", sampling="greedy", buckets=(1, 4)):
    specs = [StateSpec(f"b{b}_k{k}", method, b, k, num_draft_tokens=k + 1, verify_rule=rule, draft_sampling=sampling)
             for b in buckets]
    return Runtime(target, None, drafter, specs, max_model_len=128)


def test_plain_runtime_matches_reference(target, reference):
    rt = _runtime(target, None, 0, "none")
    for bs in (1, 4):
        out = rt.generate(_requests(), batch_size=bs)
        assert [o.token_ids for o in out] == reference
    assert rt.metrics.tau == pytest.approx(1.0)
    assert rt.metrics.num_drafts == 0


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_greedy_speculation_is_exact(target, draft, reference, method, k, batch_size):
    rt = _runtime(target, _drafter(method, draft), k, method)
    out = rt.generate(_requests(), batch_size=batch_size)
    assert [o.token_ids for o in out] == reference
    assert [o.finish_reason for o in out] == ["length"] * 4
    m = rt.metrics
    assert m.num_accepted_tokens <= m.num_draft_tokens
    assert sum(m.num_accepted_tokens_per_pos) == m.num_accepted_tokens
    assert len(m.num_accepted_tokens_per_pos) <= k
    # the draft model agrees with the target often: the accept path is really exercised
    if method == "draft_model":
        assert m.num_accepted_tokens > 0 and m.tau > 1.2
        # and disagrees sometimes: so is the reject path
        assert m.num_accepted_tokens < m.num_draft_tokens


@pytest.mark.parametrize("sampling", ["greedy", "probabilistic"])
def test_standard_rule_at_temperature_zero_is_greedy(target, draft, reference, sampling):
    rt = _runtime(target, _drafter("draft_model", draft), 3, "draft_model", rule="standard", sampling=sampling)
    out = rt.generate(_requests(), batch_size=4)
    assert [o.token_ids for o in out] == reference


def test_ngram_long_outputs_exact_and_accepting(target):
    """Longer outputs (60 tokens) where the target repeats itself: exact, and n-gram drafts get
    accepted (τ > 1), so the accept path of the one-hot drafts is exercised."""
    reqs = [Request(prompt_ids=p, params=SamplingParams(max_new_tokens=60)) for p in PROMPTS]
    rt = _runtime(target, NgramDrafter(1, 3), 3, "ngram")
    out = rt.generate(reqs, batch_size=4)
    assert [o.token_ids for o in out] == [reference_greedy(target, p, 60) for p in PROMPTS]
    assert rt.metrics.num_accepted_tokens > 0 and rt.metrics.tau > 1.0


@pytest.mark.parametrize("sampling", ["greedy", "probabilistic"])
def test_greedy_rows_exact_next_to_sampled_rows(target, draft, reference, sampling):
    """A batch mixing temperature-0 and sampled requests goes through rejection sampling as a whole;
    its greedy rows (one-hot p) still reproduce plain greedy decoding exactly."""
    rt = _runtime(target, _drafter("draft_model", draft), 3, "draft_model", rule="standard", sampling=sampling)
    reqs = _requests()
    reqs[1] = Request(prompt_ids=PROMPTS[1], params=SamplingParams(max_new_tokens=9, temperature=1.0, seed=3))
    out = rt.generate(reqs, batch_size=4)
    for i in (0, 2, 3):
        assert out[i].token_ids == reference[i]
    assert len(out[1].token_ids) == 9
