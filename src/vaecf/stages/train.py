"""``vaecf train``: Mult-VAE training, alone or under ``horovodrun``/``mpirun`` unchanged."""

from __future__ import annotations

import argparse

from vaecf.errors import VaecfError
from vaecf.io import manifest_name
from vaecf.io.bounds import STEPS_PER_CALL
from vaecf.io.roles import Role
from vaecf.stages import finite_non_negative, finite_positive, location, new_parser, run_stage, seed
from vaecf.train.config import (
    COMPRESSIONS,
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_EPOCHS,
    DEFAULT_PATIENCE,
    EASE_BLEND_MAX_ITEMS,
    EASE_BLENDS,
    PRECISIONS,
    TrainConfig,
)

STAGE = "train"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0.0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a value in [0, 1), got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(STAGE, "Train Mult-VAE on a split; export the best epoch (val "
                        "NDCG@100) as a SavedModel with 'score' and 'recommend' signatures.")
    add = parser.add_argument
    location(parser, "--split", Role.INPUT, required=True,
             help="split directory or s3:// prefix (vaecf split)")
    location(parser, "--output", Role.OUTPUT, manifest=manifest_name(STAGE), required=True,
             help="model directory or s3:// prefix")
    location(parser, "--checkpoint-dir", Role.CHECKPOINTS, derive=checkpoint_dir,
             help="checkpoints (local or s3://), in a folder of their own; a rerun resumes "
             "from the newest valid one [default: <output>-checkpoints]")
    add("--epochs", type=_positive, help="train exactly this many epochs [default: stop "
        "early, see --patience]")
    add("--patience", type=_positive, metavar="EPOCHS",
        help="without --epochs: stop once the validation NDCG@100 has not improved for this "
        "many epochs (as Keras' EarlyStopping); the best epoch is exported either way "
        f"[default: {DEFAULT_PATIENCE}]")
    add("--max-epochs", type=_positive, help="without --epochs: stop here at the latest "
        f"(beta's default annealing reaches its cap here) [default: {DEFAULT_MAX_EPOCHS}]")
    add("--batch-size", type=_positive, help="global batch: users per step over all "
        f"processes [default: {DEFAULT_BATCH_SIZE}, or the training users of a smaller split]")
    add("--precision", choices=PRECISIONS, default="fp32",
        help="mixed_float16 uses dynamic loss scaling")
    add("--xla", action="store_true", help="compile the whole training step with XLA")
    add("--learning-rate", type=finite_positive, default=TrainConfig.learning_rate,
        help="Adam learning rate")
    add("--beta-cap", type=finite_non_negative, default=TrainConfig.beta_cap,
        help="largest KL weight")
    add("--anneal-steps", type=_non_negative, help="beta = min(cap, step / this), as in the "
        "paper's code (paper: 200000; 0: the cap from the start) [default: beta reaches the cap "
        "at the run's last step]")
    add("--dropout", type=_fraction, default=TrainConfig.dropout, help="input dropout rate")
    add("--hidden", type=_positive, default=TrainConfig.hidden, help="hidden layer width")
    add("--latent", type=_positive, default=TrainConfig.latent, help="latent dimension")
    add("--l2", type=finite_non_negative, default=0.0, help="L2 penalty on the weights")
    add("--seed", type=seed, default=0)
    add("--validate-every", type=_positive, default=1, help="validate every N epochs "
        "(and the last)")
    add("--checkpoint-interval", type=_seconds, default=600.0, metavar="SECONDS",
        help="checkpoint after the first epoch ending this long after the previous "
        "checkpoint, after the last epoch and on SIGTERM or SIGINT (0: every epoch)")
    add("--checkpoint-every", type=_positive, help="also checkpoint every N epochs "
        "(1: every epoch, as before)")
    add("--steps-per-epoch", type=_positive, help="steps per epoch [default: one pass over "
        "the training users]")
    add("--steps-per-call", type=_non_negative, default=0, metavar="K", help="training "
        "steps per call to the device, each step's batch gathered on the device inside the "
        f"call (1-{STEPS_PER_CALL}; never past an epoch's end; the weights are the same "
        "for any K) [default: 0, chosen to last about a quarter of a second per call]")
    add("--item-chunk", type=_non_negative, metavar="N", help="compute the training "
        "likelihood over chunks of N items, never holding the [users, items] logits (0: "
        "whole) [default: chunked when one process's step would hold over 1 GiB of logits on "
        "a CPU, 4 GiB on a GPU]")
    add("--shard-items", action="store_true", help="each process holds its share of the "
        "items' first-layer rows and decoder columns (catalogues beyond one device); "
        "checkpoints resume on the same number of processes only")
    add("--user-shares", type=_positive, metavar="N", help="draw each step from N shares "
        "of the training users, as N processes do (each reads and trains its own share); "
        "one process then trains the batches of an N-process run [default: the number of "
        "processes]")
    add("--expect-world-size", type=_positive, help="fail unless this many processes run")
    add("--expect-hosts", type=_positive, help="fail unless the processes span this many "
        "hosts")
    add("--compression", choices=COMPRESSIONS, default="none", help="fp16: allreduce the "
        "gradients as float16 (half the bytes between hosts; under horovodrun)")
    recvae = parser.add_argument_group(
        "RecVAE and ImplicitSLIM options (off, with --encoder-layers 1: Mult-VAE as published)")
    recvae.add_argument("--kl-per-item", type=finite_positive, metavar="GAMMA",
                        help="each user's KL weight is GAMMA x the user's item count, no "
                        "annealing (RecVAE: 0.005; --beta-cap and --anneal-steps unused)")
    recvae.add_argument("--composite-prior", action="store_true", help="KL against a "
                        "mixture of N(0, I), the previous epoch's posterior (a frozen copy "
                        "of the encoder) and a wide normal")
    recvae.add_argument("--alternate", type=_non_negative, default=0, metavar="N",
                        help="each epoch: N encoder-only passes with input dropout, then one "
                        "decoder-only pass without (RecVAE: 3; 0: joint updates)")
    recvae.add_argument("--encoder-layers", type=_positive, default=5, metavar="N",
                        help="N > 1: RecVAE's encoder, N dense layers with LayerNorm and "
                        "swish, each fed the sum of the earlier ones (RecVAE's 5, measured "
                        "better); 1: Mult-VAE's one tanh layer")
    recvae.add_argument("--implicit-slim-every", type=_non_negative, default=0, metavar="N",
                        help="before every N-th epoch, set the item embeddings of the first "
                        "layer and the decoder from ImplicitSLIM's closed form (0: never)")
    recvae.add_argument("--implicit-slim-lambda", type=finite_positive, default=500.0,
                        help="ImplicitSLIM's ridge penalty")
    recvae.add_argument("--implicit-slim-alpha", type=finite_positive, default=1.0,
                        help="ImplicitSLIM's scale of the embedding update")
    recvae.add_argument("--implicit-slim-threshold", type=_non_negative, default=10,
                        metavar="USERS", help="items with fewer training users have no say "
                        "in ImplicitSLIM's embeddings")
    blend = parser.add_argument_group("EASE in the exported scores")
    blend.add_argument("--ease-blend", choices=EASE_BLENDS, default="auto", help="auto: the "
                       "exported model scores a user by its logits plus EASE's scores (each "
                       "standardised per user), EASE's weight chosen on the validation users "
                       "and kept only when it leads the model alone there by more than the "
                       "paired standard error; where the catalogue allows it (at most "
                       f"{EASE_BLEND_MAX_ITEMS:,} items, the closed form fits in memory, no "
                       "--shard-items); off: the logits alone")
    blend.add_argument("--ease-lambda", type=finite_positive, default=500.0,
                       help="EASE's ridge penalty in the blend")
    location(parser, "--tensorboard-dir", Role.TENSORBOARD, help="rank 0 writes TensorBoard "
             "event files here (local or s3://; a new or empty folder, or this flag's earlier "
             "one): loss, NLL, KL, beta, validation metrics, users/s, input share per epoch")
    return parser


def checkpoint_dir(args: argparse.Namespace) -> str:
    """``--checkpoint-dir``, or its default ``<output>-checkpoints``."""
    return str(args.checkpoint_dir or args.output.rstrip("/") + "-checkpoints")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    if args.epochs is not None:
        for flag, value in (("--patience", args.patience), ("--max-epochs", args.max_epochs)):
            if value is not None:
                raise VaecfError(f"{flag} {value}: applies only without --epochs (--epochs "
                                 f"{args.epochs} trains exactly that many epochs)")
    return TrainConfig(
        split=args.split, output=args.output, checkpoint_dir=checkpoint_dir(args),
        epochs=args.epochs, max_epochs=args.max_epochs or DEFAULT_MAX_EPOCHS,
        patience=args.patience or DEFAULT_PATIENCE,
        batch_size=args.batch_size or DEFAULT_BATCH_SIZE,
        batch_size_default=args.batch_size is None, precision=args.precision,
        xla=args.xla, learning_rate=args.learning_rate, beta_cap=args.beta_cap,
        anneal_steps=args.anneal_steps, dropout=args.dropout, hidden=args.hidden,
        latent=args.latent, l2=args.l2, seed=args.seed, validate_every=args.validate_every,
        checkpoint_interval=args.checkpoint_interval,
        checkpoint_every=args.checkpoint_every, steps_per_epoch=args.steps_per_epoch,
        steps_per_call=args.steps_per_call,
        expect_world_size=args.expect_world_size, expect_hosts=args.expect_hosts,
        compression=args.compression, tensorboard_dir=args.tensorboard_dir,
        item_chunk=args.item_chunk, shard_items=args.shard_items,
        user_shares=args.user_shares,
        kl_per_item=args.kl_per_item, composite_prior=args.composite_prior,
        alternate=args.alternate, encoder_layers=args.encoder_layers,
        implicit_slim_every=args.implicit_slim_every,
        implicit_slim_lambda=args.implicit_slim_lambda,
        implicit_slim_alpha=args.implicit_slim_alpha,
        implicit_slim_threshold=args.implicit_slim_threshold,
        ease_blend=args.ease_blend, ease_lambda=args.ease_lambda)


def _body(args: argparse.Namespace) -> None:
    config = config_from_args(args)
    if config.shard_items and config.xla:
        raise VaecfError("--shard-items: the sharded step holds Horovod collectives, which "
                         "XLA cannot compile (leave out --xla)")
    try:
        from vaecf.train.run import train  # TensorFlow is imported only when training runs

        train(config)
    except KeyboardInterrupt:  # a second Ctrl-C, or one before training started
        raise VaecfError(f"stopped by SIGINT; checkpoints in {config.checkpoint_dir} are "
                         "kept (rerun to resume from the newest)") from None


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, build_parser(), argv, _body)
