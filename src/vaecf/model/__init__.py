"""Mult-VAE: the model (Keras 3), its objective and its counter-based noise."""

from vaecf.model.batch import SparseBatch
from vaecf.model.loss import beta_at, gaussian_kl, l2_penalty, multinomial_nll
from vaecf.model.vae import MultVAE, choose_item_chunk, padded_items

__all__ = ["MultVAE", "SparseBatch", "beta_at", "choose_item_chunk", "gaussian_kl", "l2_penalty",
           "multinomial_nll", "padded_items"]
