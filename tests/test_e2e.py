"""End to end on the smoke profile, in a copy of the repository: `dvc repro`, lineage in MLflow, caching (a second
repro runs nothing), every long stage resumed after a kill with nothing lost, judge faults, a sweep. The Prefect
flow and deployment: tests/test_prefect_e2e.py."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from posttrain.curves import read_curve
from posttrain.workspace import damaged_cache_objects, invalid_outputs, run_and_kill
from smoke_workspace import HANG_GUARD_S, ROOT, SECRET, STAGES, mlflow_runs, run, smoke_env, smoke_repo

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def repro(tmp_path_factory):
    repo = smoke_repo(tmp_path_factory.mktemp("dvc"))
    start = time.perf_counter()
    out = run(["dvc", "repro"], repo)
    print(f"smoke dvc repro: {time.perf_counter() - start:.1f} s")
    return repo, out


def test_repro_writes_every_output(repro):
    repo, out = repro
    for stage in STAGES:
        assert f"Running stage '{stage}'" in out
    for split in ("train", "dev", "test"):
        assert (repo / f"data/prepared/{split}.jsonl").stat().st_size > 0
    for model in ("base", "warmup"):
        assert (repo / f"models/{model}/config.json").is_file()
        assert (repo / f"models/{model}/tokenizer.json").is_file()
    metrics = json.loads((repo / "reports/metrics/evaluate.json").read_text())
    summary = metrics["warmup"]
    assert 0 <= summary["accuracy"] <= 1 and summary["mean_response_tokens"] > 0
    assert len(summary["by_format"]) == 13 and set(summary["by_difficulty"]) <= {str(d) for d in range(1, 7)}
    assert (repo / "reports/plots/accuracy_by_difficulty.csv").read_text().startswith("difficulty,accuracy")
    assert (repo / "reports/evaluate/accuracy_by_difficulty.png").stat().st_size > 1000
    rows = [json.loads(line) for line in (repo / "reports/evaluate/responses.jsonl").open()]
    # warm-up x 13 formats; DOTS internal, external, vanilla; the rlhf and rlvr policies: 12 test questions each
    assert len(rows) == 13 * 12 + 5 * 12 and {"response", "predicted", "correct", "reason"} <= set(rows[0])
    assert {"rlhf", "rlvr", "dots_internal"} <= set(json.loads((repo / "reports/metrics/evaluate.json").read_text()))
    assert "## Accuracy by stage" in (repo / "reports/README.md").read_text()
    assert (repo / "reports/report/accuracy_by_stage.png").stat().st_size > 1000
    # each training stage's curve: DVC plots files the report draws (it read the untracked MLflow store before)
    for curve, column in (("warmup", "loss"), ("train_rm_pm", "loss"), ("train_rm_pointwise", "loss"),
                          ("rlhf_routed", "kl"), ("rlhf_routed", "dev_accuracy"),
                          ("rlvr_ar3po", "rollout_reward_mean")):
        assert read_curve(repo / f"reports/curves/{curve}.csv")[column].notna().sum() >= 2, curve
    assert list(read_curve(repo / "reports/curves/sft_internal.csv")) == ["step", "loss", "mean_token_accuracy",
                                                                          "learning_rate"]  # the smoke search kept none
    assert "## Training curves" in (repo / "reports/README.md").read_text()
    assert {"dots_internal", "dots_external", "sft_vanilla"} <= set(metrics)
    search = [json.loads(line) for line in (repo / "data/dots/search.jsonl").open()]
    assert len(search) == 12 and all(r["optimal"] or r["dropped"] for r in search)
    assert (repo / "models/sft/config.json").is_file() and (repo / "models/planner/config.json").is_file()


def test_every_file_the_stages_write_is_a_declared_output(repro):
    # an undeclared file is neither cached nor restored by `dvc checkout`, and can be stale (evaluate's PNG was)
    repo, _ = repro
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    outs = [o["path"] for stage in lock.values() for o in stage.get("outs", [])]
    copied = set(subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, text=True).stdout.split("\0"))  # what clone_workspace copied
    written = [rel for top in ("data", "models", "reports") for f in (repo / top).rglob("*")
               if f.is_file() and f.name != ".gitignore" and (rel := str(f.relative_to(repo))) not in copied]
    undeclared = [f for f in written if not any(f == o or f.startswith(o.rstrip("/") + "/") for o in outs)]
    assert not undeclared, undeclared


def test_preference_stages_write_pairs_models_and_figures(repro):
    from transformers import AutoModel, AutoModelForSequenceClassification

    from posttrain.preference_model import PreferenceModel

    repo, _ = repro
    samples = [json.loads(line) for line in (repo / "data/seppo/samples.jsonl").open()]
    assert len(samples) == 16 * 2
    assert {"reference", "anchor", "anchor_correct", "response", "h_w", "h_r", "anchor_wins",
            "verifier_wins"} <= set(samples[0])
    pairs = [json.loads(line) for line in (repo / "data/seppo/pairs.jsonl").open()]
    assert pairs and all(p["chosen"] != p["rejected"] for p in pairs)
    right_anchors = {(s["id"], s["anchor"]) for s in samples if s["anchor_correct"]}
    assert all((p["id"], p["chosen"]) in right_anchors for p in pairs if p["source"] == "anchor_vs_reference")
    bench = [json.loads(line) for line in (repo / "data/preference_benchmark/pairs.jsonl").open()]
    assert any(p["label"] in ("A", "B") for p in bench) and all(p["id"].startswith("test-") for p in bench)
    metrics = json.loads((repo / "reports/metrics/train_rm.json").read_text())
    for key in ("pm_accuracy", "pointwise_accuracy", "pm_ece_raw", "pm_ece_calibrated", "pm_pairs_per_s"):
        assert 0 <= metrics[key] and (key == "pm_pairs_per_s" or metrics[key] <= 1), key
    for png in ("reliability.png", "accuracy_by_uncertainty_decile.png"):
        assert (repo / "reports/rm" / png).stat().st_size > 1000
    # the PM loads with our class, its backbone with plain transformers; the pointwise RM is a standard HF model
    pm = PreferenceModel.from_pretrained(repo / "models/rm")
    g, var = pm.score([(bench[0]["question"], bench[0]["a"], bench[0]["b"])])
    assert g.shape == var.shape == (1,)
    # train_rm.reference_lm: the warm-up model travels inside models/rm, with the weights fitted on the pairs
    assert pm.reference is not None and pm.likelihood_weights == (metrics["likelihood_weight_pm"],
                                                                 metrics["likelihood_weight_ratio"])
    assert all(0 <= metrics[k] <= 1 for k in ("pm_alone_accuracy", "reference_ratio_accuracy"))
    assert AutoModel.from_pretrained(repo / "models/rm").config.hidden_size == pm.backbone.config.hidden_size
    assert AutoModelForSequenceClassification.from_pretrained(repo / "models/rm_pointwise").config.num_labels == 1


def test_rlhf_routed_writes_the_routing_curve_and_a_policy(repro):
    repo, out = repro
    metrics = json.loads((repo / "reports/metrics/rlhf_routed.json").read_text())
    routing = metrics["routing"]
    assert routing["judge_only"] >= routing["rm_only"] and set(routing["budgets"]) == {
        "0.0", "0.05", "0.1", "0.2", "0.4", "1.0"}
    assert routing["budgets"]["1.0"]["uncertainty"] == routing["judge_only"]
    assert (repo / "reports/routing/routing_curve.png").stat().st_size > 1000
    for row in map(json.loads, (repo / "reports/rm/benchmark_scores.jsonl").read_text().splitlines()):
        assert row["var"] == pytest.approx((row["var_ab"] + row["var_ba"]) / 2)  # what the curve reduces from
    assert metrics["judge_calls"] > 0 and metrics["judge_cost"] > 0 and 0 < metrics["routed_fraction"] <= 1
    assert (repo / "models/rlhf/config.json").is_file() and "rlhf_routed: test accuracy" in out
    assert "dev_accuracy" in mlflow_runs_by_stage(repo)["rlhf_routed"].data.metrics


def test_rlvr_ar3po_writes_a_policy_and_its_rollout_cost(repro):
    repo, out = repro
    metrics = json.loads((repo / "reports/metrics/rlvr_ar3po.json").read_text())
    assert metrics["algo"] == "ar3po" and metrics["rollout"]["responses"] > 0 and metrics["rollout"]["tokens"] > 0
    assert 2 <= metrics["responses_per_prompt"] <= 8  # k = 2 per stage, S = 4 stages
    assert 0 <= metrics["zero_advantage_share"] <= 1 and 0 < metrics["generation_share"] < 1
    assert {"sft_test", "rlvr_test"} <= set(metrics) and metrics["dev_curve"]
    assert (repo / "models/rlvr/config.json").is_file() and "rlvr_ar3po (ar3po): test accuracy" in out
    logged = mlflow_runs_by_stage(repo)["rlvr_ar3po"].data.metrics
    assert {"rollout/total_responses", "rollout/zero_advantage_share", "dev_accuracy"} <= set(logged)


def test_the_judge_key_leaves_no_trace(repro):
    repo, out = repro
    assert SECRET not in out
    for path in repo.rglob("*"):
        if path.is_file() and ".git" not in path.parts and path.stat().st_size < 200_000_000:
            assert SECRET.encode() not in path.read_bytes(), path


def mlflow_runs_by_stage(repo: Path) -> dict:
    return {r.data.tags["posttrain.stage"]: r for r in mlflow_runs(repo)}


def test_one_mlflow_run_per_stage_with_lineage(repro):
    repo, _ = repro
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    runs = mlflow_runs(repo)
    by_stage = {}
    for r in runs:
        by_stage.setdefault(r.data.tags["posttrain.stage"], []).append(r)
    assert sorted(by_stage) == sorted(STAGES)
    for stage in STAGES:
        (r,) = by_stage[stage]
        tags = r.data.tags
        assert r.info.status == "FINISHED"
        assert tags["git.commit"] == commit and tags["git.dirty"] == "false"
        for kind in ("deps", "outs"):
            for entry in lock[stage][kind]:
                assert tags[f"dvc.{kind[:-1]}.{entry['path']}"] == entry["md5"], (stage, entry["path"])
        assert any(k.startswith(f"{stage}.") or k == "seed" for k in r.data.params)
    warmup = by_stage["warmup"][0]
    assert "loss" in warmup.data.metrics and warmup.data.metrics["train_tokens_per_s"] > 0


def test_a_stage_training_several_models_gives_each_a_nested_run(repro):
    """train_rm's pointwise RM trains in a run of its own under the stage's, in the same experiment (it landed in
    MLflow's Default experiment). (The smoke search keeps no question, so sft trains nothing here; its three
    planners' runs are tests/test_sft_stage.py's.)"""
    repo, _ = repro
    stages = {r.info.run_id: r for r in mlflow_runs(repo)}
    parts = {}
    for r in mlflow_runs(repo, parts=True):
        parent = stages[r.data.tags["mlflow.parentRunId"]]
        assert r.data.tags["posttrain.part_of"] == parent.data.tags["posttrain.stage"]
        assert r.info.status == "FINISHED" and "loss" in r.data.metrics and "learning_rate" in r.data.params
        parts.setdefault(r.data.tags["posttrain.part_of"], []).append(r.info.run_name)
    assert parts == {"train_rm": ["train_rm pointwise_rm"]}


def test_second_repro_runs_nothing(repro):
    repo, _ = repro
    out = run(["dvc", "repro"], repo)
    assert "Running stage" not in out
    assert run(["dvc", "status"], repo).strip().endswith("Data and pipelines are up to date.")


def test_a_code_change_that_keeps_the_weights_reruns_nothing_downstream(repro):
    """DVC's early cutoff: the re-run policy is bit-identical, so evaluate (which reads it) stays cached. A model
    directory that carried the run's pickled Trainer arguments (their checkpoint key moves with the code) would
    hash anew and re-run it."""
    repo, _ = repro
    stage = repo / "stages/rlhf_routed.py"
    stage.write_text(stage.read_text() + "\n# a change that leaves the weights as they were\n")
    out = run(["dvc", "repro"], repo)
    assert "Running stage 'rlhf_routed'" in out
    assert "Running stage 'evaluate'" not in out and "Stage 'evaluate' didn't change" in out
    assert not list((repo / "models").glob("*/training_args.bin"))


def kill_when(cmd: list[str], repo: Path, ready, timeout: float = 600) -> None:
    """Run ``cmd``, SIGKILL its whole process group once ``ready()`` is true (or time runs out). The stage starts
    without checkpoints (those of earlier successful runs stay; ``ready`` must only see this run's)."""
    shutil.rmtree(repo / "checkpoints" / cmd[-1], ignore_errors=True)
    ran = run_and_kill(cmd, repo, smoke_env(repo.parent), lambda _: ready(), timeout=timeout, poll_s=0.05)
    assert ran.returncode in (None, 0), f"{' '.join(cmd)} failed (exit {ran.returncode}) before it could be killed"


def assert_nothing_lost(repo: Path, stage: str, outputs: list[str]) -> None:
    """After the resumed run: DVC sees the stage up to date, its cache is whole, every output file parses."""
    assert "changed" not in run(["dvc", "status", stage], repo)
    assert damaged_cache_objects(repo) == []
    assert invalid_outputs([repo / o for o in outputs]) == []


def swapped_in_since(model_dir: Path, start: float) -> bool:
    """A stage's finished model directory is in place: its config.json was written after ``start``. (Not the
    directory's own mtime: that also moves while DVC deletes the old output as the stage starts, and a kill then
    lands before any training.)"""
    try:
        return (model_dir / "config.json").stat().st_mtime >= start
    except OSError:
        return False


def set_params(repo: Path, section: str, **values) -> None:
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params[section].update(values)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def test_warmup_resumes_after_a_kill(repro):
    repo, _ = repro
    set_params(repo, "warmup", max_steps=60)
    kill_when(["dvc", "repro", "warmup"], repo,
              lambda: bool(list((repo / "checkpoints/warmup").glob("*/checkpoint-20"))))
    assert list((repo / "checkpoints/warmup").glob("*/checkpoint-*")), "no checkpoint before the kill"
    out = run(["dvc", "repro", "warmup"], repo)
    assert "warmup: resuming from" in out and "checkpoint-" in out
    assert len(list((repo / "checkpoints/warmup").iterdir())) == 1, "the checkpoints of other params are removed"
    assert_nothing_lost(repo, "warmup", ["models/warmup"])


def test_a_kill_after_the_stage_finished_but_before_dvc_recorded_it_resumes_at_the_end(repro):
    """DVC hashes and caches a stage's outputs after the stage exits; a kill then must not cost the training."""
    repo, _ = repro
    set_params(repo, "warmup", max_steps=40)
    start = time.time()
    kill_when(["dvc", "repro", "warmup"], repo, lambda: swapped_in_since(repo / "models/warmup", start))
    out = run(["dvc", "repro", "warmup"], repo)
    assert "warmup: resuming from" in out and "checkpoint-40" in out
    assert_nothing_lost(repo, "warmup", ["models/warmup"])


def test_dots_search_resumes_after_a_kill(repro):
    repo, _ = repro
    set_params(repo, "dots_search", temperature=0.7)

    def six_done() -> bool:  # searched, and their cost saved (it is written just after)
        done = list((repo / "checkpoints/dots_search").glob("*/done.jsonl"))
        cost = list((repo / "checkpoints/dots_search").glob("*/cost.json"))
        return bool(done) and done[0].read_text().count("\n") >= 6 and bool(cost) and \
            json.loads(cost[0].read_text()).get("questions", 0) >= 6  # written atomically

    kill_when(["dvc", "repro", "dots_search"], repo, six_done)
    assert list((repo / "checkpoints/dots_search").glob("*/done.jsonl")), "no progress before the kill"
    out = run(["dvc", "repro", "dots_search"], repo)
    assert "dots_search: resuming, 6 of 12 questions already searched" in out
    assert len((repo / "data/dots/search.jsonl").read_text().splitlines()) == 12
    # the cost counts both processes' questions (the killed one's chunks too), not only the resumed process's
    assert json.loads((repo / "reports/metrics/dots_search.json").read_text())["cost"]["questions"] == 12
    assert_nothing_lost(repo, "dots_search", ["data/dots", "reports/dots"])


@pytest.fixture(scope="module")
def seppo_straight(repro):
    """data/seppo/samples.jsonl of an uninterrupted seppo_sample run, on the models as earlier tests left them."""
    repo, _ = repro
    run(["dvc", "repro", "-f", "--single-item", "seppo_sample"], repo)
    return (repo / "data/seppo/samples.jsonl").read_text()


@pytest.mark.parametrize("saved,resumed", [("reference_0.jsonl", "seppo_sample: resuming, reference"),
                                           ("anchor_verdicts.json", "seppo_sample: resuming, anchors scored already")])
def test_seppo_sample_resumes_after_a_kill_and_samples_what_an_uninterrupted_run_does(repro, seppo_straight, saved,
                                                                                     resumed):
    repo, _ = repro
    cmd = ["dvc", "repro", "-f", "--single-item", "seppo_sample"]
    kill_when(cmd, repo, lambda: bool(list((repo / "checkpoints/seppo_sample").glob(f"*/{saved}"))))
    out = run(cmd, repo)
    assert resumed in out
    assert (repo / "data/seppo/samples.jsonl").read_text() == seppo_straight
    assert_nothing_lost(repo, "seppo_sample", ["data/seppo", "reports/metrics/seppo_sample.json"])


def test_sft_killed_while_its_outputs_are_written_leaves_nothing_half_done(repro):
    """The kill lands the moment the first finished model directory is swapped in, while the stage still writes the
    others (or DVC moves them into its cache)."""
    repo, _ = repro
    set_params(repo, "sft", learning_rate=0.002)
    start = time.time()
    kill_when(["dvc", "repro", "--single-item", "sft"], repo,
              lambda: any(swapped_in_since(repo / o, start) for o in ("models/sft", "models/planner",
                                                                       "models/sft_vanilla")))
    run(["dvc", "repro", "--single-item", "sft"], repo)
    assert_nothing_lost(repo, "sft", ["models/sft", "models/sft_checkpoints", "models/planner", "models/sft_vanilla"])


def test_train_rm_resumes_after_a_kill(repro):
    repo, _ = repro
    set_params(repo, "train_rm", max_steps=12)
    cmd = ["dvc", "repro", "--single-item", "train_rm"]
    kill_when(cmd, repo, lambda: bool(list((repo / "checkpoints/train_rm/pm").glob("*/checkpoint-6"))))
    assert list((repo / "checkpoints/train_rm/pm").glob("*/checkpoint-*")), "no checkpoint before the kill"
    out = run(cmd, repo)
    assert "train_rm: resuming the preference model from" in out
    assert json.loads((repo / "reports/metrics/train_rm.json").read_text())["n_decisive"] > 0
    assert_nothing_lost(repo, "train_rm", ["models/rm", "models/rm_pointwise", "reports/rm"])


def test_rlvr_ar3po_resumes_after_a_kill(repro):
    repo, _ = repro
    set_params(repo, "rlvr", max_steps=4)
    cmd = ["dvc", "repro", "--single-item", "rlvr_ar3po"]
    kill_when(cmd, repo, lambda: bool(list((repo / "checkpoints/rlvr_ar3po").glob("*/checkpoint-2/rollout_state.json"))))
    saved = json.loads(next((repo / "checkpoints/rlvr_ar3po").glob("*/checkpoint-2/rollout_state.json")).read_text())
    out = run(cmd, repo)
    assert "rlvr_ar3po: resuming from" in out
    totals = json.loads((repo / "reports/metrics/rlvr_ar3po.json").read_text())["rollout"]
    # the resumed run carried the totals on: 4 steps counted, not just the 2 after the resume
    assert totals["prompts"] == 4 * 2 and totals["responses"] > saved["totals"]["responses"]
    assert_nothing_lost(repo, "rlvr_ar3po", ["models/rlvr"])


def test_rlvr_ar3po_run_again_at_its_end_saves_the_same_model(repro):
    """Forced to run again, the stage resumes from its last checkpoint. Mid-epoch (3 steps of 2 a pass) transformers
    trained a 4th step there, and the tokenizer came out without the padding that generation had left in it: both
    moved the output's hash, so whether a stage resumed changed what DVC recorded."""
    repo, _ = repro
    set_params(repo, "rlvr", max_steps=3)
    cmd = ["dvc", "repro", "--single-item", "rlvr_ar3po"]
    run(cmd, repo)
    first = {f.name: f.read_bytes() for f in (repo / "models/rlvr").iterdir()}
    totals = json.loads((repo / "reports/metrics/rlvr_ar3po.json").read_text())["rollout"]["responses"]
    out = run([*cmd, "--force"], repo)
    assert "rlvr_ar3po: resuming from" in out and "checkpoint-3" in out
    assert {f.name: f.read_bytes() for f in (repo / "models/rlvr").iterdir()} == first
    assert json.loads((repo / "reports/metrics/rlvr_ar3po.json").read_text())["rollout"]["responses"] == totals


def test_rlhf_routed_resumes_with_its_judge_ledger_and_dev_history(repro):
    """Killed after its second checkpoint, the resumed run's figures still cover all its steps: every routed pair's
    verdict (asked in both orders, paid or from the cache) is in the ledger, and the dev accuracy of step 2 is kept."""
    from posttrain.routing import budget_count

    repo, _ = repro
    set_params(repo, "rlhf", max_steps=4, save_steps=1, dev_every=2)
    cfg = yaml.safe_load((repo / "params.yaml").read_text())["rlhf"]
    cmd = ["dvc", "repro", "--single-item", "rlhf_routed"]
    kill_when(cmd, repo, lambda: bool(list((repo / "checkpoints/rlhf_routed").glob("*/checkpoint-2/routing_state.json"))))
    out = run(cmd, repo)
    assert "rlhf_routed: resuming from" in out and "checkpoint-" in out
    metrics = json.loads((repo / "reports/metrics/rlhf_routed.json").read_text())
    n = cfg["n_responses"]
    routed = cfg["max_steps"] * budget_count(cfg["prompts_per_step"] * n * (n - 1) // 2, cfg["budget"])
    assert metrics["judge_calls"] + metrics["judge_cache_hits"] == 2 * routed  # both orders asked
    assert [step for step, _ in metrics["dev_accuracy"]] == [2, 4]
    assert_nothing_lost(repo, "rlhf_routed", ["models/rlhf", "reports/routing"])


def test_rlhf_routed_survives_every_judge_fault(repro):
    """The local judge injects every fault it knows on most requests; the stage finishes, each failed pair falls back
    to the PM, and every failure is counted by kind in MLflow."""
    repo, _ = repro
    original = (repo / "params.yaml").read_text()
    try:
        set_params(repo, "judge", faults={"http_500": 0.12, "http_429": 0.12, "timeout": 0.1, "malformed_json": 0.12,
                                          "truncated_json": 0.12, "no_verdict": 0.12, "connection_reset": 0.12},
                   timeout_s=1.0, max_retries=1, backoff_s=0.05, max_backoff_s=0.3, cache=".cache/judge_faults.sqlite")
        set_params(repo, "rlhf", routing="judge_only", max_steps=2)
        out = run(["dvc", "repro", "--single-item", "rlhf_routed"], repo)
    finally:
        (repo / "params.yaml").write_text(original)
    metrics = json.loads((repo / "reports/metrics/rlhf_routed.json").read_text())
    # pairs that fell back to the PM, and the failed requests behind them (per order asked)
    assert metrics["judge_failures"] > 0 and metrics["judge_failed_requests"] > 0
    assert "rlhf_routed: test accuracy" in out
    latest = max((r for r in mlflow_runs(repo) if r.data.tags["posttrain.stage"] == "rlhf_routed"),
                 key=lambda r: r.info.start_time)
    logged = latest.data.metrics
    for kind in ("http_500", "rate_limited", "timeout", "malformed_body", "no_verdict", "connection"):
        assert logged.get(f"judge_total.failures.{kind}", 0) > 0, (kind, logged)
    assert logged["judge_total.failures"] == sum(v for k, v in logged.items() if k.startswith("judge_total.failures."))


def test_a_second_pipeline_run_fails_fast_on_dvc_lock_and_spoils_nothing(repro):
    repo, _ = repro
    first = subprocess.Popen(["dvc", "repro", "--force", "--single-item", "warmup"], cwd=repo, env=smoke_env(repo.parent),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in first.stdout:  # wait until the first holds DVC's lock and runs the stage
        seen.append(line)
        if "Running stage 'warmup'" in line:
            break
    start = time.perf_counter()
    second = subprocess.run(["dvc", "repro"], cwd=repo, env=smoke_env(repo.parent), capture_output=True, text=True,
                            timeout=120)
    waited = time.perf_counter() - start
    out_first = "".join(seen) + first.communicate(timeout=HANG_GUARD_S)[0]
    said = second.stdout + second.stderr
    # DVC's repository lock, or (while a stage runs) its read/write lock on the outputs in use
    assert second.returncode != 0 and ("Unable to acquire lock" in said or "is busy, it is being blocked by" in said)
    assert waited < 30, f"the second run took {waited:.0f} s to give up"
    assert first.returncode == 0, out_first[-3000:]
    # the first run's outputs are whole: DVC's record matches the files, and the model loads
    assert "changed outs" not in run(["dvc", "status", "warmup"], repo)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(repo / "models/warmup")


def test_sweep_runs_each_variant_as_an_experiment_and_mlflow_compares_them(repro):
    repo, _ = repro
    (repo / "sweep.yaml").write_text(yaml.safe_dump({
        "name": "algos", "targets": ["rlvr_ar3po"], "grid": {"rlvr.algo": ["grpo", "ar3po"]},
        "metrics": ["rlvr_ar3po:rlvr_test.accuracy", "rlvr_ar3po:rollout.responses"]}))
    run([sys.executable, "-m", "flows.sweep", "sweep.yaml"], repo)
    report = (repo / "reports/sweeps/algos.md").read_text()
    assert "algos-0" in report and "algos-1" in report and (repo / "reports/sweeps/algos.png").stat().st_size > 0
    # MLflow's compare view: every variant's stage run, tagged, with its params and metrics
    runs = [r for r in mlflow_runs(repo) if r.data.tags.get("posttrain.sweep") == "algos"
            and r.data.tags["posttrain.stage"] == "rlvr_ar3po"]
    by_variant = {r.data.tags["posttrain.variant"]: r for r in runs}
    assert sorted(by_variant) == ["algos-0", "algos-1"]
    assert by_variant["algos-0"].data.params["rlvr.algo"] == "grpo"
    assert by_variant["algos-1"].data.params["rlvr.algo"] == "ar3po"
    assert by_variant["algos-0"].info.run_name == "rlvr_ar3po algos-0"  # named apart in the compare view
    assert all("rlvr_test_accuracy" in r.data.metrics for r in runs)
    exps = run([sys.executable, "-m", "dvc", "exp", "show", "--json"], repo)
    assert "algos-0" in exps and "algos-1" in exps
