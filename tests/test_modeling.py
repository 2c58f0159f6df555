"""Scratch tokenizer and model; a local pretrained directory goes through the same loading path."""
import pytest

from posttrain.modeling import ModelLoadError, build_llama, count_parameters, load_pretrained, train_tokenizer
from posttrain.params import load_params
from posttrain.task.arithmetic import generate_problems
from posttrain.task.solutions import render_response
from posttrain.trajectories import TRAJECTORIES, prompt
from stages.base_model import build_base


@pytest.fixture(scope="module")
def corpus():
    problems = generate_problems(30, seed=1, difficulties=range(1, 4), max_operand=20, max_value=200)
    return [prompt(p.question, t) + render_response(p, t) for p in problems for t in TRAJECTORIES]


def test_tokenizer_round_trips_and_splits_digits(corpus):
    tok = train_tokenizer(corpus, vocab_size=300)
    for text in corpus[:50]:
        assert tok.decode(tok(text)["input_ids"]) == text
    assert train_tokenizer(corpus, vocab_size=300, split_digits=True).tokenize("123") == ["1", "2", "3"]
    assert tok.padding_side == "left" and tok.pad_token == "<pad>"


def test_scratch_model_saves_and_loads_with_hf(tmp_path, corpus):
    tok = train_tokenizer(corpus, vocab_size=300)
    model = build_llama(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_position=128)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    tok2, model2 = load_pretrained(str(tmp_path))
    assert tok2.padding_side == "left" and tok2("Answer: 42")["input_ids"] == tok("Answer: 42")["input_ids"]
    assert count_parameters(model2) == count_parameters(model)
    # model.base pointing at a local directory loads it instead of building from scratch
    cfg = load_params("configs/params.smoke.yaml").model.model_copy(update={"base": str(tmp_path)})
    tok3, model3 = build_base(cfg, records=[], seed=0)
    assert model3.config.hidden_size == 32 and len(tok3) == len(tok)


def test_bad_sizes_and_missing_model_are_clear_errors(tmp_path, corpus):
    tok = train_tokenizer(corpus[:10], vocab_size=280)
    with pytest.raises(ValueError, match="num_heads"):
        build_llama(tok, hidden_size=30, num_layers=1, num_heads=4, intermediate_size=64, max_position=128)
    with pytest.raises(ModelLoadError, match="cannot load model"):
        load_pretrained(str(tmp_path / "nothing-here"))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="broken"):
        load_pretrained(str(tmp_path / "broken"))


@pytest.mark.parametrize("damage", ["model.safetensors", "tokenizer.json"])
def test_damaged_weights_or_tokenizer_are_a_clear_error(tmp_path, corpus, damage):
    tok = train_tokenizer(corpus[:50], vocab_size=300)
    model = build_llama(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_position=128)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    path = tmp_path / damage
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match=r"cannot load model .*damaged or cut short"):
        load_pretrained(str(tmp_path))
