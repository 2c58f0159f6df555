"""Run by tests/test_deepspeed.py in a fresh process (DeepSpeed initialises torch.distributed once per process):
whether ZeRO-3 is switched on when each training function of the pipeline loads its model under a ZeRO-3 config, so
that from_pretrained partitions the weights as it loads them (zero.Init) instead of every rank holding them whole.

    python3 tests/deepspeed_zero3_load_run.py <workdir> <zero3.json>     # prints one JSON line: RESULT {...}
"""
import json
import sys
from pathlib import Path

from transformers.integrations import is_deepspeed_zero3_enabled

sys.path.insert(0, str(Path(__file__).parent))
from tiny_model import tiny_scratch_model  # noqa: E402

import posttrain.preference_model  # noqa: E402
import posttrain.preference_training  # noqa: E402
import posttrain.sft  # noqa: E402
from posttrain.params import load_params  # noqa: E402


class Loaded(Exception):
    """Raised by the stand-in loader: the check is done, no training needed."""


def record(name: str):
    def loader(*args, **kwargs):
        seen[name] = is_deepspeed_zero3_enabled()
        raise Loaded
    return loader


work, deepspeed = Path(sys.argv[1]), sys.argv[2]
init = str(tiny_scratch_model(work / "init", n_problems=4, seed=3).path)
smoke = load_params(Path(__file__).parents[1] / "configs" / "params.smoke.yaml")
seen: dict[str, bool] = {}
posttrain.sft.load_pretrained = record("sft")
posttrain.preference_training.AutoModelForSequenceClassification.from_pretrained = record("pointwise_rm")
posttrain.preference_model.AutoModel.from_pretrained = record("preference_model")
calls = {
    "sft": lambda: posttrain.sft.train_sft(init, [], smoke.warmup.model_copy(update={"deepspeed": deepspeed}),
                                           str(work / "out"), work / "sft", [], seed=0),
    "pointwise_rm": lambda: posttrain.preference_training.train_pointwise_rm(
        init, [], smoke.train_rm.model_copy(update={"deepspeed": deepspeed}), work / "rm", work / "rm_ckpt", [], 0),
    "preference_model": lambda: posttrain.preference_training.train_preference_model(
        init, [], smoke.train_rm.model_copy(update={"deepspeed": deepspeed}), work / "pm_ckpt", [], 0),
}
for name, call in calls.items():
    try:
        call()
    except Loaded:
        pass
print("RESULT " + json.dumps(seen))
