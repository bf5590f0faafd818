"""Rank 0's per-epoch tracking: TensorBoard event files and the metrics line Katib reads.

``EpochTracker.epoch_end(record)`` is called once per epoch with the record that goes into
``train_log.jsonl``. With ``--tensorboard-dir`` it writes one point per epoch of every
scalar below through ``tf.summary``, so ``tensorboard --logdir DIR`` and Kubeflow's
TensorBoard show the run. TensorFlow 2.17 has no s3:// filesystem of its own (that lives in
tensorflow-io), so for an ``s3://`` prefix the events are written to a local folder and the
event files uploaded after every epoch: a killed run leaves every finished epoch readable.

After every validated epoch it also logs ``val ndcg_at_100=0.4123 recall_at_20=...``: one
``name=value`` pair per metric, the format of Katib's default StdOut metrics collector, so a
Katib trial reads the metric from the launcher's log with no sidecar configuration.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from vaecf import log
from vaecf.io import is_s3
from vaecf.io.storage import upload_file

# train_log.jsonl key -> TensorBoard tag, in the order TensorBoard lists them.
SCALARS = {"loss": "train/loss", "nll": "train/nll", "kl": "train/kl", "beta": "train/beta",
           "users_per_second": "speed/users_per_second", "input_share": "speed/input_share"}
# The validation metrics training reports (the first is what tuning maximises).
VAL_KEYS = ("ndcg_at_100", "recall_at_20", "recall_at_50")


def metrics_line(val: dict[str, float]) -> str:
    """``val ndcg_at_100=0.412300 recall_at_20=...``: what Katib's StdOut collector parses."""
    return "val " + " ".join(f"{key}={val[key]:.6f}" for key in VAL_KEYS if key in val)


class EpochTracker:
    """Per-epoch tracking on rank 0; the writer is created at the first epoch, so the other
    ranks (which never call ``epoch_end``) open nothing.

    Args:
      tensorboard_dir: a local folder or ``s3://`` prefix for event files, or None.
    """

    def __init__(self, tensorboard_dir: str | None) -> None:
        self.tensorboard_dir = tensorboard_dir
        self._writer: Any = None
        self._local: Path | None = None

    def epoch_end(self, record: dict[str, Any]) -> None:
        """Log the metrics line (validated epochs) and write the epoch's summaries."""
        if "val" in record:
            log.info(metrics_line(record["val"]))
        if self.tensorboard_dir is None:
            return
        import tensorflow as tf

        writer = self._open(self.tensorboard_dir)
        with writer.as_default(step=int(record["epoch"])):
            for key, tag in SCALARS.items():
                if isinstance(record.get(key), int | float):
                    tf.summary.scalar(tag, float(record[key]))
            for key, value in record.get("val", {}).items():
                tf.summary.scalar(f"val/{key}", float(value))
        writer.flush()
        if is_s3(self.tensorboard_dir) and self._local is not None:
            _upload(self._local, self.tensorboard_dir)

    def close(self) -> None:
        """Flush and close the writer; remove the local copy of an s3:// destination."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._local is not None and is_s3(str(self.tensorboard_dir)):
            shutil.rmtree(self._local, ignore_errors=True)
        self._local = None

    def _open(self, directory: str) -> Any:
        import tensorflow as tf

        if self._writer is None:
            if is_s3(directory):
                self._local = Path(tempfile.mkdtemp(prefix="vaecf-tensorboard-"))
            else:
                self._local = Path(directory)
                self._local.mkdir(parents=True, exist_ok=True)
            self._writer = tf.summary.create_file_writer(str(self._local))
            log.info(f"TensorBoard event files: {directory}")
        return self._writer


def _upload(local: Path, prefix: str) -> None:
    """Copy this run's event files (each uploaded whole, as it grew) to the s3:// prefix."""
    for path in sorted(local.iterdir()):
        upload_file(path, f"{prefix.rstrip('/')}/{path.name}")
