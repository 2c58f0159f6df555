import pytest

from posttrain.task.verifier import extract_answer, is_correct, parse_integer


@pytest.mark.parametrize("text, expected", [
    ("Step 1: 2 + 2 = 4\nAnswer: 4", 4),
    ("Answer: -17", -17),
    ("answer: 1,234", 1234),
    ("Answer: 42.", 42),
    ("Answer: 42.0", 42),
    ("**Answer:** 56", 56),
    ("The answer is 9", 9),
    ("Final answer = 12", 12),
    ("so \\boxed{81} it is", 81),
    ("Answer: 3\nWait, that is wrong.\nAnswer: 5", 5),
    ("Answer: \u221212", -12),
    ("I think it is 12", None),
    ("Answer: 2.5", None),
    ("Answer: twelve", None),
    ("", None),
    (None, None),
    ("Answer:", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_is_correct():
    assert is_correct("Answer: 10", 10)
    assert not is_correct("Answer: 10", 11)
    assert not is_correct("no answer here", 0)
    assert is_correct("answer: 1,000.", 1000)


@pytest.mark.parametrize("text", ["Answer: 3/4", "Answer: 1,2", "Answer: 1,00", "Answer: 1e5", "Answer: 0x1F",
                                  "Answer: 3.0.1", "Answer: 10^3", "\\boxed{3/4}"])
def test_a_number_that_goes_on_is_not_read_as_its_first_digits(text):
    # "Answer: 3/4" was judged right for 3, "Answer: 1,2" for 12
    assert extract_answer(text) is None


def test_thousands_separators_and_a_bold_label_still_read():
    assert extract_answer("Answer: 12,345,678, done") == 12345678
    assert extract_answer("**Answer**: 42") == 42  # was None: a right answer judged wrong


@pytest.mark.parametrize("printed, value", [("42", 42), (" -1,234 ", -1234), ("12.0", 12), ("\u22127", -7),
                                            ("1,2", None), ("1e5", None), ("1_000", None), ("inf", None),
                                            ("12.5", None), ("", None)])
def test_a_programs_printed_output_is_read_as_the_number_it_shows(printed, value):
    """pot's answer is the program's last printed line: float() read '1,2' (commas dropped) as 12 and '1e5' as
    100000."""
    assert parse_integer(printed) == value


def test_answers_past_float_precision_read_exactly():
    """float() made 10**17 + 1 into 10**17, and past 1e15 the answer was dropped: a task with large answers could not
    be verified."""
    big = 10**17 + 1
    assert parse_integer(str(big)) == big
    assert parse_integer(f"{big:,}") == big
    assert parse_integer(f"{big}.000") == big
    assert is_correct(f"Answer: {big}", big)
    assert not is_correct(f"Answer: {big - 1}", big)
    assert parse_integer("9" * 5000) is None  # beyond what int() converts: no stated answer, not a crash
