"""The reference log-likelihood ratio that joins the PM's logit (posttrain.reference_likelihood)."""
from types import SimpleNamespace

import pytest
import torch

from posttrain.preference_model import PreferenceModel
from posttrain.reference_likelihood import ReferenceLikelihood, fit_likelihood_weights
from posttrain.task.solutions import render_response
from posttrain.trajectories import BY_NAME, prompt
from tiny_model import HEAD_CFG, tiny_scratch_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """12 problems of a tiny scratch Llama, its own: one test here trains a copy of it."""
    return tiny_scratch_model(tmp_path_factory.mktemp("tiny_reference"), n_problems=12, seed=5)


def unbatched_log_likelihood(model, tok, question: str, response: str) -> float:
    """One sequence, no padding: the sum of log p(token) over the response's tokens and the EOS."""
    p = tok(prompt(question), add_special_tokens=False)["input_ids"]
    ids = tok(prompt(question) + response, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert ids[:len(p)] == p  # these responses start with a space: no merge across the boundary
    with torch.no_grad():
        logps = model(input_ids=torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
    return sum(logps[t - 1, ids[t]].item() for t in range(len(p), len(ids)))


def wrong_copy(response: str, answer: int) -> str:
    """The response with its final answer replaced by a wrong one."""
    head, _, _ = response.rpartition(str(answer))
    return f"{head}{answer + 7}"


def test_batched_log_likelihoods_match_one_sequence_at_a_time(tiny):
    ref = ReferenceLikelihood(tiny.model, tiny.tok, batch_size=3)  # several batches, each padded to its longest
    problems = tiny.problems[:4]
    pairs = [(p.question, " " + render_response(p, BY_NAME[name]).strip())
             for p in problems for name in ("cot", "pot", "decompose+cot")]
    got = ref.log_likelihoods(pairs)
    want = torch.tensor([unbatched_log_likelihood(tiny.model, tiny.tok, q, r) for q, r in pairs])
    assert len({len(r) for _, r in pairs}) > 3  # padding is exercised
    assert torch.allclose(got, want, atol=1e-4)


def test_the_ratio_is_antisymmetric_and_zero_for_a_response_against_itself(tiny):
    ref = ReferenceLikelihood(tiny.model, tiny.tok)
    q = tiny.problems[0].question
    a, b = " cot\nStep 1: 2 + 3 = 5\nAnswer: 5", " Answer: 7"
    ratio = ref.ratio([(q, a, b), (q, b, a), (q, a, a)])
    assert ratio[0] != 0 and torch.allclose(ratio[0], -ratio[1]) and ratio[2] == 0


def test_a_model_trained_on_right_solutions_prefers_the_right_response(tiny):
    """The premise: the warm-up's kind of model gives a right response a higher likelihood than a wrong copy."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny.path)
    ref = ReferenceLikelihood(model, tiny.tok)
    triples = [(p.question, " " + render_response(p, BY_NAME["cot"]).strip(),
                " " + wrong_copy(render_response(p, BY_NAME["cot"]).strip(), p.answer)) for p in tiny.problems]
    before = ref.ratio(triples)
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    texts = [prompt(q) + right + tiny.tok.eos_token for q, right, _ in triples]
    enc = tiny.tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    model.train()
    for _ in range(150):
        loss = model(**enc, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    after = ref.ratio(triples)
    assert (after > 0).float().mean() >= 0.9 and (after > 0).float().mean() > (before > 0).float().mean()


def test_the_fit_weighs_the_feature_that_carries_the_label():
    torch.manual_seed(0)
    n = 400
    ratio = torch.randn(n) + 1.5  # given as (chosen, rejected): mostly positive
    noise = torch.randn(n)        # says nothing about which is chosen
    a, b = fit_likelihood_weights(noise, ratio)
    assert b > 0.5 and abs(a) < 0.3 * b
    a2, b2 = fit_likelihood_weights(ratio, noise)  # the roles swapped: so are the weights
    assert a2 > 0.5 and abs(b2) < 0.3 * a2
    with pytest.raises(ValueError, match="at least 2"):
        fit_likelihood_weights(torch.tensor([1.0]), torch.tensor([1.0]))


def test_a_pm_with_a_reference_scores_the_weighted_sum_and_keeps_it_on_disk(tiny, tmp_path):
    torch.manual_seed(1)
    pm = PreferenceModel.from_backbone(tiny.path, SimpleNamespace(**{**vars(HEAD_CFG), "estimator": "ensemble"}))
    for p in pm.head.parameters():  # a non-trivial head
        torch.nn.init.normal_(p, std=1.0)
    q = tiny.problems[0].question
    triples = [(q, " cot\nStep 1: 2 + 3 = 5\nAnswer: 5", " Answer: 7"), (q, " Answer: 1", " pot\nprint(1)")]
    g, v_ab, v_ba = pm.score_orders(triples)  # nothing attached: the head alone
    ref = ReferenceLikelihood(tiny.model, tiny.tok)
    pm.attach_reference(ref, (0.5, 0.25))
    g2, v2_ab, v2_ba = pm.score_orders(triples)
    assert torch.allclose(g2, 0.5 * g + 0.25 * ref.ratio(triples), atol=1e-5)
    assert torch.allclose(v2_ab, 0.25 * v_ab) and torch.allclose(v2_ba, 0.25 * v_ba)
    g_flip, _, _ = pm.score_orders([(x, b, a) for x, a, b in triples])
    assert torch.allclose(g2, -g_flip, atol=1e-5)
    pm.save_pretrained(tmp_path)
    loaded = PreferenceModel.from_pretrained(tmp_path)
    assert loaded.likelihood_weights == (0.5, 0.25)
    assert torch.allclose(loaded.score_orders(triples)[0], g2, atol=1e-5)
