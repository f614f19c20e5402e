"""Shared pieces of the policy_optimization tests: prompts, tiny PPO settings, a deterministic critic."""

from __future__ import annotations

from text2grad.core.feedback import Feedback


PROMPTS = [
    "The author wrote",
    "My roommate keeps",
    "Summary: a student wants",
    "Good spans: clear",
    "def add(a, b):",
    "The café owner said",
    "Emoji test and accents:",
    "a first-time author",
]

# Small enough for CPU tests, big enough for every code path (2 minibatches, 2 epochs, LoRA).
TINY_PPO = dict(
    num_iterations=2, batch_size=4, num_mini_batches=2, num_ppo_epochs=2, response_length=8, temperature=1.0,
    learning_rate=3e-3, lora_r=4, lora_alpha=8, seed=0, save_steps=0, progress_bar=False, log_samples=1,
    kl_coef=0.05, target_kl=6.0,
)


def first_and_last_words(prompt: str, response: str) -> Feedback:
    """Quotes the first two words as good and the last word as poor (so every mode has a non-zero score)."""
    words = response.split()
    if len(words) < 3:
        return Feedback(critique="too short")
    return Feedback(critique="edges", good_spans=(words[0], words[1]), poor_spans=(words[-1],))




def word_count_score(prompts, responses) -> list[float]:
    """A task score for the scalar/mixed modes: response length in words, capped at 1 (for CLI tests)."""
    return [min(1.0, len(r.split()) / 10) for r in responses]


def character_count_score(prompts, responses) -> list[float]:
    """A task score that differs between most responses of a tiny random model (their length in characters / 40)."""
    return [len(r) / 40 for r in responses]
