"""Training of the block drafters (DFlash, DSpark, PARD) for a target, on real text.

Laid out like the drafter training tool's registry of drafter kinds (one adapter per kind with
``layers`` / ``build`` / ``collate`` / ``loss`` / ``save`` / ``load``, one recipe file per drafter),
so each kind can be registered there as it stands:

* :mod:`specc.blocktrain.corpora` — prompts in Spec-Bench's six categories and teacher-forcing
  passages from text that installable packages ship (PyPI / Debian), each with its source and licence;
* :mod:`specc.blocktrain.data` — self-distillation (the target answers the prompts greedily) and
  teacher forcing (one prefill over real text), recording the target's hidden states at the layers
  a kind reads and its argmax at every position, in safetensors shards;
* :mod:`specc.blocktrain.kinds` — the ``dflash``, ``dspark`` and ``pard`` adapters (objective: the
  target's greedy continuation of each anchor, block positions after the first disagreement of a
  real-text passage masked out);
* :mod:`specc.blocktrain.fit` — the loop (AdamW, warm-up + cosine), held-out agreement per block
  position, DSpark's confidence calibration, and the drafter's ``TRAINING.md`` card.

``python -m specc.blocktrain --help`` runs the stages.
"""
