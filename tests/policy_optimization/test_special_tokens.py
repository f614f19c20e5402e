"""PPO prompts get BOS exactly once, on the real Llama-3 tokenizer (whose chat template writes BOS and whose
tokenizer adds it too): the special tokens rule of `text2grad.core.generation` applied by the trainer."""

from __future__ import annotations

import pytest

import policy_optimization.trainer as trainer_module
from tests.policy_optimization.po_testlib import first_and_last_words
from text2grad.core.assets import real_tokenizer
from text2grad.core.critics import CallableFeedbackSource
from text2grad.core.generation import apply_chat_template
from tests.generation_recorder import record_prompt_ids

QUESTIONS = ["Summarize: the café opened late.", "Name two prime numbers.", "Translate 'chat' to English.", "Why?"]


@pytest.fixture(scope="module")
def llama3():
    return real_tokenizer("llama3")


def _sampled_prompt_ids(trainer, monkeypatch) -> list[list[int]]:
    """Run one PPO iteration and return the prompt ids of every rollout (what the policy was conditioned on)."""
    seen = record_prompt_ids(monkeypatch, trainer_module)
    metrics = trainer.step()
    assert metrics["samples/batch"] == len(seen)
    return seen


@pytest.mark.parametrize("use_chat_template", [True, False], ids=["template-flag", "prerendered-prompts"])
def test_chat_templated_prompts_carry_a_single_bos(make_trainer, llama3, monkeypatch, use_chat_template):
    """With the template applied (flag set, or prompts rendered beforehand), the prompt ids are the template's
    tokens as rendered once: one <|begin_of_text|>, never two (the old code tokenized them again with BOS)."""
    records = [{"prompt": apply_chat_template(llama3, q)} for q in QUESTIONS]
    trainer = make_trainer(
        CallableFeedbackSource(first_and_last_words), tokenizer=llama3, dataset=records, use_chat_template=use_chat_template,
        num_iterations=1, num_ppo_epochs=1, response_length=4,
    )
    by_prompt = {tuple(llama3(r["prompt"], add_special_tokens=False)["input_ids"]) for r in records}
    for ids in _sampled_prompt_ids(trainer, monkeypatch):
        assert ids.count(llama3.bos_token_id) == 1 and ids[0] == llama3.bos_token_id
        assert ids[1] == llama3.convert_tokens_to_ids("<|start_header_id|>")
        assert tuple(ids) in by_prompt


def test_plain_prompts_still_get_their_bos(make_trainer, llama3, monkeypatch):
    records = [{"prompt": q} for q in QUESTIONS]
    trainer = make_trainer(
        CallableFeedbackSource(first_and_last_words), tokenizer=llama3, dataset=records, num_iterations=1,
        num_ppo_epochs=1, response_length=4,
    )
    expected = {tuple(llama3(r["prompt"])["input_ids"]) for r in records}
    for ids in _sampled_prompt_ids(trainer, monkeypatch):
        assert ids[0] == llama3.bos_token_id and ids.count(llama3.bos_token_id) == 1
        assert tuple(ids) in expected


def test_max_prompt_length_cuts_prompts_from_the_left(make_trainer, llama3, monkeypatch):
    records = [{"prompt": apply_chat_template(llama3, q)} for q in QUESTIONS]
    trainer = make_trainer(
        CallableFeedbackSource(first_and_last_words), tokenizer=llama3, dataset=records, use_chat_template=True,
        num_iterations=1, num_ppo_epochs=1, response_length=4, max_prompt_length=6,
    )
    full = {tuple(llama3(r["prompt"], add_special_tokens=False)["input_ids"][-6:]) for r in records}
    for ids in _sampled_prompt_ids(trainer, monkeypatch):
        assert len(ids) == 6 and tuple(ids) in full  # the end (generation header) is kept
