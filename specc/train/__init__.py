"""Drafter training: real text from installable packages -> self-distillation data -> a drafter.

The ``text + target --train--> drafter`` step of specc's pipeline, one module per step:

* :mod:`specc.train.corpora` -- fetch the corpora (pip / apt-get) and read them;
* :mod:`specc.train.prompts` -- prompts in Spec-Bench's six categories from those corpora;
* :mod:`specc.train.distill` -- the target answers them (or is teacher-forced over real answers),
  its hidden states and argmax are recorded; :mod:`specc.train.data` -- the shards on disk;
* :mod:`specc.train.kinds` -- the registry of drafter kinds (EAGLE and EAGLE-3 in
  :mod:`specc.methods.eagle.recipe`); :mod:`specc.train.fit` -- the one training loop for all of them;
* :mod:`specc.train.recipe` -- recipe files (``conf/train/``); :mod:`specc.train.card` -- the
  drafter's ``TRAINING.md``; :mod:`specc.train.pipeline` -- the stages of ``specc train``.
"""
