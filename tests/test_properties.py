"""Property-based tests (hypothesis) for what reads untrusted text: the answer parser and verifier, the params
loader and the JSONL ingest. Whatever the input: never a traceback, always one clear message naming the place."""
import json
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.jsonl import JsonlError, read_jsonl
from posttrain.params import ParamsError, load_params, parse_params
from posttrain.task.records import DataError, read_records
from posttrain.task.verifier import extract_answer, is_correct

ROOT = Path(__file__).resolve().parents[1]
SMOKE = yaml.safe_load((ROOT / "configs" / "params.smoke.yaml").read_text())
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# model-written text: arbitrary unicode, plus the shapes an answer takes
answers = st.one_of(
    st.text(max_size=300),
    st.builds(lambda pre, n, post: f"{pre}Answer: {n}{post}", st.text(max_size=40), st.integers(-10**30, 10**30),
              st.text(max_size=20)),
    st.builds(lambda n: f"Step 1: ...\nAnswer: {n:,}", st.integers(-10**9, 10**9)),
)


@FAST
@given(answers, st.integers(-10**12, 10**12))
def test_the_verifier_never_raises_and_agrees_with_the_parser(text, answer):
    parsed = extract_answer(text)
    assert parsed is None or isinstance(parsed, int)
    assert is_correct(text, answer) == (parsed == answer)


@FAST
@given(st.integers(-10**15, 10**15))
def test_a_plain_final_answer_is_read_back(n):
    assert extract_answer(f"Step 1: compute\nAnswer: {n}") == n


# params: a section or key replaced by arbitrary YAML-able junk
junk = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=6)


@FAST
@given(st.sampled_from(sorted(SMOKE)), st.data())
def test_a_damaged_params_file_gives_params_errors_naming_the_key(section, data):
    raw = yaml.safe_load(yaml.safe_dump(SMOKE))
    if isinstance(raw[section], dict) and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(raw[section])))
        raw[section][key] = data.draw(junk)
        where = f"{section}.{key}"
    else:
        raw[section] = data.draw(junk)
        where = section
    try:
        parse_params(raw)
    except ParamsError as e:
        lines = str(e).splitlines()
        assert lines and all(line.startswith("params.yaml: ") for line in lines)
        assert any(where.split(".")[0] in line for line in lines), (where, lines)


@FAST
@given(st.binary(max_size=400))
def test_any_bytes_as_params_yaml_give_a_params_error_or_params(tmp_path_factory, blob):
    path = tmp_path_factory.mktemp("params") / "params.yaml"
    path.write_bytes(blob)
    try:
        load_params(path)
    except ParamsError as e:
        assert str(e).startswith(str(path))


rows = st.one_of(
    st.binary(max_size=120),
    st.text(max_size=120).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.dictionaries(st.sampled_from(["id", "question", "answer", "difficulty", "x"]), junk, max_size=5).map(
        lambda d: json.dumps(d, default=str).encode()),
)


@FAST
@given(st.lists(rows, min_size=1, max_size=5))
def test_any_jsonl_file_is_read_or_refused_with_file_and_line(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines) + b"\n")
    try:
        records = read_records(path)
        assert records and all({"id", "question", "answer"} <= set(r) for r in records)
    except DataError as e:
        assert str(e).startswith(str(path)), e
    try:
        read_jsonl(path)
    except JsonlError as e:
        assert str(e).startswith(str(path)), e
