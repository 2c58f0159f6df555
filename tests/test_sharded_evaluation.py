"""Sharded evaluation: shards are fixed by the data, Ray workers give the same rows as one in-process worker,
and a failed shard is retried."""
import json
from pathlib import Path

import pytest

from posttrain import sharded_evaluation
from posttrain.params import load_params
from posttrain.sharded_evaluation import plan_shards, run_shards
from tiny_model import tiny_scratch_model

SMOKE = Path(__file__).resolve().parents[1] / "configs/params.smoke.yaml"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_scratch_model(tmp_path_factory.mktemp("tiny_eval"), n_problems=10, seed=7)


def shards_for(tiny, size: int):
    return plan_shards({"tiny": ("model", ("cot", "pot", "own_choice"))}, len(tiny.records), size,
                       {"tiny": tiny.path})


def test_shards_cover_every_job_once_whatever_the_size():
    for size in (1, 3, 4, 100):
        shards = plan_shards({"m": ("model", ("cot", "pot")), "v": ("vanilla", ())}, 10, size)
        jobs = [(s.system, s.formats, i) for s in shards for i in range(s.start, s.stop)]
        assert len(jobs) == len(set(jobs)) == 10 * 3
        assert all(s.stop - s.start <= size for s in shards)


def test_two_ray_workers_give_the_rows_of_one_in_process_worker(tiny):
    params = load_params(SMOKE)
    cfg = params.evaluate.model_copy(update={"max_new_tokens": 12, "batch_size": 4})
    shards = shards_for(tiny, 4)
    one = run_shards(shards, tiny.records, params.model_copy(update={"evaluate": cfg.model_copy(update={"workers": 0})}))
    two = run_shards(shards, tiny.records, params.model_copy(update={"evaluate": cfg.model_copy(update={"workers": 2})}))
    assert len(one) == len(shards) and sum(map(len, one)) == len(tiny.records) * 3
    assert two == one


def test_a_failed_shard_is_retried(tiny, monkeypatch):
    params = load_params(SMOKE)
    cfg = params.evaluate.model_copy(update={"max_new_tokens": 8, "batch_size": 4, "workers": 0})
    real, calls = sharded_evaluation.answer_in_formats, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("worker lost")
        return real(*args, **kwargs)

    monkeypatch.setattr(sharded_evaluation, "answer_in_formats", flaky)
    shards = shards_for(tiny, 10)[:1]
    rows = run_shards(shards, tiny.records, params.model_copy(update={"evaluate": cfg}))
    assert len(calls) == 2 and len(rows[0]) == len(tiny.records)


def test_finished_shards_are_read_back_after_a_kill(tiny, monkeypatch, tmp_path):
    params = load_params(SMOKE)
    cfg = params.evaluate.model_copy(update={"max_new_tokens": 8, "batch_size": 4, "workers": 0})
    params = params.model_copy(update={"evaluate": cfg})
    shards = shards_for(tiny, 5)
    first = run_shards(shards, tiny.records, params, tmp_path / "done")
    assert sorted(p.name for p in (tmp_path / "done").iterdir()) == sorted(s.filename for s in shards)
    # as after a kill: one shard's file is cut short, one is missing; only those two are scored again
    (tmp_path / "done" / shards[0].filename).write_text('[{"model": "ti')
    (tmp_path / "done" / shards[1].filename).unlink()
    real, scored = sharded_evaluation._score_shard, []

    def counting(shard, part, p):
        scored.append(shard.name)
        return real(shard, part, p)

    monkeypatch.setattr(sharded_evaluation, "_score_shard", counting)
    resumed = run_shards(shards, tiny.records, params, tmp_path / "done")
    assert resumed == first
    assert scored == [shards[0].name, shards[1].name]
    # responses.jsonl is the rows dumped in order: a resumed run writes the bytes of an uninterrupted one (read-back
    # rows came with their keys sorted)
    assert json.dumps(resumed) == json.dumps(first)


def test_a_missing_model_is_one_line_before_any_shard_runs(tiny, monkeypatch, tmp_path):
    """A model that is not there (evaluate.models may name any directory under models/) was found by each shard in
    turn, three attempts each after Ray started, and under vLLM came out as vLLM's traceback."""
    from posttrain.errors import UserError

    params = load_params(SMOKE)
    params = params.model_copy(update={"evaluate": params.evaluate.model_copy(update={"workers": 0})})
    scored = []
    monkeypatch.setattr(sharded_evaluation, "_score_shard", lambda shard, part, p: scored.append(shard) or [])
    shards = plan_shards({"tiny": ("model", ("cot",)), "gone": ("model", ("cot",)), "dots_external": ("external", ())},
                         len(tiny.records), 5, {"tiny": tiny.path, "gone": str(tmp_path / "models/gone"),
                                                "dots_external": str(tmp_path / "models/planner")})
    with pytest.raises(UserError) as error:
        run_shards(shards, tiny.records, params)
    assert str(error.value).startswith(f"no model directory {tmp_path / 'models/gone'}, {tmp_path / 'models/planner'}, "
                                       f"{tmp_path / 'models/warmup'}: ") and "\n" not in str(error.value)
    assert scored == []
