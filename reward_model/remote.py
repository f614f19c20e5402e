"""The reward model behind an OpenAI-compatible server: ``GenerativeRewardModel(backend="openai")``.

The PPO process renders each (prompt, response) pair exactly as the local backends do (the same token ids, from the
reward model's own tokenizer and saved prompt format) and sends the ids to the server's completions endpoint;
the server (``text2grad serve-critic``, i.e. vLLM's OpenAI-compatible server) writes the critique. One server can
serve the critic to several PPO jobs, on its own GPUs.

- **Same request as in-process**: the prompt is the list of token ids (no re-tokenization on the server), greedy
  unless sampling is asked for, the same ``max_tokens``; the answer is cut at the end of the span JSON afterwards,
  as the in-process vLLM backend cuts it. With vLLM's ``return_token_ids`` the generated ids come back and are
  decoded here with the reward model's tokenizer, so the text is what the in-process backends would decode.
- **Concurrency**: up to ``concurrency`` requests in flight (threads on a shared HTTP connection pool); vLLM batches
  them on the server.
- **Failures never cost a batch**: connection errors, timeouts, 408/409/429 and 5xx are retried with equal-jitter
  exponential backoff (honouring ``Retry-After``, `annotation.llm.backoff_delay`) up to ``max_retries`` times; a
  request that still fails, or fails with another status, comes back as its error text and becomes
  ``Feedback.failed`` for that one pair, which PPO counts against ``max_feedback_error_rate``.
- **Checked at start-up**: `RemoteCompletions.check` asks the server's ``/models`` once, so a dead server, a wrong
  URL, a refused key or a model name the server does not serve is a clear error before any training starts.
- **The API key** comes from ``api_key`` or the environment variable named by ``api_key_env`` (prefer the latter in
  config files: run directories keep their config) and never appears in an error message.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import openai

from annotation.llm import PLACEHOLDER_KEY, backoff_delay, mask_secrets, retry_after_seconds

__all__ = ["RemoteCompletions", "RemoteError", "RemoteOutput", "DEFAULT_API_KEY_ENV"]

logger = logging.getLogger(__name__)

DEFAULT_API_KEY_ENV = "TEXT2GRAD_CRITIC_API_KEY"
_RETRYABLE_STATUS = frozenset({408, 409, 429})


class RemoteError(RuntimeError):
    """The critic server cannot be used as configured (unreachable, wrong model name, refused key)."""


@dataclass
class RemoteOutput:
    """One request's outcome: the generated text (and ids where the server returned them), or why it failed."""

    text: str = ""
    finished: bool = False
    token_ids: list[int] | None = None
    error: str | None = None
    attempts: int = 1


class RemoteCompletions:
    """The completions endpoint of an OpenAI-compatible server, for token-id prompts.

    Args:
        base_url: the server's OpenAI base URL, e.g. ``http://127.0.0.1:8000/v1``.
        model: the model name the server serves (``--served-model-name``; ``GET /v1/models`` lists them).
        api_key / api_key_env: the key, or the environment variable holding it; neither: a placeholder (a local
            server started without ``--api-key`` accepts anything).
        concurrency: requests in flight at once.
        timeout_s: one request's time limit (a timed-out request is retried like a dropped connection).
        max_retries: retries of one request on connection errors, timeouts, 408/409/429 and 5xx.
        backoff_base_s / backoff_max_s: retry ``k`` waits ``c/2 + U(0, c/2)``, ``c = min(max, base * 2**k)``, or the
            server's ``Retry-After`` (capped at ``backoff_max_s``).
        grounded_logits: send the grounded span constraint with each request (the server must have been started
            with the project's logits processor: ``text2grad serve-critic`` does so).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        api_key_env: str = DEFAULT_API_KEY_ENV,
        concurrency: int = 32,
        timeout_s: float = 300.0,
        max_retries: int = 4,
        backoff_base_s: float = 1.0,
        backoff_max_s: float = 30.0,
        seed: int | None = 0,
    ) -> None:
        if not base_url:
            raise ValueError("backend 'openai' needs base_url, the server's OpenAI URL (e.g. http://127.0.0.1:8000/v1; "
                             "`text2grad serve-critic` prints it)")
        if not model:
            raise ValueError("backend 'openai' needs model, the name the server serves the reward model under "
                             "(`text2grad serve-critic` prints it; GET <base_url>/models lists them)")
        if concurrency <= 0 or timeout_s <= 0 or max_retries < 0:
            raise ValueError(f"concurrency and timeout_s must be positive and max_retries >= 0, got {concurrency}, "
                             f"{timeout_s}, {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._key = api_key or os.environ.get(api_key_env) or PLACEHOLDER_KEY
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self.client = openai.OpenAI(base_url=self.base_url, api_key=self._key, timeout=timeout_s, max_retries=0)
        self.failed_requests = 0
        self.retries = 0

    def _mask(self, text: str) -> str:
        return mask_secrets(text, [self._key])

    def check(self) -> list[str]:
        """The models the server serves; raises `RemoteError` (what is wrong and how to fix it) when the server
        cannot be reached, refuses the key, or does not serve ``model``."""
        try:
            served = [m.id for m in self.client.models.list()]
        except openai.AuthenticationError:
            raise RemoteError(f"the critic server at {self.base_url} refused the API key (HTTP 401): set the key it was "
                              "started with (critic kwarg api_key_env names the environment variable)") from None
        except (openai.APIConnectionError, openai.APITimeoutError) as exc:
            raise RemoteError(self._mask(
                f"cannot reach the critic server at {self.base_url} ({type(exc).__name__}: {exc}); is it running "
                "(text2grad serve-critic prints its URL) and is base_url right?")) from None
        except openai.APIStatusError as exc:
            raise RemoteError(self._mask(f"the critic server at {self.base_url} answered GET /models with HTTP "
                                         f"{exc.status_code}: {exc.message}; is base_url the server's /v1 URL?")) from None
        if self.model not in served:
            raise RemoteError(f"the critic server at {self.base_url} does not serve a model named {self.model!r}; it "
                              f"serves {served}. Set the critic kwarg model to one of those.")
        return served

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int, *, do_sample: bool = False,
        temperature: float = 1.0, top_p: float = 1.0, extra_bodies: Sequence[dict[str, Any] | None] | None = None,
    ) -> list[RemoteOutput]:
        """One `RemoteOutput` per prompt (token ids), in order; never raises for a failed request."""
        body = {"temperature": temperature if do_sample else 0.0, "top_p": top_p if do_sample else 1.0}
        extras = list(extra_bodies) if extra_bodies is not None else [None] * len(prompt_ids)

        def one(k: int) -> RemoteOutput:
            return self._request([int(t) for t in prompt_ids[k]], max_new_tokens, body, extras[k])

        if len(prompt_ids) <= 1:
            return [one(k) for k in range(len(prompt_ids))]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(prompt_ids)), thread_name_prefix="critic-http") as pool:
            return list(pool.map(one, range(len(prompt_ids))))

    def _request(self, ids: list[int], max_new_tokens: int, body: dict[str, Any], extra: dict[str, Any] | None) -> RemoteOutput:
        attempt = 0
        while True:
            try:
                response = self.client.completions.create(
                    model=self.model, prompt=ids, max_tokens=max_new_tokens, temperature=body["temperature"],
                    top_p=body["top_p"], extra_body={"return_token_ids": True, "skip_special_tokens": True, **(extra or {})},
                )
            except openai.APIStatusError as exc:
                status = exc.status_code
                message = self._mask(f"HTTP {status} from the critic server at {self.base_url}: {exc.message}")
                retryable = status in _RETRYABLE_STATUS or status >= 500
                wait = retry_after_seconds(exc.response.headers)
            except (openai.APIConnectionError, openai.APITimeoutError) as exc:
                message = self._mask(f"{type(exc).__name__} from the critic server at {self.base_url}: {exc}")
                retryable, wait = True, None
            else:
                return _read_choice(response, attempt + 1)
            if not retryable or attempt >= self.max_retries:
                self.failed_requests += 1
                tries = f" (gave up after {attempt + 1} attempts)" if retryable else ""
                return RemoteOutput(error=message + tries, attempts=attempt + 1)
            with self._rng_lock:
                delay = (min(wait, self.backoff_max_s) if wait is not None
                         else backoff_delay(attempt, self.backoff_base_s, self.backoff_max_s, self._rng))
                self.retries += 1
            logger.warning("critic request failed (%s); retry %d/%d in %.1fs", message, attempt + 1, self.max_retries, delay)
            attempt += 1
            time.sleep(delay)

    def close(self) -> None:
        self.client.close()


def _read_choice(response: Any, attempts: int) -> RemoteOutput:
    """The first choice of a completions response: its text, whether it ended by itself ("stop": EOS or a stop
    string; "length" hit max_tokens), and the generated ids where the server sent them (vLLM's ``token_ids``)."""
    if not getattr(response, "choices", None):
        return RemoteOutput(error=f"the critic server answered without choices: {json.dumps(_as_dict(response))[:300]}",
                            attempts=attempts)
    choice = response.choices[0]
    ids = getattr(choice, "token_ids", None)
    if ids is None and getattr(choice, "model_extra", None):
        ids = choice.model_extra.get("token_ids")
    return RemoteOutput(
        text=choice.text or "", finished=choice.finish_reason == "stop",
        token_ids=[int(t) for t in ids] if ids is not None else None, attempts=attempts,
    )


def _as_dict(response: Any) -> Any:
    try:
        return response.model_dump()
    except AttributeError:
        return str(response)
