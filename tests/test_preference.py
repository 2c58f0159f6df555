"""SNGP head math, the preference model's order symmetry, the SePPO anchor rule and trainer, preference data."""
import math
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from trl import DPOConfig, DPOTrainer

from posttrain.form_balance import balance_solution_forms, form_bias, solution_form
from posttrain.calibration import accuracy_by_decile, expected_calibration_error, pair_correct, spearman
from posttrain.modeling import device_args, load_pretrained
from posttrain.preference_data import benchmark_pairs, check_no_leakage, tie_pairs, training_pairs
from posttrain.preference_model import PreferenceModel
from posttrain.preference_training import both_orders, tie_sample
from posttrain.seppo import SePPOTrainer, aaf_sign, preference_example, preference_logps, seppo_loss, train_policy
from posttrain.task.records import DataError
from posttrain.task.solutions import render_response
from posttrain.trajectories import BY_NAME, prompt
from posttrain.uncertainty import EnsembleHead, MCDropoutHead, RandomFeatureGPHead, calibrated_logit, pair_uncertainty
from tiny_model import HEAD_CFG, tiny_scratch_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny scratch Llama + tokenizer saved to disk, and the problems it was built on."""
    return tiny_scratch_model(tmp_path_factory.mktemp("tiny"), n_problems=20, seed=3)


# --- SNGP head ------------------------------------------------------------------------------------------------

def test_sngp_precision_accumulated_in_batches_equals_direct_computation():
    torch.manual_seed(0)
    head = RandomFeatureGPHead(in_dim=6, n_features=32, feature_scale=0.5, ridge=1e-3)
    h = torch.randn(50, 6)
    for chunk in h.split(7):
        head.accumulate(chunk)
    phi = head.features(h).double()
    direct = 1e-3 * torch.eye(32, dtype=torch.float64) + phi.T @ phi
    assert torch.allclose(head.precision.double(), direct, atol=1e-4)
    head.finalize()
    x = torch.randn(3, 6)
    phi_x = head.features(x).double()
    expected = 1e-3 * ((phi_x @ torch.linalg.inv(direct)) * phi_x).sum(-1)
    assert torch.allclose(head.predict(x)[1].double(), expected, atol=1e-5)


def test_sngp_variance_grows_away_from_the_training_data():
    torch.manual_seed(0)
    head = RandomFeatureGPHead(in_dim=2, n_features=512, feature_scale=1.0, ridge=1e-3)
    train = torch.randn(200, 2) * 0.3  # a cloud at the origin
    head.accumulate(train)
    head.finalize()
    distances = [0.0, 1.0, 2.0, 4.0, 8.0]
    var = [head.predict(torch.tensor([[d, 0.0]]))[1].item() for d in distances]
    assert all(a < b for a, b in zip(var, var[1:])), var
    assert var[0] < 0.05 and var[-1] > 0.5
    _, u = calibrated_logit(torch.tensor(2.0), torch.tensor(var[-1]), lam=10.0)
    assert u > 2  # far from the data the logit is shrunk towards 0


def test_every_head_gives_a_logit_and_a_nonnegative_variance():
    h = torch.randn(5, 8)
    for head in (MCDropoutHead(8, 0.2, 6), EnsembleHead(8, 3), RandomFeatureGPHead(8, 16, 0.1, 1e-3)):
        g, var = head.predict(h)
        assert g.shape == var.shape == (5,) and (var >= 0).all()
        assert head.train_logits(h).shape[0] == 5


# --- preference model ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("estimator", ["sngp", "mc_dropout", "ensemble"])
def test_preference_model_is_antisymmetric_in_the_order_of_responses(tiny, estimator, tmp_path):
    pm = PreferenceModel.from_backbone(tiny.path, SimpleNamespace(**{**vars(HEAD_CFG), "estimator": estimator}))
    torch.manual_seed(1)
    for p in pm.head.parameters():  # a non-trivial head
        torch.nn.init.normal_(p, std=1.0)
    q = tiny.problems[0].question
    triples = [(q, "Step 1: 2 + 3 = 5\nAnswer: 5", "Answer: 7"), (q, "Answer: 1", "no idea")]
    pm.fit_posterior(triples)
    g, var = pm.score(triples)
    g_flip, var_flip = pm.score([(x, b, a) for x, a, b in triples])
    assert torch.allclose(g, -g_flip, atol=1e-5) and g.abs().max() > 1e-4
    if estimator != "mc_dropout":  # mc_dropout's variance is itself a sample
        assert torch.allclose(var, var_flip, atol=1e-6)
        pm.save_pretrained(tmp_path)
        g2, var2 = PreferenceModel.from_pretrained(tmp_path).score(triples)
        assert torch.allclose(g, g2, atol=1e-5) and torch.allclose(var, var2, atol=1e-6)


def test_the_pair_variance_is_the_mean_or_the_max_of_both_orders(tiny):
    pm = PreferenceModel.from_backbone(tiny.path, HEAD_CFG)
    torch.manual_seed(2)
    q = tiny.problems[0].question
    triples = [(q, "Step 1: 2 + 3 = 5\nAnswer: 5", "Answer: 7"), (q, "Answer: 1", "no idea")]
    pm.fit_posterior(triples[:1])  # one order only, so the two orders' variances differ
    v_ab = pm.head.predict(pm.features(triples))[1]
    v_ba = pm.head.predict(pm.features([(x, b, a) for x, a, b in triples]))[1]
    assert (v_ab - v_ba).abs().max() > 1e-4
    assert torch.allclose(pm.score(triples)[1], (v_ab + v_ba) / 2, atol=1e-6)
    assert torch.allclose(pm.score(triples, reduce="max")[1], torch.maximum(v_ab, v_ba), atol=1e-6)


def test_a_pairs_score_does_not_depend_on_its_batch_on_an_absolute_position_backbone(tiny, tmp_path):
    """Left padding shifted a short pair as far right as a long batch mate's length, which a GPT-2-style backbone
    (learned absolute positions) reads as different input: g moved 0.18 -> 0.35 and the variance 0.92 -> 0.001."""
    from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

    from posttrain.preference_training import pointwise_scores

    config = GPT2Config(vocab_size=len(tiny.tok), n_embd=32, n_layer=1, n_head=2, n_positions=512,
                        pad_token_id=tiny.tok.pad_token_id, eos_token_id=tiny.tok.eos_token_id)
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    tiny.tok.save_pretrained(tmp_path / "gpt2")
    q = tiny.problems[0].question
    short, long = (q, "Answer: 5", "Answer: 9"), (q, "step " * 40 + "Answer: 5", "step " * 40 + "Answer: 9")
    torch.manual_seed(1)
    pm = PreferenceModel.from_backbone(str(tmp_path / "gpt2"), HEAD_CFG)
    pm.fit_posterior([short, long])
    (g_alone, v_alone), (g_batch, v_batch) = pm.score([short]), pm.score([short, long])
    assert torch.allclose(g_alone, g_batch[:1], atol=1e-5) and torch.allclose(v_alone, v_batch[:1], atol=1e-5)

    rm = GPT2ForSequenceClassification(GPT2Config(**{**config.to_dict(), "num_labels": 1})).eval()
    tok = tiny.tok
    tok.padding_side, before = "left", tok.padding_side
    try:
        with torch.no_grad():
            alone = pointwise_scores(rm, tok, [short[:2]], 64)
            batch = pointwise_scores(rm, tok, [short[:2], long[:2]], 64)
    finally:
        tok.padding_side = before
    assert alone[0] == pytest.approx(batch[0], abs=1e-5)


def test_scoring_one_batch_draws_no_progress_bar_and_several_batches_do(tiny, capsys):
    pm = PreferenceModel.from_backbone(tiny.path, HEAD_CFG)
    triples = [(tiny.problems[0].question, "Answer: 5", "Answer: 7")] * 3
    pm.score(triples, batch_size=4)  # rlhf_routed scores each prompt's pairs in one batch, every step
    assert "PM features" not in capsys.readouterr().err
    pm.score(triples, batch_size=2)
    assert "PM features" in capsys.readouterr().err


def test_preference_model_pools_the_last_token_of_each_response(tiny):
    pm = PreferenceModel.from_backbone(tiny.path, HEAD_CFG)
    enc = pm.encode([("Compute 1 + 1.", "Answer: 2", "Answer: 3"), ("Q", "a much longer response " * 3, "b")])
    for i, (a, b) in enumerate([("Answer: 2", "Answer: 3"), ("a much longer response " * 3, "b")]):
        ids = enc["input_ids"][i].tolist()
        a_ids = pm.tokenizer(" " + a.strip(), add_special_tokens=False)["input_ids"]
        b_ids = pm.tokenizer(" " + b.strip(), add_special_tokens=False)["input_ids"]
        assert ids[enc["end_a"][i] - len(a_ids) + 1:enc["end_a"][i] + 1] == a_ids
        assert ids[enc["end_b"][i] - len(b_ids) + 1:enc["end_b"][i] + 1] == b_ids


def test_preference_model_loss_is_bradley_terry_and_falls_with_training(tiny):
    torch.manual_seed(0)  # the head's init; not whatever the tests before this one left in the global generator
    pm = PreferenceModel.from_backbone(tiny.path, HEAD_CFG)
    q = tiny.problems[0].question
    batch = {**pm.encode([(q, "Answer: 5", "Answer: 9"), (q, "Answer: 9", "Answer: 5")]), "labels": torch.tensor([1, 0])}
    out = pm(**batch)  # Bradley-Terry: P(A preferred) = sigmoid(logit), scored by its log-likelihood
    bce = torch.nn.functional.binary_cross_entropy_with_logits(out["logits"], batch["labels"].float())
    assert torch.allclose(out["loss"], bce)
    opt = torch.optim.Adam(pm.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        loss = pm(**batch)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0]


# --- SePPO ----------------------------------------------------------------------------------------------------

def test_anchor_rule_flips_only_when_the_reference_fits_the_anchor_better():
    h_w = torch.tensor([0.5, -0.5, 0.0])
    h_r = torch.tensor([1.0, 1.0, 1.0])
    assert aaf_sign(h_w).tolist() == [1.0, -1.0, 1.0]
    beta = 0.7
    loss = seppo_loss(h_w, h_r, beta)
    dpo = -torch.nn.functional.logsigmoid(beta * (h_w - h_r))
    assert torch.allclose(loss[[0, 2]], dpo[[0, 2]])  # sign +1: exactly DPO
    assert torch.isclose(loss[1], -torch.nn.functional.logsigmoid(torch.tensor(beta * (-0.5 + 1.0))))
    # the flipped pair pushes the reference sample up, not down
    h_r_var = h_r.clone().requires_grad_()
    seppo_loss(h_w, h_r_var, beta).sum().backward()
    assert h_r_var.grad[0] > 0 and h_r_var.grad[1] < 0


def test_seppo_trainer_starts_at_log2_and_learns(tiny, tmp_path):
    """With the policy as its own reference, h_w = h_r = 0 at step 0 (our log-probs match TRL's tokenisation)."""
    tok, model = tiny.tok, tiny.model
    rows = []
    for p in tiny.problems[:8]:
        x = prompt(p.question)
        y_w = f" cot\n{render_response(p, BY_NAME['cot'])}"
        y_r = f" cot\nAnswer: {p.answer + 1}"
        rows.append({"prompt": x, "chosen": y_w, "rejected": y_r})
    # what seppo_sample stores
    ref_w, ref_r = preference_logps(model, tok, *([r[k] for r in rows] for k in ("prompt", "chosen", "rejected")))
    data = Dataset.from_list([{**r, "ref_chosen_logps": a, "ref_rejected_logps": b}
                              for r, a, b in zip(rows, ref_w, ref_r)])
    args = DPOConfig(str(tmp_path), precompute_ref_log_probs=True, beta=0.5, max_steps=12, learning_rate=5e-3,
                     per_device_train_batch_size=8, logging_steps=1, report_to=[], save_strategy="no", **device_args())
    trainer = SePPOTrainer(model=tiny.path, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert abs(float(losses[0]) - math.log(2)) < 1e-3, losses[0]
    assert float(losses[-1]) < float(losses[0]) - 0.05


def _long_pairs(tiny, n):
    """Pairs whose anchor (the longest trajectory's worked solution) is far longer than the rejected response."""
    longest = BY_NAME["decompose+cot+verify"]
    return [{"prompt": prompt(p.question), "chosen": f" {longest.name}\n{render_response(p, longest)}",
             "rejected": f" cot\nAnswer: {p.answer + 1}"} for p in tiny.problems[:n]]


def _cutting_max_length(tiny, rows):
    """A max_length that cuts every anchor (TRL keeps each sequence's start) and leaves the rejected responses."""
    return min(len(tiny.tok(r["prompt"] + r["chosen"])["input_ids"]) for r in rows) - 10


@pytest.mark.parametrize("truncation_mode", ["keep_start", "keep_end"])
def test_preference_logps_cover_the_tokens_dpo_trainer_keeps(tiny, tmp_path, truncation_mode):
    """Our reference log-probs against TRL's own (its precompute with the model as reference), sequences cut."""
    rows = _long_pairs(tiny, 4)
    max_length = _cutting_max_length(tiny, rows)
    args = DPOConfig(str(tmp_path), precompute_ref_log_probs=True, max_length=max_length,
                     truncation_mode=truncation_mode, report_to=[], **device_args())
    trl = DPOTrainer(model=tiny.path, args=args, train_dataset=Dataset.from_list(rows), processing_class=tiny.tok)
    _, model = load_pretrained(tiny.path)
    ours = preference_logps(model, tiny.tok, *([r[k] for r in rows] for k in ("prompt", "chosen", "rejected")),
                            max_length=max_length, truncation_mode=truncation_mode)
    for column, values in zip(("ref_chosen_logps", "ref_rejected_logps"), ours):
        assert torch.allclose(torch.tensor(trl.train_dataset[column]), torch.tensor(values), atol=1e-3)


def test_stored_log_probs_are_trls_when_the_prompt_merges_with_one_completion(tiny, tmp_path):
    """seppo_sample scored each completion from where it alone parted from the prompt's tokens; DPOTrainer starts
    both of a pair where the first of them parts. When the prompt's last token merges with the anchor's first
    ("co" + "t"), the reference log p(y_ref) it stored was one token short of the one the trainer's policy sums."""
    rows = [{"prompt": prompt(p.question) + "co", "chosen": f"t\nAnswer: {p.answer}",
             "rejected": f" cot\nAnswer: {p.answer + 1}"} for p in tiny.problems[:4]]
    assert all(len(preference_example(tiny.tok, **r)["prompt_ids"]) < len(tiny.tok(r["prompt"])["input_ids"])
               for r in rows), "the case needs a merge across the prompt's end"
    args = DPOConfig(str(tmp_path), precompute_ref_log_probs=True, report_to=[], **device_args())
    trl = DPOTrainer(model=tiny.path, args=args, train_dataset=Dataset.from_list(rows), processing_class=tiny.tok)
    _, model = load_pretrained(tiny.path)
    ours = preference_logps(model, tiny.tok, *([r[k] for r in rows] for k in ("prompt", "chosen", "rejected")))
    for column, values in zip(("ref_chosen_logps", "ref_rejected_logps"), ours):
        assert torch.allclose(torch.tensor(trl.train_dataset[column]), torch.tensor(values), atol=1e-3)


def test_seppo_policy_as_its_own_reference_starts_at_log2_when_max_length_cuts(tiny, tmp_path):
    """seppo_sample stores whole-sequence reference log-probs; the trainer's collator cut the anchors to max_length,
    so the policy's sum covered fewer tokens: h_w came out ~280 nats high, AAF never fired and the loss was 0."""
    rows = _long_pairs(tiny, 4)
    _, model = load_pretrained(tiny.path)
    ref_w, ref_r = preference_logps(model, tiny.tok, *([r[k] for r in rows] for k in ("prompt", "chosen", "rejected")))
    samples = [{"prompt": r["prompt"], "anchor": r["chosen"], "response": r["rejected"], "reference": tiny.path,
                "ref_anchor_logp": a, "ref_response_logp": b} for r, a, b in zip(rows, ref_w, ref_r)]
    cfg = SimpleNamespace(loss="seppo", beta=0.5, max_steps=1, batch_size=4, grad_accum=1, learning_rate=1e-9,
                          warmup_ratio=0.0, weight_decay=0.0, max_length=_cutting_max_length(tiny, rows),
                          logging_steps=1, deepspeed=None)
    log = next(log for log in train_policy(tiny.path, samples, cfg, str(tmp_path), seed=0).state.log_history
               if "loss" in log)
    assert abs(float(log["loss"]) - math.log(2)) < 1e-3, log
    assert abs(float(log["rewards/chosen"])) < 1e-3, log


# --- preference data ------------------------------------------------------------------------------------------

def _sample(i, response, verifier, anchor, anchor_correct=True):
    return {"id": f"q{i}", "question": f"question {i}", "anchor": "ANCHOR", "response": response,
            "verifier_wins": verifier, "anchor_wins": anchor, "anchor_correct": anchor_correct}


def test_training_pairs_follow_the_chosen_label():
    samples = [_sample(1, "right", True, False), _sample(1, "wrong", False, True)]
    by_verifier = {(p["chosen"], p["rejected"]) for p in training_pairs(samples, "verifier")}
    assert by_verifier == {("ANCHOR", "wrong"), ("right", "wrong")}
    by_anchor = {(p["chosen"], p["rejected"]) for p in training_pairs(samples, "anchor")}
    assert by_anchor == {("ANCHOR", "right"), ("wrong", "right")}
    # a sample that reproduces its anchor is no pair with it, whichever rule calls it a loser
    samples.append(_sample(1, "ANCHOR", False, False))
    for label in ("verifier", "anchor"):
        assert all(p["chosen"].strip() != p["rejected"].strip() for p in training_pairs(samples, label))
    # an anchor the verifier rejects (pot's brute force of a huge repeated block) is no winner to pair with
    failed = [{**s, "anchor_correct": False} for s in samples]
    assert {(p["chosen"], p["rejected"]) for p in training_pairs(failed, "verifier")} == {("right", "wrong"),
                                                                                     ("right", "ANCHOR")}
    assert not [t for t in tie_pairs(failed, "verifier") if t["source"] == "anchor_vs_winner"]


def test_pairs_balanced_by_form_keep_as_many_pot_over_cot_as_cot_over_pot_and_every_other_pair():
    def pair(chosen, rejected, k):
        return {"chosen": f" {chosen}\nsample {k}", "rejected": f" {rejected}\nsample {k}", "k": k}
    pairs = ([pair("pot", "cot", k) for k in range(7)] + [pair("cot", "pot", k) for k in range(7, 10)]
             + [pair("cot", "cot", 10), pair("decompose+pot", "pot", 11), pair("pot", "nonsense", 12)])
    kept = balance_solution_forms(pairs, seed=0)
    sides = [(solution_form(p["chosen"]), solution_form(p["rejected"])) for p in kept]
    assert sides.count(("pot", "cot")) == sides.count(("cot", "pot")) == 3
    assert {10, 11, 12, 7, 8, 9} <= {p["k"] for p in kept}  # the minority side and every one-form pair stay
    assert [p["k"] for p in kept] == sorted(p["k"] for p in kept)  # in their order
    assert [p["k"] for p in balance_solution_forms(pairs, seed=0)] == [p["k"] for p in kept]  # seeded
    assert {p["k"] for p in balance_solution_forms(pairs, seed=1)} != {p["k"] for p in kept}


def test_form_bias_tells_a_pm_that_reads_the_form_from_one_that_reads_the_answer():
    pot, cot = " pot\nprint(5)", " cot\nAnswer: 5"
    pairs = [{"a": pot, "b": cot, "label": "A"}, {"a": cot, "b": pot, "label": "B"},  # pot right
             {"a": cot, "b": pot, "label": "A"}, {"a": pot, "b": cot, "label": "B"},  # cot right
             {"a": pot, "b": cot, "label": "tie"}, {"a": cot, "b": pot, "label": "tie"},
             {"a": pot, "b": pot, "label": "A"}]  # one form: not counted
    by_form = [1.0, -1.0, -1.0, 1.0, 1.0, -1.0, 1.0]  # always the pot side
    by_answer = [1.0, -1.0, 1.0, -1.0, 0.0, 0.0, 1.0]
    assert form_bias(pairs, by_form) == {"pm_accuracy_pot_right": 1.0, "n_pot_right": 2, "pm_accuracy_cot_right": 0.0,
                                         "n_cot_right": 2, "tie_pot_side_share": 1.0, "n_tie_two_forms": 2}
    fair = form_bias(pairs, by_answer)
    assert fair["pm_accuracy_pot_right"] == fair["pm_accuracy_cot_right"] == 1.0
    assert fair["tie_pot_side_share"] == 0.5


def test_tie_pairs_join_samples_with_the_same_verdict_and_winners_with_their_anchor():
    samples = [_sample(1, "right", True, False), _sample(1, "right too", True, True), _sample(1, "ANCHOR", True, True),
               _sample(1, "wrong", False, False), _sample(1, "wrong too", False, False), _sample(1, "wrong", False, False),
               _sample(2, "alone", False, True)]
    ties = {(t["a"], t["b"], t["source"]) for t in tie_pairs(samples, "verifier")}
    assert ties == {("right", "right too", "both_winners"), ("right", "ANCHOR", "both_winners"),
                    ("right too", "ANCHOR", "both_winners"), ("wrong", "wrong too", "both_losers"),
                    ("ANCHOR", "right", "anchor_vs_winner"), ("ANCHOR", "right too", "anchor_vs_winner")}
    # by the anchor rule the winners are other samples
    assert {(t["a"], t["b"]) for t in tie_pairs(samples, "anchor") if t["source"] == "both_winners"} == {
        ("right too", "ANCHOR")}


def test_tie_rows_take_their_share_with_target_one_half_in_both_orders():
    pairs = [{"question": f"q{i}", "chosen": "c", "rejected": "r"} for i in range(30)]
    ties = [{"question": f"t{i}", "a": "x", "b": "y"} for i in range(100)]
    assert tie_sample(pairs, ties, 0.0, seed=0) == []
    chosen = tie_sample(pairs, ties, 0.25, seed=0)
    rows = both_orders(pairs, seed=0, ties=chosen)
    assert len(chosen) == 10 and sum(y == 0.5 for _, y in rows) / len(rows) == 0.25
    assert {(q, a, b) for (q, a, b), y in rows if y == 0.5} == {(t["question"], a, b) for t in chosen
                                                                for a, b in (("x", "y"), ("y", "x"))}
    assert sorted(y for _, y in rows if y != 0.5) == [0.0] * 30 + [1.0] * 30
    assert len(tie_sample(pairs, ties[:3], 0.5, seed=0)) == 3  # fewer ties than the share asks: all of them


def test_tie_rows_pull_the_logit_of_a_tie_to_zero(tiny):
    """Trained with both answers right as a tie, the PM leaves that pair near 1/2; trained on the decisive pair
    alone, it has no reason to."""
    q = tiny.problems[0].question
    decisive = [(q, "Answer: 5", "Answer: 9"), (q, "Answer: 9", "Answer: 5")]
    tie = [(q, "Answer: 5", "so Answer: 5"), (q, "so Answer: 5", "Answer: 5")]

    def tie_logit(rows):
        torch.manual_seed(0)
        pm = PreferenceModel.from_backbone(tiny.path, HEAD_CFG)
        batch = {**pm.encode([t for t, _ in rows]), "labels": torch.tensor([y for _, y in rows])}
        opt = torch.optim.Adam(pm.parameters(), lr=1e-2)
        for _ in range(60):
            loss = pm(**batch)["loss"]
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            return abs(float(pm.eval()(**pm.encode(tie[:1]))["logits"][0]))

    with_ties = tie_logit([(decisive[0], 1.0), (decisive[1], 0.0), (tie[0], 0.5), (tie[1], 0.5)])
    without = tie_logit([(decisive[0], 1.0), (decisive[1], 0.0)])
    print(f"|logit| on the tie: {with_ties:.3f} trained with it as a tie, {without:.3f} without")
    assert with_ties < 0.25 and with_ties < without / 4


def _resp(text, correct, predicted, n_tokens, source="s"):
    return {"response": text, "correct": correct, "predicted": predicted, "n_tokens": n_tokens,
            "trajectory": "cot", "source": source}


def test_benchmark_pairs_are_labelled_balanced_and_leak_checked():
    records = [{"id": f"t{i}", "question": f"test question {i}", "difficulty": 1 + i % 2} for i in range(6)]
    responses = {r["id"]: [_resp("a", True, 5, 10), _resp("b", False, 6, 10), _resp("c", False, 7, 12),
                           _resp("d", True, 5, 14)] for r in records}
    pairs = benchmark_pairs(records, responses, pairs_per_difficulty=4, hard_pairs_per_difficulty=2, seed=0)
    for d in (1, 2):
        kinds = [p["kind"] for p in pairs if p["difficulty"] == d]
        assert kinds.count("decisive") == 4 and kinds.count("both_wrong") == 2 and kinds.count("both_right") == 2
    for p in pairs:
        if p["kind"] == "decisive":
            assert p["label"] == ("A" if p["a_correct"] else "B") and p["a_correct"] != p["b_correct"]
        else:
            assert p["label"] == "tie"
    # one pair per question per round: the 4 decisive pairs of a difficulty cover all 3 of its questions
    assert len({p["id"] for p in pairs if p["kind"] == "decisive" and p["difficulty"] == 1}) == 3
    assert {p["label"] for p in pairs if p["kind"] == "decisive"} == {"A", "B"}
    check_no_leakage(pairs, [{"id": "train-1", "question": "another"}], "bench")
    # the reference solution and a sample that reproduces it (its token count with EOS) make no tie pair
    same = {"t0": [_resp("a", True, 5, 10, "reference"), _resp("a ", True, 5, 11), _resp("b", False, 6, 10)]}
    pairs = benchmark_pairs(records[:1], same, pairs_per_difficulty=4, hard_pairs_per_difficulty=2, seed=0)
    assert all(p["a"].strip() != p["b"].strip() for p in pairs) and len(pairs) == 2
    with pytest.raises(DataError, match="t0"):
        check_no_leakage(pairs, [{"id": "x", "question": "Test question 0 "}], "bench")


# --- calibration figures --------------------------------------------------------------------------------------

def test_calibration_figures_on_known_cases():
    torch.manual_seed(0)
    p = torch.rand(20000) * 0.5 + 0.5
    label_a = torch.rand(20000) < p  # calibrated by construction
    assert expected_calibration_error(p.tolist(), label_a.tolist()) < 0.02
    assert expected_calibration_error([0.99] * 100, [True] * 50 + [False] * 50) > 0.45
    assert spearman([1, 2, 3, 4], [0, 0, 1, 1]) > 0.8 and spearman([1, 2, 3, 4], [1, 1, 0, 0]) < -0.8
    deciles = accuracy_by_decile(list(range(100)), [i < 50 for i in range(100)])
    assert deciles[0]["accuracy"] == 1.0 and deciles[-1]["accuracy"] == 0.0 and len(deciles) == 10


def test_a_model_that_cannot_choose_is_right_half_the_time_not_on_the_side_ties_break_to():
    """p = 1/2 (the antisymmetrised score of two texts scored alike is exactly 0) was read as a vote for B: a PM that
    scored every pair 0 was 100% right on a benchmark whose better response is always B, in the accuracy, the
    reliability bins, the deciles and the routing curve's rm_only end."""
    from posttrain.routing_eval import routing_curve
    from stages.train_rm import decisive_figures

    blind, label_a = [0.5] * 4, [False] * 4
    assert decisive_figures(blind, label_a)["accuracy"] == 0.5
    assert accuracy_by_decile([0.0] * 4, pair_correct(blind, label_a), n=1)[0]["accuracy"] == 0.5
    assert pair_correct([0.9, 0.2, 0.5], [True, True, True]).tolist() == [1.0, 0.0, 0.5]
    rows = routing_curve(["B"] * 4, torch.zeros(4), torch.ones(4), ["B"] * 4, budgets=[0.0], seeds=[0])
    assert next(r["accuracy"] for r in rows if r["policy"] == "rm_only") == 0.5
    assert next(r["accuracy"] for r in rows if r["policy"] == "judge_only") == 1.0


def test_pair_uncertainty_scores():
    """predictive: highest at g = 0, falls with |g|, rises with the variance at a fixed g; variance: u itself."""
    g = torch.tensor([0.0, 1.0, 3.0, 3.0, -3.0])
    var = torch.tensor([0.0, 0.0, 0.0, 5.0, 5.0])
    pred = pair_uncertainty(g, var, lam=10.0, score="predictive")
    assert pred[0] == pytest.approx(1.0) and pred[0] > pred[1] > pred[2]
    assert pred[3] > pred[2] and pred[3] == pytest.approx(pred[4])  # symmetric in the sign of g
    assert pred[2] == pytest.approx(1 - (2 * torch.sigmoid(torch.tensor(3.0)) - 1).item())
    u = pair_uncertainty(g, var, lam=10.0, score="variance")
    assert torch.allclose(u, torch.sqrt(1 + 10.0 * var))
    with pytest.raises(ValueError, match="unknown uncertainty score"):
        pair_uncertainty(g, var, 10.0, "entropy")


def test_the_pointwise_rm_logs_to_a_run_of_its_own(tiny, tmp_path):
    """Inside the stage's run its Trainer args (max_steps, output_dir) would clash with the PM's, and MLflow
    refuses to change a logged param; its loss curve would interleave with the PM's."""
    import mlflow

    from posttrain.params import load_params
    from posttrain.preference_training import train_pointwise_rm

    cfg = load_params().train_rm.model_copy(update={"pointwise_max_steps": 2, "batch_size": 2, "logging_steps": 1,
                                                    "max_length": 128, "deepspeed": None})
    pairs = [{"question": p.question, "chosen": " cot\nAnswer: 1", "rejected": " cot\nAnswer: 2"}
             for p in tiny.problems[:4]]
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    try:
        with mlflow.start_run() as parent:
            mlflow.log_param("max_steps", 1067)
            train_pointwise_rm(tiny.path, pairs, cfg, tmp_path / "rm", tmp_path / "ckpt", [], seed=0)
        client = mlflow.MlflowClient()
        children = client.search_runs([parent.info.experiment_id],
                                      f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
        assert [c.info.run_name for c in children] == ["pointwise_rm"]
        assert children[0].data.params["max_steps"] == "2" and "train_loss" in children[0].data.metrics
        assert client.get_run(parent.info.run_id).data.params["max_steps"] == "1067"
    finally:
        mlflow.set_tracking_uri(before)


def test_the_benchmark_report_gives_the_raw_and_the_calibrated_tie_figure():
    """The tie figure read sigmoid(g/u) alone, which u shrinks toward 1/2; RLHF's advantages use the raw g."""
    from stages.train_rm import benchmark_report

    pairs = [{"label": "A", "difficulty": 1}, {"label": "B", "difficulty": 1}, {"label": "tie", "difficulty": 1}]
    metrics, _ = benchmark_report(pairs, torch.tensor([1.0, -1.0, 2.0]), torch.tensor([0.0, 0.0, 1.0]), lam=10.0,
                                  pointwise_margin=[1.0, -1.0, 0.0])
    assert metrics["tie_mean_abs_p_raw_minus_half"] == pytest.approx(torch.sigmoid(torch.tensor(2.0)).item() - 0.5)
    assert metrics["tie_mean_abs_p_minus_half"] < metrics["tie_mean_abs_p_raw_minus_half"] / 2


def test_seppo_policy_pairs_leave_out_anchors_the_verifier_rejects(tiny):
    """SePPO learns from winning data alone: an anchor that fails the verifier (seppo_sample's anchor_correct,
    pot's brute force of a huge block) is no winner, so it must not be a DPO/SePPO "chosen"."""
    from posttrain.seppo import pairs_dataset
    samples = [{"prompt": prompt(f"question {i}"), "anchor": f" cot\nAnswer: {i}", "response": f" cot\nAnswer: {i + 1}",
                "reference": tiny.path, "ref_anchor_logp": -1.0, "ref_response_logp": -2.0, "anchor_correct": ok}
               for i, ok in enumerate([True, False, True])]
    data = pairs_dataset(samples, tiny.tok, max_length=None)
    assert list(data["chosen"]) == [" cot\nAnswer: 0", " cot\nAnswer: 2"]
