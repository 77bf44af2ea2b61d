"""Frozen-KV MTP drafting behind the runtime's drafter protocol: the assistant of
:mod:`specc.methods.frozen_kv_mtp.model`, which owns no KV cache and reads the target's.

Per decode step (SGLang's ``FROZEN_KV_MTP`` worker; vLLM's ``Gemma4Proposer``):

* **draft**: κ assistant passes, one token each, every one at the same position — the last slot the
  target wrote (the last committed position ``p``; SGLang ``set_frozen_kv_positions``: "Rope phase =
  last written target slot, not advanced per draft step") — attending to the target's cached K/V of
  one layer at slots ``<= p``, read only. Pass 1 reads (the pending bonus token, the target's final-norm
  hidden at ``p``); pass ``i`` reads (draft ``i - 1``, pass ``i - 1``'s output).
* **extend**: no forward. The target's hidden state at the last accepted position is kept as the next
  step's seed (SGLang's frozen ``_draft_extend_for_decode``: "Frozen 'draft extend': no forward. Pull
  the last accepted token's target hidden from the verify output and stash it as the next-iter seed").

Counted per step: κ draft passes, no draft-extend pass, no draft KV allocated (:meth:`draft_kv_bytes`
is 0). Chains only.
"""
from __future__ import annotations

from typing import Any, List, Optional

import torch

from specc.methods.base import BatchView, Drafter, DraftSampling, PrefillChunk, Proposal, VerifyStep
from specc.errors import CheckpointError, PlanError
from specc.methods.frozen_kv_mtp.model import FrozenKVAssistant


class FrozenKVDrafter(Drafter):
    """``method.name: frozen_kv_mtp`` with a loaded :class:`FrozenKVAssistant`.

    Args:
        model: the assistant, bound to the target's embedding and LM head.
        target: the target (:class:`specc.models.llama.LlamaModel`), whose layer ``model.cfg.kv_layer``'s
            KV cache the assistant reads (looked up at every pass: the runtime sets the cache up).
    """

    name = "frozen_kv_mtp"
    supports_probabilistic = True
    capturable = False
    supports_tree = False

    def __init__(self, model: FrozenKVAssistant, target) -> None:
        self.model = model.prepare_inference()
        self._attn = target.layers[model.cfg.kv_layer].attn
        self._final_norm = target.norm
        self.hidden_layers = (int(target.config.num_layers) - 1,)
        self.forward_passes = 0
        self.h_last: Optional[torch.Tensor] = None
        self.last_pos: Optional[torch.Tensor] = None

    def setup(self, max_batch_size: int, max_seq_len: int, device: torch.device) -> None:
        """Per row: the seed hidden state ``[B, H_t]`` and its position. No KV cache."""
        self.model.to(device)
        self.h_last = torch.zeros(max_batch_size, self.model.cfg.backbone_hidden_size, device=device)
        self.last_pos = torch.zeros(max_batch_size, dtype=torch.int64, device=device)
        #: host mirror of ``last_pos`` (from the step's host copies; None: unknown, read the device)
        self.host_last_pos: Optional[List[int]] = [0] * max_batch_size
        self.first_token = torch.zeros(max_batch_size, dtype=torch.int64, device=device)  # after prefill (seeds)

    def draft_kv_bytes(self) -> int:
        """Zero: the assistant reads the target's KV and allocates none."""
        return 0

    def _seed(self, hidden, index: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, B: int) -> None:
        """Keep, for ``rows``, the final-norm target hidden state ``hidden[0] [B, N, H]`` at column
        ``index [B]`` and its position."""
        idx = torch.arange(B, device=index.device)
        index = index.clamp(0, hidden[0].shape[1] - 1)
        h = self._final_norm(hidden[0][idx, index]).float()  # [B, H]
        self.h_last[:B] = torch.where(rows.view(B, 1), h, self.h_last[:B])
        self.last_pos[:B] = torch.where(rows, positions[idx, index], self.last_pos[:B])

    @torch.inference_mode()
    def prefill(self, batch: BatchView, chunk: PrefillChunk) -> None:
        """No forward: the seed is the target's hidden state at each new row's last prompt position."""
        B = chunk.input_ids.shape[0]
        plen = batch.prompt_lens[:B]
        self._seed(chunk.target_hidden, (plen - 1).clamp(min=0), chunk.positions, chunk.rows, B)
        if self.host_last_pos is not None:  # prefill reads its rows' positions back (not a decode step)
            self.host_last_pos = self.last_pos.tolist()
        first = batch.tokens[:B].gather(1, plen.clamp(max=batch.tokens.shape[1] - 1).view(B, 1)).view(B)
        self.first_token[:B] = torch.where(chunk.rows, first, self.first_token[:B])

    def _kv(self, B: int, span: int):
        """The target layer's cached ``keys, values [B, n_kv, span, d]`` (views, read only)."""
        return self._attn.k_cache[:B, :, :span], self._attn.v_cache[:B, :, :span]

    @torch.inference_mode()
    def propose(self, batch: BatchView, num_steps: int, sampling: DraftSampling) -> Proposal:
        """κ = ``num_steps`` drafts, one assistant pass each at the last written position (module
        docstring): ``tokens [B, κ]``, ``probs [B, κ, V]`` for probabilistic drafts (the processed q of
        each pass, zero outside a draft vocabulary), ``confidence [B, κ]`` (top draft probability)."""
        from specc.kernels import process_logits

        m = self.model
        B = batch.batch_size
        dev = batch.tokens.device
        pos = self.last_pos[:B].clamp(max=batch.trash_slot - 1).view(B, 1)  # [B, 1] fixed rope phase
        hi = (max(min(p, batch.trash_slot - 1) for p in self.host_last_pos[:B]) if B else 0) \
            if self.host_last_pos is not None else int(pos.max())  # the host mirror: no device read
        keys, values = self._kv(B, hi + 1)
        tok = batch.tokens[:B].gather(1, (pos + 1).clamp(max=batch.tokens.shape[1] - 1))  # [B, 1] pending token
        hidden = self.h_last[:B].unsqueeze(1)  # [B, 1, H_t]
        probabilistic = sampling.mode == "probabilistic"
        toks, probs, conf = [], [], []
        for i in range(num_steps):
            hidden = m(tok, hidden, pos, keys, values)  # [B, 1, H_t]
            self.forward_passes += 1
            logits = m.draft_logits(hidden)  # [B, 1, Vd]
            conf.append(torch.softmax(logits[:, 0].float(), dim=-1).amax(dim=-1))
            if probabilistic:
                q = process_logits(logits, batch.temperature[:B], batch.top_k[:B], batch.top_p[:B])[:, 0]  # [B, Vd]
                d = torch.div(q, sampling.exp_noise[:B, i, : q.shape[-1]]).argmax(dim=-1)
                probs.append(m.target_probs(q))
            else:
                d = logits[:, 0].argmax(dim=-1)
            t = m.draft_to_target(d)  # [B]
            toks.append(t)
            tok = t.view(B, 1)
        return Proposal(tokens=torch.stack(toks, dim=1), num_valid=torch.full((B,), num_steps, dtype=torch.int64, device=dev),
                        probs=torch.stack(probs, dim=1) if probabilistic else None,
                        confidence=torch.stack(conf, dim=1))

    @torch.inference_mode()
    def commit(self, batch: BatchView, step: VerifyStep) -> None:
        """The frozen draft-extend: no forward; keep the target's hidden state at the last accepted
        verify row (position ``s + accepted``) as the next step's seed."""
        B = step.input_ids.shape[0]
        acc = step.accepted.to(step.input_ids.device)
        self._seed(step.target_hidden, acc, step.positions.clamp(max=batch.trash_slot), batch.active[:B], B)
        host, hv = batch.host, step.host
        if self.host_last_pos is None or host is None or hv is None or hv.roots is None:
            self.host_last_pos = None  # not handed the host values: read the device from here on
            return
        W = step.input_ids.shape[1]
        for b in range(B):  # positions[b, j] = min(root_b + j, trash)
            if host.active[b]:
                self.host_last_pos[b] = min(hv.roots[b] + min(int(hv.accepted[b]), W - 1), batch.trash_slot)

    # ------------------------------------------------------------------ disaggregation seed
    @torch.inference_mode()
    def _top1(self, row: int, token: int) -> dict:
        """The first draft at the row's seed (one assistant pass over the target's KV; not counted as
        a decode pass): ``topk_p [1]`` fp32, ``topk_index [1]`` int64 (target id)."""
        pos = self.last_pos[row].view(1, 1)
        keys = self._attn.k_cache[row: row + 1, :, : int(pos) + 1]
        values = self._attn.v_cache[row: row + 1, :, : int(pos) + 1]
        tok = torch.tensor([[int(token)]], dtype=torch.int64, device=pos.device)
        out = self.model(tok, self.h_last[row].view(1, 1, -1), pos, keys, values)
        p, d = torch.softmax(self.model.draft_logits(out)[0, 0].float(), dim=-1).max(dim=-1)
        return {"topk_p": p.view(1), "topk_index": self.model.draft_to_target(d.view(1))}

    def export_seed(self, row: int, prompt_len: int) -> dict:
        """The seed a prefill instance ships for ``row`` (SGLang counts FROZEN_KV_MTP among the methods
        whose seed carries draft hidden states): the target's final-norm hidden
        state at the prompt's last position ``hidden [H_t]``, its position ``last_pos [1]``, and the
        first draft's top-1 ``topk_p [1]``, ``topk_index [1]`` (one assistant pass over the prompt's KV
        from the first generated token). No draft KV: there is none."""
        seed = {"hidden": self.h_last[row].clone(), "last_pos": self.last_pos[row].view(1).clone()}
        seed.update(self._top1(row, int(self.first_token[row])))
        return seed

    def check_seed(self, seed: dict, prompt_len: int) -> str:
        """Why ``seed`` cannot seed this drafter ('' when it can): missing tensors, shapes, dtypes, a
        position that is not the prompt's last."""
        want = {"hidden": ((self.h_last.shape[1],), self.h_last.dtype), "last_pos": ((1,), torch.int64),
                "topk_p": ((1,), torch.float32), "topk_index": ((1,), torch.int64)}
        for name, (shape, dtype) in want.items():
            t = seed.get(name)
            if t is None:
                return f"frozen-KV MTP seed tensor {name!r} is missing"
            if tuple(t.shape) != shape or t.dtype != dtype:
                return f"frozen-KV MTP seed {name} is {tuple(t.shape)} {t.dtype}, this drafter needs {shape} {dtype}"
        extra = sorted(set(seed) - set(want))
        if extra:
            return f"unexpected frozen-KV MTP seed tensors {extra} (the assistant keeps no KV of its own)"
        if int(seed["last_pos"][0]) != prompt_len - 1:
            return f"frozen-KV MTP seed position {int(seed['last_pos'][0])} is not the prompt's last ({prompt_len - 1})"
        return ""

    @torch.inference_mode()
    def import_seed(self, row: int, seed: dict, prompt_len: int, first_token: Optional[int] = None) -> None:
        """Install a shipped seed into ``row`` (the target KV installed first). With ``first_token``
        (the payload's), check the shipped top-1 is the assistant's own first draft over the installed
        KV. Raises ValueError when it is not."""
        dev = self.h_last.device
        self.h_last[row] = seed["hidden"].to(dev)
        self.last_pos[row] = int(seed["last_pos"][0])
        if self.host_last_pos is not None:
            self.host_last_pos[row] = int(seed["last_pos"][0])
        if first_token is not None:
            self.first_token[row] = int(first_token)
            top = self._top1(row, int(first_token))["topk_index"]
            if int(top[0]) != int(seed["topk_index"][0]):
                raise ValueError(f"frozen-KV MTP seed: shipped top-1 {int(seed['topk_index'][0])} is not the assistant's "
                                 f"first draft {int(top[0])} over the installed target KV")


def build_drafter(spec: Any, target: Any, tokenizer: Any = None, device: Any = "cpu",
                  max_seq_len: Optional[int] = None) -> FrozenKVDrafter:
    """Runtime factory of method ``frozen_kv_mtp`` (``specc.methods``): loads the assistant at
    ``draft.path`` (``pkg://`` allowed) bound to ``target``.

    Raises ``PlanError`` without ``draft.path``; ``CheckpointError`` for a checkpoint that is not an
    assistant for this target (see :func:`specc.methods.frozen_kv_mtp.model.load_assistant`)."""
    from specc.methods.frozen_kv_mtp.model import load_assistant
    from specc.models.resolve import resolve_model_path

    draft = spec.get("draft") or {}
    if not draft.get("path"):
        raise PlanError("method.name=frozen_kv_mtp needs draft.path (e.g. the draft preset smollm2_135m_frozen_kv_mtp)")
    path = resolve_model_path(draft["path"])
    if not path.is_dir():
        raise CheckpointError(f"{draft['path']}: an assistant is a directory (config.json + model.safetensors), got {path}")
    model = load_assistant(path, target)
    model.to(device)
    return FrozenKVDrafter(model, target)
