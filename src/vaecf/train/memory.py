"""Whether a model of the asked size can be trained here, checked before anything is allocated.

``--hidden 1000000000`` would otherwise end in TensorFlow's ``ResourceExhaustedError`` (or the
kernel's OOM killer) after the split was read; the model's size is known from its flags and the
split's item count, so the run is refused with one line instead.
"""

from __future__ import annotations

from vaecf.errors import VaecfError
from vaecf.host import GIB, available_bytes

# Larger than any Mult-VAE that fits one device (1M items x 600 hidden is 1.2e9 parameters,
# ~19 GB with Adam and gradients); beyond it, int32 shape arithmetic in TensorFlow's GPU
# kernels overflows.
MAX_PARAMETERS = 2**31 - 1
# Bytes per parameter: float32 weights, gradients and Adam's two moments (on the device), and
# on the host the best epoch's weights and a checkpoint's copy of weights and moments.
BYTES_PER_PARAMETER = 4 * 4


def parameters(n_items: int, hidden: int, latent: int, encoder_layers: int = 1) -> int:
    """Mult-VAE's parameter count: items -> hidden -> 2 x latent, latent -> hidden -> items.

    The item layers are padded to a multiple of 8 (``vaecf.model.vae.padded_items``).
    """
    from vaecf.model.vae import padded_items  # Keras: not for ``available_bytes``' users

    items = padded_items(n_items)
    return (encoder_parameters(n_items, hidden, latent, encoder_layers)
            + (latent + 1) * hidden + (hidden + 1) * items)


def encoder_parameters(n_items: int, hidden: int, latent: int, encoder_layers: int) -> int:
    """The encoder's share of ``parameters``: the first layer and the latent statistics, and
    with ``encoder_layers`` N > 1 (RecVAE's encoder) N - 1 dense hidden x hidden blocks and N
    LayerNorms (a scale and a shift each)."""
    from vaecf.model.vae import padded_items

    deep = ((encoder_layers - 1) * (hidden + 1) * hidden + encoder_layers * 2 * hidden
            if encoder_layers > 1 else 0)
    return (padded_items(n_items) + 1) * hidden + deep + (hidden + 1) * 2 * latent


def activation_bytes(users: int, hidden: int, latent: int, encoder_layers: int = 1) -> int:
    """A lower bound of the float32 activations one step keeps for its backward pass, with
    their gradients: each of the ``users`` rows' hidden layers (the encoder's and the
    decoder's) and its latent statistics and sample."""
    return users * (hidden * (encoder_layers + 1) + 3 * latent) * 4 * 2


def training_bytes(n_items: int, hidden: int, latent: int, users: int,
                   chunk: int | None, encoder_layers: int = 1,
                   composite_prior: bool = False) -> int:
    """A lower bound of one process's training memory: the parameters' state
    (``BYTES_PER_PARAMETER`` each; the composite prior's frozen copy of the encoder, float32
    weights alone), the activations of one step's ``users`` (``activation_bytes``) and their
    float32 logits over the items it holds at once (``chunk`` of them, or all when None),
    with their gradient."""
    from vaecf.model.vae import padded_items

    logits = users * (chunk or padded_items(n_items)) * 4 * 2
    count = parameters(n_items, hidden, latent, encoder_layers)
    prior = (encoder_parameters(n_items, hidden, latent, encoder_layers) * 4
             if composite_prior else 0)
    return (count * BYTES_PER_PARAMETER + prior + logits
            + activation_bytes(users, hidden, latent, encoder_layers))


def check_fits(n_items: int, hidden: int, latent: int, users: int, chunk: int | None, *,
               encoder_layers: int = 1, composite_prior: bool = False) -> None:
    """Refuse, in one line naming the flags, a model too large to train in this process.

    ``n_items`` are the items this process holds (its shard's with ``--shard-items``);
    ``users`` the rows of its step's logits (the whole batch when sharded, where every rank
    scores every row) and ``chunk`` the items of those logits held at once.

    On a GPU the host bound still applies (best weights and checkpoints live on the host);
    TensorFlow has no public call for a GPU's total memory, so the device's own limit is
    found by allocating.
    """
    count = parameters(n_items, hidden, latent, encoder_layers)
    what = f"--hidden {hidden} --latent {latent} with {n_items:,} items"
    layers = f" in {encoder_layers} encoder layers" if encoder_layers > 1 else ""
    if count > MAX_PARAMETERS:
        raise VaecfError(f"{what}: {count:,} parameters{layers}, more than the "
                         f"{MAX_PARAMETERS:,} this trainer supports (use a smaller --hidden, "
                         "--latent or --encoder-layers)")
    needed = training_bytes(n_items, hidden, latent, users, chunk, encoder_layers,
                            composite_prior)
    free = available_bytes()
    if free is not None and needed > free:
        raise VaecfError(f"{what}: training needs at least {needed / GIB:,.1f} GiB of memory "
                         f"({count:,} parameters{layers} with Adam's moments, and a "
                         f"step's activations), {free / GIB:,.1f} GiB is available (use a smaller "
                         "--hidden, --latent, --encoder-layers or --batch-size)")
