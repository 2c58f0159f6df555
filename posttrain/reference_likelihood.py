"""The reference log-likelihood ratio: a second opinion for the PM from a language model of right solutions.

``train_rm.reference_lm`` names a causal LM trained on verified solutions (the pipeline's warm-up model: every
training question's reference response in every trajectory). The log-likelihood it gives a response,
``l = log p_ref(y | x)`` summed over the response's tokens and its EOS, is far higher for a right response than
for a wrong one: a wrong response holds at least one token (a wrong product, a miscopied number, a dropped step)
that a model of right solutions finds unlikely. So the ratio ``l_A - l_B`` picks the right response of a
decisive pair where the PM, reading both responses at once, often cannot (on the committed run's benchmark 0.953
of the decisive pairs against the PM's 0.794, docs/results.md).

The PM's logit and the ratio are joined by a logistic regression without intercept on the PM's own training
pairs in both orders (``fit_likelihood_weights``): ``s = a * g + b * (l_A - l_B)``. Fitted on the training
pairs, not the benchmark, so no benchmark figure is fitted to.

Example:
    >>> ref = ReferenceLikelihood.from_pretrained("models/warmup")                    # doctest: +SKIP
    >>> ratio = ref.ratio([("Compute 2 + 3.", " cot\\nStep 1: 2 + 3 = 5\\nAnswer: 5",
    ...                     " cot\\nStep 1: 2 + 3 = 6\\nAnswer: 6")])                   # doctest: +SKIP
    >>> float(ratio[0]) > 0                                                            # doctest: +SKIP
    True
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.data_utils import common_prefix_length
from trl.trainer.utils import selective_log_softmax

from posttrain.trajectories import prompt


class ReferenceLikelihood:
    """log p_ref(response | the policy's open prompt for the question), batched, each distinct text scored once."""

    def __init__(self, model, tokenizer, batch_size: int = 64):
        self.model, self.tokenizer, self.batch_size = model.eval(), tokenizer, batch_size

    @classmethod
    def from_pretrained(cls, path: str | Path, batch_size: int = 64) -> "ReferenceLikelihood":
        return cls(AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path), batch_size)

    def save_pretrained(self, path: str | Path) -> None:
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    def _ids(self, question: str, response: str) -> tuple[list[int], int]:
        """(ids of prompt + response + EOS, where the response starts): tokenised as one text, as generation wrote
        it, the response starting where its ids part from the prompt's alone (a merge across the boundary)."""
        head = prompt(question)
        p = self.tokenizer(head, add_special_tokens=False)["input_ids"]
        ids = self.tokenizer(head + response, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        limit = getattr(self.model.config, "max_position_embeddings", None) or len(ids)
        return ids[:limit], min(common_prefix_length(p, ids), limit - 1)

    @torch.inference_mode()
    def log_likelihoods(self, pairs: list[tuple[str, str]], desc: str = "reference log-likelihood") -> torch.Tensor:
        """l for each (question, response); a response cut by the model's context keeps its first tokens."""
        distinct = list(dict.fromkeys(pairs))
        device = next(self.model.parameters()).device
        scores: dict[tuple[str, str], float] = {}
        # One batch gets no bar: rlhf_routed scores each prompt's responses in one (as the PM's features)
        for i in tqdm(range(0, len(distinct), self.batch_size), desc=desc, unit="batch",
                      disable=len(distinct) <= self.batch_size):
            chunk = distinct[i:i + self.batch_size]
            encoded = [self._ids(q, r) for q, r in chunk]
            width = max(len(ids) for ids, _ in encoded)
            # right padding: padded positions come after every real one, so no real token attends to them
            input_ids = torch.zeros((len(chunk), width), dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            scored = torch.zeros((len(chunk), width - 1))
            for k, (ids, start) in enumerate(encoded):
                input_ids[k, :len(ids)] = torch.tensor(ids)
                mask[k, :len(ids)] = 1
                scored[k, max(start - 1, 0):len(ids) - 1] = 1  # the logits at position t predict token t + 1
            logits = self.model(input_ids=input_ids.to(device), attention_mask=mask.to(device)).logits[:, :-1]
            token_logps = selective_log_softmax(logits.float(), input_ids[:, 1:].to(device)).cpu()
            scores.update(zip(chunk, (token_logps * scored).sum(1).tolist()))
        return torch.tensor([scores[pair] for pair in pairs])

    def ratio(self, triples: list[tuple[str, str, str]]) -> torch.Tensor:
        """l_A - l_B for each (question, A, B)."""
        ll = self.log_likelihoods([(q, r) for q, a, b in triples for r in (a, b)])
        return ll[0::2] - ll[1::2]


def fit_likelihood_weights(g: torch.Tensor, ratio: torch.Tensor) -> tuple[float, float]:
    """(a, b) of ``s = a * g + b * ratio``: a logistic regression without intercept on pairs given as (chosen,
    rejected), each also in the other order with the label flipped (so s stays antisymmetric)."""
    x = torch.stack([g, ratio], dim=1).double().numpy()
    if len(x) < 2:
        raise ValueError(f"fitting the likelihood weights needs at least 2 training pairs, got {len(x)}")
    features = np.concatenate([x, -x])
    labels = np.concatenate([np.ones(len(x)), np.zeros(len(x))])
    a, b = LogisticRegression(fit_intercept=False).fit(features, labels).coef_[0]
    return float(a), float(b)
