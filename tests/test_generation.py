"""The generation interface: the engine named in params.generation, behind one ``generate``."""
import importlib.util
from pathlib import Path

import pytest
from tiny_model import tiny_scratch_model

from posttrain.generation import EngineError, HFGenerator, open_generator
from posttrain.params_schema import GenerationParams
from posttrain.trajectories import prompt

HF = GenerationParams(engine="hf", dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=1)


def test_open_generator_hf_gives_what_hf_generate_gives(tmp_path):
    tiny = tiny_scratch_model(tmp_path / "m", n_problems=6, seed=1)
    prompts = [prompt(p.question) for p in tiny.problems]
    direct = HFGenerator(tiny.model, tiny.tok, batch_size=4, max_new_tokens=10).generate(prompts, progress=False)
    opened = open_generator(tiny.path, HF, batch_size=3, max_new_tokens=10)
    assert isinstance(opened, HFGenerator)
    assert opened.generate(prompts, progress=False) == direct
    assert all(0 < c.n_tokens <= 10 for c in direct)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_engine_without_vllm_says_what_to_install(tmp_path):
    with pytest.raises(EngineError, match="bench/vllm_cpu.sh"):
        open_generator(str(tmp_path), HF.model_copy(update={"engine": "vllm"}), batch_size=1, max_new_tokens=4)


def test_rl_stages_hand_the_vllm_mode_to_trl():
    from posttrain.params import load_params
    from posttrain.rlhf import grpo_config
    from posttrain.rlvr import rlvr_config
    params = load_params(Path(__file__).resolve().parents[1] / "configs" / "params.smoke.yaml")
    assert not rlvr_config(params.rlvr, "/tmp/unused", seed=0).use_vllm
    server = rlvr_config(params.rlvr.model_copy(update={"vllm": "server"}), "/tmp/unused", seed=0)
    assert (server.use_vllm, server.vllm_mode, server.vllm_server_base_url) == (True, "server", "http://127.0.0.1:8000")
    colocate = grpo_config(params.rlhf.model_copy(update={"vllm": "colocate"}), Path("/tmp/unused"), seed=0)
    assert (colocate.use_vllm, colocate.vllm_mode, colocate.vllm_server_base_url) == (True, "colocate", None)


def test_sampling_is_plain_whatever_the_models_generation_config_says(tmp_path):
    """A hub model's generation_config (top_p 0.3, a repetition penalty) changed what the same seed sampled."""
    tiny = tiny_scratch_model(tmp_path / "m", n_problems=6, seed=1)
    prompts = [prompt(p.question) for p in tiny.problems]
    generator = HFGenerator(tiny.model, tiny.tok, batch_size=8, max_new_tokens=24)
    plain = [generator.generate(prompts, temperature, seed=7, progress=False) for temperature in (0.0, 1.0)]
    tiny.model.generation_config.top_p = 0.3
    tiny.model.generation_config.repetition_penalty = 1.3
    assert [generator.generate(prompts, temperature, seed=7, progress=False) for temperature in (0.0, 1.0)] == plain


def test_vllm_gets_one_seed_per_prompt_so_a_repeated_prompt_is_sampled_afresh(monkeypatch):
    """vLLM broadcasts one seeded SamplingParams to the whole batch and seeds each request alike, so DOTS's n_eval
    copies of a prompt came back as one sample n times. A stand-in vllm module records what the engine is given."""
    import sys
    import types
    from dataclasses import dataclass

    from posttrain.generation import VLLMGenerator

    @dataclass
    class SamplingParams:
        temperature: float
        max_tokens: int
        seed: int | None
        skip_special_tokens: bool

    given = []

    class LLM:
        def __init__(self, **kwargs):
            pass

        def get_tokenizer(self):
            return lambda prompts, add_special_tokens: {"input_ids": [[1, 2]] * len(prompts)}

        def generate(self, prompts, sampling, use_tqdm):
            given.append(sampling)
            out = types.SimpleNamespace(text="Answer: 1", token_ids=[3, 4])
            return [types.SimpleNamespace(outputs=[out]) for _ in prompts]

    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = LLM, SamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    generator = VLLMGenerator("unused", max_new_tokens=8, engine=HF.model_copy(update={"engine": "vllm"}), seed=0)
    generator.generate(["Q"] * 4, temperature=0.7, seed=100, progress=False)
    generator.generate(["Q"] * 4, temperature=0.7, seed=101, progress=False)  # the executor's verify retry
    generator.generate(["Q"] * 2, temperature=0.0, progress=False)
    first, retry = [p.seed for p in given[0]], [p.seed for p in given[1]]
    assert len(set(first)) == 4 and not set(first) & set(retry)  # seed + i gave the retry 3 of the first's seeds
    assert [p.seed for p in given[2]] == [None, None]


def test_hf_stops_at_every_eos_of_the_generation_config_as_vllm_does(tmp_path):
    """vLLM stops at the tokenizer's EOS and at every eos_token_id of the model's generation_config (a hub chat
    model's end of turn); HF generate was handed the tokenizer's alone and ran on past the others."""
    tiny = tiny_scratch_model(tmp_path / "m", n_problems=6, seed=1)
    prompts = [prompt(p.question) for p in tiny.problems]
    batch = tiny.tok(prompts[:1], return_tensors="pt", add_special_tokens=False)
    generated = tiny.model.generate(**batch, max_new_tokens=12, do_sample=False, pad_token_id=tiny.tok.pad_token_id)
    ids = generated[0, batch["input_ids"].shape[1]:].tolist()
    end_of_turn = ids[2]
    assert tiny.tok.eos_token_id not in ids[:3]
    tiny.model.generation_config.eos_token_id = [tiny.tok.eos_token_id, end_of_turn]
    generator = HFGenerator(tiny.model, tiny.tok, batch_size=1, max_new_tokens=12)
    completion = generator.generate(prompts[:1], progress=False)[0]
    assert completion.n_tokens == ids.index(end_of_turn) + 1
    assert completion.text == tiny.tok.decode(ids[:completion.n_tokens], skip_special_tokens=True)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generate_leaves_the_callers_random_stream_where_it_was(tmp_path, temperature):
    """generate seeded torch's global RNG, so a training run that evaluated its policy (or judged with it from a
    thread) restarted its own random stream at seed 0 every time; sampled outputs still follow ``seed``."""
    import torch
    tiny = tiny_scratch_model(tmp_path / "m", n_problems=6, seed=1)
    prompts = [prompt(p.question) for p in tiny.problems]
    generator = HFGenerator(tiny.model, tiny.tok, batch_size=8, max_new_tokens=24)
    torch.manual_seed(123)
    untouched = torch.rand(4)
    torch.manual_seed(123)
    first = generator.generate(prompts, temperature, seed=7, progress=False)
    assert torch.equal(torch.rand(4), untouched)
    torch.manual_seed(999)  # another caller state: the samples depend on seed alone
    assert generator.generate(prompts, temperature, seed=7, progress=False) == first
    if temperature > 0:
        assert generator.generate(prompts, temperature, seed=8, progress=False) != first
