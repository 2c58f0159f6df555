"""Training curves as DVC plots files: a Trainer callback that keeps ``reports/curves/<name>.csv`` equal to the
trainer's log history (one row per logged step), so the curves are outputs DVC tracks beside the model.

MLflow holds the same numbers, but its store is not part of the pipeline's state: a teammate after ``dvc pull``, or
a CI runner, has another store (or none), and a report drawn from it would change without any input changing.
The file is rewritten whole on every log from ``state.log_history``, which a resumed Trainer reloads from its
checkpoint, so after a kill and resume it holds the whole run, each step once.

Example:
    >>> trainer = SFTTrainer(..., callbacks=[TrainingCurve("reports/curves/warmup.csv", ["loss"])])  # doctest: +SKIP
    >>> trainer.train()                                                                               # doctest: +SKIP
    >>> read_curve("reports/curves/warmup.csv")["loss"].iloc[-1]                                     # doctest: +SKIP
    0.41

``python3 -m dvc plots show reports/curves/warmup.csv`` draws it; ``dvc plots diff`` compares two runs.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

import pandas as pd
from transformers import TrainerCallback

from posttrain.atomic import atomic_write_text

CURVE_DIR = Path("reports/curves")


def column_name(key: str) -> str:
    """A logged key as a CSV column: ``rollout/reward_mean`` -> ``rollout_reward_mean`` (plot specs address columns
    by name, and a slash reads as a path in some of them)."""
    return key.replace("/", "_")


def curve_csv(log_history: list[dict], keys: list[str]) -> str:
    """``step`` and each of ``keys`` for every logged step that has at least one of them (the Trainer's closing
    summary, ``train_loss``/``train_runtime``, has none); a key a step did not log is left empty."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["step", *map(column_name, keys)])
    for log in log_history:
        if "step" in log and any(k in log for k in keys):
            writer.writerow([log["step"], *(repr(float(log[k])) if k in log else "" for k in keys)])
    return out.getvalue()


class TrainingCurve(TrainerCallback):
    """Writes ``path`` (CSV: step + ``keys``) from the log history on every log and when training ends.

    ``dev``: a callback whose ``history`` of (step, accuracy) joins as a ``dev_accuracy`` column (the dev
    evaluation runs in a callback of its own, so the Trainer's log history never holds it); place it before this
    one in the Trainer's callbacks, so a step's accuracy is there when that step is logged.
    """

    def __init__(self, path: str | Path, keys: list[str], dev=None):
        self.path, self.keys, self.dev = Path(path), list(keys), dev

    def write(self, state) -> None:
        if not state.is_world_process_zero:
            return
        history, keys = state.log_history, self.keys
        if self.dev is not None:
            accuracy = dict(self.dev.history)
            history = [{**log, "dev_accuracy": accuracy[log["step"]]}
                       if log.get("step") in accuracy and any(k in log for k in keys) else log for log in history]
            keys = [*keys, "dev_accuracy"]
        atomic_write_text(self.path, curve_csv(history, keys))

    def on_log(self, args, state, control, **kwargs):
        self.write(state)

    def on_train_end(self, args, state, control, **kwargs):
        # a run resumed at its last checkpoint trains no step and may log nothing new: still write its history
        self.write(state)


def read_curve(path: str | Path) -> pd.DataFrame:
    """A curve file as a DataFrame (``step`` first); a missing file is an empty frame."""
    path = Path(path)
    return pd.read_csv(path) if path.is_file() else pd.DataFrame(columns=["step"])
