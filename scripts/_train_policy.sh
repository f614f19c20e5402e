# Shared by scripts/train_<dataset>.sh (policy phase: SFT -> Text2Grad PPO [-> DPO baseline]); sourced, not run.
# Expects NAME (the dataset: configs/NAME/{sft,ppo,dpo}.yaml, runs/NAME), DEFAULT_PHASES, and a function
# `configure` that sets what is dataset-specific. It is called once with TINY=1 or TINY=0:
#   TINY=1: set SOURCE (the tiny-mode feedback flags). TINY=0: SOURCE already points at REWARD_MODEL.
#   Both: optionally SFT_PROMPT / PPO_PROMPT / DPO_PROMPT (extra flags per phase, e.g. --use_chat_template false)
#   and PREPARE_FLAGS (prepare-data defaults, e.g. KodCode's --completions_model).
# The data, in both modes: `text2grad prepare-data` turns INPUT (the dataset's hub id, a local copy, or in tiny
# mode the generated native-layout files) into DATA_DIR (scripts/_prepare_data.sh); the phases then read
# SFT_DATASET (default DATA_DIR/sft.jsonl), DATASET (the RL prompts, DATA_DIR/rl_prompts.jsonl) and DPO_DATASET
# (DATA_DIR/preference_pairs.jsonl).
# The environment variables are documented in the per-dataset scripts.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/env.sh" >&2  # install/activate .venv (fast when up to date)
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python}"
OUT="${OUT:-runs/$NAME}"
PHASES="${PHASES:-$DEFAULT_PHASES}"
read -r -a SFT_EXTRA <<< "${SFT_ARGS:-}"
read -r -a PPO_EXTRA <<< "${PPO_ARGS:-}"
read -r -a DPO_EXTRA <<< "${DPO_ARGS:-}"
read -r -a BASELINE_EXTRA <<< "${BASELINE_ARGS:-}"   # extra flags for the scalar_rm / ppo_scalar / grpo phases
SFT_PROMPT=(); PPO_PROMPT=(); DPO_PROMPT=()

if [ "${TEXT2GRAD_TINY:-0}" = "1" ]; then
    TINY=1
    OUT="${OUT%/}/tiny"
    "$PY" -m text2grad.apps.tiny --dataset "$NAME" --output_dir "$OUT/world" --prepare false
    MODEL="$OUT/world/model"
    INPUT="${INPUT:-$OUT/world/raw}"; DATA_DIR="$OUT/world/data"   # generated native-layout rows unless INPUT is set
    DATASET=""; SFT_DATASET=""; DPO_DATASET=""
    PREPARE_ARGS="--max_new_tokens 24 ${PREPARE_ARGS:-}"   # KodCode: short completions from the tiny model
    SFT_SIZE=(--max_steps 2 --per_device_train_batch_size 4 --bf16 false --logging_steps 1 --save_steps 1000)
    PPO_SIZE=(--num_iterations 2 --batch_size 4 --num_mini_batches 2 --gradient_accumulation_steps 1 --num_ppo_epochs 1 --response_length 12
              --dtype auto --gradient_checkpointing false --progress_bar false --overwrite_output_dir true)
    DPO_SIZE=(--max_steps 2 --per_device_train_batch_size 4 --bf16 false --logging_steps 1 --save_steps 1000)
    SRM_SIZE=(--max_steps 2 --per_device_train_batch_size 4 --bf16 false --dtype auto --gradient_checkpointing false
              --logging_steps 1 --save_steps 1000 --eval_fraction 0.25)
    GRPO_SIZE=(--max_steps 2 --num_generations 2 --per_device_train_batch_size 4 --max_completion_length 12
               --bf16 false --dtype auto --use_chat_template false --save_steps 1000)
    ACCEL_PREFIX="cpu_deepspeed_"
    export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
else
    TINY=0
    MODEL="${MODEL:-meta-llama/Llama-3.1-8B-Instruct}"
    REWARD_MODEL="${REWARD_MODEL:-runs/$NAME/reward_model}"
    SOURCE=(--critic reward_model --critic_kwargs "{\"path\": \"$REWARD_MODEL\"}")
    SFT_SIZE=(); PPO_SIZE=(); DPO_SIZE=(); SRM_SIZE=(); GRPO_SIZE=()
    ACCEL_PREFIX="deepspeed_"
fi
PREPARE_FLAGS=()
configure
source scripts/_prepare_data.sh
ensure_prepared "$NAME"
DATASET="${DATASET:-$DATA_DIR/rl_prompts.jsonl}"
SFT_DATASET="${SFT_DATASET:-$DATA_DIR/sft.jsonl}"
DPO_DATASET="${DPO_DATASET:-$DATA_DIR/preference_pairs.jsonl}"

LAUNCH=("$PY" -m)
PPO_LAUNCH=("$PY" -m)
SFT_DS=()
if [ -n "${DEEPSPEED:-}" ]; then
    # One machine: configs/accelerate/<deepspeed_|cpu_deepspeed_><stage>.yaml. Several (NUM_MACHINES > 1): the
    # same command on every machine with its own MACHINE_RANK, all pointing at MAIN_PROCESS_IP (machine 0).
    ACCEL=(accelerate launch --config_file "${ACCELERATE_CONFIG:-configs/accelerate/${ACCEL_PREFIX}${DEEPSPEED}.yaml}")
    if [ "${NUM_MACHINES:-1}" -gt 1 ]; then
        ACCEL=(accelerate launch --config_file "${ACCELERATE_CONFIG:-configs/accelerate/multinode_deepspeed_${DEEPSPEED}.yaml}"
               --num_machines "$NUM_MACHINES" --machine_rank "${MACHINE_RANK:?set MACHINE_RANK: 0 on the first machine, 1, 2, ... on the others}"
               --main_process_ip "${MAIN_PROCESS_IP:?set MAIN_PROCESS_IP to the address of machine 0}"
               --main_process_port "${MAIN_PROCESS_PORT:-29500}")
    fi
    [ -n "${NUM_PROCESSES:-}" ] && ACCEL+=(--num_processes "$NUM_PROCESSES")
    LAUNCH=("${ACCEL[@]}" -m)
    PPO_LAUNCH=("${ACCEL[@]}" ${PPO_PROCESSES:+--num_processes "$PPO_PROCESSES"} -m)
    [ "$TINY" = "1" ] || SFT_DS=(--deepspeed "configs/deepspeed/${DEEPSPEED}.json")
fi
# In tiny mode (CPU) SFT and DPO run as one process and only PPO under accelerate + DeepSpeed; their own CPU
# DeepSpeed path (2 processes under the deepspeed launcher) is tested in tests/policy_optimization/test_multiprocess.py.
HF_LAUNCH=("${LAUNCH[@]}")
[ "$TINY" = "1" ] && HF_LAUNCH=("$PY" -m)

for phase in $PHASES; do
    echo "[train_$NAME] phase: $phase"
    case "$phase" in
        sft)
            "${HF_LAUNCH[@]}" policy_optimization.sft --config "configs/$NAME/sft.yaml" --model_name_or_path "$MODEL" \
                --dataset_path "$SFT_DATASET" --output_dir "$OUT/sft" "${SFT_DS[@]}" "${SFT_PROMPT[@]}" "${SFT_SIZE[@]}" "${SFT_EXTRA[@]}" ;;
        ppo)
            ADAPTER=(--adapter none); [ -d "$OUT/sft" ] && ADAPTER=(--adapter "$OUT/sft")
            "${PPO_LAUNCH[@]}" policy_optimization.train --config "configs/$NAME/ppo.yaml" --model_name_or_path "$MODEL" \
                "${ADAPTER[@]}" --dataset_path "$DATASET" --output_dir "$OUT/ppo" "${SOURCE[@]}" "${PPO_PROMPT[@]}" "${PPO_SIZE[@]}" "${PPO_EXTRA[@]}" ;;
        dpo)
            ADAPTER=(--adapter none); [ -d "$OUT/sft" ] && ADAPTER=(--adapter "$OUT/sft")
            "${HF_LAUNCH[@]}" policy_optimization.dpo --config "configs/$NAME/dpo.yaml" --model_name_or_path "$MODEL" \
                "${ADAPTER[@]}" --dataset_path "${DPO_DATASET:?set DPO_DATASET to a JSONL of question/chosen/rejected pairs}" \
                --output_dir "$OUT/dpo" "${SFT_DS[@]}" "${DPO_PROMPT[@]}" "${DPO_SIZE[@]}" "${DPO_EXTRA[@]}" ;;
        scalar_rm)   # the PPO baseline's Bradley-Terry reward model, on the same preference pairs as DPO
            "${HF_LAUNCH[@]}" reward_model.scalar --config "configs/$NAME/scalar_rm.yaml" --model_name_or_path "$MODEL" \
                --dataset_path "$DPO_DATASET" --output_dir "$OUT/scalar_rm" "${SFT_DS[@]}" "${SRM_SIZE[@]}" "${BASELINE_EXTRA[@]}" ;;
        ppo_scalar)  # the paper's PPO baseline: scalar reward from the scalar_rm phase at the last token
            ADAPTER=(--adapter none); [ -d "$OUT/sft" ] && ADAPTER=(--adapter "$OUT/sft")
            "${PPO_LAUNCH[@]}" policy_optimization.train --config "configs/$NAME/ppo.yaml" --model_name_or_path "$MODEL" \
                "${ADAPTER[@]}" --dataset_path "$DATASET" --output_dir "$OUT/ppo_scalar" --reward_mode scalar \
                --critic none --scalar_source scalar_rm --scalar_source_kwargs "{\"path\": \"$OUT/scalar_rm\"}" \
                --feedback_prompt_template "{prompt}" "${PPO_PROMPT[@]}" "${PPO_SIZE[@]}" "${BASELINE_EXTRA[@]}" ;;
        grpo)        # Text2Grad-GRPO with the same feedback source as PPO
            ADAPTER=(--adapter none); [ -d "$OUT/sft" ] && ADAPTER=(--adapter "$OUT/sft")
            "${HF_LAUNCH[@]}" policy_optimization.grpo --config "configs/$NAME/grpo.yaml" --model_name_or_path "$MODEL" \
                "${ADAPTER[@]}" --dataset_path "$DATASET" --output_dir "$OUT/grpo" "${SOURCE[@]}" "${GRPO_SIZE[@]}" "${BASELINE_EXTRA[@]}" ;;
        *) echo "[train_$NAME] unknown phase '$phase' (use sft, ppo, dpo, scalar_rm, ppo_scalar, grpo)" >&2; exit 2 ;;
    esac
done
echo "[train_$NAME] done: outputs in $OUT"
