"""PPO as several processes on CPU (gloo), as it runs on a multi-GPU node: every model on its process's own
device, both reward models in the loop, the global batch, resume under DeepSpeed, and what a changed process
count does on resume.

Each launch starts 2 processes of `tests.policy_optimization.multiprocess_worker` on the tiny offline model, with the
GPUs hidden (CPU ranks; the one-process runs they are compared with too), so the tests pass on a GPU machine as well."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from policy_optimization.checkpoints import check_process_count
from policy_optimization.train import main as train_main
from reward_model.scalar import CONFIG_FILENAME as SCALAR_CONFIG
from reward_model.scalar_config import ScalarRMConfig
from reward_model.serve import free_port
from tests.policy_optimization.test_training_scripts import HIDE_GPUS, ROOT, read_metrics, script_env
from text2grad.apps.tiny import make_tiny_world
from text2grad.core.config import save_config
from text2grad.core.modeling import build_tiny_llama, load_tokenizer

WORKER = "tests.policy_optimization.multiprocess_worker"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """The tiny SLF5K world (model, tokenizer, prepared prompts) and an untrained scalar reward model on it."""
    root = make_tiny_world("slf5k", tmp_path_factory.mktemp("mp") / "world")
    scalar = root / "scalar_rm"
    if not (scalar / SCALAR_CONFIG).is_file():
        model = AutoModelForSequenceClassification.from_pretrained(root / "model", num_labels=1)
        tokenizer = load_tokenizer(str(root / "model"), padding_side="right")
        model.config.pad_token_id = tokenizer.pad_token_id
        model.save_pretrained(scalar)
        tokenizer.save_pretrained(scalar)
        save_config(ScalarRMConfig(model_name_or_path=str(scalar), max_length=256), scalar / SCALAR_CONFIG)
    return root


def ppo_flags(world: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--config", str(ROOT / "configs" / "slf5k" / "ppo.yaml"), "--model_name_or_path", str(world / "model"),
        "--adapter", "none", "--dataset_path", str(world / "data" / "rl_prompts.jsonl"),
        "--num_iterations", "1", "--batch_size", "4", "--num_mini_batches", "1", "--num_ppo_epochs", "1",
        "--response_length", "8", "--dtype", "auto", "--gradient_checkpointing", "false", "--progress_bar", "false",
        "--stop_strings", "none", "--output_dir", str(out), *extra,
    ]


def with_free_port(launcher: list[str]) -> list[str]:
    """The launcher with a free rendezvous port: the default one (29500) is taken when another launch runs beside."""
    if not launcher:
        return launcher
    flag = {"torch.distributed.run": "--master_port", "accelerate.commands.launch": "--main_process_port"}.get(launcher[0])
    return [launcher[0], flag, str(free_port("127.0.0.1")), *launcher[1:]] if flag else launcher


def launch(tmp_path: Path, launcher: list[str], flags: list[str], **env: str) -> subprocess.CompletedProcess:
    launcher = with_free_port(launcher)
    cmd = [sys.executable, "-m", *launcher, "-m", WORKER, *flags] if launcher else [sys.executable, "-m", WORKER, *flags]
    proc = subprocess.run(cmd, cwd=ROOT, env=script_env(tmp_path, OMP_NUM_THREADS="1", **HIDE_GPUS, **env), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return proc


def placements(out: Path) -> list[dict]:
    return [json.loads((out / f"placement-rank{k}.json").read_text()) for k in (0, 1)]


ZERO2 = ["accelerate.commands.launch", "--config_file", str(ROOT / "configs" / "accelerate" / "cpu_deepspeed_zero2.yaml")]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_zero2_ppo_with_the_generative_and_scalar_reward_models_on_each_rank_resumes(world, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    out = tmp_path / "run"
    both_reward_models = [
        "--critic", "reward_model", "--critic_kwargs", json.dumps({"path": str(world / "model"), "max_new_tokens": 8}),
        "--reward_mode", "mixed", "--scalar_source", "scalar_rm",
        "--scalar_source_kwargs", json.dumps({"path": str(world / "scalar_rm")}),
        "--feedback_prompt_template", "{prompt}",
        "--max_feedback_error_rate", "1.0",  # the untrained generative reward model writes no valid JSON
        "--save_steps", "1",
    ]
    launch(tmp_path, ZERO2, ppo_flags(world, out, *both_reward_models), DS_ACCELERATOR="cpu")
    for rank, seen in enumerate(placements(out)):
        assert (seen["local_rank"], seen["process_index"], seen["num_processes"], seen["zero_stage"]) == (rank, rank, 2, 2)
        # each rank's own copy of each reward model, on that rank's device (cpu:<local rank> under the test resolver)
        assert seen["critic"] == seen["scalar_reward_model"] == f"cpu:{rank}"
        # policy and (shared-backbone) value head where accelerate put this process: its own device
        assert seen["policy"] == seen["value"] == [seen["accelerator_device"]] == ["cpu"]
        assert seen["rollouts_per_process"] == 2  # batch_size 4 is the global batch
    first = read_metrics(out)
    assert [(m["iteration"], m["episodes"], m["samples/batch"]) for m in first] == [(1, 4, 4.0)]
    assert first[0]["samples/feedback_error"] == 4.0 and first[0]["samples/score_error"] == 0.0
    assert (out / "checkpoint-1" / "pytorch_model").is_dir()  # DeepSpeed's sharded checkpoint

    launch(tmp_path, ZERO2, ppo_flags(world, out, *both_reward_models, "--num_iterations", "2", "--resume", "auto"),
           DS_ACCELERATOR="cpu")
    resumed = read_metrics(out)
    assert [(m["iteration"], m["episodes"]) for m in resumed] == [(1, 4), (2, 8)]
    assert resumed[0] == first[0]  # the first iteration's line is kept, not rewritten
    assert (out / "checkpoint-2" / "pytorch_model").is_dir() and (out / "policy" / "adapter_config.json").is_file()

    # The same checkpoint with one process instead of two is refused before any model loads (exit 2).
    with pytest.raises(ValueError, match="was written by 2 process\\(es\\) but this run has 1: resume with the same"):
        check_process_count(out / "checkpoint-2", 1)
    assert train_main(ppo_flags(world, out, *both_reward_models, "--num_iterations", "3", "--resume", "auto")) == 2
    assert "checkpoint-2 was written by 2 process(es) but this run has 1" in capsys.readouterr().err


DDP = ["torch.distributed.run", "--nproc_per_node", "2"]  # with ACCELERATE_USE_CPU=true: DDP over gloo
COMPARED = ("reward/score_mean", "reward/total_mean", "objective/kl", "objective/kl_coef", "policy/rollout_entropy",
            "loss/policy", "loss/value", "loss/total", "policy/entropy", "policy/approx_kl", "policy/clipfrac",
            "value/explained_variance", "tokens/nonzero_reward_share", "episodes")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_same_global_batch_gives_the_same_metrics_on_one_and_two_processes(world, tmp_path):
    """batch_size is the global batch: one process samples all 4 rollouts, or two processes 2 each, and with
    seeded rollouts (the same response whichever process samples a prompt) every metric of both iterations
    agrees to 1e-4 (relative; 1e-6 absolute): data split, whitening over the global batch (rewards and
    advantages), gradient averaging, explained variance and the metric reductions all see the same batch."""
    flags = ["--critic", "tests.policy_optimization.po_testlib:first_and_last_words", "--critic_kwargs", "{}",
             "--reward_mode", "mixed", "--scalar_source", "tests.policy_optimization.po_testlib:character_count_score",
             "--missing_eos_penalty", "0",
             "--num_iterations", "2", "--num_ppo_epochs", "2", "--learning_rate", "3e-3", "--value_learning_rate", "3e-3",
             "--lr_scheduler_type", "constant", "--whiten_rewards", "true", "--use_chat_template", "false",
             "--save_steps", "0", "--seeded_rollouts"]
    launch(tmp_path, [], ppo_flags(world, tmp_path / "one", *flags))  # no launcher: one process
    launch(tmp_path, DDP, ppo_flags(world, tmp_path / "two", *flags), ACCELERATE_USE_CPU="true")
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [m["iteration"] for m in one] == [m["iteration"] for m in two] == [1, 2]
    assert [p["rollouts_per_process"] for p in placements(tmp_path / "two")] == [2, 2]
    for a, b in zip(one, two):
        # equal token counts on both processes (every response runs to response_length), or the per-process
        # loss means would weigh tokens differently from one process's mean by design
        assert a["response/length_mean"] == b["response/length_mean"] == 8.0
        assert a["tokens/nonzero_reward_share"] > 0  # the critic rewarded something: the update had a signal
        for key in COMPARED:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    assert one[1]["loss/policy"] != one[0]["loss/policy"]  # the second iteration ran on updated weights


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_machines_launched_one_command_each_with_the_multinode_config(world, tmp_path):
    """configs/accelerate/multinode_deepspeed_zero3.yaml as two machines of one process each, both on this host:
    the same command on each with its --machine_rank. Each process is local rank 0 on its machine (its reward
    models on that machine's first device) and rank 0 or 1 of the run, and only the main process writes the
    run's files into the shared output_dir."""
    port = str(free_port("127.0.0.1"))
    out = tmp_path / "run"
    flags = ppo_flags(world, out, "--critic", "reference", "--critic_kwargs", '{"reference_field": "reference"}',
                      "--scalar_source", "scalar_rm", "--reward_mode", "mixed",
                      "--scalar_source_kwargs", json.dumps({"path": str(world / "scalar_rm")}))
    machines = []
    for machine in (0, 1):
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(ROOT / "configs" / "accelerate" / "multinode_deepspeed_zero3.yaml"), "--num_processes", "2",
               "--machine_rank", str(machine), "--main_process_ip", "127.0.0.1", "--main_process_port", port,
               "--mixed_precision", "no", "-m", WORKER, *flags]
        env = script_env(tmp_path, OMP_NUM_THREADS="1", **HIDE_GPUS, DS_ACCELERATOR="cpu")
        machines.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for proc in machines:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-6000:]
    seen = placements(out)
    assert [(p["local_rank"], p["process_index"], p["num_processes"], p["zero_stage"]) for p in seen] == [(0, 0, 2, 3), (0, 1, 2, 3)]
    assert [p["scalar_reward_model"] for p in seen] == ["cpu:0", "cpu:0"]  # local rank 0 on each machine
    assert [(m["iteration"], m["episodes"]) for m in read_metrics(out)] == [(1, 4)]  # one writer: one line
    assert (out / "policy" / "adapter_config.json").is_file()


def deepspeed_launch(tmp_path: Path, module: str, flags: list[str]) -> subprocess.CompletedProcess:
    """``module`` as 2 CPU processes under the DeepSpeed launcher (DS_ACCELERATOR=cpu: gloo)."""
    port = str(30500 + os.getpid() % 1000)
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", port, "--no_local_rank",
           "--module", module, *flags]
    proc = subprocess.run(cmd, cwd=ROOT, env=script_env(tmp_path, OMP_NUM_THREADS="1", **HIDE_GPUS, DS_ACCELERATOR="cpu"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "dist_world_size=2" in proc.stdout + proc.stderr
    # each rank removed DeepSpeed's shared-memory workspace (DeepSpeed leaves it in /dev/shm, ~66 MB per rank)
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))
    return proc


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sft_zero3_dpo_zero2_and_grpo_zero3_as_two_processes(world, tmp_path):
    """SFT with ZeRO-3 (the training arguments come before the weights, so they load partitioned) and DPO with
    ZeRO-2 from that SFT adapter under the DeepSpeed launcher, and Text2Grad-GRPO with ZeRO-3 under accelerate (its
    YAML's gradient_accumulation_steps 2 against the accelerate config's 1), each as 2 CPU processes of one ZeRO
    world (each checkpoint holds both ranks' shards); each saves a whole adapter."""
    hf = ["--bf16", "false", "--max_steps", "2", "--per_device_train_batch_size", "2", "--logging_steps", "1",
          "--save_steps", "2", "--model_name_or_path", str(world / "model")]
    sft = tmp_path / "sft"
    deepspeed_launch(tmp_path, "policy_optimization.sft", [
        "--config", str(ROOT / "configs" / "slf5k" / "sft.yaml"), "--dataset_path", str(world / "data" / "sft.jsonl"),
        "--output_dir", str(sft), "--deepspeed", str(ROOT / "configs" / "deepspeed" / "zero3.json"), *hf])
    dpo = tmp_path / "dpo"
    deepspeed_launch(tmp_path, "policy_optimization.dpo", [
        "--config", str(ROOT / "configs" / "slf5k" / "dpo.yaml"), "--adapter", str(sft),
        "--dataset_path", str(world / "data" / "preference_pairs.jsonl"), "--output_dir", str(dpo),
        "--deepspeed", str(ROOT / "configs" / "deepspeed" / "zero2.json"), *hf])
    grpo = tmp_path / "grpo"
    zero3 = ["accelerate.commands.launch", "--config_file", str(ROOT / "configs" / "accelerate" / "cpu_deepspeed_zero3.yaml")]
    cmd = [sys.executable, "-m", *zero3, "-m", "policy_optimization.grpo", "--config", str(ROOT / "configs" / "slf5k" / "grpo.yaml"),
           "--adapter", "none", "--dataset_path", str(world / "data" / "rl_prompts.jsonl"), "--critic", "reference",
           "--critic_kwargs", '{"reference_field": "reference"}', "--output_dir", str(grpo), "--num_generations", "2",
           "--max_completion_length", "12", "--dtype", "auto", "--use_chat_template", "false", *hf]
    proc = subprocess.run(cmd, cwd=ROOT, env=script_env(tmp_path, OMP_NUM_THREADS="1", **HIDE_GPUS, DS_ACCELERATOR="cpu"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert [m["step"] for m in read_metrics(sft) if "loss" in m] == [1, 2]
    assert [m["step"] for m in read_metrics(dpo) if "loss" in m] == [1, 2]
    assert len([m for m in read_metrics(grpo) if "loss" in m]) == 2
    for run in (sft, dpo, grpo):
        assert list((run / "checkpoint-2").glob("global_step2/*zero_pp_rank_1_*")), f"{run.name}: not one world of 2"
        adapter = load_file(str(run / "adapter_model.safetensors"))
        assert adapter and all(t.numel() > 0 for t in adapter.values())  # gathered whole, not ZeRO-3 placeholders
    assert json.loads((dpo / "adapter_config.json").read_text())["base_model_name_or_path"] == str(dpo / "base_merged")
    assert (dpo / "base_merged" / "config.json").is_file()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_zero3_ppo_samples_with_one_vllm_engine_per_process(world, tmp_path, monkeypatch):
    """generation_backend vllm under a launcher (ZeRO-3, 2 CPU processes, LoRA): each process starts its own engine,
    placed by `text2grad.core.placement.engine_placement` (half the machine's KV-cache budget and its own core each),
    samples its own half of the global batch, and refreshes it from its own policy copy every iteration (the
    whole policy gathered from the ZeRO-3 shards, its adapter folded in: lora_mode auto merges on a CPU), so each
    process's refresh check stays small."""
    pytest.importorskip("vllm", reason="vllm is not importable (install the 'vllm' extra: see env.sh)")
    model = tmp_path / "model"  # vLLM's CPU attention needs a head size of at least 32 (the tiny world's is 16)
    tokenizer = load_tokenizer(str(world / "model"))
    build_tiny_llama(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=0).save_pretrained(model)
    tokenizer.save_pretrained(model)
    out = tmp_path / "run"
    flags = ppo_flags(world, out, "--generation_backend", "vllm", "--vllm_cpu_kv_cache_gb", "0.25",
                      "--critic", "reference", "--critic_kwargs", '{"reference_field": "reference"}',
                      "--num_iterations", "2", "--learning_rate", "1e-2", "--use_chat_template", "false",
                      "--save_steps", "0", "--log_samples", "0")
    flags[flags.index("--model_name_or_path") + 1] = str(model)
    flags[flags.index("--dtype") + 1] = "fp32"  # the engine samples in the policy's own precision
    zero3 = ["accelerate.commands.launch", "--config_file", str(ROOT / "configs" / "accelerate" / "cpu_deepspeed_zero3.yaml")]
    for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    started = time.perf_counter()
    launch(tmp_path, zero3, flags, DS_ACCELERATOR="cpu")
    print(f"2 processes, 2 engines, 2 iterations: {time.perf_counter() - started:.0f} s")

    cores = sorted(os.sched_getaffinity(0))
    seen = [json.loads((out / f"vllm-rank{k}.json").read_text()) for k in (0, 1)]
    half = (1 << 30) // 4 // 2
    for rank, record in enumerate(seen):
        placed, engine = record["placement"], record["engine"]
        assert placed["gpu_index"] is None and placed["pinned"] and placed["cpu_kv_cache_bytes"] == half
        assert engine["kv_cache_bytes"] == half  # the engine itself holds its share of the budget
        if len(cores) >= 2:  # each engine's threads on its own slice of the cores
            share = cores[rank * len(cores) // 2 : (rank + 1) * len(cores) // 2]
            assert placed["cpu_cores"] == share and set(engine["cpu_affinity"]) <= set(share)
        # this rank's own refresh check, both iterations (the second after an update), far below what an engine
        # left on the initial policy reads after the updates
        assert len(record["own_logprob_abs_diff"]) == 2 and max(record["own_logprob_abs_diff"]) < 1e-3, record
        assert record["stale_logprob_abs_diff"] > 10 * max(record["own_logprob_abs_diff"]), record
    # two engines: each rank's engine worker is its own process, started under that rank
    pids = {seen[0]["rank_pid"], seen[1]["rank_pid"], seen[0]["engine"]["pid"], seen[1]["engine"]["pid"]}
    assert len(pids) == 4
    assert [p["rollouts_per_process"] for p in placements(out)] == [2, 2]
    metrics = read_metrics(out)
    assert [(m["iteration"], m["episodes"]) for m in metrics] == [(1, 4), (2, 8)]
    for m, own in zip(metrics, zip(*(r["own_logprob_abs_diff"] for r in seen))):
        assert m["vllm/logprob_abs_diff"] == pytest.approx(sum(own) / 2)
        assert m["vllm/logprob_abs_diff_max"] == pytest.approx(max(own))
    adapter = load_file(str(out / "policy" / "adapter_model.safetensors"))
    assert any(float(t.abs().sum()) > 0 for name, t in adapter.items() if "lora_B" in name)  # the policy moved


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_reward_model_refresh_gives_every_process_the_same_refreshed_weights(world, tmp_path):
    """The main process annotates the rollouts of both processes and fine-tunes the reward model; the other process
    receives the same weights (without the broadcast it would keep the untrained ones)."""
    out = tmp_path / "run"
    flags = ["--critic", "reward_model", "--critic_kwargs", json.dumps({"path": str(world / "model"), "max_new_tokens": 8}),
             "--feedback_prompt_template", "{prompt}", "--max_feedback_error_rate", "1.0", "--save_steps", "0",
             "--rm_refresh_every", "1", "--rm_refresh_critic", "tests.policy_optimization.po_testlib:first_and_last_words",
             "--rm_refresh_steps", "2", "--rm_refresh_batch_size", "2", "--rm_refresh_learning_rate", "1e-2"]
    launch(tmp_path, DDP, ppo_flags(world, out, *flags), ACCELERATE_USE_CPU="true")
    ranks = [json.loads((out / f"rm-rank{k}.json").read_text()) for k in (0, 1)]
    untrained = [p.detach().double().sum().item() for p in AutoModelForCausalLM.from_pretrained(world / "model").parameters()]
    assert ranks[0] == ranks[1]
    assert ranks[0] != untrained
    (metrics,) = read_metrics(out)
    assert metrics["rm_refresh/annotations_total"] == metrics["samples/batch"] == 4.0  # both processes' rollouts
