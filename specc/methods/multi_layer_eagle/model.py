"""Multi-layer EAGLE: one distinct MTP module per draft step (SGLang's ``MultiLayerEagleDraftWorker``,
``draft_runners``: "One runner per draft step (len == speculative_num_steps)";
``multi_layer_eagle_worker_v2.py``), for a Llama-family target.

Each module is one DeepSeek-style MTP layer (:class:`specc.methods.mtp.model.NextNLayer`: ``eh_proj`` over
[norm(embedding); norm(hidden)], one decoder block with its own KV cache, the shared head). Module
``k`` (``k = 0 .. n-1``) reads, at position ``j``, the target's final-norm hidden state at ``j`` and the
token at ``j + k + 1``, and predicts the token at ``j + k + 2``: SGLang's non-chain mode (each step uses
the target model's hidden states; ``chain_mtp_hidden_states`` is off except for Step3p5/Inkling MTP),
with each step's input ids rotated left by one and the previous step's draft appended
(``rotate_input_ids``). So the last committed position ``p``'s output of module ``k`` is draft ``k + 1``.
A module's KV at the positions whose token was still a draft when it ran is recomputed once the
tokens commit (SGLang's boundary-KV fix widens the draft-extend window by ``num_steps - 1`` front rows
for this; ``SGLANG_ENABLE_MTP_BOUNDARY_KV_FIX``).

Checkpoint: the MTP layout of :mod:`specc.methods.mtp.model` with ``num_nextn_predict_layers = n`` (layers
``model.layers.{L} .. model.layers.{L + n - 1}``); a plan's κ uses modules ``0 .. κ - 1``. Resident
weights grow with n (n modules of equal size: n times one module's weights),
and so does the draft cost: a step costs Σ c_i over the modules it runs.
"""
from __future__ import annotations

import pathlib

from specc.methods.mtp.model import MTPConfig, MTPModel, load_mtp, save_mtp


class MultiLayerEagleModel(MTPModel):
    """``cfg.num_layers`` MTP modules, module ``k`` drafting step ``k + 1`` (see the module docstring).
    :meth:`module` runs one of them; the rest of the contract is :class:`specc.methods.mtp.model.MTPModel`'s."""

    def module(self, k: int, tokens, features, positions, cache=None, cache_slots=None, attn_mask=None):
        """Module ``k`` over ``N`` pairs: ``tokens [B, N]`` (the token ``k + 1`` after each position),
        ``features [B, N, H]`` the target's final-norm hidden states, ``positions [B, N]``; its KV
        written into ``cache`` at ``cache_slots``. Returns ``out [B, N, H]`` fp32 (post-norm)."""
        if not 0 <= k < self.cfg.num_layers:
            raise IndexError(f"module {k}: the checkpoint has {self.cfg.num_layers} (num_nextn_predict_layers)")
        return self.forward(tokens, features, positions, cache=cache, cache_slots=cache_slots,
                            attn_mask=attn_mask, layer=k)


def load_multi_layer_eagle(path, target) -> MultiLayerEagleModel:
    """Read a multi-layer checkpoint (:func:`specc.methods.mtp.model.load_mtp`'s layout) bound to ``target``.
    Raises ``CheckpointError`` as :func:`specc.methods.mtp.model.load_mtp`."""
    return load_mtp(path, target, "multi_layer_eagle", MultiLayerEagleModel)


def save_multi_layer_eagle(model: MultiLayerEagleModel, directory, target_config=None) -> pathlib.Path:
    """Write ``model`` in the published layout (fp16; :func:`specc.methods.mtp.model.save_mtp`)."""
    return save_mtp(model, directory, target_config=target_config)


__all__ = ("MTPConfig", "MultiLayerEagleModel", "load_multi_layer_eagle", "save_multi_layer_eagle")
