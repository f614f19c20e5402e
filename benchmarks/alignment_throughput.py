"""Throughput of the span-to-token core: alignment + token-reward construction on 1,000 responses.

    python benchmarks/alignment_throughput.py [--n 1000] [--repeats 3]

Responses are realistic-length generated summaries (60-120 tokens) tokenized by a byte-level BPE
tokenizer trained on them; each has 1-3 good and 1-3 poor quotes, some needing normalization (curly
quotes, case, spacing) and some not present at all. Three paths are timed side by side:

- text:       tokenizer offset mapping of the response text -> labels -> rewards (annotation data);
- ids (fast): the policy's generated ids (+EOS) -> decode_with_offsets (re-encode check) -> labels -> rewards;
- ids (slow): the same ids forced through the prefix-decoding fallback (non-canonical ids).
Also reported: the reward step the PPO trainer calls (`compute_score_rewards`, nl_gradient mode: alignment on
the ids, rewards and the padded (B, T) batch) for all 1,000.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

import torch

from text2grad.core.feedback import Feedback
from text2grad.core.modeling import train_tokenizer
from text2grad.core.rewards import compute_score_rewards, span_token_rewards
from text2grad.core.spans import decode_with_offsets, feedback_token_labels, token_offsets

WORDS = ("the author wants to move to berlin for a new job but worries that her partner will not follow her and "
         "asks whether she should take the offer or wait another year while saving money for the flat").split()


def make_response(rng: random.Random) -> str:
    n = rng.randint(45, 90)
    words = [rng.choice(WORDS) for _ in range(n)]
    for i in range(0, n, rng.randint(8, 15)):
        words[i] = words[i].capitalize() + ("," if rng.random() < 0.3 else "")
    return " ".join(words) + "."


def make_feedback(rng: random.Random, text: str) -> Feedback:
    words = text.split()

    def quote() -> str:
        i = rng.randrange(0, len(words) - 6)
        q = " ".join(words[i : i + rng.randint(2, 6)])
        r = rng.random()
        if r < 0.15:
            q = q.upper()  # needs normalization
        elif r < 0.2:
            q = q + " zebra"  # not in the response
        return q

    return Feedback("critique", tuple(quote() for _ in range(rng.randint(1, 3))), tuple(quote() for _ in range(rng.randint(1, 3))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(0)
    responses = [make_response(rng) for _ in range(args.n)]
    feedbacks = [make_feedback(rng, r) for r in responses]
    tok = train_tokenizer(responses, vocab_size=2000, kind="bpe")
    ids = [tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in responses]
    n_tokens = sum(len(i) for i in ids)

    class NonCanonical:  # same tokenizer, but re-encoding never "matches", forcing the slow path
        def __init__(self, inner):
            self.inner, self.is_fast = inner, False
            self.all_special_ids = inner.all_special_ids

        def decode(self, *a, **k):
            return self.inner.decode(*a, **k)

    slow_tok = NonCanonical(tok)

    def run_text():
        out, unmatched = [], 0
        for r, fb in zip(responses, feedbacks):
            _, offs = token_offsets(tok, r)
            res = feedback_token_labels(fb, r, offs)
            unmatched += res.alignment.n_unmatched
            out.append(span_token_rewards(res.labels))
        return out, unmatched

    def run_ids(t):
        out = []
        for i, fb in zip(ids, feedbacks):
            text, offs = decode_with_offsets(t, i)
            out.append(span_token_rewards(feedback_token_labels(fb, text, offs).labels))
        return out

    timings = {}
    for name, fn in [("text", run_text), ("ids (fast)", lambda: run_ids(tok)), ("ids (slow)", lambda: run_ids(slow_tok))]:
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - t0)
        timings[name] = statistics.median(times)
        if name == "text":
            _, unmatched = result
    t0 = time.perf_counter()
    batch = compute_score_rewards(feedbacks, ids, tok, mode="nl_gradient").rewards
    t_batch = time.perf_counter() - t0
    n_quotes = sum(len(f.good_spans) + len(f.poor_spans) for f in feedbacks)
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, python {platform.python_version()}")
    print(f"{args.n} responses, {n_tokens} tokens, {n_quotes} quotes ({unmatched} unmatched = {unmatched / n_quotes:.1%})")
    print(f"{'path':<12} {'seconds':>8} {'tokens/s':>12} {'responses/s':>12}")
    for name, t in timings.items():
        print(f"{name:<12} {t:>8.3f} {n_tokens / t:>12,.0f} {args.n / t:>12,.0f}")
    print(f"ids fast path vs slow path: {timings['ids (slow)'] / timings['ids (fast)']:.1f}x faster")
    print(f"compute_score_rewards (the trainer's reward step) for {tuple(batch.shape)}: {t_batch:.3f} s")


if __name__ == "__main__":
    main()
