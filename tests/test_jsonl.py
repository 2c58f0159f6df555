"""The pipeline's own JSONL files: a damaged or missing one is named with its line and the fix."""
import pytest

from posttrain.jsonl import JsonlError, read_jsonl


def test_a_damaged_line_is_named(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"id": 1}\n{"id": 2, "respo\n')  # a write cut short
    with pytest.raises(JsonlError, match=r"pairs.jsonl:2: not valid JSON .*re-run the stage"):
        read_jsonl(path)


def test_a_missing_file_says_to_run_the_pipeline(tmp_path):
    with pytest.raises(JsonlError, match=r"no such file; run `dvc repro`"):
        read_jsonl(tmp_path / "absent.jsonl")


def test_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
