"""DOTS search on a stub solver with known success rates."""
import random

import pytest

from posttrain.dots import SearchConfig, search_trajectories
from posttrain.trajectories import TRAJECTORIES


def stub(rates: dict[str, dict[str, float]], seed: int | None = None):
    """run_samples for known per-(question, trajectory) success rates; exact counts unless seeded."""
    rng = random.Random(seed)
    calls = []

    def run(jobs, n):
        calls.append(len(jobs))
        out = []
        for q, t in jobs:
            p = rates[q].get(t.name, 0.0)
            out.append(sum(rng.random() < p for _ in range(n)) if seed is not None else round(p * n))
        return out

    return run, calls


def test_finds_the_known_optimum_and_keeps_n_k():
    rates = {"a": {t.name: 0.2 for t in TRAJECTORIES} | {"decompose+pot+verify": 0.9},
             "b": {t.name: 0.5 for t in TRAJECTORIES} | {"cot": 1.0, "rewrite+cot": 0.75}}
    run, calls = stub(rates)
    results = search_trajectories(["a", "b"], run, SearchConfig())
    assert [r.optimal for r in results] == ["decompose+pot+verify", "cot"]
    assert calls == [24, 16]  # 12 candidates each, then the 8 kept
    assert len(results[0].survivors) == 3 and results[1].survivors[:2] == ["cot", "rewrite+cot"]
    assert results[0].trials["decompose+pot+verify"] == 8 and results[0].trials["rewrite+pot+verify"] == 4


def test_ties_go_to_fewer_actions():
    rates = {"q": {"rewrite+cot+verify": 1.0, "pot+verify": 1.0, "pot": 1.0, "cot": 0.0}}
    results = search_trajectories(["q"], stub(rates)[0], SearchConfig())
    assert results[0].optimal == "pot"
    assert results[0].survivors == ["pot", "pot+verify", "rewrite+cot+verify"]


def test_all_solved_and_all_failed_are_dropped():
    rates = {"easy": {t.name: 1.0 for t in TRAJECTORIES}, "hard": {}, "mid": {"cot": 0.5}}
    run, calls = stub(rates)
    results = {r.id: r for r in search_trajectories(["easy", "hard", "mid"], run, SearchConfig())}
    assert results["easy"].dropped == "all solved" and results["easy"].optimal is None
    assert results["hard"].dropped == "all failed" and results["hard"].optimal is None
    assert results["mid"].optimal == "cot" and calls == [36, 8]  # dropped questions are not searched further


def test_noisy_solver_mostly_finds_a_clear_winner():
    rates = {f"q{i}": {t.name: 0.1 for t in TRAJECTORIES} | {"rewrite+pot": 0.95} for i in range(50)}
    results = search_trajectories(list(rates), stub(rates, seed=0)[0], SearchConfig(n_eval=8))
    assert sum(r.optimal == "rewrite+pot" for r in results) >= 45


def test_config_checks_keep_length():
    with pytest.raises(ValueError, match="one per iteration"):
        SearchConfig(iterations=3, keep=(8, 3))


def test_resume_file_ignores_a_line_cut_by_a_kill(tmp_path):
    from stages.dots_search import read_done

    path = tmp_path / "done.jsonl"
    path.write_text('{"id": "a", "optimal": "cot"}\n{"id": "b", "optimal": "pot"}\n{"id": "c", "opt')
    assert sorted(read_done(path)) == ["a", "b"]
    assert read_done(tmp_path / "missing.jsonl") == {}


def test_the_record_after_a_cut_line_is_kept(tmp_path):
    from stages.dots_search import open_progress, read_done

    path = tmp_path / "done.jsonl"
    path.write_text('{"id": "a", "optimal": "cot"}\n{"id": "b", "opt')
    with open_progress(path) as log:
        log.write('{"id": "c", "optimal": "pot"}\n')
    assert sorted(read_done(path)) == ["a", "c"]
    with open_progress(path) as log:  # a whole file gets no blank line
        log.write('{"id": "d", "optimal": "pot"}\n')
    assert path.read_text().endswith('"pot"}\n{"id": "d", "optimal": "pot"}\n')


def test_a_killed_and_resumed_search_writes_what_an_uninterrupted_one_does(tmp_path, monkeypatch):
    """The stage's main() on a fake solver whose outcomes are a pure function of the sampling seed, killed after
    its first chunk (and once halfway through writing its second), then resumed."""
    import contextlib
    import hashlib
    import json

    import stages.dots_search as stage
    from posttrain.params import load_params
    from stages.prepare import synthetic_splits

    params = load_params()
    params = params.model_copy(update={"dots_search": params.dots_search.model_copy(
        update={"n_questions": 8, "chunk_size": 3})})
    train = synthetic_splits(params.task, params.prepare, params.seed)["train"][:8]
    kill = {"after_calls": None}

    class FakeExecutor:
        def __init__(self, *args):
            self.calls = 0

        def run(self, recs, trajectories, temperature, seed, desc):
            self.calls += 1
            if kill["after_calls"] is not None and self.calls > kill["after_calls"]:
                raise KeyboardInterrupt("simulated kill")
            out, seen = [], {}
            for r, t in zip(recs, trajectories):
                k = seen[(r["id"], t.name)] = seen.get((r["id"], t.name), -1) + 1
                h = hashlib.sha256(f"{seed}|{r['id']}|{t.name}|{k}".encode()).digest()[0]
                out.append({"correct": h < 100, "attempts": 1, "n_tokens": 1})
            return out

    class NoTracking:
        def __getattr__(self, name):
            return lambda *a, **k: None

    monkeypatch.setattr(stage, "mlflow", NoTracking())
    monkeypatch.setattr(stage, "stage_run", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(stage, "load_params", lambda: params)
    monkeypatch.setattr(stage, "open_generator", lambda *a, **k: None)
    monkeypatch.setattr(stage, "plot_distribution", lambda *a, **k: None)
    monkeypatch.setattr(stage, "TrajectoryExecutor", FakeExecutor)

    def search(workdir, kills=()):
        (workdir / "data/prepared").mkdir(parents=True)
        (workdir / "models/warmup").mkdir(parents=True)
        (workdir / "data/prepared/train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
        monkeypatch.chdir(workdir)
        for after_calls, cut in kills:
            kill["after_calls"] = after_calls
            with pytest.raises(SystemExit) as stop:  # the stage's entry point ends a Ctrl-C with exit 130
                stage.main()
            assert stop.value.code == 130
            if cut:  # a kill while the chunk's lines were being written: the last record is cut short
                done = next((workdir / "checkpoints").rglob("done.jsonl"))
                done.write_text(done.read_text()[:-40])
        kill["after_calls"] = None
        stage.main()
        return (workdir / "data/dots/search.jsonl").read_text()

    straight = search(tmp_path / "straight")
    assert search(tmp_path / "resumed", kills=[(params.dots_search.iterations, False)]) == straight
    assert search(tmp_path / "cut", kills=[(2 * params.dots_search.iterations, True)]) == straight


def test_the_distribution_plot_places_string_groups_without_matplotlib_categorical_warnings(tmp_path, caplog):
    """Difficulties come back from JSON as strings: passed to ax.bar as x, matplotlib logged 'Using categorical
    units ... parsable as floats' once per bar, 14 lines a run."""
    import logging

    from stages.dots_search import plot_distribution

    caplog.set_level(logging.INFO, logger="matplotlib")
    summary = {"optimal_by_difficulty": {"1": {"cot": 3, "dropped: all solved": 1}, "2": {"pot": 2}},
               "optimal_by_kind": {"rate": {"cot": 1}, "mix": {"pot": 1, "dropped: all failed": 2}}}
    plot_distribution(summary, tmp_path / "dist.png")
    assert (tmp_path / "dist.png").stat().st_size > 1000
    assert not [r for r in caplog.records if "categorical" in r.getMessage()]
