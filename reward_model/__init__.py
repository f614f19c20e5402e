"""Phase 2: the generative reward model (critique + span JSON), see reward_model/README.md.

- `reward_model.serialization`: input format, target z, label masks (shared by training and inference)
- `reward_model.train`: ``python -m reward_model.train --config configs/<dataset>/reward_model.yaml``
- `reward_model.train_config`: `RewardModelConfig` (and the other CLIs' configs in ``<x>_config.py`` beside them)
- `reward_model.inference`: `GenerativeRewardModel` (batched feedback and token rewards)
- `reward_model.evaluate`: ``python -m reward_model.evaluate`` (JSON validity, unmatched spans, token P/R/F1, span matches)
- `reward_model.merge`: ``python -m reward_model.merge`` (LoRA adapter -> merged model)
"""
