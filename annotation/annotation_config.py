"""The one configuration of an annotation run (`AnnotationConfig`), read by ``python -m text2grad.annotate``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from text2grad.core.config import config_field, range_problems
from text2grad.core.critics import CRITICS as REGISTERED_CRITICS

__all__ = ["AnnotationConfig", "DATASETS", "CRITICS", "DEFAULT_FIELD_MAPS", "REQUIRED_FIELDS"]

DATASETS = ("slf5k", "ultrafeedback", "kodcode")
# The critic registry's names (the same in PPO's critic) plus 'human', which only annotation has: the
# record's own human feedback, grounded in exact spans by the LLM.
CRITICS = (*REGISTERED_CRITICS, "human")

# Our field name -> the dataset's own field name. The per-dataset YAML in configs/ repeats these; they are
# the defaults when only --dataset is given.
DEFAULT_FIELD_MAPS: dict[str, dict[str, str]] = {
    "slf5k": {"prompt": "post", "response": "generated_summary_for_feedback", "feedback": "feedback"},
    "ultrafeedback": {"prompt": "prompt", "response": "response"},
    "kodcode": {"prompt": "question", "response": "solution", "tests": "test"},
}

# Fields each critic needs (after field mapping).
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "llm": ("prompt", "response"),
    "human": ("prompt", "response", "feedback"),
    "code_tests": ("prompt", "response", "tests"),
    "reference": ("prompt", "response", "reference"),
}


@dataclass
class AnnotationConfig:
    """Annotate (prompt, response) records with a critique and good/poor spans (Text2Grad phase 1)."""

    # --- data -------------------------------------------------------------------------------------
    dataset_path: str = config_field(
        "",
        "Records to annotate: a .jsonl or .json file, a directory saved with "
        "datasets' save_to_disk, or a Hugging Face hub dataset id.",
    )
    output: str = config_field(
        "",
        "Annotation records are appended here (JSONL, one line per record id). Rerunning the "
        "same command resumes: ids already in this file or in the failures file are skipped.",
    )
    failures: str | None = config_field(
        None,
        "Records that could not be annotated, with the reason (JSONL). Default: "
        "<output>.failures.jsonl.",
    )
    report: str | None = config_field(
        None,
        "Where the run's report (counts, tokens, cost) is written as JSON. Default: "
        "<output>.report.json.",
    )
    dataset: Literal["slf5k", "ultrafeedback", "kodcode"] = config_field(
        "ultrafeedback",
        "Which dataset's prompt template and default field mapping to use "
        "(ultrafeedback is the general question-answering template).",
    )
    dataset_split: str = config_field("train", "Split to read from a hub dataset or a DatasetDict.")
    field_map: dict[str, str] = config_field(
        {},
        "JSON object mapping our field names (prompt, response; feedback for --critic human; "
        "tests for --critic code_tests) to the input's field names, e.g. "
        "'{\"prompt\": \"post\", \"response\": \"summary\"}'. Merged over the dataset's defaults.",
    )
    limit: int | None = config_field(None, "Annotate only the first N input records.")
    retry_failures: bool = config_field(
        False,
        "Also retry records listed in the failures file (they are removed from it first).",
    )

    # --- critic -----------------------------------------------------------------------------------
    critic: str = config_field(
        "llm",
        "The critic that writes the feedback (same names as PPO's --critic): 'llm' (an "
        "OpenAI-compatible model critiques the response), 'human' (the record's human feedback is the "
        "critique; the LLM grounds it in exact spans), 'code_tests' (run the response against the "
        "record's unit tests in the sandbox), 'reference' (agreement with the record's reference "
        "summary), 'reward_model' (a trained reward model; critic_kwargs {\"path\": ...}), or "
        "'package.module:ClassName' for any FeedbackSource class, built with critic_kwargs.",
    )
    critic_kwargs: dict[str, Any] = config_field(
        {},
        "JSON object of keyword arguments for the critic (for registry critics and custom classes).",
    )
    cot: bool = config_field(
        True,
        "Chain-of-thought prompt (reason step by step, then critique, then spans justified by "
        "the critique). false: the no-CoT prompt asks for spans directly.",
    )
    prompt_template: str | None = config_field(
        None,
        "A YAML file with 'system' and 'user' templates ({prompt}, {response}, and {feedback} "
        "for --critic human) to use instead of the built-in one.",
    )

    # --- model and API ----------------------------------------------------------------------------
    model: str = config_field("gpt-4o", "Model name (the deployment name on Azure).")
    base_url: str | None = config_field(
        None,
        "Any OpenAI-compatible server, e.g. http://localhost:8000/v1 for vLLM. Default: "
        "the OpenAI API (or $OPENAI_BASE_URL).",
    )
    api_key_env: str = config_field(
        "OPENAI_API_KEY",
        "Name of the environment variable holding the API key (the key itself is never "
        "taken as a flag, logged or written). With a --base_url and no key set, a placeholder is "
        "sent (local servers usually need none).",
    )
    azure: bool = config_field(
        False,
        "Use Azure OpenAI: endpoint from --azure_endpoint or $AZURE_OPENAI_ENDPOINT, API "
        "version from --azure_api_version or $OPENAI_API_VERSION, key from $AZURE_OPENAI_API_KEY "
        "(or the --api_key_env variable); --model is the deployment name.",
    )
    azure_endpoint: str | None = config_field(None, "Azure OpenAI endpoint URL.")
    azure_api_version: str | None = config_field(None, "Azure OpenAI API version.")
    structured_output: Literal["auto", "json_schema", "off"] = config_field(
        "auto",
        "Ask the server for JSON that follows a schema (response_format json_schema: the critique and the two "
        "span lists, plus a reasoning field with --cot): json_schema always, auto only with --base_url (a local "
        "server such as vLLM; the OpenAI API keeps the paper's free-form prompt), off never. A server that "
        "refuses the schema (HTTP 400) gets the free-form request and today's parsing and repair instead.",
    )
    temperature: float = config_field(0.0, "Sampling temperature of the annotator.")
    max_tokens: int = config_field(1024, "Maximum tokens in one annotator answer.")
    seed: int | None = config_field(
        0,
        "Sent to the API as 'seed' (best-effort determinism) and seeds the backoff jitter.",
    )

    # --- throughput and robustness ----------------------------------------------------------------
    concurrency: int = config_field(8, "Records annotated at the same time.")
    max_retries: int = config_field(
        2,
        "Re-asks when an answer cannot be parsed as span JSON (the model is shown the error); "
        "after that the record goes to the failures file.",
    )
    max_api_retries: int = config_field(
        6,
        "Retries of one request on 408/409/429/5xx, timeouts and dropped connections.",
    )
    backoff_base_s: float = config_field(
        1.0,
        "First retry waits about this long; each further retry doubles it (with jitter). A "
        "Retry-After header from the server takes precedence.",
    )
    backoff_max_s: float = config_field(60.0, "Cap on one exponential-backoff wait.")
    retry_after_max_s: float = config_field(
        600.0,
        "Cap on one wait requested by a Retry-After header.",
    )
    timeout_s: float = config_field(120.0, "Timeout of one API request, in seconds.")
    max_connection_errors: int = config_field(
        5,
        "Stop the run (exit 1, naming the URL) after this many connection attempts in a row found "
        "no server; an answer of any kind resets the count. Timeouts are not counted.",
    )
    max_requests: int | None = config_field(
        None,
        "Stop cleanly after this many API requests (retries count). Unfinished records are "
        "left for the next run.",
    )
    max_cost_usd: float | None = config_field(
        None,
        "Stop cleanly before the estimated cost (tokens x prices below) would exceed this. "
        "Requests in flight are reserved at the average cost so far.",
    )
    price_per_1k_input: float = config_field(
        0.0025,
        "USD per 1,000 prompt tokens (default: gpt-4o's list price).",
    )
    price_per_1k_output: float = config_field(
        0.01,
        "USD per 1,000 completion tokens (default: gpt-4o's list price).",
    )

    fsync_interval_s: float = config_field(
        1.0,
        "Each finished record is appended at once as one complete line (it survives kill -9); "
        "lines reach the disk itself (fsync, surviving a power cut) in batches at most this many "
        "seconds apart and at the end. 0: fsync after every record.",
    )

    # --- code_tests critic ------------------------------------------------------------------------
    test_timeout_s: float = config_field(10.0, "code_tests: time limit of one test run.")
    test_memory_mb: int = config_field(1024, "code_tests: memory limit of one test run.")

    progress_bar: bool = config_field(True, "Show a progress bar with rate and ETA (stderr).")

    def __post_init__(self) -> None:
        problems = range_problems(
            self,
            positive=("concurrency", "max_tokens", "timeout_s", "max_connection_errors", "limit", "test_timeout_s",
                      "test_memory_mb", "max_cost_usd"),
            non_negative=("max_retries", "max_api_retries", "max_requests", "backoff_base_s", "backoff_max_s",
                          "retry_after_max_s", "temperature", "price_per_1k_input", "price_per_1k_output",
                          "fsync_interval_s"),
        )
        if problems:
            raise ValueError("; ".join(problems))
        if self.critic not in CRITICS and ":" not in self.critic:
            raise ValueError(
                f"critic must be one of {list(CRITICS)} or 'package.module:ClassName', got {self.critic!r}"
            )

    # Derived paths -------------------------------------------------------------------------------
    @property
    def failures_path(self) -> Path:
        return Path(self.failures) if self.failures else Path(self.output + ".failures.jsonl")

    @property
    def report_path(self) -> Path:
        return Path(self.report) if self.report else Path(self.output + ".report.json")

    @property
    def wants_structured_output(self) -> bool:
        """Whether requests carry the span JSON schema (`structured_output`)."""
        return self.structured_output == "json_schema" or (self.structured_output == "auto" and bool(self.base_url))

    def resolved_field_map(self) -> dict[str, str]:
        """The dataset's default mapping with the user's --field_map over it."""
        return {**DEFAULT_FIELD_MAPS.get(self.dataset, {}), **self.field_map}

    def required_fields(self) -> tuple[str, ...]:
        return REQUIRED_FIELDS.get(self.critic, ("prompt", "response"))
