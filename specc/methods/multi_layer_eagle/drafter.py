"""Multi-layer EAGLE drafting behind the runtime's drafter protocol: one MTP module per draft step
(:mod:`specc.methods.multi_layer_eagle.model`; SGLang's ``MultiLayerEagleDraftWorker.draft_runners``), chains
only (SGLang asserts ``num_draft_tokens == num_steps + 1``, multi_layer_eagle_worker_v2.py:150).

Module ``k`` reads (target final-norm hidden at ``j``, token at ``j + k + 1``) at position ``j`` and keeps
its own KV cache, written by position. Per decode step:

* **extend** (after verify): module 0 over the accepted pairs, as an EAGLE head's draft-extend
  (hidden at ``s + j``, token at ``s + j + 1`` for ``j = 0 .. accepted``, the last one the bonus); its
  last output gives draft 1. The step's target hidden states are kept in a small ring per row
  (positions mod ``R``), which the later modules read.
* **draft**: for ``k = 1 .. κ - 1`` one pass of module ``k`` over its window, the positions from the
  first one whose KV is not final yet to the last committed position ``p``; a position's token past
  the pending one is the draft the earlier modules just made (SGLang rotates the input ids by one per
  step and appends the previous step's draft, ``rotate_input_ids``). The output at ``p`` gives draft
  ``k + 1``. Rows whose tokens were all committed are final; the others (up to ``k`` positions) are
  recomputed by module ``k``'s next pass (SGLang's boundary-KV fix widens its draft-extend window by
  ``num_steps - 1`` front rows for the same reason).

SGLang runs all ``num_steps`` runners inside its draft-extend and none in ``draft``; here runner 0 runs
in the extend stage and runners ``1 .. κ - 1`` in the draft stage. The passes are the same (Σ c_i per
step); the split lets κ change between steps and lets probabilistic drafts use the step's own noise.
Counted per step: ``κ - 1`` draft passes and one draft-extend pass.
"""
from __future__ import annotations

from typing import Any, List, Optional

import torch

from specc.methods.base import BatchView, Drafter, DraftSampling, PrefillChunk, Proposal, VerifyStep
from specc.errors import CheckpointError, PlanError
from specc.methods.eagle.model import DraftKVCache
from specc.methods.multi_layer_eagle.model import MultiLayerEagleModel


class MultiLayerEagleDrafter(Drafter):
    """``method.name: multi_layer_eagle`` with a loaded :class:`MultiLayerEagleModel`.

    Args:
        model: the modules, bound to the target's embedding and LM head.
        target_num_layers: the target's decoder layers. target_norm: its final RMSNorm.
        num_modules: modules to run (the plan's κ); at most the checkpoint's.
    Raises:
        CheckpointError: ``num_modules`` exceeds the checkpoint's modules.
    """

    name = "multi_layer_eagle"
    supports_probabilistic = True
    capturable = False
    supports_tree = False

    def __init__(self, model: MultiLayerEagleModel, target_num_layers: int, target_norm, num_modules: int) -> None:
        n = int(num_modules)
        if not 1 <= n <= model.cfg.num_layers:
            raise CheckpointError(f"method.num_steps={n} needs {n} modules (one per draft step); the multi-layer "
                                  f"checkpoint has {model.cfg.num_layers} (num_nextn_predict_layers)")
        self.model = model.prepare_inference()
        self.num_modules = n
        self.hidden_layers = (int(target_num_layers) - 1,)
        self._final_norm = target_norm
        self.ring = max(16, 4 * n)  # feature positions kept per row (>= any module's window)
        self.forward_passes = 0
        self.caches: List[DraftKVCache] = []

    # ------------------------------------------------------------------ state
    def setup(self, max_batch_size: int, max_seq_len: int, device: torch.device) -> None:
        """One KV cache per module ``[B, kv_heads, max_seq_len, head_dim]``, the feature ring
        ``[B, R, H]``, module 0's last output and position, and each module's last final position."""
        B, H = max_batch_size, self.model.cfg.hidden_size
        self.model.to(device)
        self.caches = [self.model.new_cache(B, max_seq_len, device=device) for _ in range(self.num_modules)]
        self.feats = torch.zeros(B, self.ring, H, device=device)  # [B, R, H] final-norm target hidden by position mod R
        self.g0 = torch.zeros(B, H, device=device)  # module 0's output at each row's last committed position
        self.last_pos = torch.zeros(B, dtype=torch.int64, device=device)
        self.final = torch.full((self.num_modules, B), -1, dtype=torch.int64, device=device)  # last final KV slot
        #: host mirrors of ``last_pos`` and ``final`` (from the step's host copies; None: unknown, read the device)
        self.host_last_pos: Optional[List[int]] = [0] * B
        self.host_final: Optional[List[List[int]]] = [[-1] * B for _ in range(self.num_modules)]

    def _mirrored(self) -> bool:
        return self.host_last_pos is not None and self.host_final is not None

    def _forget(self) -> None:
        """The host mirrors are unknown from here on (a caller without host copies): read the device."""
        self.host_last_pos = self.host_final = None

    @staticmethod
    def _causal_mask(positions: torch.Tensor, highest: int) -> torch.Tensor:
        """The head's default cache mask ``[B, N, S]`` (slot ``j`` visible iff ``j <= position``) over
        ``S = highest + 1`` slots, ``highest`` = ``positions.max()`` known on the host."""
        keys = torch.arange(highest + 1, device=positions.device)
        return keys.view(1, 1, -1) <= positions.unsqueeze(-1)

    def draft_kv_bytes(self) -> int:
        """Bytes of the modules' KV caches (every module, K and V)."""
        return sum(c.k.nbytes + c.v.nbytes for c in self.caches)

    def _features(self, hidden) -> torch.Tensor:
        return self._final_norm(hidden[0]).float()  # [B, N, H]

    def _store(self, feats: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor) -> None:
        """Write ``feats [B, N, H]`` at ``positions [B, N]`` (mod R) where ``keep [B, N]`` (unique mod R)."""
        b, n = keep.nonzero(as_tuple=True)
        self.feats[b, positions[b, n] % self.ring] = feats[b, n]

    def _module0(self, tokens, feats, positions, slots, last_index, rows, B: int, attn_mask=None) -> None:
        """Module 0 over pairs ``[B, N]``; for ``rows``: keep its output and position at ``last_index``
        (``attn_mask``: the cache mask when the caller knows its span)."""
        g = self.model.module(0, tokens, feats, positions, cache=self.caches[0], cache_slots=slots,
                              attn_mask=attn_mask)  # [B, N, H]
        self.forward_passes += 1
        idx = torch.arange(B, device=tokens.device)
        last_index = last_index.clamp(0, tokens.shape[1] - 1)
        self.g0[:B] = torch.where(rows.view(B, 1), g[idx, last_index], self.g0[:B])
        self.last_pos[:B] = torch.where(rows, positions[idx, last_index], self.last_pos[:B])

    # ------------------------------------------------------------------ protocol
    @torch.inference_mode()
    def prefill(self, batch: BatchView, chunk: PrefillChunk) -> None:
        """Every module over the new rows' prompts: module ``k``'s pairs (hidden at ``p``, token at
        ``p + k + 1``) for the positions whose token is known (the first generated token included);
        the prompt's last ``R`` features into the ring."""
        B, N = chunk.input_ids.shape
        dev = chunk.input_ids.device
        plen = batch.prompt_lens[:B]
        feats = self._features(chunk.target_hidden)
        pos = chunk.positions
        col = torch.arange(N, device=dev).view(1, N)
        valid = chunk.rows.view(B, 1) & (col < plen.view(B, 1))
        trash = torch.full_like(pos, batch.trash_slot)
        nxt = batch.tokens[:B].gather(1, (pos + 1).clamp(max=batch.tokens.shape[1] - 1))
        self._module0(nxt, feats, pos, torch.where(valid, pos, trash), (plen - 1).clamp(min=0), chunk.rows, B)
        self._store(feats, pos, valid & (pos >= (plen - self.ring).view(B, 1)))
        for k in range(1, self.num_modules):
            known = valid & (pos <= (plen - k - 1).view(B, 1))
            toks = batch.tokens[:B].gather(1, (pos + k + 1).clamp(max=batch.tokens.shape[1] - 1))
            self.model.module(k, toks, feats, pos, cache=self.caches[k], cache_slots=torch.where(known, pos, trash))
            self.forward_passes += 1
            self.final[k, :B] = torch.where(chunk.rows, plen - k - 1, self.final[k, :B])
        if self._mirrored():  # prefill reads its rows' state back (not a decode step)
            self.host_last_pos = self.last_pos.tolist()
            self.host_final = self.final.tolist()

    def _choose(self, logits, batch: BatchView, sampling: DraftSampling, i: int):
        """Draft ``i`` from module logits ``[B, Vd]``: ``(target ids [B], q over the target vocabulary
        [B, V] or None, top draft probability [B])``."""
        from specc.kernels import process_logits

        m, B = self.model, logits.shape[0]
        conf = torch.softmax(logits.float(), dim=-1).amax(dim=-1)
        if sampling.mode != "probabilistic":
            return m.draft_to_target(logits.argmax(dim=-1)), None, conf
        q = process_logits(logits.view(B, 1, -1), batch.temperature[:B], batch.top_k[:B], batch.top_p[:B])[:, 0]
        d = torch.div(q, sampling.exp_noise[:B, i, : q.shape[-1]]).argmax(dim=-1)  # exponential race
        return m.draft_to_target(d), m.target_probs(q), conf

    @torch.inference_mode()
    def propose(self, batch: BatchView, num_steps: int, sampling: DraftSampling) -> Proposal:
        """κ = ``num_steps`` drafts: draft 1 from module 0's last output, draft ``k + 1`` from one pass of
        module ``k`` over its window (module docstring). Returns ``tokens [B, κ]``, ``probs [B, κ, V]``
        for probabilistic drafts, ``confidence [B, κ]``.

        Raises: PlanError when κ exceeds the modules loaded."""
        if num_steps > self.num_modules:
            raise PlanError(f"κ = {num_steps} needs {num_steps} modules; this drafter runs {self.num_modules}")
        B = batch.batch_size
        dev = batch.tokens.device
        active = batch.active[:B]
        last = self.last_pos[:B]  # [B] last committed position p
        pending = last + 1  # the pending (bonus) token's position
        S = batch.tokens.shape[1]
        tok, q, conf = self._choose(self.model.draft_logits(self.g0[:B]), batch, sampling, 0)
        toks, probs, confs = [tok], [q], [conf]
        for k in range(1, num_steps):
            lo = torch.maximum(self.final[k, :B] + 1, last - self.ring + 1).clamp(min=0)
            lo = torch.where(active, torch.minimum(lo, last), last)  # [B] window start
            width = self._width(batch, k, B) if self._mirrored() and batch.host is not None \
                else int((last - lo).max()) + 1
            j = lo.view(B, 1) + torch.arange(width, device=dev).view(1, width)  # [B, w] positions
            real = active.view(B, 1) & (j <= last.view(B, 1))
            j = torch.minimum(j, last.view(B, 1))
            at = j + k + 1  # the token each pair reads: committed up to `pending`, then drafts 1..k
            drafted = torch.stack(toks, dim=1)  # [B, k]
            from_draft = drafted.gather(1, (at - pending.view(B, 1) - 1).clamp(0, k - 1))
            hist = batch.tokens[:B].gather(1, at.clamp(max=S - 1))
            t = torch.where(at > pending.view(B, 1), from_draft, hist)
            f = self.feats[:B].gather(1, (j % self.ring).unsqueeze(-1).expand(B, width, self.feats.shape[-1]))
            slots = torch.where(real, j, torch.full_like(j, batch.trash_slot))
            mask = (self._causal_mask(j, max(self.host_last_pos[:B]))
                    if self._mirrored() and batch.host is not None and B else None)  # max j = max last
            out = self.model.module(k, t, f, j, cache=self.caches[k], cache_slots=slots, attn_mask=mask)  # [B, w, H]
            self.forward_passes += 1
            g = out[torch.arange(B, device=dev), (last - lo).clamp(min=0, max=width - 1)]  # [B, H] at p
            tok, q, conf = self._choose(self.model.draft_logits(g), batch, sampling, k)
            toks.append(tok)
            probs.append(q)
            confs.append(conf)
            self.final[k, :B] = torch.where(active, last - k, self.final[k, :B])
            if self._mirrored() and batch.host is not None:
                for b in range(B):
                    if batch.host.active[b]:
                        self.host_final[k][b] = self.host_last_pos[b] - k
            else:
                self._forget()
        probabilistic = sampling.mode == "probabilistic"
        return Proposal(tokens=torch.stack(toks, dim=1), num_valid=torch.full((B,), num_steps, dtype=torch.int64, device=dev),
                        probs=torch.stack(probs, dim=1) if probabilistic else None, confidence=torch.stack(confs, dim=1))

    @torch.inference_mode()
    def commit(self, batch: BatchView, step: VerifyStep) -> None:
        """The extend stage: module 0 over the committed verify rows ``j = 0 .. accepted`` (hidden at
        ``s + j``, token at ``s + j + 1``: the accepted drafts, then the bonus); their features into the ring."""
        B, W = step.input_ids.shape
        dev = step.input_ids.device
        acc = step.accepted.to(dev)
        col = torch.arange(W, device=dev).view(1, W)
        nxt = torch.zeros_like(step.input_ids)
        nxt[:, : W - 1] = step.input_ids[:, 1:]
        nxt = torch.where(col == acc.view(B, 1), step.bonus.view(B, 1).to(nxt.dtype), nxt)
        active = batch.active[:B]
        keep = active.view(B, 1) & (col <= acc.view(B, 1)) & (step.cache_slots != batch.trash_slot)
        slots = torch.where(keep, step.positions, torch.full_like(step.positions, batch.trash_slot))
        feats = self._features(step.target_hidden)
        positions = step.positions.clamp(max=batch.trash_slot)
        host, hv, trash = batch.host, step.host, batch.trash_slot
        if not self._mirrored() or host is None or hv is None or hv.roots is None:
            self._forget()
            self._module0(nxt, feats, positions, slots, acc, active, B)
        else:  # positions[b, j] = min(root_b + j, trash): the span and the new last positions on the host
            highest = max(min(r + W - 1, trash) for r in hv.roots[:B]) if B else 0
            self._module0(nxt, feats, positions, slots, acc, active, B,
                          attn_mask=self._causal_mask(positions, highest))
            for b in range(B):
                if host.active[b]:
                    self.host_last_pos[b] = min(hv.roots[b] + min(int(hv.accepted[b]), W - 1), trash)
        self._store(feats, positions, keep)

    def _width(self, batch: BatchView, k: int, B: int) -> int:
        """Module ``k``'s window width ``max(last - lo) + 1`` from the host mirrors (as ``propose``
        computes ``lo`` on the device)."""
        widest = 0
        for b in range(B):
            last = self.host_last_pos[b]
            if batch.host.active[b]:
                lo = max(self.host_final[k][b] + 1, last - self.ring + 1, 0)
                lo = min(lo, last)
            else:
                lo = last
            widest = max(widest, last - lo)
        return widest + 1

    # ------------------------------------------------------------------ disaggregation seed
    @torch.inference_mode()
    def export_seed(self, row: int, prompt_len: int) -> dict:
        """The seed a prefill instance ships for ``row`` (SGLang ships the draft KV pool of every
        runner with the draft hidden state and top-k, eagle_disaggregation.py):
        each module's KV over the prompt ``draft_k.{k}``/``draft_v.{k}`` ``[kv_heads, P, head_dim]``,
        module 0's output ``hidden [H]``, ``last_pos [1]`` (= P - 1), each module's last final position
        ``final [n]``, the target's final-norm hidden states at the prompt's last ``min(P, R)`` positions
        ``features [min(P, R), H]`` (the later modules' windows read them), and module 0's top-1
        ``topk_p [1]``, ``topk_index [1]`` (draft 1; the later drafts come from the decode side's
        first draft passes, which read the shipped KV and features)."""
        P = prompt_len
        keep = min(P, self.ring)
        positions = torch.arange(P - keep, P, device=self.feats.device)
        seed = {f"draft_{n}.{k}": (c.k if n == "k" else c.v)[row, :, :P].clone()
                for k, c in enumerate(self.caches) for n in ("k", "v")}
        seed.update({"hidden": self.g0[row].clone(), "last_pos": self.last_pos[row].view(1).clone(),
                     "final": self.final[:, row].clone(), "features": self.feats[row, positions % self.ring].clone()})
        seed.update(self._top1(row))
        return seed

    def _top1(self, row: int) -> dict:
        """Module 0's top-1 at the row's state: ``topk_p [1]`` fp32 and ``topk_index [1]`` (target id)."""
        logits = self.model.draft_logits(self.g0[row].view(1, -1))[0].float()
        p, d = torch.softmax(logits, dim=-1).max(dim=-1)
        return {"topk_p": p.view(1), "topk_index": self.model.draft_to_target(d.view(1))}

    def check_seed(self, seed: dict, prompt_len: int) -> str:
        """Why ``seed`` cannot seed this drafter for a ``prompt_len``-token prompt ('' when it can)."""
        c = self.caches[0].k
        kv, d = c.shape[1], c.shape[3]
        want = {"hidden": ((self.g0.shape[1],), self.g0.dtype), "last_pos": ((1,), torch.int64),
                "final": ((self.num_modules,), torch.int64),
                "features": ((min(prompt_len, self.ring), self.feats.shape[-1]), self.feats.dtype),
                "topk_p": ((1,), torch.float32), "topk_index": ((1,), torch.int64)}
        for k in range(self.num_modules):
            for n in ("k", "v"):
                want[f"draft_{n}.{k}"] = ((kv, prompt_len, d), c.dtype)
        for name, (shape, dtype) in want.items():
            t = seed.get(name)
            if t is None:
                return f"multi-layer EAGLE seed tensor {name!r} is missing (this drafter runs {self.num_modules} modules)"
            if tuple(t.shape) != shape or t.dtype != dtype:
                return f"multi-layer EAGLE seed {name} is {tuple(t.shape)} {t.dtype}, this drafter needs {shape} {dtype}"
        extra = sorted(set(seed) - set(want))
        if extra:
            return f"unexpected multi-layer EAGLE seed tensors {extra}"
        if int(seed["last_pos"][0]) != prompt_len - 1:
            return f"multi-layer EAGLE seed position {int(seed['last_pos'][0])} is not the prompt's last ({prompt_len - 1})"
        return ""

    @torch.inference_mode()
    def import_seed(self, row: int, seed: dict, prompt_len: int, first_token: Optional[int] = None) -> None:
        """Install a shipped seed (:meth:`export_seed`) into ``row`` (``first_token``, the payload's, is
        read from the history at the first draft pass). Raises ValueError when the shipped top-1 is not
        module 0's own top-1 at the shipped hidden state."""
        dev = self.g0.device
        P = prompt_len
        for k, c in enumerate(self.caches):
            c.k[row, :, :P] = seed[f"draft_k.{k}"].to(dev)
            c.v[row, :, :P] = seed[f"draft_v.{k}"].to(dev)
        self.g0[row] = seed["hidden"].to(dev)
        self.last_pos[row] = int(seed["last_pos"][0])
        self.final[:, row] = seed["final"].to(dev)
        if self._mirrored():
            self.host_last_pos[row] = int(seed["last_pos"][0])
            for k, f in enumerate(seed["final"].tolist()):
                self.host_final[k][row] = int(f)
        keep = seed["features"].shape[0]
        positions = torch.arange(P - keep, P, device=dev)
        self.feats[row, positions % self.ring] = seed["features"].to(dev)
        top = self._top1(row)["topk_index"]
        if int(top[0]) != int(seed["topk_index"][0]):
            raise ValueError(f"multi-layer EAGLE seed: shipped top-1 {int(seed['topk_index'][0])} is not module 0's "
                             f"top-1 {int(top[0])} at the shipped hidden state")


def build_drafter(spec: Any, target: Any, tokenizer: Any = None, device: Any = "cpu",
                  max_seq_len: Optional[int] = None) -> MultiLayerEagleDrafter:
    """Runtime factory of method ``multi_layer_eagle`` (``specc.methods``): loads ``draft.path``
    (``pkg://`` allowed) bound to ``target`` and runs its first ``method.num_steps`` modules.

    Raises ``PlanError`` without ``draft.path``; ``CheckpointError`` for a checkpoint that does not fit
    the target or has fewer modules than κ."""
    from specc.methods.multi_layer_eagle.model import load_multi_layer_eagle
    from specc.models.resolve import resolve_model_path

    draft = spec.get("draft") or {}
    if not draft.get("path"):
        raise PlanError("method.name=multi_layer_eagle needs draft.path (e.g. the draft preset "
                        "smollm2_135m_multi_layer_eagle)")
    model = load_multi_layer_eagle(resolve_model_path(draft["path"]), target)
    model.to(device)
    k = (spec.get("method") or {}).get("num_steps") or model.cfg.num_layers
    return MultiLayerEagleDrafter(model, target.config.num_layers, target.norm, int(k))
