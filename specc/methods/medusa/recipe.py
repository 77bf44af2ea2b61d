"""The Medusa drafter kind for the training tool (see :mod:`specc.train.kinds`).

Objective (Cai et al. 2024, "Medusa", Medusa-1: heads trained on a frozen target; our own code): head
k reads the target's final-norm hidden state at position p and is scored with cross-entropy against
the target's token k + 2 positions ahead, i.e. the label of position ``p + k + 1`` (the distillation
data hold, at every position, the token the target emits next), weighted ``head_decay**k`` (the
paper's λ_k = 0.8^k). Only answer positions count. The heads share the target's LM head, frozen (the
shipped layout stores none: vLLM's ``original_lm_head``); their residual blocks start as the identity
(zero weights). As for the EAGLE kind's ``train_vocab``, the training softmax runs over the
``train_vocab`` most frequent answer labels (positions whose label is outside are left out); the full
LM head is used at inference and for the validation agreement.

Medusa is position-wise (no attention), so a batch is simply every answer position of its sequences.
"""
from __future__ import annotations

import pathlib

import torch
import torch.nn.functional as F

from specc.methods.medusa.model import MedusaConfig, MedusaModel
from specc.train.kinds import DrafterKind
from specc.train.vocab import label_counts, top_vocab


class MedusaKind(DrafterKind):
    name = "medusa"
    title = "Medusa"
    options = {"num_heads": 4, "num_layers": 1, "head_decay": 0.8, "train_vocab": 16384}

    def layers(self, target_config, options):
        return (target_config.num_layers - 1,)  # the final-norm output is computed from it

    def unroll_steps(self, options):
        return int(options["num_heads"])  # agreement is reported per head ("draft step" k = head k - 1)

    def build(self, target, options, data, idx):
        cfg = MedusaConfig(num_heads=int(options["num_heads"]), num_layers=int(options["num_layers"]),
                           hidden_size=target.config.hidden_size, vocab_size=target.config.vocab_size,
                           fc_bias=True, shared_lm_head=True)
        model = MedusaModel(cfg, target.lm_head).init_identity()
        size = min(int(options["train_vocab"]), target.config.vocab_size)
        ids, _, _, coverage = top_vocab(label_counts(data, target.config.vocab_size, idx), size)
        self._attach(model, target, ids)
        return model, {"train_vocab": size, "train_label_coverage": round(coverage, 4)}

    def adopt(self, model, target, options):
        """Continue loaded heads: the training softmax runs over the full vocabulary."""
        self._attach(model, target, torch.arange(target.config.vocab_size))

    @staticmethod
    def _attach(model, target, ids: torch.Tensor) -> None:
        emb = target.embed_weight.detach().float()  # [V, H], the tied LM head
        to_train = torch.full((target.config.vocab_size,), -100, dtype=torch.long)
        to_train[ids] = torch.arange(ids.numel())
        model.train_state = {"layer": target.config.num_layers - 1, "final_norm_w": target.norm.weight.detach().float(),
                             "eps": float(target.config.rms_norm_eps), "head": emb, "train_ids": ids,
                             "train_head": emb[ids].contiguous(), "to_train": to_train}

    def collate(self, model, data, idx, options, device) -> dict:
        """Every answer position of sequences ``idx``: ``h [N, H]`` the target's final-norm hidden
        state (fp32) and ``labels [N, K]`` (head k: the label of position ``p + k + 1``, -100 past the
        sequence)."""
        tr = model.train_state
        k = int(options["num_heads"])
        hs, labs = [], []
        for i in idx:
            _, lab, f = data.seq(i)
            start = max(0, int(data.prompt_len[i]) - 1)
            n = lab.shape[0]
            if start >= n:
                continue
            hs.append(f[tr["layer"]][start:])
            y = torch.full((n - start, k), -100, dtype=torch.long)
            for kk in range(k):
                src = torch.arange(start + kk + 1, n + kk + 1)
                ok = src < n
                vals = lab[src.clamp(max=n - 1)].long()
                y[:, kk] = torch.where(ok & (vals >= 0), vals, torch.full_like(vals, -100))
            labs.append(y)
        if not hs:
            h = torch.zeros(0, model.cfg.hidden_size)
            y = torch.zeros(0, k, dtype=torch.long)
        else:
            h, y = torch.cat(hs).to(device).float(), torch.cat(labs).to(device)
        w = tr["final_norm_w"].to(device)
        h = w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + tr["eps"]))
        return {"h": h, "labels": y}

    def loss(self, model, batch, options, train: bool):
        tr = model.train_state
        h, labels = batch["h"], batch["labels"]
        total = h.new_zeros(())
        hits, counts = [], []
        head = tr["train_head"] if train else tr["head"]
        for kk in range(model.cfg.num_heads):
            z = model.blocks[kk](h)  # [N, H]
            logits = F.linear(z, head)  # [N, Vt] (validation: the full vocabulary)
            y = labels[:, kk]
            yt = torch.where(y >= 0, tr["to_train"][y.clamp(min=0)], y) if train else y
            ok = yt >= 0
            if ok.any():
                total = total + float(options["head_decay"]) ** kk * F.cross_entropy(logits[ok], yt[ok])
            with torch.no_grad():
                pred = logits.argmax(-1)
                if train:
                    pred = tr["train_ids"][pred]
                valid = y >= 0
                hits.append(int(((pred == y) & valid).sum()))
                counts.append(int(valid.sum()))
        return total, hits, counts

    def save(self, model, directory, target):
        from specc.methods.medusa.model import save_medusa_heads

        save_medusa_heads(model, directory, dtype=torch.float16)

    def load(self, directory, target):
        from specc.methods.medusa.model import load_medusa_heads

        return load_medusa_heads(pathlib.Path(directory), target.config, target.lm_head)
