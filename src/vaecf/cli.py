"""The ``vaecf`` entry point: one subcommand per stage.

Each stage lives in ``vaecf.stages.<name>`` and is imported only when run, so ``vaecf
download`` never pays for importing TensorFlow.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import os
import sys

STAGES = {
    "download": "Fetch a dataset's raw files (https, s3://, file://) and verify them.",
    "preprocess": "Convert ratings to implicit feedback and filter users and items.",
    "split": "Split users into train/val/test and held-out items into fold_in/holdout.",
    "train": "Train Mult-VAE (alone or under horovodrun/mpirun).",
    "evaluate": "Recall@20, Recall@50 and NDCG@100 of a model or baseline.",
    "recommend": "Top-k recommendations from a trained model.",
    "serve": "Serve a trained model with KServe (v1, v2 REST and gRPC).",
    "benchmark-serve": "Load-test a running 'vaecf serve': latency, users/s, memory.",
    "report": "Write the benchmark report (Markdown, HTML, JSON).",
    "benchmark": "Measure training speed over a matrix of configurations.",
    "launch-mpijob": "Run training as a Kubeflow MPIJob and wait for it.",
    "launch-sparkapp": "Run preprocess or split on Spark as a SparkApplication and wait.",
    "tune": "Search training hyperparameters; evaluate the best (by validation) on test.",
    "deploy": "Create or update the KServe InferenceService serving a trained model.",
    "demo": "Run every stage on this machine on synthetic data.",
}

# The heavy third-party module a stage imports and the image that has it. The slim images lack
# some (the data image has no TensorFlow): they neither list those stages nor crash on them.
NEEDS = {
    "train": ("tensorflow", "vaecf-train"),
    "evaluate": ("tensorflow", "vaecf-train"),
    "recommend": ("tensorflow", "vaecf-train"),
    "serve": ("kserve", "vaecf-serve"),
    "benchmark-serve": ("kserve", "vaecf-serve"),
    "benchmark": ("tensorflow", "vaecf-train"),
    "report": ("matplotlib", "vaecf-launcher"),
    "launch-mpijob": ("kubernetes", "vaecf-launcher"),
    "launch-sparkapp": ("kubernetes", "vaecf-launcher"),
    "tune": ("tensorflow", "vaecf-train"),
    "deploy": ("kubernetes", "vaecf-launcher"),
    "demo": ("tensorflow", "a development install (make install)"),
}


def runnable(stage: str) -> bool:
    """Whether this installation has the stage's heavy dependency (found without importing it)."""
    module = NEEDS.get(stage, ("vaecf", ""))[0]
    return importlib.util.find_spec(module) is not None


def stage_module(stage: str) -> str:
    return "vaecf.stages." + stage.replace("-", "_")


def build_parser(stage: str) -> argparse.ArgumentParser:
    """The real argument parser of ``vaecf <stage>`` (used by tests of compiled pipelines)."""
    module = importlib.import_module(stage_module(stage))
    parser: argparse.ArgumentParser = module.build_parser()
    return parser


def quiet_tensorflow() -> None:
    """Hide TensorFlow's start-up banners (oneDNN, cpu_feature_guard) in every stage's log.

    Set here, before any stage imports TensorFlow, so that it holds under ``docker run``, KFP
    and horovodrun alike. Both banners are INFO messages, hidden from level 1 on; level 2 also
    hides TensorFlow's C++ warnings, as the Makefile and tests always did. oneDNN itself stays
    on (``TF_ENABLE_ONEDNN_OPTS`` is left alone, so numerics do not change). A level the user
    set is kept (``TF_CPP_MIN_LOG_LEVEL=0`` shows everything again).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def stage_tmp(stage: str) -> contextlib.AbstractContextManager[object]:
    """A private temporary directory for a TensorFlow stage's process, removed at its exit.

    TensorFlow writes the code autograph generates (``__autograph_generated_file*.py``) into
    ``$TMPDIR`` and removes it only at a clean exit; a killed run's files go with its
    ``$TMPDIR/vaecf-tf-<pid>-*``, which the next TensorFlow stage removes once that process is
    gone (``vaecf.io.publish.process_tmp``).
    """
    if NEEDS.get(stage, ("",))[0] != "tensorflow":
        return contextlib.nullcontext()
    from vaecf.io.publish import process_tmp

    return process_tmp("tf")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print("usage: vaecf <stage> [--help] ...\n\nstages:")
        for name, summary in STAGES.items():
            if runnable(name):
                print(f"  {name:<14} {summary}")
        return 0
    if argv and argv[0] == "--version":
        import vaecf

        print(vaecf.__version__)
        return 0
    if not argv or argv[0] not in STAGES:  # the stages' convention: one line, exit 1
        given = f"unknown stage '{argv[0]}'" if argv else "no stage given"
        print(f"vaecf: error: {given} (one of: {', '.join(STAGES)})", file=sys.stderr)
        return 1
    if not runnable(argv[0]):
        module_name, image = NEEDS[argv[0]]
        print(f"vaecf: error: stage '{argv[0]}' needs {module_name}, which this image lacks; "
              f"run it in {image}", file=sys.stderr)
        return 1
    quiet_tensorflow()
    module = importlib.import_module(stage_module(argv[0]))
    with stage_tmp(argv[0]):
        code: int = module.main(argv[1:])
    return code


if __name__ == "__main__":
    sys.exit(main())
