"""One interface for text generation; Hugging Face ``generate`` is the CPU default.

Prompts are sorted by length before batching (less left padding, faster), decoded completions come
back in input order with their token counts, and a progress bar shows the work.

Example:
    >>> gen = HFGenerator(model, tokenizer, batch_size=32, max_new_tokens=64)   # doctest: +SKIP
    >>> gen.generate(["Question: Compute 2 + 3.\\nTrajectory: cot\\n"])[0].text  # doctest: +SKIP
    'Step 1: 2 + 3 = 5\\nAnswer: 5'
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm


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

    @torch.inference_mode()
    def generate(
        self, prompts: list[str], temperature: float = 0.0, seed: int = 0, desc: str = "generate",
        progress: bool = True,
    ) -> list[Completion]:
        tok = self.tokenizer
        torch.manual_seed(seed)
        lengths = [len(ids) for ids in tok(prompts, add_special_tokens=False)["input_ids"]]
        order = sorted(range(len(prompts)), key=lambda i: -lengths[i])
        out: list[Completion | None] = [None] * len(prompts)
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0} if temperature > 0 else {"do_sample": False}
        for start in tqdm(range(0, len(order), self.batch_size), desc=desc, unit="batch", disable=not progress):
            idx = order[start:start + self.batch_size]
            batch = tok([prompts[i] for i in idx], return_tensors="pt", padding=True, add_special_tokens=False)
            generated = self.model.generate(
                **batch, max_new_tokens=self.max_new_tokens, pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id, **sampling,
            )[:, batch["input_ids"].shape[1]:]
            for row, i in zip(generated, idx):
                ids = row.tolist()
                n = ids.index(tok.eos_token_id) + 1 if tok.eos_token_id in ids else len(ids)
                out[i] = Completion(tok.decode(ids[:n], skip_special_tokens=True), n)
        return out  # type: ignore[return-value]
