"""A pairwise LLM judge over the OpenAI chat-completions protocol: concurrency and rate limits, timeouts,
retries with backoff (tenacity; a 429's or 5xx's Retry-After holds back every thread), a SQLite cache so a
re-run never pays twice, and a cost ledger. After the retries a pair has no verdict (``None``): the caller
falls back to the RM and counts a judge failure. An endpoint that refuses every request (401, 403, 404, no
quota) raises ``JudgeConfigError`` instead. The API key is read from the environment variable named in params
and only ever goes into the Authorization header.

Example:
    >>> client = JudgeClient(params.judge, base_url="http://127.0.0.1:8000/v1")          # doctest: +SKIP
    >>> client.judge([("Compute 2 + 3.", "Answer: 5", "Answer: 6")])                     # doctest: +SKIP
    ['A']
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from email.utils import parsedate_to_datetime
from concurrent.futures import ThreadPoolExecutor
from datetime import timezone
from pathlib import Path

import httpx
from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from posttrain.errors import UserError
from posttrain.judge_cache import JudgeCache
from posttrain.judge_cost import CostLedger
from posttrain.judge_prompt import combine_orders, judge_messages, parse_verdict


logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request drowns the stage's output
log = logging.getLogger(__name__)


class JudgeCallError(Exception):
    """One attempt failed in a way worth retrying (timeout, 5xx, 429, malformed body, no verdict)."""

    def __init__(self, kind: str, retry_after: float | None = None):
        super().__init__(kind)
        self.kind, self.retry_after = kind, retry_after


class JudgeConfigError(UserError):
    """The endpoint refuses every request (a bad or missing key, an unknown model, a wrong URL, no quota left).
    Falling back pair by pair would quietly turn the whole run into rm_only, so the caller stops with the reason."""


def _retryable(err: BaseException) -> bool:
    return isinstance(err, JudgeCallError) and not err.kind.endswith("_fatal")


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header in seconds: delay-seconds or an HTTP-date (RFC 9110); None if absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # the asctime form carries no zone; HTTP dates are GMT, not the local time
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, when.timestamp() - time.time())


def token_count(usage: dict, key: str) -> int:
    """A usage field as an int; proxies send null or omit it, and a missing count must not cost the verdict."""
    try:
        return int(usage.get(key) or 0)
    except (TypeError, ValueError):
        return 0


def answer_text(choice) -> str | None:
    """The text of a completion's choice; None if it has no message. ``content`` may be null (a refusal, or a
    reasoning model whose answer is all reasoning) or a list of text parts."""
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        return None
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    content = content if isinstance(content, str) else ""
    if not content.strip() and choice.get("finish_reason") == "stop":
        # vLLM's reasoning parsers file a whole answer that never closed its <think> under reasoning_content (newer
        # servers and routers say reasoning): finished, not cut off, so its last verdict is the answer
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        content = reasoning if isinstance(reasoning, str) else content
    return content


def server_message(raw: bytes, secret: str | None) -> str:
    """The error a server gave, short, with the key cut out (a proxy may echo the header it refused)."""
    text = raw.decode("utf-8", "replace")
    try:
        data = json.loads(text)
        err = data.get("error", data) if isinstance(data, dict) else data
        text = str(err.get("message") or err.get("detail") or err) if isinstance(err, dict) else str(err)
    except ValueError:
        pass
    if secret:
        text = text.replace(secret, "***")
    return " ".join(text.split())[:300]


def refused_parameter(raw: bytes) -> str | None:
    """The parameter an HTTP 400 refuses when every request carries it (OpenAI's reasoning models refuse max_tokens
    and any temperature but 1), so that no request would ever pass; None for a fault of one prompt (too long)."""
    try:
        param = json.loads(raw).get("error").get("param")
    except (ValueError, AttributeError):
        return None
    return param if param in ("model", "temperature", "max_tokens") else None


def address(url: httpx.URL) -> str:
    """A URL without the credentials it may hold."""
    return f"{url.scheme}://{url.host}" + (f":{url.port}" if url.port else "") + url.path.rstrip("/")


def judge_identity(cfg) -> list:
    """Who answers, for the cache key: the model name and temperature; a remote judge also by its endpoint (one
    model name served by two servers, say a quantised copy, is two judges), credentials left out; the local
    service by its backend (the default model name is the same whichever backend serves it, and a verifier's
    verdicts must not be served as an HF model's) and a fallible verifier by its mistake rate, an HF judge also by
    its files' sizes and times, so one retrained in place is asked anew. The local service's URL is left out: its
    port is new on every run."""
    if cfg.base_url is not None:
        url = httpx.URL(cfg.base_url)
        return [cfg.model, cfg.temperature, [url.scheme, url.host, url.port, url.path.rstrip("/")]]
    local = [cfg.backend, cfg.hf_model if cfg.backend == "hf" else None]
    if cfg.backend == "verifier" and cfg.mistake_rate > 0:  # a fallible verifier is another judge; 0 keeps old keys
        local.append(["mistake_rate", cfg.mistake_rate])
    if cfg.backend == "hf" and Path(cfg.hf_model).is_dir():
        local.append(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns)
                            for f in Path(cfg.hf_model).iterdir() if f.is_file()))
    return [cfg.model, cfg.temperature, *local]


cut_lock = threading.Lock()


def cut(sock, done: threading.Event) -> None:
    """Shut a response's socket at its deadline, unless the response is done with it."""
    with cut_lock:
        if isinstance(sock, socket.socket) and not done.is_set():
            try:  # socket's own shutdown: an SSLSocket's would unwrap it, and a read after that raises ValueError
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:  # closed meanwhile
                pass


class RateLimiter:
    """At most ``per_minute`` request starts per minute, evenly spaced, across threads."""

    def __init__(self, per_minute: float):
        self.interval, self.next, self.lock = 60.0 / per_minute, 0.0, threading.Lock()
        self.held_until = 0.0

    def wait(self) -> None:
        while True:
            with self.lock:
                now = time.monotonic()
                start = max(now, self.next)
                self.next = start + self.interval
            time.sleep(max(0.0, start - now))
            # a hold placed while this thread slept toward a turn booked before it: book again after the hold
            with self.lock:
                if time.monotonic() >= self.held_until:
                    return

    def hold(self, seconds: float) -> None:
        """No request starts for ``seconds``: a Retry-After speaks for the account, not for one request."""
        with self.lock:
            self.held_until = max(self.held_until, time.monotonic() + seconds)
            self.next = max(self.next, self.held_until)


class JudgeClient:
    """Judge (question, A, B) triples; ``cfg`` is a ``JudgeParams``."""

    def __init__(self, cfg, base_url: str, cache: JudgeCache | None = None, ledger: CostLedger | None = None):
        self.cfg = cfg
        headers = {"Content-Type": "application/json"}
        # a key pasted from a file keeps its newline, which no header may carry: every request would fail as a
        # "connection" error, and httpx's message for it quotes the whole header
        self._key = (os.environ.get(cfg.api_key_env) or "").strip() if cfg.api_key_env else ""
        if self._key:
            if not (self._key.isascii() and self._key.isprintable()):
                raise ValueError(f"${cfg.api_key_env} holds characters an HTTP header cannot carry")
            headers["Authorization"] = f"Bearer {self._key}"
        self.http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=cfg.timeout_s)
        self.cache = cache
        self.ledger = ledger or CostLedger(cfg.price_in_per_1k, cfg.price_out_per_1k)
        self.limiter = RateLimiter(cfg.requests_per_minute)
        # for the client, not per judge() call: two threads judging at once must not double the requests in flight
        self.slots = threading.BoundedSemaphore(cfg.concurrency)
        self.identity = judge_identity(cfg)
        self.fatal: JudgeConfigError | None = None
        # until the endpoint has answered once, a refused connection is a wrong address or a server that is not up,
        # not a passing fault: after the retries it stops the stage instead of failing every pair in turn
        self.reached = False

    def _post(self, body: dict) -> tuple[httpx.Response, bytes]:
        """One POST and its whole body, within ``timeout_s`` in all (httpx's timeout is per read, and a server that
        keeps the connection alive with a byte of whitespace now and then, as some routers do, would never end)."""
        deadline = time.monotonic() + self.cfg.timeout_s
        chunks, done = [], threading.Event()
        try:
            with self.http.stream("POST", "/chat/completions", json=body) as resp:
                self.reached = True  # the server answered (any status, any body to come): it exists
                # a read still blocked at the deadline (a byte just before it, then silence) is cut there, not a
                # whole read timeout later: the socket is shut, which wakes the read (not once the connection is
                # back in the pool, for another request)
                stream = resp.extensions.get("network_stream")
                sock = stream.get_extra_info("socket") if stream is not None else None
                watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), cut, (sock, done))
                watchdog.start()
                try:
                    for chunk in resp.iter_bytes():
                        chunks.append(chunk)
                        if time.monotonic() > deadline:
                            raise JudgeCallError("timeout")
                finally:
                    with cut_lock:
                        done.set()
                    watchdog.cancel()
        except httpx.TimeoutException:
            raise JudgeCallError("timeout") from None
        except httpx.ConnectError:
            raise JudgeCallError("connection" if self.reached else "unreachable") from None
        except httpx.TransportError:
            raise JudgeCallError("timeout" if time.monotonic() >= deadline else "connection") from None
        except httpx.HTTPError:  # a body that does not decode, a redirect loop: the server's fault, maybe passing
            raise JudgeCallError("bad_response") from None
        return resp, b"".join(chunks)

    def _once(self, messages: list[dict]) -> tuple[str, str]:
        """One HTTP call -> (verdict, raw answer); raises JudgeCallError on anything retryable."""
        body = {"model": self.cfg.model, "messages": messages, "temperature": self.cfg.temperature}
        if self.cfg.max_tokens is not None:
            body["max_tokens"] = self.cfg.max_tokens
        with self.slots:
            self.limiter.wait()
            resp, raw = self._post(body)
        status = resp.status_code
        reason = server_message(raw, self._key) if status >= 400 else ""
        if 300 <= status < 400:  # not followed: every request would be redirected (http:// for https, a wrong path)
            reason = f"a redirect to {address(resp.url.join(resp.headers.get('Location', '')))}"
        if (status in (401, 403, 404) or 300 <= status < 400 or (status == 400 and refused_parameter(raw))
                or (status == 429 and "insufficient_quota" in raw.decode("utf-8", "replace"))):
            key_env = f" and ${self.cfg.api_key_env}" if self.cfg.api_key_env else ""
            raise JudgeConfigError(f"the judge endpoint answered HTTP {status} for model {self.cfg.model!r}: {reason} "
                                   f"(check judge.base_url, judge.model{key_env})")
        if status == 429 or status in (408, 409) or status >= 500:
            kind = "rate_limited" if status == 429 else f"http_{status}"
            retry_after = retry_after_seconds(resp.headers.get("Retry-After"))
            if retry_after is not None and retry_after > self.cfg.max_retry_after_s:
                # retried sooner than the server asked, it would refuse again and spend every retry
                raise JudgeCallError(f"{kind}_fatal")
            if retry_after:
                self.limiter.hold(retry_after)  # the other threads' requests would be refused too
            raise JudgeCallError(kind, retry_after)
        if status >= 400:  # a client error will not fix itself: no retry
            log.warning("judge request refused, HTTP %d: %s", status, reason)
            raise JudgeCallError(f"http_{status}_fatal")
        try:
            data = json.loads(raw)
        except ValueError:
            raise JudgeCallError("malformed_body") from None
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) and isinstance(data, dict) and "error" in data:
            # an HTTP 200 that is an error (OpenRouter's, for a provider failing mid-answer): retried, and said why
            log.warning("judge answered HTTP 200 with an error: %s", server_message(raw, self._key))
            raise JudgeCallError("error_body")
        if not isinstance(choices, list):
            raise JudgeCallError("malformed_body")
        # a completion is paid for whatever it holds, a null or verdict-less answer too
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        self.ledger.add(token_count(usage, "prompt_tokens"), token_count(usage, "completion_tokens"))
        text = answer_text(choices[0]) if choices else None
        if text is None:
            raise JudgeCallError("malformed_body")
        verdict = parse_verdict(text)
        if verdict is None:
            raise JudgeCallError("no_verdict")
        return verdict, text

    def _wait(self, state) -> float:
        err = state.outcome.exception()
        if isinstance(err, JudgeCallError) and err.retry_after is not None:
            return err.retry_after  # the server said when; _once failed at once if that is past max_retry_after_s
        return wait_exponential_jitter(multiplier=self.cfg.backoff_s, jitter=self.cfg.backoff_s,
                                       max=self.cfg.max_backoff_s)(state)

    def ask(self, messages: list[dict]) -> str | None:
        """The verdict for one prompt (cached), or None after the retries (the failure is in the ledger)."""
        key = JudgeCache.key(self.identity, messages)
        if self.fatal is not None:  # the rest of a batch need not each be refused
            raise self.fatal
        if self.cache is not None and (hit := self.cache.get(key)) is not None:
            with self.ledger.lock:
                self.ledger.cache_hits += 1
            return hit
        retrying = Retrying(stop=stop_after_attempt(self.cfg.max_retries + 1), wait=self._wait,
                            retry=retry_if_exception(_retryable), reraise=False)
        try:
            verdict, raw = retrying(self._once, messages)
        except RetryError as e:
            kind = e.last_attempt.exception().kind
            self.ledger.fail(kind)
            if kind == "unreachable" and not self.reached:
                url = self.http.base_url.copy_with(path="/")  # scheme, host and port: not credentials
                self.fatal = JudgeConfigError(
                    f"the judge endpoint {address(url)} could not be connected to in "
                    f"{self.cfg.max_retries + 1} attempts (check judge.base_url, and that the server is up)")
                raise self.fatal from None
            return None
        except JudgeCallError as e:  # a fatal kind: not retried
            self.ledger.fail(e.kind)
            return None
        except JudgeConfigError as e:
            self.fatal = e
            raise
        if self.cache is not None:
            self.cache.put(key, verdict, raw)
        return verdict

    def judge(self, triples: list[tuple[str, str, str]]) -> list[str | None]:
        """A verdict about (A, B) per triple ('A', 'B', 'tie' or None), ``concurrency`` requests at a time."""
        jobs = [judge_messages(q, a, b, self.cfg.criteria) for q, a, b in triples]
        if self.cfg.both_orders:
            jobs += [judge_messages(q, b, a, self.cfg.criteria) for q, a, b in triples]
        # One prompt is asked once per batch: a group often holds one response twice, so (i, j) and (k, j) can be
        # the same comparison. Asked concurrently, both copies would miss the cache and both be paid, and how many
        # raced would change the bill from run to run. A copy counts as a cache hit when its prompt got an answer
        # (a failed request is one failure in the ledger; its copies were served nothing).
        keys = [JudgeCache.key(self.identity, m) for m in jobs]
        first: dict[str, int] = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        with ThreadPoolExecutor(self.cfg.concurrency) as pool:
            asked = dict(zip(first, pool.map(self.ask, [jobs[i] for i in first.values()])))
        answers = [asked[key] for key in keys]
        served_copies = sum(a is not None for a in answers) - sum(a is not None for a in asked.values())
        with self.ledger.lock:
            self.ledger.cache_hits += served_copies
        if not self.cfg.both_orders:
            return answers
        n = len(triples)
        return [combine_orders(answers[i], answers[n + i]) for i in range(n)]

    def close(self) -> None:
        self.http.close()
