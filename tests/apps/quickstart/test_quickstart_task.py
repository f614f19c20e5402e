"""The toy task: generator determinism and disjoint splits, the FactCritic's spans, and fact_accuracy."""

from __future__ import annotations

import json
import random

import pytest

from policy_optimization.scores import build_score_fn
from text2grad.core.critics import FeedbackSource
from text2grad.apps.quickstart.task import (
    PROBLEM_PHRASES,
    SLOTS,
    FactCritic,
    FactScore,
    TaskConfig,
    check_summary,
    critique_summary,
    fact_accuracy,
    fact_scores,
    generate_task,
    noisy_summary,
    render_summary,
    write_task,
)
from text2grad.core.spans import locate_spans

SMALL = TaskConfig(seed=3, n_train=60, n_rl=20, n_eval=20)

FACTS = {
    "key": {"name": "Maya", "age": 27, "city": "Oslo", "job": "nurse", "problem": "quit"},
    "distractors": {"name": "Theo", "age": 31, "city": "Lisbon", "job": "chef", "relation": "brother"},
}
PROMPT = (
    "Hi all, I'm Maya (27). I work as a nurse in Oslo. My brother Theo (31) is a chef in Lisbon. "
    "I have been thinking about quitting my job. What should I do?\nTL;DR:"
)
GOOD = " Maya (27), a nurse in Oslo, wants to quit their job."


def test_generator_is_seeded_and_deterministic():
    a, b = generate_task(SMALL), generate_task(SMALL)
    assert a == b
    c = generate_task(TaskConfig(seed=4, n_train=60, n_rl=20, n_eval=20))
    assert [r["prompt"] for r in a["train"]] != [r["prompt"] for r in c["train"]]


def test_splits_have_requested_sizes_and_are_disjoint():
    splits = generate_task(SMALL)
    assert {k: len(v) for k, v in splits.items()} == {"train": 60, "rl": 20, "eval": 20}
    prompts = [{r["prompt"] for r in recs} for recs in splits.values()]
    assert sum(len(p) for p in prompts) == 100  # no duplicate within or across splits
    ids = [r["id"] for recs in splits.values() for r in recs]
    assert len(set(ids)) == len(ids)


def test_records_are_well_formed_and_references_are_perfect():
    for rec in generate_task(SMALL)["eval"]:
        assert rec["prompt"].endswith("\nTL;DR:")
        assert rec["completion"].startswith(" ") and rec["reference"].startswith(" ")
        key = rec["facts"]["key"]
        # the post states every key fact and every distractor
        post = rec["prompt"]
        for slot in ("name", "city", "job"):
            assert key[slot] in post and rec["facts"]["distractors"][slot] in post
        assert str(key["age"]) in post
        assert fact_scores(rec["facts"], rec["reference"])["perfect"] == 1.0


def test_sft_completions_are_imperfect_at_the_configured_rate():
    noisy = generate_task(TaskConfig(seed=0, n_train=400, n_rl=1, n_eval=1, p_omit=0.1, p_wrong=0.15))["train"]
    perfect = sum(fact_scores(r["facts"], r["completion"])["perfect"] for r in noisy) / len(noisy)
    # P(all five slots untouched) = 0.75 ** 5 ~= 0.24
    assert 0.15 < perfect < 0.35
    clean = generate_task(TaskConfig(seed=0, n_train=50, n_rl=1, n_eval=1, p_omit=0.0, p_wrong=0.0))["train"]
    assert all(fact_scores(r["facts"], r["completion"])["perfect"] == 1.0 for r in clean)


def test_bad_config_is_rejected_with_the_field_name():
    with pytest.raises(ValueError, match="p_wrong"):
        generate_task(TaskConfig(p_wrong=1.5))


def test_write_task_writes_three_jsonl_files(tmp_path):
    paths = write_task(SMALL, tmp_path)
    assert set(paths) == {"train", "rl", "eval"}
    lines = paths["eval"].read_text().splitlines()
    assert len(lines) == 20 and json.loads(lines[0])["facts"]["key"]["name"]


def test_critique_praises_correct_facts_and_flags_the_wrong_token():
    bad = " Maya (27), a nurse in Lisbon, wants to quit their job."
    fb = critique_summary(FACTS, bad)
    assert fb.poor_spans == ("Lisbon",)
    assert set(fb.good_spans) == {"Maya", "27", "nurse", "wants to quit their job"}
    assert "Wrong city" in fb.critique and "Lisbon is the brother's" in fb.critique
    perfect = critique_summary(FACTS, GOOD)
    assert perfect.poor_spans == () and len(perfect.good_spans) == 5


def test_spans_are_exact_substrings_of_every_response():
    splits = generate_task(SMALL)
    for rec in splits["train"]:
        for response in (rec["completion"], rec["reference"], rec["completion"] + " Oslo Oslo. Extra text 99"):
            fb = critique_summary(rec["facts"], response)
            for span in fb.good_spans + fb.poor_spans:
                assert span in response
            assert not locate_spans(response, fb.good_spans, fb.poor_spans).unmatched


def test_omissions_invented_numbers_repeats_and_rambling():
    fb = critique_summary(FACTS, " Maya, a nurse, wants to quit their job.")
    assert "Missing age and city" in fb.critique and fb.poor_spans == ()
    fb = critique_summary(FACTS, " Maya (72), a nurse in Oslo, wants to quit their job.")
    assert fb.poor_spans == ("72",)
    fb = critique_summary(FACTS, " Maya (27), a nurse in Oslo Oslo, wants to quit their job.")
    assert "Oslo Oslo" in fb.poor_spans and "Repeats Oslo" in fb.critique
    fb = critique_summary(FACTS, GOOD + " She likes Berlin.")
    assert "She likes Berlin." in fb.poor_spans and "Text after the summary" in fb.critique


def test_wrong_problem_phrase_is_a_false_fact():
    response = f" Maya (27), a nurse in Oslo, {PROBLEM_PHRASES['dog']}."
    fb = critique_summary(FACTS, response)
    assert fb.poor_spans == (PROBLEM_PHRASES["dog"],)
    check = check_summary(FACTS, response)
    assert check.wrong == {"problem": [PROBLEM_PHRASES["dog"]]} and "problem" in check.missing


def test_fact_critic_implements_the_protocol_and_reads_task_files(tmp_path):
    paths = write_task(SMALL, tmp_path)
    critic = FactCritic(data_path=[str(paths["rl"]), str(paths["eval"])])
    assert isinstance(critic, FeedbackSource)
    rec = json.loads(paths["eval"].read_text().splitlines()[0])
    wrapped = "<|user|>\n" + rec["prompt"] + "\n<|assistant|>"  # a chat template around the post
    out = critic.feedback([rec["prompt"], wrapped, "an unknown post"], [rec["reference"]] * 3)
    assert out[0].ok and len(out[0].good_spans) == 5 and out[0].poor_spans == ()
    assert out[1].ok and out[1].good_spans == out[0].good_spans
    assert not out[2].ok and "not a post" in out[2].error
    with pytest.raises(ValueError, match="got 1 prompts but 2"):
        critic.feedback(["x"], ["a", "b"])
    with pytest.raises(ValueError, match="needs task records"):
        FactCritic()


def test_fact_scores_on_hand_made_examples():
    assert fact_scores(FACTS, GOOD) == {"fact_score": 1.0, "fact_recall": 1.0, "n_false": 0.0, "perfect": 1.0}
    # one wrong city: 4 correct, 1 false -> (4 - 1) / 5
    s = fact_scores(FACTS, " Maya (27), a nurse in Lisbon, wants to quit their job.")
    assert s["fact_score"] == pytest.approx(0.6) and s["fact_recall"] == pytest.approx(0.8) and s["n_false"] == 1
    # an omission costs less than a false statement: 4 correct, 0 false -> 0.8
    assert fact_scores(FACTS, " Maya (27), a nurse, wants to quit their job.")["fact_score"] == pytest.approx(0.8)
    # stating a correct and a wrong city: the correct one counts, the wrong one costs
    s = fact_scores(FACTS, " Maya (27), a nurse in Oslo and Lisbon, wants to quit their job.")
    assert s["fact_score"] == pytest.approx(0.8) and s["perfect"] == 0.0
    # nothing stated at all
    assert fact_scores(FACTS, " The author has a problem.")["fact_score"] == 0.0
    # a wrong value repeated counts once
    assert fact_scores(FACTS, " Theo Theo")["n_false"] == 1


def test_fact_accuracy_averages_and_validates():
    recs = [{"facts": FACTS}, {"facts": FACTS}]
    out = fact_accuracy(recs, [GOOD, " Maya (27), a nurse in Lisbon, wants to quit their job."])
    assert out["fact_score"] == pytest.approx(0.8) and out["perfect"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="2 records but 1"):
        fact_accuracy(recs, [GOOD])


def test_render_summary_omits_none_values():
    values = dict(FACTS["key"], problem=PROBLEM_PHRASES["quit"])
    assert render_summary(values, 0) == GOOD.strip()
    assert render_summary(dict(values, city=None, age=None), 1) == "Maya, a nurse, wants to quit their job."
    assert set(SLOTS) == set(FACTS["key"])


def test_noisy_summary_follows_the_error_rate_and_can_repeat_a_clause():
    recs = generate_task(TaskConfig(seed=5, n_train=300, n_rl=1, n_eval=1))["train"]
    rng = random.Random(0)
    hard = TaskConfig(p_omit=0.0, p_wrong=0.5)
    texts = [noisy_summary(rng, r["facts"], hard, p_repeat=1.0) for r in recs]
    wrong = sum(fact_scores(r["facts"], t)["n_false"] for r, t in zip(recs, texts)) / len(recs)
    assert 2.0 < wrong < 3.0  # 5 slots x 0.5 (a repeated wrong value counts once)
    assert all(t.startswith(" ") and t.endswith(".") for t in texts)
    flagged = [critique_summary(r["facts"], t) for r, t in zip(recs, texts)]
    assert sum("Repeats" in fb.critique for fb in flagged) > len(recs) // 2


def test_fact_score_is_the_task_metric_as_a_ppo_scalar_source():
    """The oracle scalar baseline's reward: exactly fact_scores' fact_score, None for a post it does not know."""
    score = build_score_fn("text2grad.apps.quickstart.task:FactScore", {"records": [{"prompt": PROMPT, "facts": FACTS}]})
    wrong = " Maya (27), a chef in Lisbon, wants to quit their job."  # 3 of 5 right, 2 false: (3 - 2) / 5
    assert score([PROMPT, PROMPT, "an unknown post"], [GOOD, wrong, GOOD]) == [1.0, pytest.approx(0.2), None]
    assert score([PROMPT], [wrong])[0] == fact_scores(FACTS, wrong)["fact_score"]
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        FactScore(records=[{"prompt": PROMPT, "facts": FACTS}])([PROMPT, PROMPT], [GOOD])
