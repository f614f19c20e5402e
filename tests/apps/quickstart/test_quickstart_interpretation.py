"""The report's interpreting sentences are read from the numbers: change a number and the sentence changes."""

from __future__ import annotations

from text2grad.apps.quickstart.report import describe_results, describe_shift, logprob_shift


def _results(t2g: float, scalar: float, sft: float = 0.2):
    return {"sft": {"fact_score": sft}, "nl_gradient": {"fact_score": t2g}, "scalar": {"fact_score": scalar}}


def test_results_sentences_follow_the_scores_and_the_kept_iteration():
    curves = {"nl_gradient": [{"iteration": 0, "fact_score": 0.2}, {"iteration": 20, "fact_score": 0.39},
                              {"iteration": 30, "fact_score": 0.19}],
              "scalar": [{"iteration": 0, "fact_score": 0.2}, {"iteration": 30, "fact_score": 0.24}]}
    up = describe_results(_results(0.39, 0.24), curves, {"nl_gradient": 20, "scalar": 30}, {"nl_gradient": 9.87})
    assert up[0] == ("Text2Grad (NL-gradient PPO) scores 0.390 on the eval split, +0.190 against the start policy (0.200); "
                     "+0.150 against scalar PPO. Early stopping kept iteration 20; at the end of training (iteration 30) "
                     "it scored 0.190 (-0.200); KL to the start policy at the end: 9.87 nats.")
    # scalar PPO's kept point is its last one: no early-stopping clause
    assert up[1] == "scalar PPO scores 0.240 on the eval split, +0.040 against the start policy (0.200); -0.150 against Text2Grad (NL-gradient PPO)."
    down = describe_results(_results(0.10, 0.24), curves, {"nl_gradient": 30, "scalar": 30})
    assert "scores 0.100" in down[0] and "-0.100 against the start policy" in down[0] and "-0.140 against scalar PPO" in down[0]
    assert "Early stopping" not in down[0]


def test_shift_sentence_says_which_way_the_poor_tokens_moved():
    items = [{"labels": [1, -1, -1, 0], "logp": {"sft": [-1.0, -1.0, -1.0, -1.0], "nl_gradient": [-1.1, -1.5, -1.2, -1.0]}}]
    shift = logprob_shift(items, "nl_gradient")
    fell = describe_shift("Text2Grad", shift, {"poor_first": {"mean": -0.5, "n": 1}}, "the reward model's")
    assert fell == ("Under Text2Grad, tokens the reward model's labels call poor moved by -0.350 nats and good ones by -0.100: "
                    "the poor tokens lost 0.250 nats relative to the good ones. The first tokens of poor quotes, where the "
                    "policy chooses to write the flaw, moved by -0.500 (n=1): they fell.")
    items[0]["logp"]["nl_gradient"] = [-1.5, -0.9, -0.8, -1.0]
    rose = describe_shift("Text2Grad", logprob_shift(items, "nl_gradient"), {"poor_first": {"mean": 0.1, "n": 1}}, "the critic's true")
    assert "did not lose probability relative to the good ones (they gained 0.650 nats more)" in rose
    assert rose.endswith("moved by +0.100 (n=1): they rose.")
    assert "nothing to compare" in describe_shift("x", {"good": 0.1, "poor": float("nan")}, {}, "the critic's true")


def test_a_policy_that_did_not_move_is_said_not_to_have_moved():
    assert describe_shift("scalar PPO", {"good": 0.0, "poor": 0.0, "neutral": 0.0}, {"poor_first": {"mean": 0.0, "n": 9}},
                          "the critic's true") == ("Under scalar PPO, neither poor nor good tokens (the critic's true labels) "
                                                   "moved (both within 0.0005 nats).")
