"""Test-split evaluation cut into shards and run by a Prefect task runner on Ray.

A *system* is one thing evaluated: a model answering in given trajectory formats (``model``), the DOTS
external planner naming a trajectory that the solver follows (``external``), or vanilla SFT answering the bare
question (``vanilla``). Each system's (question x format) jobs are cut into shards of ``evaluate.shard_size``
jobs; a shard is one Prefect task (retried on failure), and the tasks run on a Ray instance: a local one
with ``evaluate.workers`` CPUs by default, or the cluster at ``evaluate.ray_address`` (one GPU per task where
GPUs exist). Shards are defined by the data, never by the worker count, and merged back in shard order, so
any number of workers gives the same rows as one. With a ``done_dir`` each finished shard's rows are kept there
(written atomically), so an evaluation killed half way re-scores only the shards it had not finished.

    >>> shards = plan_shards({"warmup": ("model", ("cot", "pot"))}, n_records=5, shard_size=4)
    >>> [(s.system, s.formats, s.start, s.stop) for s in shards]
    [('warmup', ('cot',), 0, 4), ('warmup', ('cot',), 4, 5), ('warmup', ('pot',), 0, 4), ('warmup', ('pot',), 4, 5)]
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from posttrain.orchestration import apply_prefect_settings

apply_prefect_settings()  # before Prefect reads its settings: the repository's Prefect home, a patient ephemeral server
from prefect import flow, task  # noqa: E402
from prefect.task_runners import ThreadPoolTaskRunner

from posttrain.atomic import atomic_write_text
from posttrain.evaluation import OWN_CHOICE, score_responses
from posttrain.generation import open_generator
from posttrain.modeling import ModelLoadError
from posttrain.params_schema import EvaluateParams, Params
from posttrain.sandbox import sandbox_limits
from posttrain.trajectories import Trajectory, plain_prompt, prompt, split_choice

SOLVER, PLANNER = Path("models/warmup"), Path("models/planner")


@dataclass(frozen=True)
class Shard:
    """One unit of work: ``system``'s answers for records[start:stop] in ``formats``."""

    system: str
    kind: str  # model | external | vanilla
    formats: tuple[str, ...]
    start: int
    stop: int
    model_dir: str = ""

    @property
    def name(self) -> str:
        return f"{self.system}/{'+'.join(self.formats)}/{self.start}-{self.stop}"

    @property
    def filename(self) -> str:
        return self.name.replace("/", "__") + ".json"


def plan_shards(systems: dict[str, tuple[str, tuple[str, ...]]], n_records: int, shard_size: int,
                model_dirs: dict[str, str] | None = None) -> list[Shard]:
    """Shards for ``systems`` (name -> (kind, formats)): per format, records cut every ``shard_size``.
    ``external`` and ``vanilla`` systems have one format of their own, their kind."""
    shards = []
    for system, (kind, formats) in systems.items():
        model_dir = str(Path((model_dirs or {}).get(system, f"models/{system}")).resolve())
        for fmt in formats if kind == "model" else (kind,):
            shards += [Shard(system, kind, (fmt,), start, min(start + shard_size, n_records), model_dir)
                       for start in range(0, n_records, shard_size)]
    return shards


def model_dirs(shard: Shard) -> list[Path]:
    """The model directories ``shard`` loads: the external planner and the solver it directs, or its own model."""
    if shard.kind == "external":
        root = Path(shard.model_dir).parent.parent  # shards carry absolute paths: Ray workers may run elsewhere
        return [root / PLANNER, root / SOLVER]
    return [Path(shard.model_dir)]


def _answer(model_dir: str, records: list[dict], prompts: list[str], formats: list[str], params: Params) -> list[dict]:
    """Greedy answers to ``prompts`` from the model in ``model_dir``, scored as ``formats``; one row per answer."""
    cfg, sandbox = params.evaluate, params.sandbox
    generator = open_generator(model_dir, params.generation, cfg.batch_size, cfg.max_new_tokens, params.seed)
    completions = generator.generate(prompts, seed=params.seed, progress=False)
    rows = score_responses(records, formats, [c.text for c in completions], sandbox_limits(sandbox), sandbox.workers)
    for row, c in zip(rows, completions):
        row["n_tokens"] = c.n_tokens
    return rows


def answer_in_formats(model_dir: str, records: list[dict], formats: list[str], params: Params) -> list[dict]:
    """A model answers every (question, format)."""
    jobs = [(rec, fmt) for fmt in formats for rec in records]
    prompts = [prompt(rec["question"], None if fmt == OWN_CHOICE else Trajectory.from_name(fmt)) for rec, fmt in jobs]
    return _answer(model_dir, [r for r, _ in jobs], prompts, [f for _, f in jobs], params)


def answer_with_external_planner(planner_dir: str, solver_dir: str, records: list[dict], params: Params) -> list[dict]:
    """DOTS with an external planner: it names a trajectory and the solver follows it (when the planner
    names none, the solver chooses its own)."""
    planner = open_generator(planner_dir, params.generation, params.evaluate.batch_size, 16, params.seed)
    chosen = [split_choice(p.text)[0] for p in planner.generate([prompt(r["question"]) for r in records],
                                                                  seed=params.seed, progress=False)]
    # before the solver's engine opens: two vLLM engines would each claim gpu_memory_utilization of the device
    del planner
    gc.collect()
    rows = _answer(solver_dir, records, [prompt(r["question"], t) for r, t in zip(records, chosen)],
                   [t.name if t else OWN_CHOICE for t in chosen], params)
    for row, t in zip(rows, chosen):
        row.update(format="external", trajectory=t.name if t else row["trajectory"])
    return rows


def answer_plainly(model_dir: str, records: list[dict], params: Params) -> list[dict]:
    """Vanilla SFT: the question alone in, a plain solution out."""
    rows = _answer(model_dir, records, [plain_prompt(r["question"]) for r in records], ["cot"] * len(records), params)
    for row in rows:
        row.update(format="vanilla", trajectory=None)
    return rows


@task(retries=2, retry_delay_seconds=1, task_run_name="evaluate {shard.name}")
def evaluate_shard(shard: Shard, part: list[dict], params: Params, done_dir: str | None = None) -> list[dict]:
    """Score one shard (``part`` = its records), or read it back from ``done_dir`` when an earlier, killed run
    finished it. Runs in a Ray worker: it uses the CPUs Ray gave it, not every core of the machine."""
    done = Path(done_dir) / shard.filename if done_dir else None
    if done is not None and done.is_file():
        with contextlib.suppress(ValueError):  # a damaged file is scored again
            return json.loads(done.read_text(encoding="utf-8"))
    rows = _score_shard(shard, part, params)
    if done is not None:
        # keys in the order scored (atomic_write_json sorts them): a resumed run's responses.jsonl is byte for byte
        # an uninterrupted one's
        atomic_write_text(done, json.dumps(rows))
    return rows


def _score_shard(shard: Shard, part: list[dict], params: Params) -> list[dict]:
    if "OMP_NUM_THREADS" in os.environ:  # a Ray worker: one thread per CPU Ray gave it, not one per core
        torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
    if shard.kind == "external":
        planner, solver = model_dirs(shard)
        rows = answer_with_external_planner(str(planner), str(solver), part, params)
    elif shard.kind == "vanilla":
        rows = answer_plainly(shard.model_dir, part, params)
    else:
        rows = answer_in_formats(shard.model_dir, part, list(shard.formats), params)
    return [{"model": shard.system, **r} for r in rows]


def prefect_api_url() -> str:
    """The Prefect API that Ray workers report task runs to: PREFECT_API_URL, or else this process's ephemeral
    server (started now if need be). Without it every Ray worker would start an ephemeral server of its own."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return str(client.api_url)


def task_runner(cfg: EvaluateParams):
    """Ray (local with ``cfg.workers`` CPUs, or ``cfg.ray_address``); a one-thread pool for ``workers: 0``."""
    if cfg.workers == 0:
        return ThreadPoolTaskRunner(max_workers=1)
    from prefect_ray import RayTaskRunner

    env = {"PREFECT_API_URL": prefect_api_url(), "OMP_NUM_THREADS": "1"}
    if cfg.ray_address:
        return RayTaskRunner(address=cfg.ray_address, init_kwargs={"runtime_env": {"env_vars": env}})
    return RayTaskRunner(init_kwargs={"num_cpus": cfg.workers, "include_dashboard": False, "log_to_driver": False,
                                      "runtime_env": {"env_vars": env}})


def run_shards(shards: list[Shard], records: list[dict], params: Params,
               done_dir: str | Path | None = None) -> list[list[dict]]:
    """Every shard's rows, in shard order, computed on the task runner ``params.evaluate`` configures (shards
    already in ``done_dir`` are read back)."""
    absent = sorted({str(d) for s in shards for d in model_dirs(s) if not d.is_dir()})
    if absent:  # said before Ray starts and each shard fails three times (under vLLM, with vLLM's own traceback)
        raise ModelLoadError(f"no model directory {', '.join(absent)}: run the stage that writes it (dvc repro), or "
                             "fix evaluate.models / evaluate.policies")
    done = str(Path(done_dir).resolve()) if done_dir else None
    cfg = params.evaluate
    gpus = 1 if torch.cuda.is_available() else 0

    @flow(name="posttrain-evaluate", task_runner=task_runner(cfg), log_prints=True)
    def evaluate_flow() -> list[list[dict]]:
        if gpus and cfg.workers:
            from prefect_ray.context import remote_options

            with remote_options(num_gpus=gpus):
                futures = [evaluate_shard.submit(s, records[s.start:s.stop], params, done) for s in shards]
        else:
            futures = [evaluate_shard.submit(s, records[s.start:s.stop], params, done) for s in shards]
        return [f.result() for f in futures]

    return evaluate_flow()
