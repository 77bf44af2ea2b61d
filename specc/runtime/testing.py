"""Small models and a reference decoder for tests and benchmarks of the runtime (no downloads).

``tiny_llama`` builds a random Llama-family model quickly; ``perturbed_copy`` a draft that agrees
with it often but not always; ``reference_greedy`` decodes one prompt token by token with
``LlamaModel.forward`` only — an oracle independent of the runtime's batching, routing, drafting
and verification.
"""
from __future__ import annotations

import copy
from typing import List, Optional, Sequence

import torch

from specc.methods.base import Drafter
from specc.models.config import LlamaConfig
from specc.models.llama import LlamaModel


def tiny_llama(seed: int = 0, vocab_size: int = 64, hidden_size: int = 32, num_layers: int = 2,
               max_model_len: int = 256, std: float = 0.3) -> LlamaModel:
    """A random ``LlamaModel`` (4 heads, 2 KV heads, head_dim 8), weights ~ N(0, std²), norms 1.

    ``std`` sets how peaked its next-token distributions are (0.3: varied, not uniform).
    Returns an eval-mode fp32 CPU model with the numpy fast path on, no cache set up.
    """
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_layers=num_layers, num_heads=4, num_kv_heads=2, head_dim=hidden_size // 4,
                      max_model_len=max_model_len, max_position_embeddings=max_model_len)
    gen = torch.Generator().manual_seed(seed)
    model = LlamaModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    model.eval().requires_grad_(False)
    return model.use_cpu_fast()


def quantized_copy(model: LlamaModel, type_name: str = "Q4_1", head_type: str = "Q8_0",
                   overrides: Optional[dict] = None) -> LlamaModel:
    """``model`` with its linear weights quantized to GGML ``type_name`` (the embedding / LM head to
    ``head_type``; ``overrides`` maps a name suffix such as ``"v_proj.weight"`` to another type, as
    mixed GGUFs do) by gguf-py's own quantizer and kept in those codes (``specc.models.qweights``): a
    small native-precision target for the runtime's exactness tests. ``"F16"`` / ``"BF16"`` keep the
    weights rounded to that 16-bit type in its own bytes (``QuantWeight.from_half``), as a safetensors
    checkpoint of that dtype loads with ``dtype: native``. Needs ``hidden_size`` and the intermediate
    size to be multiples of the types' block (32; 16 for the 16-bit types)."""
    import gguf

    from specc.models.qweights import QuantWeight, build_native_model

    half = {"F16": torch.float16, "BF16": torch.bfloat16}
    state = {}
    for name, t in model.hf_state_dict().items():
        w = t.detach().float().cpu().numpy()
        if w.ndim == 2:
            kind = head_type if name in ("model.embed_tokens.weight", "lm_head.weight") else type_name
            kind = next((t for suffix, t in (overrides or {}).items() if name.endswith(suffix)), kind)
            if kind in half:
                state[name] = QuantWeight.from_half(name, torch.from_numpy(w).to(half[kind]))
                continue
            raw = gguf.quants.quantize(w, getattr(gguf.GGMLQuantizationType, kind))
            state[name] = QuantWeight.from_gguf(name, kind, raw, tuple(w.shape))
        else:
            state[name] = torch.from_numpy(w.copy())
    return build_native_model(model.config, state, "quantized_copy")


def perturbed_copy(model: LlamaModel, noise: float, seed: int = 1) -> LlamaModel:
    """A deep copy of ``model`` with N(0, noise²) added to every weight: a draft model with the same
    vocabulary whose proposals the target accepts often but not always. The noise is drawn on the CPU
    (the same draft for a model on any device)."""
    gen = torch.Generator().manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_((torch.randn(p.shape, generator=gen) * noise).to(p.device, p.dtype))
    draft.max_batch_size = draft.max_seq_len = 0
    return draft.use_cpu_fast()


@torch.inference_mode()
def reference_greedy(model: LlamaModel, prompt: Sequence[int], max_new_tokens: int,
                     eos_token_ids: Sequence[int] = (), max_model_len: Optional[int] = None) -> List[int]:
    """Plain greedy decoding of one prompt: prefill, then one forward per token (batch 1, row 0).

    Stops after ``max_new_tokens`` tokens, after an EOS token (included), or when prompt + output
    reach ``max_model_len``. Returns the generated ids. Uses (and overwrites) cache row 0.
    """
    limit = int(max_model_len or model.config.max_model_len)
    model.setup_cache(1, limit)
    ids = torch.tensor([list(prompt)], dtype=torch.int64)
    pos = torch.arange(ids.shape[1]).view(1, -1)
    logits, _ = model.forward(ids, pos)
    out: List[int] = []
    n = ids.shape[1]
    while True:
        tok = int(logits[0, -1].argmax())
        out.append(tok)
        n += 1
        if len(out) >= max_new_tokens or tok in eos_token_ids or n >= limit:
            return out
        logits, _ = model.forward(torch.tensor([[tok]]), torch.tensor([[n - 1]]))


def shallow_copy(model: LlamaModel, num_layers: int) -> LlamaModel:
    """A draft made from a target without training: its first ``num_layers`` decoder layers, final
    norm, embeddings and head (the recipe of ``specc.methods.draft_model.shallow``), as a separate in-memory model
    with its own KV cache."""
    draft = copy.deepcopy(model)
    draft.layers = torch.nn.ModuleList(list(draft.layers)[:num_layers])
    draft.config = draft.config.replace(num_layers=num_layers)
    draft.max_batch_size = draft.max_seq_len = 0
    return draft


def runtime_for_plan(plan, target, drafter, *, cost_table: Optional[dict] = None, max_model_len: int = 128,
                     seed: int = 0, tokenizer=None, prefill_chunk: int = 512):
    """:func:`specc.compiler.build.plan_runtime` (the plan's execution plan, generic kernels) with test defaults
    (no tokenizer, 128 tokens). Imports ``specc.compiler.build`` (and so ``specc.plan``) only when called."""
    from specc.compiler.build import plan_runtime

    return plan_runtime(plan, target, tokenizer, drafter, cost_table=cost_table, max_model_len=max_model_len,
                             seed=seed, prefill_chunk=prefill_chunk)


class CopyTreeDrafter(Drafter):
    """A reference tree drafter for tests: grows draft trees (dynamic, SGLang/EAGLE-2 style, or a
    state's static tree) from a small causal LM ``model`` (e.g. :func:`perturbed_copy` of the
    target, which agrees with it often but not always) by a full forward over every frontier node's
    context (history + path) in each level, without any draft KV to manage. It keeps no state between
    steps, so it isolates the runtime's tree contract (verify mask, KV commit, emission) from a
    drafter's own caching. CPU only.

    Args:
        model: ``LlamaModel`` with the target's vocabulary (its cache is used as scratch).
        max_rows: scratch rows for one level's forward (B × frontier nodes).
    """

    name = "eagle"
    hidden_layers = ()
    supports_probabilistic = True
    supports_tree = True
    capturable = False
    prefill_row_index = False

    def __init__(self, model: LlamaModel, max_rows: int = 1 << 15) -> None:
        self.model = model
        self.max_rows = int(max_rows)
        self.max_len = 0

    def setup(self, max_batch_size: int, max_seq_len: int, device) -> None:
        self.max_len = int(max_seq_len)

    def prefill(self, batch, chunk) -> None:
        """Nothing to absorb: every step re-reads the history."""

    def commit(self, batch, step) -> None:
        """Stateless."""

    @torch.inference_mode()
    def _level_logits(self, batch, path_tokens: torch.Tensor) -> torch.Tensor:
        """Draft logits ``[B, F, V]`` after each row's history followed by ``path_tokens [B, F, d]``."""
        b, f, d = path_tokens.shape
        lens = batch.seq_lens[:b]  # [B]
        width = int(lens.max()) + d
        rows = b * f
        self.model.setup_cache(min(self.max_rows, max(rows, 1)), max(self.max_len, width + 1))
        hist = batch.tokens[:b, :width]  # [B, S]
        col = torch.arange(width).view(1, width)
        ids = hist.unsqueeze(1).expand(b, f, width).clone()  # [B, F, S]
        for j in range(d):  # place the path right after each row's history
            at = (lens + j).view(b, 1, 1).expand(b, f, 1)
            ids.scatter_(2, at, path_tokens[:, :, j:j + 1])
        ids = ids.reshape(rows, width)
        last = (lens + d - 1).repeat_interleave(f).view(rows, 1)
        out = []
        for r0 in range(0, rows, self.max_rows):  # chunks of the scratch cache
            r1 = min(rows, r0 + self.max_rows)
            pos = col.expand(r1 - r0, width)
            logits, _ = self.model.forward(ids[r0:r1], pos, logits_at=last[r0:r1])
            out.append(logits[:, 0])
        return torch.cat(out).view(b, f, -1).float()

    @torch.inference_mode()
    def propose(self, batch, num_steps: int, sampling):
        """A chain: the tree with one child per node."""
        from specc.methods.base import StaticTree, TreeRequest
        from specc.compiler.trees import chain_choices, compile_tree

        tree = StaticTree.from_buffers(compile_tree(chain_choices(num_steps)), batch.tokens.device)
        prop = self.propose_tree(batch, TreeRequest(num_steps, 1, num_steps, tree), sampling)
        prop.parents = prop.depths = None
        return prop

    @torch.inference_mode()
    def propose_tree(self, batch, tree, sampling):
        from specc.methods.base import Proposal
        from specc.kernels import process_logits

        b = batch.batch_size
        st = tree.static
        probabilistic = sampling.mode == "probabilistic"
        if st is None:
            if probabilistic:
                raise ValueError("dynamic trees draft greedily")
            return self._dynamic(batch, tree)
        n = st.num_nodes
        tokens = torch.zeros(b, n + 1, dtype=torch.int64)
        path_p = torch.ones(b, n + 1)
        probs = torch.zeros(b, n, self.model.config.vocab_size) if probabilistic else None
        parent_of = torch.cat([torch.zeros(1, dtype=torch.int64), st.parents])
        rank_of = torch.cat([torch.zeros(1, dtype=torch.int64), st.ranks])
        anc = st.mask  # [W, W]
        for d, frontier in enumerate(st.expand):
            f = frontier.numel()
            # the path of each frontier node: its ancestors' tokens at depths 1..d, in depth order
            path = torch.zeros(b, f, d, dtype=torch.int64)
            for i, node in enumerate(frontier.tolist()):
                chain = [j for j in range(1, n + 1) if bool(anc[node, j])]  # ancestors + itself, depth order
                chain.sort(key=lambda j: int(st.depths[j]))
                for k, j in enumerate(chain):
                    path[:, i, k] = tokens[:, j]
            logits = self._level_logits(batch, path)  # [B, F, V]
            if probabilistic:
                q = process_logits(logits.reshape(b * f, 1, -1), batch.temperature[:b].repeat_interleave(f),
                                   batch.top_k[:b].repeat_interleave(f), batch.top_p[:b].repeat_interleave(f))
                q = q[:, 0].view(b, f, -1)
                cand = torch.div(q, sampling.exp_noise[:b][:, frontier]).topk(st.topk, dim=-1).indices
                probs[:, frontier] = q
            else:
                q = torch.softmax(logits, dim=-1)
                cand = logits.topk(st.topk, dim=-1).indices
            slot = torch.full((n + 1,), -1, dtype=torch.int64)
            slot[frontier] = torch.arange(f)
            children = torch.nonzero(st.depths == d + 1).view(-1)
            if children.numel() == 0:
                continue
            ps = slot[parent_of[children]]
            picked = cand[:, ps, rank_of[children]]
            tokens[:, children] = picked
            path_p[:, children] = path_p[:, parent_of[children]] * q[:, ps].gather(2, picked.unsqueeze(-1)).squeeze(-1)
        return Proposal(tokens=tokens[:, 1:], num_valid=torch.full((b,), n, dtype=torch.int64), probs=probs,
                        confidence=path_p[:, 1:], parents=st.parents.expand(b, n), depths=st.depths[1:].expand(b, n))

    def _dynamic(self, batch, tree):
        """SGLang's EAGLE tree over this model's log-probabilities (see ``specc.methods.eagle.drafter``)."""
        from specc.methods.base import Proposal

        b, k, steps, n = batch.batch_size, tree.topk, tree.num_steps, tree.num_nodes
        lp = torch.log_softmax(self._level_logits(batch, torch.zeros(b, 1, 0, dtype=torch.int64))[:, 0], -1)
        score, tok = lp.topk(k, dim=-1)
        pool_s, pool_t = [score], [tok]
        pool_par, pool_d = [torch.full((b, k), -1, dtype=torch.int64)], [torch.ones(b, k, dtype=torch.int64)]
        beam_s, beam_pool = score, torch.arange(k).expand(b, k)
        beam_path = tok.unsqueeze(-1)  # [B, k, depth]
        off = k
        for i in range(1, steps):
            lp = torch.log_softmax(self._level_logits(batch, beam_path), -1)  # [B, k, V]
            cs, ct = lp.topk(k, dim=-1)
            cum = (beam_s.unsqueeze(-1) + cs).reshape(b, k * k)
            ctok = ct.reshape(b, k * k)
            pool_s.append(cum)
            pool_t.append(ctok)
            pool_par.append(beam_pool.unsqueeze(-1).expand(b, k, k).reshape(b, k * k))
            pool_d.append(torch.full((b, k * k), i + 1, dtype=torch.int64))
            beam_s, top = cum.topk(k, dim=-1)
            parent_r = top // k
            beam_path = torch.cat([beam_path.gather(1, parent_r.unsqueeze(-1).expand(b, k, i)),
                                   ctok.gather(1, top).unsqueeze(-1)], dim=2)
            beam_pool = off + top
            off += k * k
        scores = torch.cat(pool_s, 1)
        order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :n]
        par_pool = torch.cat(pool_par, 1).gather(1, order)
        rank = torch.full(scores.shape, -1, dtype=torch.int64)
        rank.scatter_(1, order, torch.arange(n).expand(b, n).contiguous())
        parents = torch.where(par_pool < 0, torch.zeros_like(par_pool), rank.gather(1, par_pool.clamp(min=0)) + 1)
        return Proposal(tokens=torch.cat(pool_t, 1).gather(1, order), num_valid=torch.full((b,), n, dtype=torch.int64),
                        confidence=scores.gather(1, order).exp(), parents=parents,
                        depths=torch.cat(pool_d, 1).gather(1, order))


def shortcut_tree_rejection(draft_tokens: torch.Tensor, parents: torch.Tensor, target_probs: torch.Tensor,
                            draft_probs, uniforms: torch.Tensor, exp_noise: torch.Tensor, num_valid=None,
                            *, backend: str = "torch"):
    """A WRONG tree verify rule, kept to show what :func:`specc.kernels.tree.tree_rejection_verify`
    buys (tests and ``tools/bench_tree_distribution.py``): each child x of the current node is
    accepted with probability min(1, p(x) / q(x)) against the node's *original* p ("top-k drafts with
    q treated as 1" for greedy drafts: probability p(x)), never the residual left by its rejected
    siblings; when all are rejected the bonus comes from p with the tried siblings removed,
    renormalised. With one child per node this is the exact chain rule; with several it over-samples
    the later siblings' complement. Same signature and result type as the exact rule."""
    from specc.kernels.tree_common import _path_outputs

    b, n = draft_tokens.shape
    vocab = target_probs.shape[-1]
    rows = torch.arange(b)
    valid_n = torch.full((b,), n) if num_valid is None else num_valid.to(torch.int64)
    cur = torch.zeros(b, dtype=torch.int64)
    accepted = torch.zeros(b, dtype=torch.int64)
    path = torch.full((b, n + 1), -1, dtype=torch.int64)
    path[:, 0] = 0
    finished = torch.zeros(b, dtype=torch.bool)
    tried = torch.zeros(b, n, dtype=torch.bool)
    removed = torch.zeros(b, vocab, dtype=torch.bool)  # siblings tried at the current node
    idx = torch.arange(n).view(1, n)
    valid = (idx < valid_n.view(b, 1)) & (draft_tokens >= 0) & (draft_tokens < vocab)
    for _ in range(n + 1 if n else 0):
        cand = (parents == cur.view(b, 1)) & valid & ~tried
        has = cand.any(1) & ~finished
        finished = finished | ~has
        j = cand.to(torch.int32).argmax(1).to(torch.int64)
        x = draft_tokens[rows, j].clamp(0, vocab - 1)
        px = target_probs[rows, cur, x]
        qx = torch.ones_like(px) if draft_probs is None else draft_probs[rows, cur.clamp(max=n - 1), x]
        accept = has & (uniforms[rows, j] * qx < px)
        tried[rows, j] |= has
        removed[rows, x] |= has & ~accept
        cur = torch.where(accept, j + 1, cur)
        accepted = accepted + accept.to(torch.int64)
        path[rows, accepted] = torch.where(accept, cur, path[rows, accepted])
        removed = removed & ~accept.view(b, 1)
    p_cur = target_probs[rows, cur]
    w = torch.where(removed, torch.zeros_like(p_cur), p_cur)
    w = torch.where(w.amax(1, keepdim=True) > 0, w, p_cur)
    return _path_outputs(path, accepted, draft_tokens, torch.div(w, exp_noise).argmax(-1))


# ------------------------------------------------------------------ host reads
HOST_READ_METHODS = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")
"""``torch.Tensor`` methods that hand a tensor's values to the host (:func:`count_host_reads`)."""


class HostReads:
    """What :func:`count_host_reads` saw: ``calls``, a list of ``(method, "file:line")`` of each
    device->host conversion, attributed to the nearest ``specc`` frame that made it. ``count`` is
    their number; :meth:`by_site` groups them."""

    def __init__(self) -> None:
        self.calls: List[tuple] = []
        self.active = True

    @property
    def count(self) -> int:
        return len(self.calls)

    def by_site(self) -> dict:
        out: dict = {}
        for method, site in self.calls:
            out[f"{method} @ {site}"] = out.get(f"{method} @ {site}", 0) + 1
        return out


def _caller_site(ignore: Sequence[str]) -> Optional[str]:
    """``"path:line"`` of the innermost frame in ``specc`` (not this module), or None when the call
    came from a place ``ignore`` names: a package-relative path prefix (``"specc/models/llama.py"``)
    or ``"path::function"`` (``"specc/methods/eagle/model.py::_lin"``)."""
    import sys

    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename.replace("\\", "/")
        if "/specc/" in name and not name.endswith("specc/runtime/testing.py"):
            rel = name[name.rindex("/specc/") + 1:]
            func = f"{rel}::{f.f_code.co_name}"
            if any(func == p if "::" in p else rel.startswith(p) for p in ignore):
                return None
            return f"{rel}:{f.f_lineno}"
        f = f.f_back
    return None


CPU_FAST_PATHS = ("specc/models/llama.py", "specc/models/qweights.py", "specc/methods/eagle/model.py::_lin")
"""Where the models' CPU-only fast paths hand activations to numpy (``LlamaModel``'s forward on the
CPU, the quantized GEMMs, the draft heads' small linear layers): host code by construction, never run
on a device, so :func:`count_host_reads` callers pass them as ``ignore`` to count the step's own I/O.
(The target forward's device path reads nothing; the CPU one also reads its ragged shape.)"""


class count_host_reads:
    """Context manager counting the device->host conversions the code inside it makes.

    Patches ``torch.Tensor.item / tolist / cpu / numpy``, the implicit reads ``int(t)``,
    ``float(t)``, ``bool(t)``, ``operator.index(t)`` (``__int__`` ... ``__index__``), ``Tensor.to``
    with a CPU destination from a non-CPU tensor, and ``torch.cuda.synchronize``. On CUDA each such
    call on a device tensor is a device->host transfer (a synchronisation); on the CPU every tensor is
    already on the host, so the calls themselves are counted (what the same code would read on a
    device). Only calls made (directly or through ``torch``) by a frame of ``specc`` are counted, and
    none from files under ``ignore`` (package-relative path prefixes, e.g. the target model's CPU
    fast path ``"specc/models/llama.py"``, which converts activations to numpy and is not part of
    the step's own I/O). Nested reads (``tolist`` calling ``__index__``) count once.

    Yields a :class:`HostReads`. Not thread-safe (patches the class for the duration).
    """

    def __init__(self, ignore: Sequence[str] = ()) -> None:
        self.ignore = tuple(ignore)
        self.reads = HostReads()
        self._saved: List[tuple] = []
        self._depth = 0

    def _wrap(self, name: str, fn):
        counter = self

        def wrapped(*args, **kwargs):
            if counter._depth == 0 and counter.reads.active:
                site = _caller_site(counter.ignore)
                if site is not None:
                    counter.reads.calls.append((name, site))
            counter._depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                counter._depth -= 1
        wrapped.__name__ = getattr(fn, "__name__", name)
        return wrapped

    def _wrap_to(self, fn):
        counter = self

        def to(t, *args, **kwargs):
            dest = kwargs.get("device")
            if dest is None and args and isinstance(args[0], (str, torch.device)):
                dest = args[0]
            if (dest is not None and torch.device(dest).type == "cpu" and t.device.type != "cpu"
                    and counter._depth == 0 and counter.reads.active):
                site = _caller_site(counter.ignore)
                if site is not None:
                    counter.reads.calls.append(("to(cpu)", site))
            counter._depth += 1
            try:
                return fn(t, *args, **kwargs)
            finally:
                counter._depth -= 1
        return to

    def __enter__(self) -> HostReads:
        for name in HOST_READ_METHODS:
            orig = getattr(torch.Tensor, name)
            self._saved.append((torch.Tensor, name, orig))
            setattr(torch.Tensor, name, self._wrap(name, orig))
        self._saved.append((torch.Tensor, "to", torch.Tensor.to))
        torch.Tensor.to = self._wrap_to(torch.Tensor.to)
        self._saved.append((torch.cuda, "synchronize", torch.cuda.synchronize))
        torch.cuda.synchronize = self._wrap("synchronize", torch.cuda.synchronize)
        return self.reads

    def __exit__(self, *exc) -> None:
        for owner, name, orig in reversed(self._saved):
            setattr(owner, name, orig)
        self._saved.clear()
