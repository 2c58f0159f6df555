"""Which training checkpoint a killed run resumes from.

A SIGKILL can land while the Trainer is still writing ``checkpoint-<n>``: the directory exists but its
weights, optimizer or state are half there, and ``transformers.trainer_utils.get_last_checkpoint`` (which only
looks at directory names) would hand it to ``Trainer.train`` to crash on. The Trainer writes
``trainer_state.json`` after everything else, so a checkpoint is complete when that file (or a later marker
such as RLVR's rollout state) is present and parses. A file damaged after the fact (a disk error, a bad copy)
is caught too: every safetensors file must cover its header's tensors, and every torch pickle (optimizer,
scheduler) must be a whole zip archive. A damaged checkpoint is skipped with a warning, and the run resumes
from the one before it.
"""
from __future__ import annotations

import copy
import hashlib
import json
import re
import shutil
import warnings
import zipfile
from pathlib import Path

import mlflow
from pydantic import BaseModel
from safetensors import SafetensorError, safe_open
from transformers.trainer import TRAINER_STATE_NAME, TRAINING_ARGS_NAME

from posttrain.process_group import world_size
from posttrain.tracking import HASHES_MISSING_TAG, PART_TAG


# how many processes do a stage's work, not what they compute: left out of a resume key, so lowering them after
# running out of memory keeps what the killed run finished
RUN_ONLY_FIELDS = {"sandbox": {"workers"}, "evaluate": {"workers", "ray_address"}}


def result_params(params, sections: tuple[str, ...]) -> dict:
    """The named params sections as far as they decide a stage's results (``RUN_ONLY_FIELDS`` left out): the
    ``cfg`` of ``claim_checkpoint_dir`` for a stage that reads those sections.

    >>> from posttrain.params import load_params
    >>> "workers" in result_params(load_params(), ("sandbox",))["sandbox"]
    False
    """
    return {name: getattr(params, name).model_dump(exclude=RUN_ONLY_FIELDS.get(name, set())) for name in sections}


CODE_ROOT = Path(__file__).resolve().parents[1]  # where posttrain/ and stages/ lie


def project_code() -> list[Path]:
    """The project's Python files (posttrain/ and, in a checkout, stages/), in a fixed order."""
    return sorted(CODE_ROOT.glob("posttrain/**/*.py")) + sorted(CODE_ROOT.glob("stages/*.py"))


def claim_checkpoint_dir(root: Path, cfg: BaseModel | dict, seed: int, key_files: list[Path]) -> Path:
    """``root/<key>``: a directory unique to this config and these inputs, so a resumed run never picks up
    checkpoints made from other params, inputs or code. In a stage run the key covers DVC's md5s of the stage's
    deps (the ``dvc.dep.*`` tags ``stage_run`` put on the stage's MLflow run, also read inside a ``part_run``; code
    included, no file is read again) and the bytes of any of ``key_files`` outside those deps; elsewhere the bytes
    of every one of ``key_files`` (a directory: every file) and of the project's code (``project_code``).

    Checkpoints outlive a successful run: a kill after the stage finished but before DVC recorded its outputs
    (DVC hashes and caches them after the stage exits) then resumes at the end instead of starting over.
    Directories of other keys under ``root`` are stale, and are removed here, except when the stage run is
    tagged as having no DVC hashes (DVC could not hash its deps): that key is a fallback, and the others may be
    the real one."""
    run = mlflow.active_run()
    tags = run.data.tags if run is not None else {}
    if PART_TAG in tags:  # a run for one of the stage's models (part_run): its stage's run holds the deps' hashes
        tags = mlflow.get_run(tags["mlflow.parentRunId"]).data.tags
    deps = {k: v for k, v in tags.items() if k.startswith("dvc.dep.")}
    config = cfg if isinstance(cfg, dict) else cfg.model_dump()
    # the number of processes sets the global batch, and DeepSpeed refuses ZeRO states saved by another number (a
    # single process's key stays as it was)
    processes = [world_size()] if world_size() > 1 else []
    h = hashlib.sha256(json.dumps([seed, config, deps, *processes], sort_keys=True).encode())
    # a key file DVC does not hash for this stage (evaluate.models may name any model under models/) is read here:
    # otherwise a changed model outside the deps would resume on the old model's finished work
    dep_paths = [Path(k.removeprefix("dvc.dep.")).resolve() for k in deps]
    for path in [p for p in key_files if not any(d == p.resolve() or d in p.resolve().parents for d in dep_paths)]:
        for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if f.is_file():
                h.update(f.read_bytes())
    if not deps:  # no DVC hashes, so no code in the key: the project's own code stands in for it, or a run resumed
        # after an edit (to the verifier, a loss) would pick up what the old code trained or scored
        for f in project_code():
            h.update(f.read_bytes())
    key_dir = Path(root) / h.hexdigest()[:16]
    if tags.get(HASHES_MISSING_TAG) == "true":
        warnings.warn(f"{root}: no DVC hashes of the stage's deps; keying checkpoints on file bytes ({key_dir.name})"
                      " and keeping the other keys' checkpoints", stacklevel=2)
        return key_dir
    for stale in Path(root).iterdir() if Path(root).is_dir() else []:
        if stale != key_dir:
            shutil.rmtree(stale, ignore_errors=True)
    return key_dir


def save_trained(trainer, tokenizer, out: str | Path) -> None:
    """Save a trained model and its tokenizer to ``out``: what ``from_pretrained`` loads, nothing of the run.

    ``Trainer.save_model`` (which also gathers ZeRO-3 shards under DeepSpeed) pickles the run's arguments beside
    the weights; their output_dir is the checkpoint key, which moves with any change to the stage's code, so
    bit-identical weights would get a new DVC hash and re-run every stage downstream. The Trainer's
    checkpoints keep their copy for resuming.

    The tokenizer is saved without the padding and truncation of its last call: a fast tokenizer keeps them in its
    backend and writes them into tokenizer.json (where ``from_pretrained`` takes its default padding side from
    them), so the file depended on what ran last, and a run resumed at its final checkpoint, which tokenizes
    nothing, saved another file than the run it resumed."""
    trainer.save_model(str(out))
    as_loaded = copy.deepcopy(tokenizer)  # the caller's tokenizer keeps its state
    if getattr(as_loaded, "backend_tokenizer", None) is not None:
        as_loaded.backend_tokenizer.no_padding()
        as_loaded.backend_tokenizer.no_truncation()
    as_loaded.save_pretrained(out)
    (Path(out) / TRAINING_ARGS_NAME).unlink(missing_ok=True)


class StopsAtMaxSteps:
    """Mixin for a transformers ``Trainer`` (list it first): a run resumed from the checkpoint of its last step
    loads that checkpoint and trains no further.

    transformers (5.23) fast-forwards the data loader past the checkpoint's batches and takes the next one before it
    checks ``max_steps``, so where ``max_steps`` ends mid-epoch such a resume trained one step more than the run it
    resumed (RLVR's 100 steps end in epoch 0.27: its "resumed" model took a 101st step). Resumed at its last step, the
    epoch loop is left empty; the checkpoint's weights still load (``_prepare_for_training``)."""

    def _init_training_state(self, max_steps, num_update_steps_per_epoch, num_train_epochs, *args, **kwargs):
        trained = super()._init_training_state(max_steps, num_update_steps_per_epoch, num_train_epochs, *args,
                                               **kwargs)
        if max_steps > 0 and self.state.global_step >= max_steps:
            return num_train_epochs, 0
        return trained


WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")


def is_damaged(path: Path) -> bool:
    """True when a weight or state file (safetensors, or a torch.save zip) is cut short or unreadable (cheap:
    the header or the zip directory only, no tensor is read)."""
    if path.suffix == ".safetensors":
        try:
            with safe_open(str(path), framework="pt"):
                return False
        except (SafetensorError, OSError):
            return True
    return not zipfile.is_zipfile(path)  # torch.save writes a zip archive; a cut one has no central directory


def damaged_files(checkpoint: Path) -> list[str]:
    """Paths (relative to ``checkpoint``) of the weight and state files in it that are cut short or unreadable,
    subdirectories included: DeepSpeed keeps its optimizer and model states in ``global_step<n>/``."""
    return [str(p.relative_to(checkpoint)) for p in sorted(checkpoint.rglob("*"))
            if p.suffix in WEIGHT_SUFFIXES and p.is_file() and is_damaged(p)]


def is_complete(checkpoint: Path, marker: str = TRAINER_STATE_NAME) -> bool:
    """True when ``checkpoint/marker`` exists and is whole JSON (a kill mid-write leaves it truncated) and no
    weight or state file is damaged."""
    try:
        json.loads((checkpoint / marker).read_text())
    except (OSError, ValueError):
        return False
    bad = damaged_files(checkpoint)
    if bad:
        warnings.warn(f"{checkpoint}: damaged {', '.join(bad)}; not resuming from it", stacklevel=2)
        return False
    return True


def last_complete_checkpoint(root: Path, marker: str = TRAINER_STATE_NAME) -> str | None:
    """The newest complete ``checkpoint-<n>`` under ``root``, or None (no directory, or nothing complete yet).

    >>> last_complete_checkpoint(Path("checkpoints/does-not-exist")) is None
    True
    """
    # the Trainer's names only: a copy such as checkpoint-backup-20 is no step (it crashed the step's int())
    done = [p for p in Path(root).glob("checkpoint-*")
            if re.fullmatch(r"checkpoint-\d+", p.name) and is_complete(p, marker)]
    return str(max(done, key=lambda p: int(p.name.removeprefix("checkpoint-")))) if done else None
