"""Draft methods behind one protocol (:mod:`specc.drafters.base`): ``ngram``
(:mod:`specc.drafters.ngram`), ``suffix`` (:mod:`specc.drafters.suffix`), ``draft_model``
(:mod:`specc.drafters.draft_model`), the EAGLE family (:mod:`specc.drafters.eagle`), Medusa, the block drafters, and the MTP family: ``mtp``
(:mod:`specc.drafters.mtp`), ``multi_layer_eagle`` (:mod:`specc.drafters.multi_layer_eagle`) and
``frozen_kv_mtp`` (:mod:`specc.drafters.frozen_kv`). Each module exposes ``build_drafter(spec, target, tokenizer, device,
max_seq_len)``, named by its row of the method table (:mod:`specc.methods`); the runtime calls it
through :func:`specc.methods.build_drafter`."""
