"""The training stages under DeepSpeed: a few SFT steps with ZeRO-1 on the CPU, through the same trainer config
(``posttrain.sft.sft_config`` with ``warmup.deepspeed`` set) that the warmup and sft stages use."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sft_steps_under_deepspeed_zero1_on_the_cpu(tmp_path):
    # One process of a world of one: what a launcher (deepspeed / accelerate launch) would export.
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "DS_BUILD_OPS": "0"}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "deepspeed_sft_run.py"), str(tmp_path),
                           str(ROOT / "configs" / "deepspeed" / "zero1_cpu.json")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert result["engine"] == "DeepSpeedEngine" and result["zero_stage"] == 1
    assert len(result["losses"]) == 6 and result["losses"][-1] < result["losses"][0]
    # a DeepSpeed checkpoint: ZeRO optimizer states per rank beside the HF weights
    files = result["checkpoint_files"]
    assert any(f.endswith("zero_pp_rank_0_mp_rank_00_optim_states.pt") for f in files), files
    assert "checkpoint-6/model.safetensors" in files


def test_under_zero3_every_trainer_loads_its_model_with_zero3_on(tmp_path):
    """The SFT, pointwise-RM and PM trainers loaded their model before building the trainer's args, so ZeRO-3's
    zero.Init was not on and every rank held the whole model in memory before DeepSpeed partitioned it."""
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "DS_BUILD_OPS": "0"}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "deepspeed_zero3_load_run.py"), str(tmp_path),
                           str(ROOT / "configs" / "deepspeed" / "zero3.json")],
                          env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert seen == {"sft": True, "pointwise_rm": True, "preference_model": True}
