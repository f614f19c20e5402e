"""Phase 3 of Text2Grad: Text2Grad PPO (token-level rewards from natural-language feedback) and baselines.

- `PPOConfig` (ppo_config.py) and `NLGradientPPOTrainer` (trainer.py): the trainer; `python -m policy_optimization.train`.
- the reward modes (named in `text2grad.core.reward_options`) are pure functions in `text2grad.core.rewards`.
- scores.py: task score functions for the scalar/score_spread/mixed reward modes. The critics themselves (reward
  model, LLM, unit tests, reference, any ``module:Class``) come from the one registry in `text2grad.core.critics`.
- sft.py / dpo.py: TRL SFTTrainer and DPOTrainer runs (``text2grad sft`` / ``text2grad dpo``); their configs in
  sft_config.py / dpo_config.py.

Names are loaded on first use (`text2grad.core.critics.lazy_exports`), so ``import policy_optimization`` stays cheap.
"""

from __future__ import annotations

from text2grad.core.critics import lazy_exports

_EXPORTS = {
    "PPOConfig": "policy_optimization.ppo_config",
    "NLGradientPPOTrainer": "policy_optimization.trainer",
    "NonFiniteError": "policy_optimization.trainer",
    "ValueModel": "policy_optimization.models",
    "compute_score_rewards": "text2grad.core.rewards",
    "build_critic": "text2grad.core.critics",
    "CallableFeedbackSource": "text2grad.core.critics",
    "ReferenceSummaryCritic": "annotation.critics",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
