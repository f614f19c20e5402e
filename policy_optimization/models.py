"""The value function and the module that trains policy and value together.

Two designs, chosen by ``PPOConfig.value_model`` (V(x, y_<t) is read from the hidden state of the token before
y_t in both):

* ``shared_backbone`` (the default for LoRA runs; what TRL's old PPO and the paper's code did): a scalar
  `ValueHead` on the policy's own last hidden state. One forward pass gives logits and values; the value loss
  trains the head and, through the policy's LoRA adapter, the shared backbone. No second model in memory:
  the cost is one ``hidden_size + 1`` head (see benchmarks/README.md, "Value function memory"). The reference
  model stays exact (the LoRA-disabled forward never sees the head).
* ``separate``: a `ValueModel`, a second transformer backbone with its own scalar head. It keeps value
  gradients out of the policy and may be a smaller model of the same tokenizer, at the price of a second
  trainable backbone (weights, gradients, optimizer states, activations). Its backbone is any causal LM
  checkpoint (the LM head is dropped); it must share the policy's tokenizer.

`PolicyAndValue` holds both so that one optimizer and one ``accelerator.prepare`` cover them (DeepSpeed
wraps exactly one trainable module). Policy and value parameters are disjoint, so minimizing
``policy_loss + vf_coef * value_loss`` gives each the gradient of its own loss, as in Algorithm 4's two
updates (only gradient clipping sees their joint norm).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel

from text2grad.core.modeling import resolve_dtype

__all__ = ["ValueModel", "ValueHead", "PolicyAndValue", "disable_dropout"]

HEAD_FILE = "value_head.safetensors"


class ValueModel(nn.Module):
    """Transformer backbone + linear scalar head: (B, L) token ids -> (B, L) values.

    The head starts at zero, so the first values are 0 and early advantages equal the discounted rewards.
    """

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        hidden = backbone.config.hidden_size
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @property
    def config(self):
        return self.backbone.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        hidden = out.last_hidden_state
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)

    @classmethod
    def from_causal_lm(cls, model: nn.Module) -> "ValueModel":
        """Take the backbone of a causal LM object (its LM head is discarded)."""
        return cls(model.base_model)

    @classmethod
    def from_pretrained(cls, name_or_path: str, dtype: str | None = "auto") -> "ValueModel":
        """Load a backbone (hub id or directory of a causal LM or of a saved value model) and its head if saved."""
        torch_dtype = resolve_dtype(dtype)
        backbone = AutoModel.from_pretrained(name_or_path, **({"dtype": torch_dtype} if torch_dtype is not None else {}))
        model = cls(backbone)
        head = Path(name_or_path) / HEAD_FILE
        if head.is_file():
            model.head.load_state_dict(load_file(str(head)))
        return model

    def save_pretrained(self, save_directory: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Backbone via ``save_pretrained`` plus ``value_head.safetensors``; loadable with `from_pretrained`."""
        out = Path(save_directory)
        out.mkdir(parents=True, exist_ok=True)
        state = state_dict if state_dict is not None else self.state_dict()
        backbone_state = {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}
        self.backbone.save_pretrained(out, state_dict=backbone_state)
        head_state = {k[len("head."):]: v.detach().cpu().contiguous() for k, v in state.items() if k.startswith("head.")}
        save_file(head_state, str(out / HEAD_FILE))


class ValueHead(nn.Module):
    """A scalar head on the policy's own hidden states: (B, L, H) -> (B, L). Starts at zero, like `ValueModel`."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)

    def save_pretrained(self, save_directory: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """``value_head.safetensors`` only (the backbone is the policy, saved next to it)."""
        out = Path(save_directory)
        out.mkdir(parents=True, exist_ok=True)
        state = state_dict if state_dict is not None else self.state_dict()
        head_state = {k[len("head."):]: v.detach().cpu().contiguous() for k, v in state.items() if k.startswith("head.")}
        save_file(head_state, str(out / HEAD_FILE))

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> "ValueHead":
        weights = load_file(str(Path(directory) / HEAD_FILE))
        head = cls(weights["weight"].shape[1])
        head.head.load_state_dict(weights)
        return head


def _decoder(policy: nn.Module) -> nn.Module:
    """The transformer body of a causal LM (inside a PEFT wrapper too): its output is the last hidden state."""
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    if decoder is None or decoder is base:
        raise TypeError(f"{type(base).__name__} exposes no decoder (get_decoder()); use value_model: separate")
    return decoder


class PolicyAndValue(nn.Module):
    """Policy and value function in one module: returns response logits (B, T, V) and values (B, T).

    ``value_model`` is a `ValueModel` (separate backbone, its own forward pass) or a `ValueHead` (read from the
    policy's last hidden state, caught with a forward hook on the policy's decoder during the policy's pass).
    """

    def __init__(self, policy: nn.Module, value_model: "ValueModel | ValueHead") -> None:
        super().__init__()
        self.policy = policy
        self.value_model = value_model
        self.shares_backbone = isinstance(value_model, ValueHead)
        if self.shares_backbone:
            _decoder(policy)  # fail at construction, not in the first forward

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        response_length: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``input_ids`` = left-padded prompt (width P) + right-padded response (width T = response_length).

        Logits at positions P-1 .. P+T-2 predict the response tokens; the value of the state before
        response token t is read at the same position.
        """
        T = response_length
        kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, logits_to_keep=T + 1)
        if not self.shares_backbone:
            logits = self.policy(**kwargs).logits[:, :-1]
            return logits, self.value_model(input_ids, attention_mask, position_ids)[:, -T - 1 : -1]
        caught: list[torch.Tensor] = []
        hook = _decoder(self.policy).register_forward_hook(lambda module, args, output: caught.append(output[0]))
        try:
            logits = self.policy(**kwargs).logits[:, :-1]
        finally:
            hook.remove()
        return logits, self.value_model(caught[-1][:, -T - 1 : -1])


def disable_dropout(model: nn.Module) -> None:
    """Set every dropout probability to 0: PPO's ratios and KL need the same log-probs in rollout and update."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if hasattr(module, "attention_dropout") and isinstance(getattr(module, "attention_dropout"), float):
            module.attention_dropout = 0.0
    config = getattr(model, "config", None)
    for name in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout"):
        if config is not None and isinstance(getattr(config, name, None), float):
            setattr(config, name, 0.0)
