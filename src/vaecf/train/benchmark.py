"""Benchmark runner: ``vaecf train`` over precisions x world sizes x batch sizes x repeats.

Each run is a real ``vaecf train`` process (world sizes above 1 under ``horovodrun -np N
--gloo`` on this host) doing a fixed amount of work: one warm-up epoch, excluded, then the
measured epochs (``--steps`` steps each, or full epochs with ``--epochs``). Speed is read back
from the run's ``train_log.jsonl``; see ``vaecf.report.benchstats`` for the statistics and the
compute bound.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vaecf import log
from vaecf.data.split import write_synthetic_split
from vaecf.errors import VaecfError
from vaecf.io import open_input, read_manifest
from vaecf.io.readers import read_json, read_jsonl
from vaecf.report import benchstats, fingerprint
from vaecf.train.config import TrainConfig
from vaecf.train.scaling import scaled_learning_rate

WARMUP_EPOCHS = 1
# "ValueError: ..." on a line of its own, possibly prefixed by horovodrun's "[1]<stderr>:".
_EXCEPTION = re.compile(r"^(?:\[\d+\]<std\w+>:)?\s*((?:[\w.]+\.)?\w*(?:Error|Exception)\b.*)$")
RUN_TIMEOUT_SECONDS = 4 * 3600
DEFAULT_HIDDEN, DEFAULT_LATENT = TrainConfig.hidden, TrainConfig.latent  # vaecf train's


@dataclass(frozen=True)
class BenchmarkConfig:
    """What to measure. Exactly one of ``steps`` (per measured epoch) and ``epochs`` is set."""

    split: str | None
    precisions: tuple[str, ...]
    world_sizes: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    steps: int | None
    epochs: int | None
    repeats: int
    target_ndcg: float | None
    synthetic_users: int
    synthetic_items: int
    seed: int
    xla: bool = False
    lr_scalings: tuple[str, ...] = ("none",)
    shard_items: tuple[bool, ...] = (False,)  # runs without and/or with --shard-items
    hidden: int = DEFAULT_HIDDEN  # the model's width (train --hidden, --latent)
    latent: int = DEFAULT_LATENT
    training_options: tuple[str, ...] = ()  # names of ``TRAINING_OPTIONS``, in every run


# RecVAE's options and ImplicitSLIM's step as ``vaecf benchmark --training-options`` names
# them, at their authors' settings: what one of them costs per step is a benchmark with it
# against one without (an epoch of --alternate 3 is 4 passes: users/s counts every pass).
TRAINING_OPTIONS: dict[str, tuple[str, ...]] = {
    "kl-per-item": ("--kl-per-item", "0.005"), "composite-prior": ("--composite-prior",),
    "alternate": ("--alternate", "3"), "encoder-layers": ("--encoder-layers", "5"),
    "one-layer-encoder": ("--encoder-layers", "1"),  # Mult-VAE's (train's default is 5)
    "implicit-slim": ("--implicit-slim-every", "1")}


def split_shape(directory: Path, synthetic: bool) -> dict[str, Any]:
    """Items, users and known items per training user, from the split's manifest."""
    manifest = read_manifest(directory, "dataset")
    try:
        n_users = {k: int(v) for k, v in manifest["n_users"].items()}
        nnz = int(manifest["counts"]["pairs"]["train"])
        return {"synthetic": synthetic, "dataset": manifest.get("dataset"),
                "n_items": int(manifest["n_items"]), "n_users": n_users,
                "train_pairs": nnz, "nnz_per_user": nnz / max(n_users["train"], 1)}
    except (KeyError, TypeError, ValueError) as err:
        raise VaecfError(f"{directory}/dataset_manifest.json: missing field {err}") from err


def train_command(config: BenchmarkConfig, split_dir: Path, run_dir: Path, precision: str,
                  world_size: int, batch_size: int, lr_scaling: str = "none",
                  shard_items: bool = False) -> list[str]:
    """The ``vaecf train`` command line of one run (under horovodrun when world_size > 1),
    its learning rate scaled to the global batch by ``lr_scaling`` (``train.scaling``)."""
    epochs = WARMUP_EPOCHS + (config.epochs or 1)
    command = [sys.executable, "-m", "vaecf.cli", "train", "--split", str(split_dir),
               "--output", str(run_dir / "model"), "--checkpoint-dir", str(run_dir / "ckpt"),
               "--epochs", str(epochs), "--batch-size", str(batch_size), "--precision",
               precision, "--seed", str(config.seed), "--expect-world-size", str(world_size),
               "--checkpoint-every", str(epochs), "--learning-rate",
               str(scaled_learning_rate(batch_size, lr_scaling)),
               "--validate-every", "1" if config.target_ndcg is not None else str(epochs),
               "--hidden", str(config.hidden), "--latent", str(config.latent)]
    for option in config.training_options:
        command += TRAINING_OPTIONS[option]
    if config.steps:
        command += ["--steps-per-epoch", str(config.steps)]
    if config.xla:
        command.append("--xla")
    if shard_items:
        command.append("--shard-items")
    if world_size > 1:
        horovodrun = Path(sys.executable).parent / "horovodrun"
        command = [str(horovodrun), "-np", str(world_size), "--gloo", *command]
    return command


def _model_shape(run_dir: Path, n_items: int) -> tuple[int, int, int]:
    """(hidden, latent, padded n_items) as the run recorded them (defaults if it did not)."""
    try:
        params = read_json(run_dir / "model" / "train_manifest.json").get("parameters", {})
    except VaecfError:
        params = {}
    padded = -(-n_items // 8) * 8
    return (int(params.get("hidden", DEFAULT_HIDDEN)), int(params.get("latent", DEFAULT_LATENT)),
            padded)


def run_one(config: BenchmarkConfig, split_dir: Path, shape: dict[str, Any], run_dir: Path,
            key: tuple[str, int, int, str, bool]) -> dict[str, Any]:
    """Train once and measure; a failed run is recorded (with its last error line), not raised.

    ``peak_rss_bytes`` is the largest peak resident memory of any rank (each rank's is in
    ``peak_rss_bytes_per_rank``), read from the last epoch of the train log."""
    precision, world_size, batch_size, lr_scaling, shard_items = key
    run: dict[str, Any] = {"precision": precision, "world_size": world_size,
                           "batch_size": batch_size, "lr_scaling": lr_scaling,
                           "shard_items": shard_items,
                           "learning_rate": scaled_learning_rate(batch_size, lr_scaling),
                           "status": "failed", "error": None}
    command = train_command(config, split_dir, run_dir, precision, world_size, batch_size,
                            lr_scaling, shard_items)
    with open(run_dir / "train.out", "w") as out:
        try:
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False,
                                  timeout=RUN_TIMEOUT_SECONDS, env=_run_env())
        except subprocess.TimeoutExpired:
            return run | {"error": f"timed out after {RUN_TIMEOUT_SECONDS} s"}
    if done.returncode != 0:
        return run | {"error": f"exit {done.returncode}: {_error_line(run_dir / 'train.out')}"}
    entries = [entry for _, entry in read_jsonl(run_dir / "model" / "train_log.jsonl")]
    try:
        stats = benchstats.run_stats(entries, WARMUP_EPOCHS, config.target_ndcg)
    except ValueError as err:
        return run | {"error": str(err)}
    hidden, latent, padded = _model_shape(run_dir, shape["n_items"])
    per_rank = entries[-1].get("peak_rss_bytes") or []
    return run | stats | {"status": "ok", "hidden": hidden, "latent": latent,
                          "n_items_padded": padded, "peak_rss_bytes_per_rank": per_rank,
                          "peak_rss_bytes": max(per_rank, default=None)}


def _error_line(output: Path) -> str:
    """The trainer's own one-line error (from any rank), else the last exception a rank raised
    (not horovodrun's own "one or more processes exited"), else the last line."""
    lines = output.read_text(errors="replace").strip().splitlines() or ["no output"]
    for line in lines:
        if "vaecf train: error:" in line:
            return line[line.index("vaecf train: error:"):][:300]
    raised = [m.group(1) for line in lines if (m := _EXCEPTION.match(line))
              and "Horovod detected" not in line]
    return (raised or lines)[-1].strip()[:300]


def _run_env() -> dict[str, str]:
    """The run's environment: this one, with TensorFlow's C++ banners quiet (the trainer itself
    splits a CPU host's cores between ranks) and GPU memory taken as needed, so that no
    process (a rank, or this one's matmul-rate probe) holds a GPU that another needs."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    return env


def measure_rates(rates: dict[str, float], precisions: tuple[str, ...]) -> None:
    """Measure the matmul FLOP/s of each precision again, keeping the best rate seen.

    Measured before, between and after the runs: on a shared host the peak shows only when
    the other tenants pause (see ``fingerprint.matmul_rate``)."""
    for precision in precisions:
        rates[precision] = max(rates.get(precision, 0.0), fingerprint.matmul_rate(precision))


def compute_bound(shape: dict[str, Any], runs: list[dict[str, Any]],
                  rates: dict[str, float], gpu_count: int) -> dict[str, Any]:
    """FLOPs per user, the matmul rate per precision, and each run's fraction of the bound.

    On a GPU host each rank has its own device, so the bound scales with the world size; on a
    CPU host every rank shares the same cores, so the bound is the host's.
    """
    ok = [r for r in runs if r["status"] == "ok"]
    hidden, latent, padded = ((ok[0]["hidden"], ok[0]["latent"], ok[0]["n_items_padded"])
                              if ok else (DEFAULT_HIDDEN, DEFAULT_LATENT,
                                          -(-shape["n_items"] // 8) * 8))
    flops = benchstats.flops_per_user(padded, hidden, latent, shape["nnz_per_user"])
    for run in ok:
        devices = run["world_size"] if gpu_count else 1
        run["bound_users_per_second"] = rates[run["precision"]] * devices / flops
        run["bound_fraction"] = run["users_per_second"] / run["bound_users_per_second"]
    return {"flops_per_user": flops, "hidden": hidden, "latent": latent,
            "n_items_padded": padded, "nnz_per_user": shape["nnz_per_user"],
            "formula": "3 x (2*nnz*hidden + 2*hidden*2*latent + 2*latent*hidden "
                       "+ 2*hidden*n_items_padded)",
            "matmul_flops_per_second": rates,
            "devices": ("Bound per run: one device per rank (GPUs)." if gpu_count else
                        "Bound per run: this host's CPU, shared by all ranks.")}


def run_benchmark(config: BenchmarkConfig, output: Path) -> dict[str, Any]:
    """Run the matrix; write each run's log under ``output/runs``; return benchmark.json's data."""
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vaecf-bench-")))
        if config.split:
            split_dir = stack.enter_context(open_input(config.split))
        else:
            split_dir = work / "split"
            split_dir.mkdir()
            log.info(f"benchmark: synthetic ML-20M-shaped split, {config.synthetic_users:,} "
                     f"users x {config.synthetic_items:,} items")
            write_synthetic_split(split_dir, config.synthetic_users, config.synthetic_items,
                                  config.seed)
        shape = split_shape(split_dir, synthetic=not config.split)
        fingerprint.grow_gpu_memory()  # first: this process must not hold the runs' GPU
        machine = fingerprint.fingerprint()
        rates: dict[str, float] = {}
        measure_rates(rates, config.precisions)
        runs = [run | {"device": machine["device"]}
                for run in run_matrix(config, split_dir, shape, work, output, rates)]
        bound = compute_bound(shape, runs, rates, machine["gpu_count"])
        size, products = fingerprint.probe_shape()
        bound["matmul_probe"] = {"size": size, "products_per_sync": products}
    machine["load_average_end"] = fingerprint.fingerprint_load()
    return {"fingerprint": machine, "split": shape | {"uri": config.split},
            "work": {"steps": config.steps, "epochs": config.epochs, "xla": config.xla,
                     "warmup_epochs": WARMUP_EPOCHS, "repeats": config.repeats},
            "target_ndcg": config.target_ndcg, "compute_bound": bound, "runs": runs,
            "configs": benchstats.summarize(runs)}


def run_matrix(config: BenchmarkConfig, split_dir: Path, shape: dict[str, Any], work: Path,
               output: Path, rates: dict[str, float]) -> list[dict[str, Any]]:
    """Every (precision, world size, batch size, learning-rate rule, item layout) ``repeats``
    times, in that order; the matmul rates are measured again after each run."""
    keys = [(p, w, b, lr, sh) for p in config.precisions for w in config.world_sizes
            for b in config.batch_sizes for lr in config.lr_scalings
            for sh in config.shard_items if w > 1 or not sh]  # sharding needs 2 ranks
    runs = []
    bar = log.Progress("benchmark runs", len(keys) * config.repeats, "runs")
    for key in keys:
        for repeat in range(config.repeats):
            rule = "" if key[3] == "none" else f"-lr{key[3]}"
            layout = "-shard" if key[4] else ""
            name = f"{key[0]}-np{key[1]}-b{key[2]}{rule}{layout}-r{repeat}"
            run_dir = work / name
            run_dir.mkdir()
            run = run_one(config, split_dir, shape, run_dir, key) | {"repeat": repeat,
                                                                     "name": name}
            _keep_logs(run_dir, output / "runs" / name)
            log.info(f"benchmark: {name}: " + (
                f"{run['users_per_second']:,.1f} users/s" if run["status"] == "ok"
                else f"failed ({run['error']})"))
            runs.append(run)
            measure_rates(rates, config.precisions)
            bar.update(1)
    bar.close()
    return runs


def _keep_logs(run_dir: Path, dest: Path) -> None:
    """Keep the run's console output and train log (not its model) beside benchmark.json."""
    dest.mkdir(parents=True)
    for source in (run_dir / "train.out", run_dir / "model" / "train_log.jsonl"):
        if source.is_file():
            shutil.copyfile(source, dest / source.name)
