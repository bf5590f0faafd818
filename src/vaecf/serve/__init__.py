"""Serving: a KServe predictor that folds users in at request time, in raw item ids.

Mult-VAE needs no user embedding: any user, seen in training or not, is a list of items, and
the model's ``recommend_ids`` signature (``vaecf.train.export``) turns that list into top-k
raw ids in one call. ``model`` loads and checks a ``vaecf train`` output, ``protocol`` turns
v1/v2 requests into a batch and back (with the limits a request must respect), ``predictor``
is the ``kserve.Model`` (batching concurrent requests into model calls no larger than the
warm-up's), ``gate`` bounds what a request may send before KServe sees it, ``runtime`` is
KServe's ModelServer with that gate, one-line errors and a joint REST/gRPC stop, ``server``
starts it, and ``loadtest`` measures it from the outside.
"""
