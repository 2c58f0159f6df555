"""A kill during the Trainer's checkpoint write must not leave a checkpoint that resume then crashes on."""
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from posttrain.checkpoints import last_complete_checkpoint


def write_weights(checkpoint):
    save_file({"w": torch.ones(64, 64)}, str(checkpoint / "model.safetensors"))
    torch.save({"state": {0: torch.zeros(64)}}, checkpoint / "optimizer.pt")


def test_a_checkpoint_without_its_trainer_state_is_skipped(tmp_path):
    for step in (10, 20, 30):
        (tmp_path / f"checkpoint-{step}").mkdir()
        write_weights(tmp_path / f"checkpoint-{step}")
    (tmp_path / "checkpoint-10" / "trainer_state.json").write_text('{"global_step": 10}')
    (tmp_path / "checkpoint-20" / "trainer_state.json").write_text('{"global_step": 20}')
    # checkpoint-30: killed after the weights, before the state (the CI failure of stop 11)
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-20")
    # killed while writing the state itself: a truncated JSON is not complete either
    (tmp_path / "checkpoint-30" / "trainer_state.json").write_text('{"global_st')
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-20")
    (tmp_path / "checkpoint-30" / "trainer_state.json").write_text('{"global_step": 30}')
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-30")


def test_a_copy_named_like_a_checkpoint_is_no_step(tmp_path):
    from transformers.trainer import TRAINER_STATE_NAME

    for name in ("checkpoint-5", "checkpoint-backup-20", "checkpoint-7-old"):
        (tmp_path / name).mkdir()
        (tmp_path / name / TRAINER_STATE_NAME).write_text("{}")
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-5")  # was int('backup'): ValueError


def test_no_checkpoint_means_a_fresh_start(tmp_path):
    assert last_complete_checkpoint(tmp_path / "missing") is None
    (tmp_path / "checkpoint-5").mkdir()
    assert last_complete_checkpoint(tmp_path) is None


@pytest.mark.parametrize("damaged", ["model.safetensors", "optimizer.pt"])
def test_a_checkpoint_with_a_damaged_file_is_skipped_with_a_warning(tmp_path, damaged):
    for step in (10, 20):
        (tmp_path / f"checkpoint-{step}").mkdir()
        write_weights(tmp_path / f"checkpoint-{step}")
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    path = tmp_path / "checkpoint-20" / damaged
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # cut short after the state was written
    with pytest.warns(UserWarning, match=f"checkpoint-20: damaged {damaged}"):
        assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")


def test_a_deepspeed_checkpoint_with_a_damaged_optimizer_shard_is_skipped(tmp_path):
    """Under DeepSpeed the optimizer states are in checkpoint-<n>/global_step<n>/; a cut shard there was not looked
    at, and the resume crashed in DeepSpeed's torch.load instead of going back to the checkpoint before."""
    for step in (10, 20):
        checkpoint = tmp_path / f"checkpoint-{step}"
        (checkpoint / f"global_step{step}").mkdir(parents=True)
        write_weights(checkpoint)
        shard = checkpoint / f"global_step{step}" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
        torch.save({"state": torch.zeros(64)}, shard)
        (checkpoint / "latest").write_text(f"global_step{step}")
        (checkpoint / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    shard = tmp_path / "checkpoint-20" / "global_step20" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.warns(UserWarning, match="checkpoint-20: damaged global_step20/zero_pp_rank_0"):
        assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")


def test_checkpoint_dir_keys_on_inputs_and_removes_the_stale_ones(tmp_path):
    from pydantic import BaseModel

    from posttrain.checkpoints import claim_checkpoint_dir

    class Cfg(BaseModel):
        lr: float

    data, root = tmp_path / "train.jsonl", tmp_path / "ckpt"
    data.write_text("a\n")
    first = claim_checkpoint_dir(root, Cfg(lr=0.1), 0, [data])
    (first / "checkpoint-5").mkdir(parents=True)
    assert claim_checkpoint_dir(root, Cfg(lr=0.1), 0, [data]) == first and (first / "checkpoint-5").is_dir()
    data.write_text("b\n")  # other inputs: another key, and the old checkpoints are stale
    second = claim_checkpoint_dir(root, Cfg(lr=0.1), 0, [data])
    assert second != first and not first.exists()
    assert claim_checkpoint_dir(root, {"lr": 0.2}, 0, [data]) not in (first, second)


def test_without_dvc_hashes_an_edit_to_the_projects_code_starts_afresh(tmp_path, monkeypatch):
    """Outside a stage run (or where DVC could not hash the deps) the key held params and key files only: a run
    resumed after an edit to the verifier picked up the old verifier's checkpoints."""
    import posttrain.checkpoints as checkpoints

    code = tmp_path / "code"
    (code / "posttrain/task").mkdir(parents=True)
    (code / "stages").mkdir()
    verifier = code / "posttrain/task/verifier.py"
    verifier.write_text("ANSWER = 'last line'\n")
    (code / "stages/sft.py").write_text("")
    monkeypatch.setattr(checkpoints, "CODE_ROOT", code)
    data = tmp_path / "train.jsonl"
    data.write_text("{}\n")
    before = checkpoints.claim_checkpoint_dir(tmp_path / "ckpt", {"lr": 0.1}, 0, [data])
    assert checkpoints.claim_checkpoint_dir(tmp_path / "ckpt", {"lr": 0.1}, 0, [data]) == before
    verifier.write_text("ANSWER = 'boxed'\n")
    assert checkpoints.claim_checkpoint_dir(tmp_path / "ckpt", {"lr": 0.1}, 0, [data]) != before
    assert verifier in checkpoints.project_code() and len(checkpoints.project_code()) == 2


def test_a_resume_under_another_number_of_processes_starts_afresh(tmp_path, monkeypatch):
    """A run killed on 2 ranks and run again on 1 (or 8 GPUs, then 4) resumed the same checkpoints: another global
    batch from the middle on, and under DeepSpeed a crash (ZeRO states cannot be loaded by another world size)."""
    from posttrain.checkpoints import claim_checkpoint_dir

    data = tmp_path / "train.jsonl"
    data.write_text("a\n")
    alone = claim_checkpoint_dir(tmp_path / "ckpt", {"lr": 0.1}, 0, [data])
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert claim_checkpoint_dir(tmp_path / "ckpt", {"lr": 0.1}, 0, [data]) == alone
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert claim_checkpoint_dir(tmp_path / "ckpt", {"lr": 0.1}, 0, [data]) != alone


def test_in_a_stage_run_the_key_is_dvcs_hashes_of_the_deps(tmp_path, monkeypatch):
    import mlflow

    from posttrain.checkpoints import claim_checkpoint_dir

    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.chdir(tmp_path)
    try:
        data = Path("models/sft/model.bin")
        data.parent.mkdir(parents=True)
        data.write_bytes(b"weights")
        with mlflow.start_run(tags={"dvc.dep.models/sft": "aaa", "dvc.dep.stages/x.py": "bbb"}):
            first = claim_checkpoint_dir(tmp_path / "ckpt", {"lr": 0.1}, 0, [data])
            data.write_bytes(b"not read: DVC's md5 stands for it")
            assert claim_checkpoint_dir(tmp_path / "ckpt", {"lr": 0.1}, 0, [data]) == first
        with mlflow.start_run(tags={"dvc.dep.models/sft": "aaa", "dvc.dep.stages/x.py": "ccc"}):  # code changed
            assert claim_checkpoint_dir(tmp_path / "ckpt", {"lr": 0.1}, 0, [data]) != first
    finally:
        mlflow.set_tracking_uri(before)


def test_a_key_file_outside_the_stages_deps_is_read(tmp_path, monkeypatch):
    """evaluate keys its finished shards on every model it scores, and evaluate.models may name a model that is not
    one of its DVC deps: the key read only the deps' hashes, so a retrained models/mine resumed the old scores."""
    import mlflow

    from posttrain.checkpoints import claim_checkpoint_dir

    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.chdir(tmp_path)
    try:
        covered, outside = Path("models/sft"), Path("models/mine")
        for d in (covered, outside):
            d.mkdir(parents=True)
            (d / "model.bin").write_bytes(b"weights")
        keys = []
        for weights in (b"weights", b"retrained"):
            (outside / "model.bin").write_bytes(weights)
            with mlflow.start_run(tags={"dvc.dep.models/sft": "aaa"}):
                keys.append(claim_checkpoint_dir(Path("ckpt"), {"lr": 0.1}, 0, [covered, outside]))
        assert keys[0] != keys[1]
    finally:
        mlflow.set_tracking_uri(before)


def test_inside_a_part_run_the_key_is_still_the_stages_dvc_hashes(tmp_path):
    """sft trains each planner in a part_run, whose tags held no dvc.dep.*: the key fell back to the input files'
    bytes, so after a code change the stage resumed the old code's final checkpoint and saved the old model."""
    import mlflow

    from posttrain.checkpoints import claim_checkpoint_dir
    from posttrain.tracking import part_run

    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    try:
        data = tmp_path / "model.bin"
        data.write_bytes(b"weights")
        keys = []
        for code in ("bbb", "ccc"):  # stages/sft.py changed, the inputs did not
            with mlflow.start_run(tags={"posttrain.stage": "sft", "dvc.dep.stages/sft.py": code}), part_run("internal"):
                keys.append(claim_checkpoint_dir(tmp_path / "ckpt", {"lr": 0.1}, 0, [data]))
        assert keys[0] != keys[1]
        (keys[1] / "checkpoint-4").mkdir(parents=True)
        # DVC could not hash the deps: the fallback key must keep the DVC-keyed checkpoints here too
        with mlflow.start_run(tags={"posttrain.stage": "sft", "posttrain.dvc_hashes_missing": "true"}), \
                part_run("internal"), pytest.warns(UserWarning, match="no DVC hashes"):
            claim_checkpoint_dir(tmp_path / "ckpt", {"lr": 0.1}, 0, [data])
        assert (keys[1] / "checkpoint-4").is_dir()
    finally:
        mlflow.set_tracking_uri(before)


def test_a_stage_run_without_dvc_hashes_keeps_the_other_keys_checkpoints(tmp_path):
    """When DVC cannot hash a stage's deps the key falls back to file bytes; the checkpoints under the DVC key
    (the killed run's) must survive it."""
    import mlflow

    from posttrain.checkpoints import claim_checkpoint_dir

    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    try:
        data, root = tmp_path / "model.bin", tmp_path / "ckpt"
        data.write_bytes(b"weights")
        with mlflow.start_run(tags={"posttrain.stage": "warmup", "dvc.dep.models/base": "aaa"}):
            keyed = claim_checkpoint_dir(root, {"lr": 0.1}, 0, [data])
            (keyed / "checkpoint-40").mkdir(parents=True)
        with mlflow.start_run(tags={"posttrain.stage": "warmup", "posttrain.dvc_hashes_missing": "true"}):
            with pytest.warns(UserWarning, match="no DVC hashes"):
                fallback = claim_checkpoint_dir(root, {"lr": 0.1}, 0, [data])
        assert fallback != keyed and (keyed / "checkpoint-40").is_dir()
    finally:
        mlflow.set_tracking_uri(before)


def test_dvc_hashes_retries_a_failing_hash(monkeypatch):
    from dvc.repo import Repo

    from posttrain.tracking import dvc_hashes

    calls = []
    real = Repo.__init__

    def flaky(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError("database is locked")
        real(self, *args, **kwargs)

    monkeypatch.setattr(Repo, "__init__", flaky)
    hashes = dvc_hashes("prepare", "dep")
    assert len(calls) == 2 and "dvc.dep.stages/prepare.py" in hashes


def test_a_resumed_sft_counts_the_tokens_it_trained_and_keeps_its_whole_curve(tmp_path, restore_tracking_uri):
    """TRL's token count starts again at 0 on a resume: the session after a kill at step 2 reported 424 tokens of
    the 1,199 it trained, and after a kill at step 4, 0. The curve file holds every step once, those before the
    kill as the killed session logged them."""
    import json
    import shutil

    import yaml
    from tiny_model import tiny_scratch_model

    from posttrain.curves import read_curve
    from posttrain.params_schema import SftParams
    from posttrain.sft import train_sft
    from posttrain.task.solutions import render_response
    from posttrain.trajectories import TRAJECTORIES, prompt

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    tiny = tiny_scratch_model(tmp_path / "tiny", n_problems=20, seed=3)
    examples = [{"prompt": prompt(p.question), "completion": f" {t.name}\n{render_response(p, t)}"}
                for p in tiny.problems for t in TRAJECTORIES[:3]]
    base = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())["sft"]
    cfg = SftParams(**{**base, "max_steps": 6, "save_steps": 2, "batch_size": 4, "logging_steps": 1})
    (tmp_path / "key").write_text("x")

    def train(ckpt, out):  # inside a run of its own, as in a stage (no run left active for the next test)
        with mlflow.start_run():
            return train_sft(tiny.path, examples, cfg, str(tmp_path / out), tmp_path / ckpt,
                             key_files=[tmp_path / "key"], seed=1, snapshots=str(tmp_path / f"snapshots_{out}"),
                             curve=tmp_path / f"{out}.csv")
    full = train("ckpt", "full")
    key = next((tmp_path / "ckpt").iterdir())
    counted = {log["step"]: log["num_tokens"] for log in
               json.loads((key / "checkpoint-6" / "trainer_state.json").read_text())["log_history"] if "num_tokens" in log}
    for killed_at in (2, 4):
        shutil.rmtree(tmp_path / "killed", ignore_errors=True)
        shutil.copytree(tmp_path / "ckpt", tmp_path / "killed")
        for later in next((tmp_path / "killed").iterdir()).glob("checkpoint-*"):
            if int(later.name.split("-")[1]) > killed_at:
                shutil.rmtree(later)
        resumed = train("killed", f"resumed_{killed_at}")
        assert resumed["resumed_from"] and resumed["train_tokens"] == full["train_tokens"] - counted[killed_at]
        whole, after_kill = read_curve(tmp_path / "full.csv"), read_curve(tmp_path / f"resumed_{killed_at}.csv")
        assert whole["step"].tolist() == after_kill["step"].tolist() == [1, 2, 3, 4, 5, 6]
        before = whole["step"] <= killed_at
        assert after_kill["loss"][before].tolist() == whole["loss"][before].tolist()
        assert after_kill["loss"].notna().all()


@pytest.mark.parametrize("stage", ["dots_search", "seppo_sample", "evaluate"])
def test_a_run_resumed_with_fewer_workers_keeps_what_the_killed_run_finished(stage, tmp_path):
    """Each resumable stage's key hashed every param it read, so lowering sandbox.workers (or evaluate.workers) after
    running out of memory started the work over; what the stage computes must still change the key."""
    import importlib

    from posttrain.checkpoints import claim_checkpoint_dir, result_params
    from posttrain.params import load_params

    sections = importlib.import_module(f"stages.{stage}").RESUME_SECTIONS
    params = load_params()
    fewer = params.model_copy(update={
        "evaluate": params.evaluate.model_copy(update={"workers": 1, "ray_address": "auto"}),
        "sandbox": params.sandbox.model_copy(update={"workers": 1})})
    first = claim_checkpoint_dir(tmp_path, result_params(params, sections), params.seed, [])
    first.mkdir(parents=True)
    (first / "done.jsonl").write_text("{}\n")
    assert claim_checkpoint_dir(tmp_path, result_params(fewer, sections), params.seed, []) == first
    assert (first / "done.jsonl").exists()
    more_cpu = params.sandbox.model_copy(update={"cpu_seconds": params.sandbox.cpu_seconds + 1})
    tighter = params.model_copy(update={"sandbox": more_cpu})
    assert claim_checkpoint_dir(tmp_path, result_params(tighter, sections), params.seed, []) != first


def test_the_saved_tokenizer_is_the_loaded_one_whatever_the_last_call_padded(tmp_path):
    """A fast tokenizer wrote its last call's padding into tokenizer.json: RLVR's model, saved after TRL's
    left-padded generation, held a padding section, while the same run resumed at its final checkpoint (no call)
    held none, so the output's hash depended on whether the stage resumed."""
    from types import SimpleNamespace

    from posttrain.checkpoints import save_trained
    from posttrain.modeling import train_tokenizer

    tokenizer = train_tokenizer(["Compute 12 + 30.", "Answer: 42"] * 20, vocab_size=300)
    tokenizer.save_pretrained(tmp_path / "loaded")
    tokenizer(["Compute 1 + 2.", "Answer: 3 and more"], padding=True, truncation=True, max_length=8)
    trainer = SimpleNamespace(save_model=lambda out: None)
    save_trained(trainer, tokenizer, tmp_path / "saved")
    assert (tmp_path / "saved/tokenizer.json").read_bytes() == (tmp_path / "loaded/tokenizer.json").read_bytes()
    assert tokenizer.backend_tokenizer.padding is not None  # the caller's tokenizer is left as it was


def test_a_run_resumed_at_its_last_step_trains_no_further(tmp_path):
    """max_steps ending mid-epoch: transformers took the next batch before it checked max_steps, so a resume from the
    last checkpoint trained a step more than the run it resumed (RLVR's resumed model took a 101st step)."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from posttrain.checkpoints import StopsAtMaxSteps

    class Line(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x, labels):
            return {"loss": ((self.w * x - labels) ** 2).mean()}

    class Resumable(StopsAtMaxSteps, Trainer):
        pass

    data = Dataset.from_list([{"x": float(i), "labels": 2.0 * i} for i in range(16)])  # 8 steps an epoch
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, save_steps=2,
                             learning_rate=0.01, report_to=[], use_cpu=True, save_only_model=False)
    done = Line()
    Resumable(model=done, args=args, train_dataset=data).train()
    for trainer_cls in (Resumable, Trainer):
        again = trainer_cls(model=Line(), args=args, train_dataset=data)
        again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
        if trainer_cls is Resumable:
            assert again.state.global_step == 2 and torch.equal(again.model.w, done.w)
        else:  # the bug it works around, still there: when transformers fixes it, this mixin can go
            assert again.state.global_step == 3
