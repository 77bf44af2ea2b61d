"""Draft methods behind one protocol (:mod:`specc.drafters.base`): ``ngram``
(:mod:`specc.drafters.ngram`), ``suffix`` (:mod:`specc.drafters.suffix`), ``draft_model``
(:mod:`specc.drafters.draft_model`) and the EAGLE family (:mod:`specc.drafters.eagle`). Each module exposes ``build_drafter(spec, target, tokenizer, device,
max_seq_len)``, named by its row of the method table (:mod:`specc.methods`); the runtime calls it
through :func:`specc.methods.build_drafter`."""
