"""The judge client against the real local service (verdicts, faults, retries, fallback, cache, cost, the key)
and against a mock transport for protocol corners the service never sends; the verdict parser; the service."""
import email.utils
import json
import logging
import socket
import sqlite3
import threading
import time
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from posttrain.judge_client import JudgeCache, JudgeClient, JudgeConfigError, judge_identity
from posttrain.judge_prompt import combine_orders, judge_messages, parse_verdict, read_messages
from posttrain.judge_server import JudgeService, build_app, mistaken, verifier_backend
from posttrain.params import load_params

RECORDS = [{"id": f"q{i}", "question": f"Compute {i} + 1.", "answer": i + 1, "difficulty": 1} for i in range(8)]


def cfg(**overrides):
    base = load_params("configs/params.smoke.yaml").judge
    return base.model_copy(update={"max_retries": 2, "backoff_s": 0.01, "max_backoff_s": 1.0, "timeout_s": 2.0,
                                   "both_orders": False, **overrides})


def triples(n=4):
    """(question, right, wrong) triples: A is always the better response."""
    return [(r["question"], f" cot\nStep 1: {i} + 1 = {i + 1}\nAnswer: {i + 1}", f" cot\nAnswer: {i + 7}")
            for i, r in enumerate(RECORDS[:n])]


@pytest.fixture
def service():
    def start(**kw):
        svc = JudgeService(build_app(verifier_backend(RECORDS), "verifier-judge", **kw)).start()
        started.append(svc)
        return svc
    started = []
    yield start
    for svc in started:
        svc.stop()


def test_happy_path_both_orders_and_cache(service, tmp_path):
    svc = service()
    cache = JudgeCache(tmp_path / "cache.sqlite")
    client = JudgeClient(cfg(both_orders=True), svc.base_url, cache=cache)
    ts = triples()
    swapped = [(q, b, a) for q, a, b in ts]
    assert client.judge(ts + [(ts[0][0], ts[0][1], "Answer: 1")]) == ["A"] * 4 + ["tie"]  # both right
    assert client.ledger.calls == 10 and client.ledger.tokens_in > 0 and client.ledger.cost > 0
    # the swapped pairs are the same two prompts per pair: served from the cache
    assert client.judge(swapped) == ["B"] * 4 and client.ledger.calls == 10 and client.ledger.cache_hits == 8
    # a re-run (a new client on the same cache file) pays nothing
    again = JudgeClient(cfg(both_orders=True), svc.base_url, cache=JudgeCache(tmp_path / "cache.sqlite"))
    assert again.judge(ts) == ["A"] * 4
    assert again.ledger.calls == 0 and again.ledger.cache_hits == 8


def test_a_comparison_asked_twice_in_one_batch_is_paid_once(service, tmp_path):
    # concurrent copies of one prompt would all miss the cache (the service's latency keeps them in flight together)
    svc = service(latency_s=0.1)
    client = JudgeClient(cfg(both_orders=True, concurrency=4), svc.base_url, cache=JudgeCache(tmp_path / "c.sqlite"))
    ts = triples(2)
    assert client.judge([ts[0], ts[1], ts[0], ts[0]]) == ["A"] * 4
    assert client.ledger.calls == 4 and client.ledger.cache_hits == 4
    uncached = JudgeClient(cfg(concurrency=4), svc.base_url)  # without a cache too
    assert uncached.judge([ts[1]] * 3) == ["A"] * 3 and uncached.ledger.calls == 1


def test_copies_of_a_failed_prompt_are_not_counted_as_cache_hits(service):
    svc = service(faults={"http_500": 1.0})
    client = JudgeClient(cfg(max_retries=1, concurrency=4), svc.base_url)
    assert client.judge(triples(1) * 3) == [None] * 3
    # one request, one failure, and nothing served to its two copies
    assert client.ledger.failures == {"http_500": 1} and client.ledger.cache_hits == 0


@pytest.mark.parametrize("fault,kind", [("http_500", "http_500"), ("malformed_json", "malformed_body"),
                                        ("truncated_json", "malformed_body"), ("no_verdict", "no_verdict"),
                                        ("http_429", "rate_limited"), ("connection_reset", "connection")])
def test_every_fault_ends_in_a_counted_fallback_after_the_retries(service, fault, kind):
    svc = service(faults={fault: 1.0})
    client = JudgeClient(cfg(), svc.base_url)
    assert client.judge(triples(2)) == [None, None]
    assert client.ledger.failures == {kind: 2}


def test_a_body_that_does_not_decode_falls_back_instead_of_raising():
    # a gzip header over bytes that are not gzip: httpx raises DecodingError, neither a timeout nor a transport error
    def broken(request):
        return httpx.Response(200, headers={"Content-Encoding": "gzip"}, content=b"not gzip at all")
    client = JudgeClient(cfg(), "http://judge.invalid/v1")
    client.http = httpx.Client(base_url="http://judge.invalid/v1", transport=httpx.MockTransport(broken))
    assert client.judge(triples(1)) == [None]
    assert client.ledger.failures == {"bad_response": 1}


def test_a_cache_locked_by_another_process_costs_a_call_not_the_step(service, tmp_path):
    svc = service()
    cache = JudgeCache(tmp_path / "judge.sqlite")
    cache.db = sqlite3.connect(str(tmp_path / "judge.sqlite"), check_same_thread=False, timeout=0.05)
    holder = sqlite3.connect(str(tmp_path / "judge.sqlite"))
    holder.execute("BEGIN EXCLUSIVE")  # another run mid-write
    try:
        client = JudgeClient(cfg(), svc.base_url, cache=cache)
        assert client.judge(triples(2)) == ["A", "A"]
        assert client.ledger.calls == 2 and client.ledger.cache_hits == 0
    finally:
        holder.rollback()


def test_timeouts_are_retried_then_fall_back(service):
    svc = service(faults={"timeout": 1.0}, hang_s=3.0)
    client = JudgeClient(cfg(timeout_s=0.3, max_retries=1), svc.base_url)
    start = time.perf_counter()
    assert client.judge(triples(1)) == [None]
    assert client.ledger.failures == {"timeout": 1} and time.perf_counter() - start < 3


def test_flaky_service_mostly_recovers_and_429_waits_for_retry_after(service):
    svc = service(faults={"http_500": 0.3, "http_429": 0.3}, seed=1)
    client = JudgeClient(cfg(max_retries=6, concurrency=2), svc.base_url)
    start = time.perf_counter()
    verdicts = client.judge(triples(8))
    assert verdicts.count("A") >= 7
    assert time.perf_counter() - start >= 0.2  # at least one Retry-After: 0.2 was honoured


def test_the_service_stops_promptly_and_quietly_with_a_request_still_hanging(service):
    """The hung request is answered (503, so the client falls back) rather than cancelled mid-flight, which made
    uvicorn wait out its grace period and log a traceback per request."""
    svc = service(faults={"timeout": 1.0})
    client = JudgeClient(cfg(timeout_s=60.0, max_retries=0), svc.base_url)
    caller = threading.Thread(target=client.judge, args=(triples(1),), daemon=True)
    caller.start()
    time.sleep(1.0)  # the request is in, and the service holds it for 30 s
    logged = []
    handler = logging.Handler(level=logging.DEBUG)
    handler.emit = logged.append
    logging.getLogger("uvicorn.error").addHandler(handler)
    try:
        start = time.perf_counter()
        svc.stop()
        stopped_in = time.perf_counter() - start
    finally:
        logging.getLogger("uvicorn.error").removeHandler(handler)
    caller.join(timeout=5)
    assert not svc.thread.is_alive() and stopped_in < 8
    assert [r.getMessage() for r in logged if r.levelno >= logging.WARNING] == []
    assert not caller.is_alive() and client.ledger.failures == {"http_503": 1}


def test_a_judge_unreachable_from_the_start_stops_the_stage_naming_the_endpoint():
    """It fell back pair by pair, each after every retry: a wrong port quietly made the whole run rm_only."""
    client = JudgeClient(cfg(max_retries=1), "http://user:secret@127.0.0.1:9/v1")
    start = time.perf_counter()
    with pytest.raises(JudgeConfigError, match=r"http://127\.0\.0\.1:9 could not be connected to in 2 attempts") as e:
        client.judge(triples(3))
    assert "secret" not in str(e.value) and time.perf_counter() - start < 5
    with pytest.raises(JudgeConfigError):  # and the next batch is refused at once
        client.judge(triples(1))


def test_a_judge_whose_first_answer_stalled_has_been_reached():
    """Its headers came, its body did not (a timeout): the endpoint exists, so a refused connection after it is a
    passing fault, the pair falls back, and the stage goes on."""
    class Stalled(httpx.SyncByteStream):
        def __iter__(self):
            raise httpx.ReadTimeout("stalled")

    calls = []

    def handler(request):
        calls.append(request)
        if len(calls) == 1:
            return httpx.Response(200, stream=Stalled())
        raise httpx.ConnectError("refused")
    client = handler_client(handler, max_retries=1)
    assert client.judge(triples(1)) == [None] and client.ledger.failures == {"connection": 1}


def test_a_judge_that_answered_once_and_then_went_away_falls_back_pair_by_pair(service):
    svc = service()
    client = JudgeClient(cfg(max_retries=1), svc.base_url)
    assert client.judge(triples(1)) == ["A"]
    svc.stop()  # the port is closed now: connections are refused
    assert client.judge(triples(2)[1:]) == [None] and client.ledger.failures == {"connection": 1}


def test_the_api_key_goes_only_into_the_header(service, monkeypatch, caplog, capsys):
    secret = "sk-test-SECRET-0123456789"
    monkeypatch.setenv("POSTTRAIN_JUDGE_API_KEY", secret)
    svc = service()
    with caplog.at_level(logging.DEBUG):
        client = JudgeClient(cfg(), svc.base_url)
        client.judge(triples(1))
    assert client.http.headers["Authorization"] == f"Bearer {secret}"
    out = capsys.readouterr()
    assert secret not in caplog.text + out.out + out.err
    assert secret not in repr(client.ledger.as_metrics()) and secret not in repr(client.cfg)


def test_verdict_parser_and_prompt_round_trip():
    assert parse_verdict("reasoning...\nVerdict: A") == "A"
    assert parse_verdict("**Final verdict**: [[B]]") == "B"
    assert parse_verdict("<think>Verdict: A</think>\nVerdict: tie") == "tie"
    assert parse_verdict("Both answers are 5.") is None and parse_verdict("") is None
    assert combine_orders("A", "B") == "A" and combine_orders("A", "A") == "tie" and combine_orders(None, "A") == "B"
    msgs = judge_messages("Compute 2 + 3.", "Answer: 5\n", "multi\nline", "correctness")
    assert read_messages(msgs) == ("Compute 2 + 3.", "Answer: 5", "multi\nline")


@pytest.mark.parametrize("answer, verdict", [
    ("My first instinct was [[A]], but A has an arithmetic slip. Verdict: B", "B"),  # the last one, by position
    ("Verdict: B\n\nExplanation: Response A's answer is a wrong number.", "B"),      # 'answer is a' is no verdict
    ('{"verdict": "A", "reason": "right total"}', "A"), ('{"winner": "B"}', "B"), ("**Verdict**: B", "B"),
    ("Verdict: Response A", "A"), ("Final verdict: **Response B**", "B"), ("The winner is a tie.", "tie"),
    ("Final answer: B", "B"), ("The answer is A", None), ("Verdict: none", None)])
def test_verdict_parser_reads_json_markdown_and_takes_the_last_verdict(answer, verdict):
    assert parse_verdict(answer) == verdict


@pytest.mark.parametrize("answer, verdict", [
    # the article "a" after a keyword is no verdict for A (it used to override the real verdict above it)
    ("Verdict: B\nExplanation: the winner is a response whose final answer is right.", "B"),
    ("Verdict: tie\n(The preferred response is a matter of style here.)", "tie"),
    ("Verdict: B\nNote: my verdict is a judgement on the final answer only.", "B"),
    ("My verdict: a slight edge to B.", None),
    # markdown around the colon and the side, dashes as the separator
    ("**Verdict:** **B**", "B"), ("**Final Verdict:** Response **B**", "B"), ("Verdict — B", "B"),
    ("Verdict - B", "B"),
    # reasoning: an unclosed <think> runs to the end (cut off); R1-style output has only the closing tag
    ("<think>The verdict: B seems right", None),
    ("So the verdict: A, surely.</think>\nBoth responses reach the same answer.", None),
    ("Maybe verdict: A?\n</think>\n\nVerdict: B", "B"),
    # a lowercase side standing alone still counts, and "a tie" / "a draw" are still ties
    ("verdict: b.", "B"), ("**Verdict:** a\nBecause...", "A"), ("The winner is a draw.", "tie"),
    ("Verdict: a tie", "tie")])
def test_verdict_parser_skips_the_article_and_reasoning_and_reads_markdown(answer, verdict):
    assert parse_verdict(answer) == verdict


def test_the_metrics_keep_pairs_that_fell_back_apart_from_failed_judge_requests():
    """rlhf_routed.json used to carry the ledger's failed-request count under the routing's ``judge_failures``
    (pairs that fell back to the PM), overwriting it."""
    from posttrain.judge_cost import CostLedger
    from posttrain.rlhf import RoutedPairwiseReward
    from stages.rlhf_routed import judge_figures

    reward = RoutedPairwiseReward(pm=None, judge=None, cfg=None, seed=0)  # summary() reads the totals alone
    reward.totals.update({"pairs": 12, "routed": 6, "judge_failures": 1, "judge_verdicts": 5})
    ledger = CostLedger(0.001, 0.002)
    for kind in ("http_500", "http_500", "timeout"):
        ledger.fail(kind)
    figures = judge_figures(reward.summary(), ledger)
    assert figures["judge_failures"] == 1 and figures["judge_failed_requests"] == 3
    assert figures["judge_failed_requests.http_500"] == 2 and figures["judge_failed_requests.timeout"] == 1
    assert len(figures) == len(reward.summary()) + len(ledger.as_metrics())  # nothing overwritten


def mock_client(responses, **overrides):
    """A client whose HTTP calls get ``responses`` in turn (protocol corners the local service never sends)."""
    sent = []

    def reply(request):
        sent.append(request)
        return responses[min(len(sent), len(responses)) - 1]
    client = JudgeClient(cfg(**overrides), "http://judge.test/v1")
    client.http = httpx.Client(base_url="http://judge.test/v1", transport=httpx.MockTransport(reply))
    return client, sent


def test_retry_after_as_an_http_date_is_honoured_and_null_token_counts_cost_nothing():
    # the clock starts before the date is written: the date is to the second, so 1-2 s after this start however
    # long a loaded machine takes to build the client
    start = time.perf_counter()
    date = email.utils.format_datetime(datetime.now(timezone.utc) + timedelta(seconds=2), usegmt=True)
    ok = {"choices": [{"message": {"content": "Verdict: A"}}], "usage": {"prompt_tokens": None,
                                                                          "completion_tokens": None}}
    client, sent = mock_client([httpx.Response(429, headers={"Retry-After": date}), httpx.Response(200, json=ok)])
    assert client.judge(triples(1)) == ["A"]
    assert len(sent) == 2 and time.perf_counter() - start >= 0.9
    assert client.ledger.calls == 1 and client.ledger.tokens_in == client.ledger.tokens_out == 0


def test_a_retry_after_longer_than_allowed_fails_the_pair_at_once():
    client, sent = mock_client([httpx.Response(429, headers={"Retry-After": "3600"})], max_retries=3,
                               max_retry_after_s=30.0)
    start = time.perf_counter()
    assert client.judge(triples(1)) == [None]
    assert len(sent) == 1 and client.ledger.failures == {"rate_limited_fatal": 1}
    assert time.perf_counter() - start < 5


def test_the_cache_keeps_one_backends_verdicts_from_another(service, tmp_path):
    svc = service()
    verifier = JudgeClient(cfg(base_url=None, backend="verifier"), svc.base_url, JudgeCache(tmp_path / "c.sqlite"))
    assert verifier.judge(triples(2)) == ["A", "A"] and verifier.ledger.calls == 2
    hf = JudgeClient(cfg(base_url=None, backend="hf"), svc.base_url, JudgeCache(tmp_path / "c.sqlite"))
    hf.judge(triples(2))
    assert hf.ledger.calls == 2 and hf.ledger.cache_hits == 0  # same model name, another judge: asked again
    again = JudgeClient(cfg(base_url=None, backend="verifier"), svc.base_url, JudgeCache(tmp_path / "c.sqlite"))
    assert again.judge(triples(2)) == ["A", "A"] and again.ledger.calls == 0


def test_a_fallible_verifier_judge_errs_on_its_share_of_pairs_the_same_way_in_both_orders(tmp_path):
    svc = JudgeService(build_app(verifier_backend(RECORDS, mistake_rate=1.0), "verifier-judge")).start()
    try:
        client = JudgeClient(cfg(both_orders=True, mistake_rate=1.0), svc.base_url)
        ts = triples()
        # every decisive pair goes to the wrong response, in both orders alike (no position-bias tie)
        assert client.judge(ts) == ["B"] * 4 and client.ledger.calls == 8
        assert client.judge([(q, b, a) for q, a, b in ts]) == ["A"] * 4
        # two right answers: no tie, but one response preferred whichever side it is on
        q, right = ts[0][0], ts[0][1]
        other = "Answer: 1"
        first = client.judge([(q, right, other)])[0]
        assert first in ("A", "B") and client.judge([(q, other, right)]) == [{"A": "B", "B": "A"}[first]]
    finally:
        svc.stop()
    # the draw: the share asked for, a fixed function of the unordered pair, nested across rates
    pairs = [(f"Compute {i} + 1.", f"Answer: {i}", f"Answer: {i + 1}") for i in range(4000)]
    at = {rate: {i for i, (q, a, b) in enumerate(pairs) if mistaken(q, a, b, rate)} for rate in (0.0, 0.05, 0.1)}
    assert not at[0.0] and at[0.05] <= at[0.1]
    assert abs(len(at[0.1]) / len(pairs) - 0.1) < 0.015 and abs(len(at[0.05]) / len(pairs) - 0.05) < 0.01
    assert all(mistaken(q, b, a, 0.1) == (i in at[0.1]) for i, (q, a, b) in enumerate(pairs))
    # a fallible verifier is another judge for the cache; a faultless one keeps the keys it always had
    faultless = judge_identity(cfg(backend="verifier", base_url=None))
    assert judge_identity(cfg(backend="verifier", base_url=None, mistake_rate=0.1)) != faultless
    assert "mistake_rate" not in json.dumps(faultless)


def test_an_hf_judge_retrained_in_place_is_not_served_its_old_verdicts(tmp_path):
    model = tmp_path / "judge_model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights v1")
    hf = cfg(backend="hf", hf_model=str(model), base_url=None)
    before = judge_identity(hf)
    (model / "model.safetensors").write_bytes(b"weights v2, retrained")
    assert judge_identity(hf) != before
    assert judge_identity(cfg(backend="verifier", base_url=None)) == judge_identity(cfg(backend="verifier",
                                                                                        base_url=None))


def test_a_remote_judges_verdicts_are_its_endpoints_own():
    """The key held the model name only: one name served at two endpoints (a quantised copy, another provider) shared
    its verdicts. Credentials and a trailing slash are not part of who answers."""
    remote = judge_identity(cfg(base_url="http://gpu-1:8000/v1"))
    assert judge_identity(cfg(base_url="http://gpu-2:8000/v1")) != remote
    assert judge_identity(cfg(base_url="http://gpu-1:8001/v1")) != remote
    assert judge_identity(cfg(base_url="http://me:token@gpu-1:8000/v1/")) == remote
    assert "token" not in json.dumps(judge_identity(cfg(base_url="http://me:token@gpu-1:8000/v1")))


@pytest.mark.parametrize("max_tokens", [512, None])
def test_max_tokens_is_sent_when_set(max_tokens):
    client, sent = mock_client([httpx.Response(200, json=OK_BODY)], max_tokens=max_tokens)
    assert client.judge(triples(1)) == ["A"]
    body = json.loads(sent[0].content)
    assert body.get("max_tokens") == max_tokens and ("max_tokens" in body) == (max_tokens is not None)


OK_BODY = {"choices": [{"message": {"content": "Verdict: A"}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 10, "completion_tokens": 5}}


def handler_client(handler, **overrides):
    """A client whose HTTP calls go to ``handler(request) -> httpx.Response`` (called in the caller's thread)."""
    client = JudgeClient(cfg(**overrides), "http://judge.test/v1")
    client.http = httpx.Client(base_url="http://judge.test/v1", transport=httpx.MockTransport(handler))
    return client


def test_a_key_with_a_trailing_newline_is_sent_stripped(service, monkeypatch):
    """A key read from a file keeps its newline: no header may carry it, so every request failed as a "connection"
    error (and httpx's message for it quoted the whole header, key included)."""
    monkeypatch.setenv("POSTTRAIN_JUDGE_API_KEY", "sk-test-SECRET-42\n")
    client = JudgeClient(cfg(max_retries=0), service().base_url)
    assert client.judge(triples(1)) == ["A"] and client.ledger.failures == {}
    assert client.http.headers["Authorization"] == "Bearer sk-test-SECRET-42"


@pytest.mark.parametrize("status, error", [
    (401, {"message": "Incorrect API key provided: {key}.", "type": "invalid_request_error"}),
    (403, {"message": "Project does not have access to this model", "type": "invalid_request_error"}),
    (429, {"message": "You exceeded your current quota.", "type": "insufficient_quota", "code": "insufficient_quota"})])
def test_an_endpoint_that_refuses_every_request_stops_the_run_with_its_reason_but_not_the_key(monkeypatch, status,
                                                                                            error):
    """A bad key, a model the account cannot use or no quota left used to fail each pair in turn, quietly: the run
    went on as rm_only with a failure count in MLflow."""
    secret = "sk-test-SECRET-0123456789"
    monkeypatch.setenv("POSTTRAIN_JUDGE_API_KEY", secret)
    sent = []

    def refuse(request):
        sent.append(request)
        return httpx.Response(status, json={"error": {**error, "message": error["message"].format(key=secret)}})
    client = handler_client(refuse, concurrency=1, max_retries=3)
    with pytest.raises(Exception) as err:
        client.judge(triples(6))
    assert type(err.value).__name__ == "JudgeConfigError" and f"HTTP {status}" in str(err.value)
    assert error["message"].split(":")[0].split(".")[0] in str(err.value)
    assert secret not in str(err.value) + repr(err.value) and len(sent) == 1  # neither retried nor asked again
    with pytest.raises(type(err.value)):
        client.judge(triples(1))
    assert len(sent) == 1


def test_a_wrong_model_name_gets_a_404_from_the_service_and_stops_the_client(service):
    svc = service()
    with pytest.raises(Exception, match="HTTP 404.*does not exist"):
        JudgeClient(cfg(model="gpt-judge"), svc.base_url).judge(triples(2))


def test_null_content_is_a_paid_answer_and_a_finished_answer_all_in_reasoning_is_read():
    """vLLM's reasoning parsers put an answer that never closed its <think> in reasoning_content with content null:
    that used to count as a malformed body and its tokens went unbilled."""
    def answer(finish, **message):
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", **message},
                                                      "finish_reason": finish}],
                                         "usage": {"prompt_tokens": 100, "completion_tokens": 40}})
    client, sent = mock_client([answer("stop", content=None, reasoning_content="A slips a digit.\nVerdict: B")])
    assert client.judge(triples(1)) == ["B"] and client.ledger.tokens_out == 40 and client.ledger.calls == 1
    # cut off mid-reasoning: its verdict was tentative, so none; still paid for, attempt by attempt
    client, sent = mock_client([answer("length", content=None, reasoning_content="Verdict: A? Let me check")],
                               max_retries=1)
    assert client.judge(triples(1)) == [None] and client.ledger.failures == {"no_verdict": 1}
    assert client.ledger.calls == 2 and client.ledger.tokens_in == 200
    client, sent = mock_client([answer("stop", content=[{"type": "text", "text": "Verdict: A"}])])
    assert client.judge(triples(1)) == ["A"]
    # no choice at all (a content filter), yet billed for the prompt
    client, sent = mock_client([httpx.Response(200, json={"choices": [], "usage": {"prompt_tokens": 7}})],
                               max_retries=0)
    assert client.judge(triples(1)) == [None] and client.ledger.failures == {"malformed_body": 1}
    assert client.ledger.tokens_in == 7


def test_a_server_that_trickles_bytes_is_timed_out_on_the_whole_request():
    """httpx's timeout is per read: a server (or router) that keeps the connection alive with a space every so often
    held the request as long as it liked."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    body = json.dumps(OK_BODY).encode()

    def serve():  # one request, a space every 0.2 s for 3 s, then the answer
        conn, _ = sock.accept()
        with conn, sock:
            conn.recv(65536)
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % (15 + len(body)))
                for _ in range(15):
                    conn.sendall(b" ")
                    time.sleep(0.2)
                conn.sendall(body)
            except OSError:
                pass
    threading.Thread(target=serve, daemon=True).start()
    client = JudgeClient(cfg(timeout_s=1.0, max_retries=0), f"http://127.0.0.1:{sock.getsockname()[1]}/v1")
    start = time.perf_counter()
    assert client.judge(triples(1)) == [None] and client.ledger.failures == {"timeout": 1}
    assert time.perf_counter() - start < 2.5


def test_a_retry_after_holds_back_every_thread_not_only_the_one_refused():
    """A 429's Retry-After is about the account: the other threads went on and were refused too."""
    starts, lock = [], threading.Lock()

    def reply(request):
        with lock:
            starts.append(time.monotonic())
            first = len(starts) == 1
        if first:
            return httpx.Response(429, headers={"Retry-After": "1"})
        time.sleep(0.2)
        return httpx.Response(200, json=OK_BODY)
    client = handler_client(reply, concurrency=2)
    assert client.judge(triples(4)) == ["A"] * 4
    # the request already in flight at the 429 aside, none starts within the second asked for
    assert len(starts) == 5 and all(t - starts[0] >= 0.9 for t in sorted(starts)[2:])


def test_the_concurrency_limit_holds_across_threads_sharing_a_client():
    """The limit was per judge() call: two threads judging at once had twice the requests in flight."""
    in_flight, peak, lock = [0], [0], threading.Lock()

    def reply(request):
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        time.sleep(0.1)
        with lock:
            in_flight[0] -= 1
        return httpx.Response(200, json=OK_BODY)
    client = handler_client(reply, concurrency=2)
    ts = triples(8)
    callers = [threading.Thread(target=client.judge, args=(part,)) for part in (ts[:4], ts[4:])]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=10)
    assert client.ledger.calls == 8 and peak[0] == 2


def test_408_is_retried_and_a_503s_retry_after_is_honoured():
    client, sent = mock_client([httpx.Response(408), httpx.Response(200, json=OK_BODY)])
    assert client.judge(triples(1)) == ["A"] and len(sent) == 2
    client, sent = mock_client([httpx.Response(503, headers={"Retry-After": "1"}), httpx.Response(200, json=OK_BODY)])
    start = time.perf_counter()
    assert client.judge(triples(1)) == ["A"] and time.perf_counter() - start >= 0.9


def test_a_retry_after_in_asctime_form_is_read_as_gmt(monkeypatch):
    """parsedate_to_datetime gives no zone for the asctime form, and .timestamp() then read it as local time."""
    from posttrain.judge_client import retry_after_seconds

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        wait = retry_after_seconds(time.asctime(time.gmtime(time.time() + 30)))
    finally:
        monkeypatch.undo()
        time.tzset()
    assert 25 <= wait <= 31


def test_a_cache_file_that_is_no_database_is_a_clear_error_and_is_left_alone(tmp_path):
    path = tmp_path / "judge.sqlite"
    path.write_bytes(b"not a database, but maybe a salvageable one" * 100)
    with pytest.raises(Exception, match=f"judge cache {path}.*Move it aside"):
        JudgeCache(path)
    assert path.read_bytes() == b"not a database, but maybe a salvageable one" * 100


def test_a_cache_damaged_after_it_opened_costs_calls_not_the_step(service, tmp_path, caplog):
    """'database disk image is malformed' is a DatabaseError, not the OperationalError the cache caught."""
    path = tmp_path / "judge.sqlite"
    cache = JudgeCache(path)
    for i in range(2000):
        cache.put(f"{i:064x}", "A", "x" * 200)
    with open(path, "r+b") as f:
        for page in range(2, path.stat().st_size // 4096):
            f.seek(page * 4096)
            f.write(b"\xff" * 100)
    client = JudgeClient(cfg(), service().base_url, cache=JudgeCache(path))
    with caplog.at_level(logging.WARNING):
        assert client.judge(triples(2)) == ["A", "A"] and client.ledger.calls == 2
    assert "malformed" in caplog.text


@pytest.mark.parametrize("body, status", [
    (b"not json", 400), (b"[1, 2]", 400), (b'{"messages": [1, 2]}', 400), (b'{"messages": []}', 400),
    (b'{"messages": [{"role": "user", "content": null}]}', 400),
    (b'{"model": "verifier-judge", "messages": [{"role": "user", "content": "hi"}], "stream": true}', 400),
    (b'{"model": "other-model", "messages": [{"role": "user", "content": "hi"}]}', 404),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}', 200)])
def test_the_service_answers_bad_requests_as_an_openai_server_does(service, body, status):
    """They used to crash the handler (a 500 and a traceback), pass FastAPI's 422, or be answered (any model name)."""
    svc = service()
    logged = []
    handler = logging.Handler(level=logging.ERROR)
    handler.emit = logged.append
    logging.getLogger("uvicorn.error").addHandler(handler)
    try:
        resp = httpx.post(svc.base_url + "/chat/completions", content=body,
                          headers={"Content-Type": "application/json"})
    finally:
        logging.getLogger("uvicorn.error").removeHandler(handler)
    assert resp.status_code == status and logged == []
    if status != 200:
        assert resp.json()["error"]["message"]
    else:
        assert "Verdict" in resp.json()["choices"][0]["message"]["content"]


def test_the_service_holds_its_port_from_the_moment_it_picks_it():
    """The port was looked up, released and bound again by uvicorn later: another process could take it between."""
    svc = JudgeService(build_app(verifier_backend(RECORDS), "verifier-judge"))
    thief = socket.socket()
    thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        try:
            thief.bind(("127.0.0.1", svc.port))
            thief.listen(1)
        except OSError:
            pass
        svc.start()
        assert JudgeClient(cfg(), svc.base_url).judge(triples(1)) == ["A"]
    finally:
        svc.stop()
        thief.close()


@pytest.mark.parametrize("answer, verdict", [
    ("Both compute 6 but B shows its steps.\n\n**Final Answer**\n\\boxed{B}", "B"),
    ("Verdict: $\\boxed{\\text{A}}$", "A"), ("\\boxed{\\text{Response B}}", "B"), ("\\boxed{tie}", "tie"),
    ("Response A's total is \\boxed{12}. Verdict: A", "A"),
    ("B", "B"), ("**A**", "A"), ("Tie.", "tie"), ("<think>A or B...</think>\n\nB", "B"),
    ("A or B", None), ("Response A", None),
    # a side named with the other is no verdict for either (it was read as A)
    ("Verdict: A and B are equally good", None), ("Verdict: A/B", None), ("Verdict: A or B?\nVerdict: B", "B"),
    ("Verdict: A, since B is wrong", "A")])
def test_verdict_parser_reads_boxed_and_bare_answers(answer, verdict):
    assert parse_verdict(answer) == verdict


def test_a_question_the_verifier_judge_does_not_know_is_a_failure_not_a_cached_tie(service, tmp_path):
    """It answered "Verdict: tie", which the client cached: once the records were right the tie was still served."""
    svc = service()
    cache = JudgeCache(tmp_path / "cache.sqlite")
    client = JudgeClient(cfg(), svc.base_url, cache=cache)
    unknown = ("Compute 99 + 1.", " cot\nAnswer: 100", " cot\nAnswer: 7")
    assert client.judge([unknown]) == [None]
    assert client.ledger.failures == {"http_400_fatal": 1}
    assert client.judge([unknown]) == [None] and client.ledger.cache_hits == 0  # nothing was cached


def test_a_retry_after_holds_back_threads_already_waiting_for_their_turn_under_the_rate_limit():
    """Threads waiting in the requests-per-minute limiter had their start times booked before the 429: they started
    inside the Retry-After anyway, were refused too, and each spent a retry."""
    starts, lock = [], threading.Lock()

    def reply(request):
        with lock:
            starts.append(time.monotonic())
            first = len(starts) == 1
        if first:
            time.sleep(0.1)  # the others have booked their turns by now
            return httpx.Response(429, headers={"Retry-After": "1"})
        return httpx.Response(200, json=OK_BODY)
    client = handler_client(reply, concurrency=3, requests_per_minute=200)  # a start every 0.3 s
    assert client.judge(triples(3)) == ["A"] * 3
    assert len(starts) == 4 and all(t - starts[0] >= 0.9 for t in starts[1:])


def test_a_redirect_stops_the_run_naming_where_it_points_not_the_credentials():
    """http:// for an https-only API (or a base URL missing its path) answers every POST with a redirect: read as a
    malformed body, each pair was retried and fell back, and the run went on as rm_only."""
    client, sent = mock_client([httpx.Response(301, headers={"Location": "https://me:token@judge.test/v1/chat/"
                                                                         "completions"})], max_retries=3,
                               concurrency=1)
    with pytest.raises(JudgeConfigError, match=r"HTTP 301.*https://judge\.test/v1/chat/completions") as e:
        client.judge(triples(3))
    assert "token" not in str(e.value) and len(sent) == 1


@pytest.mark.parametrize("error", [
    {"message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' "
                "instead.", "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"},
    {"message": "Unsupported value: 'temperature' does not support 0.6 with this model. Only the default (1) value is "
                "supported.", "type": "invalid_request_error", "param": "temperature", "code": "unsupported_value"}])
def test_a_parameter_the_model_refuses_stops_the_run(error):
    """OpenAI's reasoning models refuse max_tokens and any temperature but 1 on every request: each pair failed as
    http_400_fatal with a warning, and the run quietly became rm_only."""
    client, sent = mock_client([httpx.Response(400, json={"error": error})], concurrency=1)
    with pytest.raises(JudgeConfigError, match=r"HTTP 400.*" + error["param"]):
        client.judge(triples(3))
    assert len(sent) == 1


def test_a_400_about_one_prompt_still_fails_only_that_pair():
    too_long = {"error": {"message": "This model's maximum context length is 4096 tokens.", "param": "messages",
                          "code": "context_length_exceeded", "type": "invalid_request_error"}}
    client, sent = mock_client([httpx.Response(400, json=too_long), httpx.Response(200, json=OK_BODY)], concurrency=1)
    assert client.judge(triples(2)) == [None, "A"] and client.ledger.failures == {"http_400_fatal": 1}


@pytest.mark.parametrize("answer, verdict", [
    # Chinese-tuned judges (Qwen, DeepSeek, GLM) write a full-width colon; it was read as no verdict at all
    ("Verdict：A", "A"), ("**Verdict：** **B**", "B"), ("最终判断：两个都对。\nVerdict：tie", "tie"), ("Final answer：B", "B")])
def test_verdict_parser_reads_a_full_width_colon(answer, verdict):
    assert parse_verdict(answer) == verdict


@pytest.mark.parametrize("body, status", [
    (b'{"messages": [{"role": "user", "content": "\xff\xfe not UTF-8"}]}', 400),
    (b'{"messages": [{"role": "user", "content": "hi"}], "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400),
    (b'{"messages": [{"role": "user", "content": "hi"}], "n": 3}', 400),
    (b'{"messages": [{"role": "user", "content": "hi"}], "n": 1}', 200)])
def test_the_service_answers_a_body_it_cannot_parse_or_serve_in_openais_shape(service, body, status):
    """A body that is not UTF-8 got FastAPI's {"detail": ...}, which OpenAI clients do not read; n=3 got one choice,
    and a client reading choices[1] failed."""
    resp = httpx.post(service().base_url + "/chat/completions", content=body,
                      headers={"Content-Type": "application/json"})
    assert resp.status_code == status
    assert resp.json()["error"]["message"] if status != 200 else len(resp.json()["choices"]) == 1


def test_a_read_still_blocked_at_the_deadline_is_cut_there():
    """The deadline was checked between reads only: a byte just before it, then silence, held the request for a whole
    further read timeout (1.9 s for timeout_s=1)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)

    def serve():
        conn, _ = sock.accept()
        with conn, sock:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
            time.sleep(0.8)
            conn.sendall(b" ")
            time.sleep(3)
    threading.Thread(target=serve, daemon=True).start()
    client = JudgeClient(cfg(timeout_s=1.0, max_retries=0), f"http://127.0.0.1:{sock.getsockname()[1]}/v1")
    start = time.perf_counter()
    assert client.judge(triples(1)) == [None] and client.ledger.failures == {"timeout": 1}
    assert time.perf_counter() - start < 1.4


@pytest.mark.parametrize("answer, verdict", [
    # a note after the verdict naming a response's answer read as a verdict for that side
    ("**Verdict: A**\n\n*(Response B's final answer: B is wrong.)*", "A"), ("[[A]]\nThe answer: B", "A"),
    # where no stronger keyword names a side, "answer:" still decides, the last one winning
    ("Final answer: B", "B"), ("First answer: A, then on reflection the answer: B", "B")])
def test_an_answer_line_decides_only_where_no_verdict_does(answer, verdict):
    assert parse_verdict(answer) == verdict


def test_an_error_in_a_200_body_is_retried_counted_as_such_and_its_reason_logged(caplog):
    # OpenRouter answers a provider's failure mid-generation with HTTP 200 and {"error": ...}: it was "malformed_body",
    # and the server's reason never reached the log
    error = httpx.Response(200, json={"error": {"code": 502, "message": "provider down"}})
    client, sent = mock_client([error, error, httpx.Response(200, json=OK_BODY)], concurrency=1)
    with caplog.at_level("WARNING", logger="posttrain.judge_client"):
        assert client.judge(triples(1)) == ["A"]
    assert len(sent) == 3 and caplog.text.count("HTTP 200 with an error: provider down") == 2
    client, sent = mock_client([error], max_retries=0)
    assert client.judge(triples(1)) == [None] and client.ledger.failures == {"error_body": 1}
