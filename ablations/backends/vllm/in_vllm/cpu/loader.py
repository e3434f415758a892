"""`load_format="k3_fan_in"`: random weights that make a tiny model depend on its whole context.

vLLM's `dummy` format fills every tensor with uniform ±1e-3 from the same seed, so activations
vanish and the next token depends only on the last one: layer bugs stay invisible. Here each
tensor is drawn from its own generator (seeded by the run seed and the parameter name, so the
same model gets the same weights in every engine and process):

- matrices (and stacked expert / conv weights): N(0, 1/fan_in), fan_in = last dimension;
- embeddings: N(0, 1);
- norm weights: 1 + N(0, 0.02²); biases and router score-correction biases: 0;
- KDA `A_log`: log U(1, 16); `dt_bias`: inverse softplus of exp U(log 1e-3, log 1e-1) (the FLA init).

`model_loader_extra_config={"seed": N}` picks the seed (default 0).
"""

from __future__ import annotations

import math
import zlib

import torch
from torch import nn

LOAD_FORMAT = "k3_fan_in"


def _generator(seed: int, name: str) -> torch.Generator:
    return torch.Generator().manual_seed((seed << 32) ^ zlib.crc32(name.encode()))


def init_tensor(name: str, tensor: torch.Tensor, seed: int) -> None:
    """Fill `tensor` in place by the rules above."""
    gen = _generator(seed, name)
    leaf = name.rsplit(".", 1)[-1]
    shape = tensor.shape
    if leaf == "A_log":
        values = torch.empty(shape).uniform_(1.0, 16.0, generator=gen).log()
    elif leaf == "dt_bias":
        dt = torch.empty(shape).uniform_(math.log(1e-3), math.log(1e-1), generator=gen).exp()
        values = dt + torch.log(-torch.expm1(-dt))
    elif leaf in ("bias", "e_score_correction_bias"):
        values = torch.zeros(shape)
    elif tensor.dim() == 1:
        values = 1.0 + 0.02 * torch.randn(shape, generator=gen)
    elif "embed_tokens" in name:
        values = torch.randn(shape, generator=gen)
    else:
        values = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
    with torch.no_grad():
        tensor.copy_(values.to(tensor.dtype))


def init_model(model: nn.Module, seed: int) -> None:
    """Fan-in init of every floating-point parameter of `model` (buffers such as KV scales keep their values)."""
    for name, param in model.named_parameters():
        if param.is_floating_point() and param.dim() > 0:
            init_tensor(name, param.data, seed)


def register() -> None:
    """Register the load format with vLLM (idempotent)."""
    from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER, register_model_loader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    if LOAD_FORMAT in _LOAD_FORMAT_TO_MODEL_LOADER:
        return

    class FanInDummyLoader(BaseModelLoader):
        def __init__(self, load_config):
            super().__init__(load_config)
            extra = dict(load_config.model_loader_extra_config or {})
            unknown = sorted(set(extra) - {"seed"})
            if unknown:
                raise ValueError(
                    f"load_format={LOAD_FORMAT}: unknown model_loader_extra_config key(s) {unknown}; valid: seed"
                )
            self.seed = int(extra.get("seed", 0))

        def download_model(self, model_config) -> None:
            pass

        def load_weights(self, model: nn.Module, model_config) -> None:
            init_model(model, self.seed)

    register_model_loader(LOAD_FORMAT)(FanInDummyLoader)
