"""Run by tests/test_deepspeed.py in a fresh process (DeepSpeed initialises torch.distributed once per process):
a few SFT steps of a tiny model with the trainer config the pipeline's SFT stages build, under a DeepSpeed config.

    python3 tests/deepspeed_sft_run.py <workdir> <deepspeed.json>     # prints one JSON line: RESULT {...}
"""
import json
import sys
from pathlib import Path

from datasets import Dataset
from trl import SFTTrainer

sys.path.insert(0, str(Path(__file__).parent))
from tiny_model import tiny_scratch_model  # noqa: E402

from posttrain.params import load_params  # noqa: E402
from posttrain.sft import sft_config  # noqa: E402
from posttrain.task.solutions import render_response  # noqa: E402
from posttrain.trajectories import TRAJECTORIES, prompt  # noqa: E402

work, deepspeed = Path(sys.argv[1]), sys.argv[2]
tiny = tiny_scratch_model(work / "init", n_problems=16, seed=3)
examples = [{"prompt": prompt(p.question, t), "completion": render_response(p, t)}
            for p in tiny.problems for t in TRAJECTORIES[:2]]
smoke = load_params(Path(__file__).parents[1] / "configs" / "params.smoke.yaml")
cfg = smoke.warmup.model_copy(update={"deepspeed": deepspeed, "max_steps": 6, "save_steps": 6, "logging_steps": 1,
                                      "batch_size": 4, "grad_accum": 1, "learning_rate": 3e-3})
args = sft_config(cfg, work / "ckpt", seed=0)
args.report_to = []
trainer = SFTTrainer(model=tiny.model, args=args, train_dataset=Dataset.from_list(examples), processing_class=tiny.tok)
trainer.train()
losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
plugin = trainer.accelerator.state.deepspeed_plugin
print("RESULT " + json.dumps({
    "engine": type(trainer.model_wrapped).__name__, "zero_stage": plugin.zero_stage if plugin else None,
    "losses": losses, "checkpoint_files": sorted(str(p.relative_to(work / "ckpt")) for p in (work / "ckpt").rglob("*"))}))
