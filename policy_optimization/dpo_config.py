"""The configuration of `python -m policy_optimization.dpo` / `text2grad dpo` (`DPORunConfig`)."""

from __future__ import annotations

from dataclasses import dataclass

from policy_optimization.sft_config import HFRunConfig
from text2grad.core.config import config_field

__all__ = ["DPORunConfig"]


@dataclass
class DPORunConfig(HFRunConfig):
    """Direct preference optimization on chosen/rejected pairs (the paper's DPO baseline)."""

    chosen_template: str = config_field("{chosen}", "Preferred response, with {field} placeholders.")
    rejected_template: str = config_field("{rejected}", "Dispreferred response, with {field} placeholders.")
    beta: float = config_field(0.1, "DPO temperature beta (strength of the implicit KL constraint).")
    loss_type: str = config_field("sigmoid", "TRL DPO loss type (sigmoid = the original DPO loss).")
