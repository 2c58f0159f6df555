"""The local judge service: an HTTP server on loopback speaking the OpenAI chat-completions protocol.

Backends:
- ``verifier`` (default): stands in for a strong, costly reasoning judge. It reads the question and both
  responses back from the judge prompt, looks the question up in the task's records, and decides by the
  task verifier (``pot`` programs run in the sandbox): the right response wins; both right or both wrong is
  a tie. Its answer carries some reasoning text before the verdict line, like a real judge's. Optional
  latency and injected faults (5xx, 429, hangs, broken bodies, verdict-less answers, dropped connections) from params make it
  behave like a slow, flaky remote model; a mistake rate makes it fallible, as a real judge is (the paper's
  DeepSeek-R1 is right on 92.3% of RewardBench): that share of pairs gets the wrong verdict.
- ``hf``: a local Hugging Face causal LM generates the judgement from the prompt (any chat model works).

Start it with ``JudgeService(...).start()`` (a free port, a background thread; ``stop()`` ends it) or
``posttrain judge serve`` for standing use. Usage is counted as whitespace-separated words (an estimate
of tokens), which the client's cost ledger prices.

Example:
    >>> with JudgeService(build_app(verifier_backend(records), "verifier-judge")) as svc:  # doctest: +SKIP
    ...     JudgeClient(params.judge, svc.base_url).judge([(question, response_a, response_b)])
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from typing import get_args

import uvicorn
from fastapi import Body, FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from posttrain.evaluation import OWN_CHOICE, score_responses
from posttrain.judge_prompt import read_messages
from posttrain.online_params import JudgeFault
from posttrain.trajectories import split_choice


def _verdict_text(question: str, verdicts: list[dict]) -> str:
    a, b = verdicts
    why = lambda v: f"its final answer {v['predicted']} is {'correct' if v['correct'] else 'wrong'}"  # noqa: E731
    if a["correct"] == b["correct"]:
        decision = "tie"
    else:
        decision = "A" if a["correct"] else "B"
    return (f"Checking both responses to: {question}\nResponse A: {why(a)}.\nResponse B: {why(b)}.\n"
            f"Verdict: {decision}")


class UnknownQuestion(ValueError):
    """The verifier judge was asked about a question its records do not hold: it cannot check the answers."""


def mistaken(question: str, a: str, b: str, mistake_rate: float, draw: int = 0) -> bool:
    """Whether the fallible verifier judge gets this pair wrong: a fixed draw per question and unordered pair of
    responses, so both orders of a pair, a re-run and the cache all agree, and the pairs judged wrong at a lower
    rate are among those judged wrong at a higher one. Another ``draw`` is another judge, as fallible (a bench's
    spread over judges; the service is always draw 0, which the cache key assumes)."""
    if mistake_rate <= 0:
        return False
    digest = hashlib.sha256("\0".join([str(draw), question.strip(), *sorted((a, b))]).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < mistake_rate


def mistake(verdicts: list[dict], a: str, b: str) -> list[dict]:
    """The verdicts a mistaken judge reaches: the wrong side of a decisive pair; on a tie (both right or both
    wrong) a preference for one response, the same one in both orders."""
    if verdicts[0]["correct"] != verdicts[1]["correct"]:
        return [{**v, "correct": not v["correct"]} for v in verdicts]
    if a == b:  # one response twice: no side to prefer
        return verdicts
    first = a < b
    return [{**verdicts[0], "correct": first}, {**verdicts[1], "correct": not first}]


def verifier_backend(records: list[dict], mistake_rate: float = 0.0, draw: int = 0):
    """A judge function (messages -> text) that decides by the task verifier, wrong on a ``mistake_rate`` share
    of the pairs (see ``mistaken``)."""
    by_question = {r["question"].strip(): r for r in records}

    def judge(messages: list[dict]) -> str:
        parsed = read_messages(messages)
        if parsed is None:
            return "I can only compare two responses given in the judge prompt format. Verdict: none"
        question, a, b = parsed
        rec = by_question.get(question.strip())
        if rec is None:  # refused, not a tie: a tie would be cached and served for good once the records are right
            raise UnknownQuestion(f"the verifier judge has no record of the question {question[:60]!r}")
        # an own-choice response names its trajectory on the first line; plain text counts as cot
        fmts = [OWN_CHOICE if split_choice(x)[0] else "cot" for x in (a, b)]
        verdicts = score_responses([rec, rec], fmts, [a, b])
        if mistaken(question, a, b, mistake_rate, draw):
            verdicts = mistake(verdicts, a, b)
        return _verdict_text(question, verdicts)

    return judge


def hf_backend(model_dir: str, max_new_tokens: int = 128):
    """A judge function that asks a local Hugging Face causal LM (chat template if it has one)."""
    from posttrain.generation import HFGenerator
    from posttrain.modeling import load_pretrained

    tokenizer, model = load_pretrained(model_dir)
    gen = HFGenerator(model, tokenizer, batch_size=1, max_new_tokens=max_new_tokens)
    lock = threading.Lock()

    def judge(messages: list[dict]) -> str:
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = "\n".join(m["content"] for m in messages) + "\n"
        with lock:
            return gen.generate([text], temperature=0.0, progress=False)[0].text

    return judge


FAULTS = get_args(JudgeFault)


class InjectedConnectionReset(ConnectionResetError):
    """Raised mid-response by the ``connection_reset`` fault: uvicorn then drops the connection."""


class _QuietExpectedErrors(logging.Filter):
    """uvicorn logs a full traceback for every response it drops: the ``connection_reset`` fault's (on purpose), and
    at shutdown each request still running past the grace period (a slow HF judge), after one line saying how many
    it cancels. Neither traceback says more than that."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1],
                                                   (InjectedConnectionReset, asyncio.CancelledError)))


logging.getLogger("uvicorn.error").addFilter(_QuietExpectedErrors())


def _reset_midway(head: bytes):
    """A response body that sends its first bytes and then loses the connection, as a reset peer would."""
    yield head
    raise InjectedConnectionReset("injected connection reset")


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    """An error as OpenAI's API words it, so any client reads the reason."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=status)


def _text_messages(messages) -> list[dict] | None:
    """The messages with each content as one string (OpenAI also takes a list of text parts); None if malformed."""
    if not isinstance(messages, list) or not messages:
        return None
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            return None
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
                return None
            content = "\n".join(p["text"] for p in content)
        if not isinstance(content, str):
            return None
        out.append({**m, "content": content})
    return out


def build_app(judge, model_name: str, latency_s: float = 0.0, faults: dict[str, float] | None = None,
              seed: int = 0, hang_s: float = 30.0) -> FastAPI:
    """The OpenAI-compatible app. ``faults`` maps a fault (see FAULTS) to the probability of injecting it on a
    request: 5xx, 429 with Retry-After, a hang of ``hang_s`` (the client times out), a non-JSON or cut-off body,
    an answer with no verdict line, a connection dropped after the headers and a few bytes of the body."""
    faults = faults or {}
    unknown = set(faults) - set(FAULTS)
    if unknown:
        raise ValueError(f"unknown judge faults {sorted(unknown)}; expected some of {FAULTS}")
    app = FastAPI(title="posttrain judge")

    @app.exception_handler(RequestValidationError)
    async def not_a_json_object(request, exc):  # FastAPI's own answer is a 422 in a shape no OpenAI client reads
        return _error(400, "expected a JSON object body with 'model' and 'messages'")

    @app.exception_handler(StarletteHTTPException)
    async def in_openais_shape(request, exc):  # a body that is not UTF-8 or nests too deep: FastAPI's {"detail": ...}
        return _error(exc.status_code, str(exc.detail))

    # set by JudgeService.stop: a request held by latency or the timeout fault then answers 503 at once, rather
    # than keeping the server from stopping until it is cancelled mid-flight
    app.state.stopping = stopping = threading.Event()
    rng = random.Random(seed)
    lock = threading.Lock()

    def draw_fault() -> str | None:
        with lock:
            x, acc = rng.random(), 0.0
        for name, rate in faults.items():
            acc += rate
            if x < acc:
                return name
        return None

    @app.get("/health")
    def health() -> dict:
        return {"ok": True}

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model"}]}

    @app.post("/v1/chat/completions")
    def chat(body: dict = Body(...)):  # a sync endpoint: FastAPI runs it in a thread pool, requests overlap
        # checked first: a malformed message would raise inside the backend (a bare 500 and a traceback)
        if body.get("model") not in (None, model_name):
            return _error(404, f"The model {body['model']!r} does not exist (this server has {model_name!r}).",
                          "model_not_found")
        if body.get("stream"):
            return _error(400, "stream is not supported by this server")
        if body.get("n") not in (None, 1):  # one choice would be sent: a client reading the n-th one would fail
            return _error(400, "n other than 1 is not supported by this server")
        messages = _text_messages(body.get("messages"))
        if messages is None:
            return _error(400, "'messages' must be a non-empty list of {'role': str, 'content': str or text parts}")
        if latency_s:
            stopping.wait(latency_s)
        fault = draw_fault()
        if fault == "timeout":
            stopping.wait(hang_s)
        if stopping.is_set():
            return _error(503, "the judge service is stopping")
        if fault == "http_500":
            return _error(500, "injected server error")
        if fault == "http_429":
            response = _error(429, "slow down", "rate_limit_exceeded")
            response.headers["Retry-After"] = "0.2"
            return response
        try:
            text = "I compared them carefully and both have merit." if fault == "no_verdict" else judge(messages)
        except UnknownQuestion as e:
            return _error(400, str(e))
        prompt_tokens = sum(len(m["content"].split()) for m in messages)
        payload = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "model": model_name,
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(text.split()),
                             "total_tokens": prompt_tokens + len(text.split())}}
        if fault == "malformed_json":
            return PlainTextResponse("<html>502 Bad Gateway</html>", media_type="application/json")
        if fault == "truncated_json":
            return PlainTextResponse(json.dumps(payload)[:40], media_type="application/json")
        if fault == "connection_reset":
            return StreamingResponse(_reset_midway(json.dumps(payload)[:40].encode()), media_type="application/json")
        return payload

    return app


def listening_socket(port: int = 0) -> socket.socket:
    """A socket listening on 127.0.0.1 (a free port for 0). Held from here on: a port only looked up, then
    bound by uvicorn later, can be taken in between by another process (other runs and workers share the host)."""
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a fixed port after a restart
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise RuntimeError(f"the local judge service cannot listen on 127.0.0.1:{port}: {e}") from None
    return sock


class JudgeService:
    """The judge app under uvicorn in a background thread on 127.0.0.1 (a free port unless given)."""

    def __init__(self, app: FastAPI, port: int | None = None):
        self.sock = listening_socket(port or 0)
        self.app, self.port = app, self.sock.getsockname()[1]
        # a request still hanging (the timeout fault, a slow HF judge) must not hold shutdown past a few seconds
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 30) -> "JudgeService":
        self.thread.start()
        deadline = time.time() + timeout
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                self.stop()
                raise RuntimeError(f"the local judge service did not start on port {self.port}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.app.state.stopping.set()
        self.server.should_exit = True
        if self.thread.ident is not None:
            self.thread.join(timeout=10)
            if self.thread.is_alive():
                self.server.force_exit = True
                self.thread.join(timeout=5)
        self.sock.close()

    def __enter__(self) -> "JudgeService":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextmanager
def judge_endpoint(cfg, records: list[dict], seed: int = 0):
    """The judge's base URL: ``cfg.base_url`` if set, else a local service started for the duration."""
    if cfg.base_url:
        yield cfg.base_url
        return
    judge = verifier_backend(records, cfg.mistake_rate) if cfg.backend == "verifier" else hf_backend(cfg.hf_model)
    with JudgeService(build_app(judge, cfg.model, cfg.latency_s, cfg.faults, seed)) as svc:
        print(f"judge: local {cfg.backend} service on {svc.base_url}")
        yield svc.base_url
