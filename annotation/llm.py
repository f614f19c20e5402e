"""Talking to an OpenAI-compatible chat API robustly, and the `LLMCritic` built on it.

The ``openai`` client's own retries are switched off (``max_retries=0``) and `ChatClient` retries instead,
so the behaviour is ours and tested: requests that fail with 408, 409, 429 or 5xx, time out, or lose their
connection are retried up to ``max_api_retries`` times. The wait before retry ``k`` (0-based) is the
server's ``Retry-After``/``retry-after-ms`` when it sends one (capped at ``retry_after_max_s``, plus up to
10 % jitter so clients that were told the same time do not return in lockstep), otherwise "equal jitter"
exponential backoff: ``c/2 + U(0, c/2)`` with ``c = min(backoff_max_s, backoff_base_s * 2**k)``.
401/403/404 are configuration errors (bad key, no access, wrong model or URL) and stop a run at once
(`FatalAPIError`); other 4xx fail only the record at hand (`AnnotationAPIError`).

The API key is read from an environment variable, never from a flag or config file, and every error text
that leaves this module passes through `mask_secrets`, so the key appears in no log, output or exception.

The model's answer text is masked the moment it arrives (`ChatClient.complete`): a proxy or server that
echoes the request (key included) in a 200 reply must not get the key into records, failures or reports.

A `UsageMeter` counts requests, retries and tokens for the report and enforces ``max_requests`` and
``max_cost_usd``: when a budget would be exceeded, no new request starts (`BudgetExhausted`) and requests
already in flight finish normally. A server that sends no ``usage`` gets its tokens estimated from the text
length (`estimate_tokens`, ~4 characters per token); the meter counts those requests so the report can say
its token and cost figures are partly estimates.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import json
import logging
import os
import random
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Coroutine, Sequence, TypeVar

import openai

from annotation.annotation_config import AnnotationConfig
from annotation.templates import PromptTemplate, builtin_template, load_template, repair_message
from text2grad.core.feedback import Feedback, parse_feedback

__all__ = [
    "AnnotationAPIError",
    "FatalAPIError",
    "BudgetExhausted",
    "UsageMeter",
    "ChatClient",
    "Completion",
    "LLMCritic",
    "critique_with_llm",
    "make_openai_client",
    "mask_secrets",
    "estimate_tokens",
    "feedback_schema",
    "backoff_delay",
    "retry_after_seconds",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")

RETRYABLE_STATUS = frozenset({408, 409, 429})
FATAL_STATUS = frozenset({401, 403, 404})
PLACEHOLDER_KEY = "no-key-set"  # sent to local servers that need no key; never a secret
_KEY_PATTERN = re.compile(r"\b(sk-[A-Za-z0-9_\-]{4})[A-Za-z0-9_\-*]{4,}")


class AnnotationAPIError(RuntimeError):
    """A request failed for good (non-retryable status, or retries exhausted); the record fails."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class FatalAPIError(AnnotationAPIError):
    """The API rejects us as configured (401/403/404): continuing would fail every record."""


class BudgetExhausted(RuntimeError):
    """``max_requests`` or ``max_cost_usd`` is reached: start no new request."""


def mask_secrets(text: str, secrets: Sequence[str | None] = ()) -> str:
    """Remove the given secrets, and anything shaped like an OpenAI key, from ``text``."""
    for secret in secrets:
        if secret and secret != PLACEHOLDER_KEY and len(secret) >= 4:
            text = text.replace(secret, "***")
    return _KEY_PATTERN.sub(r"\1***", text)


CHARS_PER_TOKEN = 4  # a rough average for English text with GPT-style tokenizers; only used as an estimate


def estimate_tokens(text: str) -> int:
    """A rough token count for ``text`` (~4 characters per token), for servers that report no usage.

    An estimate, not a tokenizer: it can be off by a factor of 2 for code or non-English text, so it keeps
    ``max_cost_usd`` working, not exact.
    """
    return -(-len(text) // CHARS_PER_TOKEN) if text else 0


def backoff_delay(attempt: int, base_s: float, max_s: float, rng: random.Random) -> float:
    """Equal-jitter exponential backoff for retry ``attempt`` (0-based): ``c/2 + U(0, c/2)``, ``c = min(max_s, base_s * 2**attempt)``."""
    cap = min(max_s, base_s * (2.0 ** attempt))
    return cap / 2 + rng.uniform(0, cap / 2)


def retry_after_seconds(headers: Any) -> float | None:
    """Seconds the server asked us to wait (``retry-after-ms``, or ``retry-after`` as seconds or an HTTP date)."""
    if headers is None:
        return None
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return max(0.0, float(value) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class UsageMeter:
    """Requests, retries and tokens of one run, and the request/cost budget.

    Thread-safe (an `LLMCritic` may share one meter between loops). ``acquire`` before each request, ``release`` after it.
    """

    def __init__(
        self,
        max_requests: int | None = None,
        max_cost_usd: float | None = None,
        price_per_1k_input: float = 0.0,
        price_per_1k_output: float = 0.0,
    ) -> None:
        self.max_requests = max_requests
        self.max_cost_usd = max_cost_usd
        self.price_per_1k_input = price_per_1k_input
        self.price_per_1k_output = price_per_1k_output
        self.requests = 0
        self.finished = 0
        self.billed = 0  # finished requests that used tokens: the only ones the average cost is taken over
        self.estimated = 0  # requests whose tokens were estimated because the server sent no usage
        self.in_flight = 0
        self.api_retries = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.exhausted: str | None = None
        self._lock = threading.Lock()  # LLMCritic may share one meter between loops in several threads

    @property
    def cost_usd(self) -> float:
        return (self.prompt_tokens * self.price_per_1k_input + self.completion_tokens * self.price_per_1k_output) / 1000

    def acquire(self) -> None:
        """Count a request about to start, or raise `BudgetExhausted` if it would break a budget."""
        with self._lock:
            self._acquire()

    def _acquire(self) -> None:
        if self.exhausted is None and self.max_requests is not None and self.requests >= self.max_requests:
            self.exhausted = f"max_requests={self.max_requests} reached"
        if self.exhausted is None and self.max_cost_usd is not None:
            # Reserve the requests in flight (and this one) at the average cost so far, so concurrency
            # does not overshoot the budget by up to `concurrency` requests. Failed requests cost nothing, so
            # counting them would drag the average down and let too many requests start.
            average = self.cost_usd / self.billed if self.billed else 0.0
            if self.cost_usd + (self.in_flight + 1) * average > self.max_cost_usd or self.cost_usd >= self.max_cost_usd:
                self.exhausted = f"max_cost_usd={self.max_cost_usd} reached (spent ${self.cost_usd:.4f})"
        if self.exhausted is not None:
            raise BudgetExhausted(self.exhausted)
        self.requests += 1
        self.in_flight += 1

    def count_retry(self) -> None:
        with self._lock:
            self.api_retries += 1

    def release(self, prompt_tokens: int = 0, completion_tokens: int = 0, estimated: bool = False) -> None:
        """Count a finished request and the tokens it used (none for a failed one); ``estimated`` marks
        tokens that were estimated from text length rather than reported by the server."""
        with self._lock:
            self._release(prompt_tokens, completion_tokens, estimated)

    def _release(self, prompt_tokens: int, completion_tokens: int, estimated: bool = False) -> None:
        self.in_flight -= 1
        self.finished += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        if prompt_tokens or completion_tokens:
            self.billed += 1
        if estimated:
            self.estimated += 1


@dataclass(frozen=True)
class Completion:
    """One successful chat completion."""

    text: str
    prompt_tokens: int
    completion_tokens: int


def _api_key(cfg: AnnotationConfig) -> str | None:
    names = [cfg.api_key_env]
    if cfg.azure and cfg.api_key_env == "OPENAI_API_KEY":
        names.insert(0, "AZURE_OPENAI_API_KEY")
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def make_openai_client(cfg: AnnotationConfig) -> tuple[openai.AsyncOpenAI, str | None]:
    """The async client for ``cfg`` (OpenAI, any compatible ``base_url``, or Azure) and its key (to mask).

    Raises ValueError with the fix when a key or an Azure setting is missing.
    """
    key = _api_key(cfg)
    if cfg.azure:
        endpoint = cfg.azure_endpoint or os.environ.get("AZURE_OPENAI_ENDPOINT")
        version = cfg.azure_api_version or os.environ.get("OPENAI_API_VERSION")
        if not endpoint:
            raise ValueError("Azure OpenAI needs an endpoint: pass --azure_endpoint or set AZURE_OPENAI_ENDPOINT")
        if not version:
            raise ValueError("Azure OpenAI needs an API version: pass --azure_api_version or set OPENAI_API_VERSION")
        if not key:
            raise ValueError(f"no API key: set AZURE_OPENAI_API_KEY (or {cfg.api_key_env})")
        client = openai.AsyncAzureOpenAI(
            azure_endpoint=endpoint, api_version=version, api_key=key, timeout=cfg.timeout_s, max_retries=0
        )
        return client, key
    base_url = cfg.base_url or os.environ.get("OPENAI_BASE_URL")
    if not key:
        if not base_url:
            raise ValueError(
                f"no API key: set the {cfg.api_key_env} environment variable (or pass --api_key_env NAME to read "
                "another variable), or pass --base_url for a server that needs no key"
            )
        key = PLACEHOLDER_KEY
    client = openai.AsyncOpenAI(api_key=key, base_url=base_url, timeout=cfg.timeout_s, max_retries=0)
    return client, key


def feedback_schema(reasoning: bool) -> dict[str, Any]:
    """The JSON schema of an annotator's answer (``response_format`` json_schema): the critique and the two span
    lists (at most 3 quotes each, as the prompts ask), after a ``reasoning`` field when the prompt asks the model to
    reason first (CoT), since a schema-bound answer has no room for prose before the JSON."""
    spans = {"type": "array", "items": {"type": "string"}, "maxItems": 3}
    properties: dict[str, Any] = {"reasoning": {"type": "string"}} if reasoning else {}
    properties.update({"critique": {"type": "string"}, "good_spans": spans, "poor_spans": spans})
    schema = {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}
    return {"type": "json_schema", "json_schema": {"name": "span_feedback", "schema": schema, "strict": True}}


class ChatClient:
    """Chat completions with our retry/backoff policy, budget and usage accounting (see the module doc).

    With ``cfg.wants_structured_output`` each request carries `feedback_schema` as its ``response_format``; the
    first time the server refuses it (HTTP 400), the request is sent again without it, and if that succeeds the
    client stops sending it (``structured`` becomes False and ``structured_refused`` holds the server's reason):
    the answers are then parsed and repaired as free text.
    """

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        cfg: AnnotationConfig,
        meter: UsageMeter | None = None,
        secret: str | None = None,
    ) -> None:
        self.client = client
        self.cfg = cfg
        self.meter = meter or UsageMeter()
        self.secret = secret
        self.rng = random.Random(cfg.seed)
        self.connection_errors = 0  # connection attempts in a row that found no server (any answer resets it)
        self.structured = cfg.wants_structured_output
        self.structured_refused: str | None = None
        self._schema = feedback_schema(reasoning=cfg.cot and cfg.critic != "human")

    def _mask(self, text: str) -> str:
        return mask_secrets(text, [self.secret])

    async def complete(self, messages: list[dict[str, str]]) -> Completion:
        cfg = self.cfg
        extra: dict[str, Any] = {} if cfg.seed is None else {"seed": cfg.seed}
        attempt = 0
        schema_refused: str | None = None  # the server's reason, while this request tries without the schema
        while True:
            self.meter.acquire()
            structured = self.structured and schema_refused is None
            try:
                response = await self.client.chat.completions.create(
                    model=cfg.model,
                    messages=messages,  # type: ignore[arg-type]
                    temperature=cfg.temperature,
                    max_tokens=cfg.max_tokens,
                    **({"response_format": self._schema} if structured else {}),
                    **extra,
                )
            except openai.APIStatusError as exc:
                self.meter.release()
                self.connection_errors = 0
                status = exc.status_code
                message = self._mask(f"HTTP {status} from {cfg.model}: {exc.message}")
                if status == 400 and structured:  # maybe the schema: ask again without it, at once
                    schema_refused = message
                    continue
                if status in FATAL_STATUS:
                    raise FatalAPIError(message, status) from None
                if not (status in RETRYABLE_STATUS or status >= 500):
                    raise AnnotationAPIError(message, status) from None
                wait = retry_after_seconds(exc.response.headers)
            except (openai.APITimeoutError, openai.APIConnectionError, openai.APIError, json.JSONDecodeError) as exc:
                # Timeouts, dropped connections and unreadable (non-JSON) answers are transient.
                self.meter.release()
                message = self._mask(f"{type(exc).__name__} from {cfg.model}: {exc}")
                status, wait = None, None
                if isinstance(exc, openai.APIConnectionError) and not isinstance(exc, openai.APITimeoutError):
                    self.connection_errors += 1
                    if self.connection_errors >= cfg.max_connection_errors:
                        # An unreachable server would fail every record after all its retries: stop now, say where.
                        raise FatalAPIError(self._mask(
                            f"cannot reach {self.client.base_url}: {self.connection_errors} connection attempts in a "
                            f"row failed ({message}); is the server running and is --base_url right?"
                        )) from None
            else:
                self.connection_errors = 0
                if schema_refused is not None and self.structured:
                    self.structured, self.structured_refused = False, schema_refused
                    logger.warning("the server refused the span JSON schema (%s); answers are parsed as free text "
                                   "from now on", schema_refused)
                text = (response.choices[0].message.content or "") if response.choices else ""
                usage = response.usage
                prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
                completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
                # No usage (or all zeros, which no real completion has) would make every request look free
                # and max_cost_usd never trigger, so estimate from the text instead.
                estimated = prompt_tokens == 0 and completion_tokens == 0
                if estimated:
                    prompt_tokens = sum(estimate_tokens(str(m.get("content") or "")) for m in messages)
                    completion_tokens = estimate_tokens(text)
                self.meter.release(prompt_tokens, completion_tokens, estimated=estimated)
                return Completion(self._mask(text), prompt_tokens, completion_tokens)
            if attempt >= cfg.max_api_retries:
                raise AnnotationAPIError(f"{message} (gave up after {attempt + 1} attempts)", status)
            if wait is not None:
                wait = min(wait, cfg.retry_after_max_s) * (1 + 0.1 * self.rng.random())
            else:
                wait = backoff_delay(attempt, cfg.backoff_base_s, cfg.backoff_max_s, self.rng)
            logger.debug("retry %d in %.2fs after: %s", attempt + 1, wait, message)
            self.meter.count_retry()
            attempt += 1
            await asyncio.sleep(wait)


async def critique_with_llm(
    chat: ChatClient, messages: list[dict[str, str]], max_retries: int
) -> tuple[Feedback, int]:
    """Ask for feedback; re-ask (showing the model its answer and the parse error) up to ``max_retries`` times.

    Returns (feedback, parse retries used). The feedback is `Feedback.failed` if no answer parsed.
    API errors and `BudgetExhausted` propagate.
    """
    conversation = list(messages)
    last_text, last_error = "", ""
    for attempt in range(max_retries + 1):
        completion = await chat.complete(conversation)
        result = parse_feedback(completion.text)
        if result.ok:
            return result.feedback, attempt
        last_text, last_error = completion.text, result.error or "unparseable"
        conversation = list(messages) + [
            {"role": "assistant", "content": completion.text},
            repair_message(last_error),
        ]
    return Feedback.failed(f"unparseable answer after {max_retries + 1} attempts: {last_error}", raw=last_text), max_retries


def select_template(cfg: AnnotationConfig, human: bool = False) -> PromptTemplate:
    """The user's --prompt_template, or the built-in template for the dataset and CoT setting."""
    if cfg.prompt_template:
        return load_template(cfg.prompt_template)
    return builtin_template(cfg.dataset, cot=cfg.cot, human=human)


class _LoopThread:
    """An event loop running in a daemon thread, so sync callers in any thread can run coroutines on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="llm-critic-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("LLMCritic.feedback was called from its own event loop; await afeedback() instead")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()


class LLMCritic:
    """A `FeedbackSource` that asks an OpenAI-compatible model for a critique and spans.

    For the policy phase (and anything else that wants feedback on the fly)::

        critic = LLMCritic(model="gpt-4o", dataset="slf5k")          # key from $OPENAI_API_KEY
        critic = LLMCritic(model="qwen", base_url="http://localhost:8000/v1", cot=False)
        feedbacks = critic.feedback(prompts, responses)               # one Feedback per pair

    Keyword arguments are `AnnotationConfig` fields (model, base_url, dataset, cot, prompt_template,
    concurrency, max_retries, max_api_retries, timeout_s, max_requests, max_cost_usd, ...). ``feedback`` is
    synchronous and safe to call from any thread, including while another event loop runs in the caller's
    thread: requests run concurrently on the critic's own loop thread. It never raises: API errors, exhausted
    budgets and unparseable answers come back as `Feedback.failed` with a (key-free) reason.
    Spans are returned as the model wrote them; align them with `text2grad.core.spans.locate_spans`.
    """

    def __init__(self, config: AnnotationConfig | None = None, **overrides: Any) -> None:
        self.config = dataclasses.replace(config or AnnotationConfig(), **overrides)
        self.template = select_template(self.config)
        self.meter = UsageMeter(
            self.config.max_requests, self.config.max_cost_usd,
            self.config.price_per_1k_input, self.config.price_per_1k_output,
        )
        _, self._secret = make_openai_client(self.config)  # fails now, not at the first batch, if misconfigured
        # One client per event loop: an async HTTP connection pool belongs to the loop that opened it.
        self._chats: dict[int, ChatClient] = {}
        self._runner: _LoopThread | None = None
        self._lock = threading.Lock()

    def _get_chat(self) -> ChatClient:
        key = id(asyncio.get_running_loop())
        with self._lock:
            if key not in self._chats:
                client, _ = make_openai_client(self.config)
                self._chats[key] = ChatClient(client, self.config, self.meter, self._secret)
            return self._chats[key]

    async def _one(self, prompt: str, response: str, semaphore: asyncio.Semaphore) -> Feedback:
        async with semaphore:
            try:
                messages = self.template.messages({"prompt": prompt, "response": response})
                feedback, _ = await critique_with_llm(self._get_chat(), messages, self.config.max_retries)
                return feedback
            except (AnnotationAPIError, BudgetExhausted) as exc:
                return Feedback.failed(mask_secrets(str(exc), [self._secret]))
            except Exception as exc:  # a FeedbackSource reports failures per sample and never raises
                return Feedback.failed(mask_secrets(f"{type(exc).__name__}: {exc}", [self._secret]))

    async def afeedback(self, prompts: Sequence[str], responses: Sequence[str]) -> list[Feedback]:
        """`feedback` for callers already inside an event loop (runs on the caller's loop)."""
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses")
        semaphore = asyncio.Semaphore(self.config.concurrency)
        return list(await asyncio.gather(*(self._one(p, r, semaphore) for p, r in zip(prompts, responses))))

    def feedback(self, prompts: Sequence[str], responses: Sequence[str]) -> list[Feedback]:
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses")
        with self._lock:
            if self._runner is None:
                self._runner = _LoopThread()
            runner = self._runner
        return runner.run(self.afeedback(list(prompts), list(responses)))

    def close(self) -> None:
        """Close the HTTP connections and stop the loop thread."""
        with self._lock:
            runner, self._runner = self._runner, None
            chat = self._chats.pop(id(runner.loop), None) if runner is not None else None
        if runner is not None:
            try:
                if chat is not None:
                    runner.run(chat.client.close())
            finally:
                runner.close()

    def __enter__(self) -> "LLMCritic":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
