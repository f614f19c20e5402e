"""SFT (TRL's SFTTrainer): the full-logits loss option trains exactly like TRL's fused LM head; metrics.jsonl."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from policy_optimization.sft import main
from text2grad.core.data import write_jsonl

RECORDS = [
    {"prompt": "Post: my cat Tom is 3 and sleeps all day.\nTL;DR:", "completion": " Tom the cat, 3, sleeps all day."},
    {"prompt": "Post: I am Ana, a nurse in Lima.\nTL;DR:", "completion": " Ana is a nurse in Lima."},
    {"prompt": "Post: our car broke down on the way to Oslo.\nTL;DR:", "completion": " The car broke down near Oslo."},
    {"prompt": "Post: Ben, 40, wants to learn the piano.\nTL;DR:", "completion": " Ben (40) wants piano lessons."},
]


def train(tmp_path, model_dir, fused: bool) -> tuple[list[dict], dict[str, torch.Tensor]]:
    out = tmp_path / f"sft-fused-{fused}"
    argv = ["--model_name_or_path", str(model_dir), "--dataset_path", str(tmp_path / "train.jsonl"),
            "--prompt_template", "{prompt}", "--completion_template", "{completion}", "--output_dir", str(out),
            "--use_lora", "false", "--max_steps", "4", "--learning_rate", "1e-2", "--per_device_train_batch_size", "2",
            "--logging_steps", "1", "--save_steps", "1000", "--seed", "0", "--fused_lm_head", str(fused).lower()]
    assert main(argv) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return metrics, load_file(str(out / "model.safetensors"))


def test_full_logits_loss_trains_like_trls_fused_lm_head(tmp_path, tiny_llama, bpe_tokenizer):
    write_jsonl(tmp_path / "train.jsonl", RECORDS)
    model_dir = tmp_path / "base"
    tiny_llama.save_pretrained(model_dir)
    bpe_tokenizer.save_pretrained(model_dir)
    fused_log, fused_weights = train(tmp_path, model_dir, fused=True)
    plain_log, plain_weights = train(tmp_path, model_dir, fused=False)
    fused_losses = [float(m["loss"]) for m in fused_log if "loss" in m]
    plain_losses = [float(m["loss"]) for m in plain_log if "loss" in m]
    # every logged step is in metrics.jsonl, once
    assert [m["step"] for m in plain_log if "loss" in m] == [1, 2, 3, 4] == [m["step"] for m in fused_log if "loss" in m]
    # the same masked mean cross-entropy on the completion tokens, step after step, and the same updates
    assert plain_losses == pytest.approx(fused_losses, rel=1e-3)
    assert fused_losses[-1] < fused_losses[0]  # it trained
    assert "mean_token_accuracy" in fused_log[0] and "mean_token_accuracy" not in plain_log[0]  # TRL's tile metrics
    assert fused_weights.keys() == plain_weights.keys()
    for name in fused_weights:
        torch.testing.assert_close(plain_weights[name], fused_weights[name], rtol=1e-3, atol=1e-4)
    # a second run into the same directory starts a fresh metrics log (SFT does not resume)
    again, _ = train(tmp_path, model_dir, fused=False)
    assert [m["step"] for m in again if "loss" in m] == [1, 2, 3, 4]

