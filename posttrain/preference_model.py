"""The pairwise preference model (PM): one sequence holds the prompt and two responses; a head on the
states at the ends of A and B gives s(x, A, B), the logit of "A is better", with an uncertainty
(``train_rm.estimator``: ensemble by default).

Trained with the Bradley-Terry cross-entropy on every pair in both orders (label flipped), through
transformers' Trainer (checkpoints, resume, MLflow logging). Saved as a Hugging Face backbone directory
(loads with ``AutoModel.from_pretrained``) plus ``preference_head.safetensors`` and ``preference_head.json``.

With a reference LM attached (``train_rm.reference_lm``, ``posttrain.reference_likelihood``) the PM's logit is
``a * g + b * (l_A - l_B)``, its variances scaled by a^2 as g is; the reference LM is saved in ``reference_lm/``.

Example:
    >>> pm = PreferenceModel.from_pretrained("models/rm")                         # doctest: +SKIP
    >>> g, var = pm.score([("Compute 2 + 3.", "Answer: 5", "Answer: 6")])         # doctest: +SKIP
    >>> float(g[0]) > 0                                                           # doctest: +SKIP
    True
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm.auto import tqdm
from transformers import AutoModel, AutoTokenizer

from posttrain.reference_likelihood import ReferenceLikelihood
from posttrain.uncertainty import RandomFeatureGPHead, build_head, pair_uncertainty

HEAD_WEIGHTS, HEAD_CONFIG = "preference_head.safetensors", "preference_head.json"
REFERENCE_DIR = "reference_lm"


def tail(tokenizer, text: str, max_tokens: int) -> str:
    """The last ``max_tokens`` tokens of ``text`` (a response's final answer sits at its end)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[-max_tokens:])


def left_padded_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Each token's position counted from its sequence's first real token. Without them a left-padded sequence
    sits as far right as its batch's padding pushes it, so on a backbone with absolute position embeddings
    (GPT-2's) its score would depend on what else is in the batch; rotary backbones (Llama's) see no change."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def pair_segments(question: str, a: str, b: str) -> list[str]:
    """The PM's input for (x, A, B) in five pieces; pieces 1 and 3 are the responses."""
    return [f"Question: {question}\nResponse A:", f" {a.strip()}", "\nResponse B:", f" {b.strip()}",
            "\nWhich response is better?"]


def reduce_variance(v_ab: torch.Tensor, v_ba: torch.Tensor, reduce: str) -> torch.Tensor:
    """A pair's variance from both orders' (``rlhf.uncertainty_reduce``): their mean or max. Either uncertainty
    score grows with var at a given |g|, so the max of both orders' u is the u of the max variance."""
    if reduce not in ("mean", "max"):
        raise ValueError(f"unknown reduce {reduce!r}; expected mean or max")
    return (v_ab + v_ba) / 2 if reduce == "mean" else torch.maximum(v_ab, v_ba)


class PreferenceModel(nn.Module):
    """Backbone (a causal LM's transformer) + an uncertainty head.

    The head reads [h(end of A), h(end of B)]: the hidden states at the last token of each response,
    concatenated. (The last token of the whole sequence, the usual choice, sits on a fixed closing line
    whose state barely varies in a small model; trained from it, the PM stayed at chance. The response ends
    carry the answer each response gave, in the context of its own steps and of the other response.)
    Concatenated, not subtracted: the SNGP variance is a distance to the training pairs, and the difference
    h_A - h_B maps every pair of look-alike responses (the hard pairs) to the origin, the centre of the
    order-symmetric training set, where the variance is lowest; in the concatenated space those pairs lie on
    the diagonal h_A = h_B, away from the decisive training pairs, where the variance is high.
    """

    def __init__(self, backbone, tokenizer, estimator: str, head_cfg, max_response_tokens: int, lam: float,
                 uncertainty_score: str = "variance"):
        super().__init__()
        self.backbone, self.tokenizer = backbone, tokenizer
        self.estimator, self.max_response_tokens, self.lam = estimator, max_response_tokens, lam
        self.uncertainty_score = uncertainty_score
        self.head_cfg = {k: getattr(head_cfg, k) for k in
                         ("random_features", "feature_scale", "ridge", "dropout", "mc_samples", "ensemble_size")}
        self.head = build_head(estimator, 2 * backbone.config.hidden_size, head_cfg)
        self.reference: ReferenceLikelihood | None = None
        self.likelihood_weights: tuple[float, float] | None = None

    def attach_reference(self, reference: ReferenceLikelihood, weights: tuple[float, float]) -> None:
        """From now on score with ``a * g + b * (l_A - l_B)``, (a, b) = ``weights`` (``fit_likelihood_weights``)."""
        self.reference, self.likelihood_weights = reference, (float(weights[0]), float(weights[1]))

    @classmethod
    def from_backbone(cls, path: str, cfg) -> "PreferenceModel":
        """A fresh PM on the transformer of the causal LM at ``path`` (its LM head is dropped)."""
        return cls(AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path), cfg.estimator, cfg,
                   cfg.max_response_tokens, cfg.uncertainty_lambda, cfg.uncertainty_score)

    def encode(self, triples: list[tuple[str, str, str]]) -> dict[str, torch.Tensor]:
        """Left-padded ids of each (question, A, B), responses cut to their last ``max_response_tokens`` tokens,
        and the positions of the last token of A and of B."""
        tok, n = self.tokenizer, self.max_response_tokens
        seqs, ends = [], []
        for q, a, b in triples:
            ids, marks = [], []
            for k, piece in enumerate(pair_segments(q, a, b)):
                piece_ids = tok(piece, add_special_tokens=False)["input_ids"]
                ids += piece_ids[-n:] if k in (1, 3) else piece_ids
                marks.append(len(ids) - 1)
            seqs.append(ids)
            ends.append((marks[1], marks[3]))
        width = max(map(len, seqs))
        input_ids = torch.full((len(seqs), width), tok.pad_token_id)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, ids in enumerate(seqs):
            input_ids[i, width - len(ids):] = torch.tensor(ids)
            mask[i, width - len(ids):] = 1
        offsets = torch.tensor([width - len(ids) for ids in seqs])
        return {"input_ids": input_ids, "attention_mask": mask,
                "end_a": offsets + torch.tensor([e[0] for e in ends]), "end_b": offsets + torch.tensor([e[1] for e in ends])}

    def pooled(self, input_ids, attention_mask, end_a, end_b) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                               position_ids=left_padded_positions(attention_mask)).last_hidden_state
        rows = torch.arange(len(hidden), device=hidden.device)
        return torch.cat([hidden[rows, end_a], hidden[rows, end_b]], dim=-1)

    def forward(self, input_ids, attention_mask, end_a, end_b, labels=None):
        logits = self.head.train_logits(self.pooled(input_ids, attention_mask, end_a, end_b))  # (batch, members)
        out = {"logits": logits.mean(-1)}
        if labels is not None:
            target = labels.float()[:, None].expand_as(logits)
            loss = nn.functional.binary_cross_entropy_with_logits(logits, target, reduction="none")
            if logits.shape[1] > 1 and self.training:  # ensemble members see bootstrap-resampled batches
                loss = loss * torch.poisson(torch.ones_like(loss))
            out["loss"] = loss.mean()
        return out

    @torch.no_grad()
    def features(self, triples: list[tuple[str, str, str]], batch_size: int = 64,
                 desc: str = "PM features") -> torch.Tensor:
        self.eval()
        # One batch gets no bar: rlhf_routed scores each prompt's pairs in one, and 16 bars a step buried its log
        chunks = [self.pooled(**self.encode(triples[i:i + batch_size]))
                  for i in tqdm(range(0, len(triples), batch_size), desc=desc, unit="batch",
                                disable=len(triples) <= batch_size)]
        return torch.cat(chunks) if chunks else torch.empty(0, 2 * self.backbone.config.hidden_size)

    @torch.no_grad()
    def fit_posterior(self, triples: list[tuple[str, str, str]], batch_size: int = 64) -> None:
        """sngp: one pass over the training pairs (both orders) accumulates the Laplace precision."""
        if not isinstance(self.head, RandomFeatureGPHead):
            return
        self.head.reset_precision()
        h = self.features(triples + [(q, b, a) for q, a, b in triples], batch_size, desc="SNGP precision pass")
        for i in range(0, len(h), 1024):
            self.head.accumulate(h[i:i + 1024])
        self.head.finalize()

    @torch.no_grad()
    def score_orders(self, triples: list[tuple[str, str, str]],
                     batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(g, var_ab, var_ba) for (question, A, B): the antisymmetrised g = (s(A,B) - s(B,A)) / 2 and each order's
        variance; with a reference LM attached, g joined with the likelihood ratio (see the module's doc)."""
        g, v_ab, v_ba = self.score_orders_alone(triples, batch_size)
        if self.reference is None:
            return g, v_ab, v_ba
        a, b = self.likelihood_weights
        return a * g + b * self.reference.ratio(triples), a * a * v_ab, a * a * v_ba

    @torch.no_grad()
    def score_orders_alone(self, triples: list[tuple[str, str, str]],
                           batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``score_orders`` of the PM's own head, without the reference LM."""
        g_ab, v_ab = self.head.predict(self.features(triples, batch_size))
        g_ba, v_ba = self.head.predict(self.features([(q, b, a) for q, a, b in triples], batch_size))
        return (g_ab - g_ba) / 2, v_ab, v_ba

    @torch.no_grad()
    def score(self, triples: list[tuple[str, str, str]], batch_size: int = 64,
              reduce: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
        """Antisymmetrised (g, var) for (question, A, B): var = the mean or the max of both orders' variances
        (``rlhf.uncertainty_reduce``; see ``reduce_variance``)."""
        g, v_ab, v_ba = self.score_orders(triples, batch_size)
        return g, reduce_variance(v_ab, v_ba, reduce)

    def uncertainty(self, g: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        """The routing uncertainty of scored pairs (``train_rm.uncertainty_score``; see ``pair_uncertainty``)."""
        return pair_uncertainty(g, var, self.lam, self.uncertainty_score)

    def save_pretrained(self, path: str | Path) -> None:
        path = Path(path)
        self.backbone.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        save_file({k: v.contiguous() for k, v in self.head.state_dict().items()}, path / HEAD_WEIGHTS)
        if self.reference is not None:
            self.reference.save_pretrained(path / REFERENCE_DIR)
        (path / HEAD_CONFIG).write_text(json.dumps(
            {"estimator": self.estimator, "max_response_tokens": self.max_response_tokens,
             "uncertainty_lambda": self.lam, "uncertainty_score": self.uncertainty_score,
             "likelihood_weights": self.likelihood_weights, **self.head_cfg}, indent=1))

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "PreferenceModel":
        path = Path(path)
        cfg = json.loads((path / HEAD_CONFIG).read_text())
        pm = cls(AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path), cfg["estimator"],
                 SimpleNamespace(**cfg), cfg["max_response_tokens"], cfg["uncertainty_lambda"],
                 cfg.get("uncertainty_score", "variance"))
        pm.head.load_state_dict(load_file(path / HEAD_WEIGHTS))
        if cfg.get("likelihood_weights") is not None:
            pm.attach_reference(ReferenceLikelihood.from_pretrained(path / REFERENCE_DIR), cfg["likelihood_weights"])
        return pm.eval()
