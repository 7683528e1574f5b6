"""The non-gated MLP's activations (`Architecture.mlp_activation` where ``gated_mlp`` is False).

Torch bodies traced into the programs (on CUDA the same ops run; none has an ABI op of its own yet),
in the Hugging Face references' order of operations so that float32 programs equal them:

- ``silu``; ``gelu_tanh``: the tanh-approximated GELU (``gelu_new``, ``gelu_pytorch_tanh``);
  ``gelu``: the exact (erf) GELU;
- ``relu2``: relu(x) squared (``ReLUSquaredActivation``: Nemotron, Arcee);
- ``xielu``: xIELU (Apertus), with learned scalars per layer: the ``layers.i.mlp_act`` slot holds
  float32 [alpha_p, alpha_n, beta, eps] as the reference uses them (alpha_p = softplus(its raw
  parameter), alpha_n = beta + softplus(its raw parameter)), cast to the activations' dtype:
  ``x > 0``: alpha_p x^2 + beta x, else (expm1(min(x, eps)) - x) alpha_n + beta x.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The activations that take learned scalars, and how many (the ``layers.i.mlp_act`` slot's length).
PARAMETER_COUNTS = {"xielu": 4}
XIELU_BETA, XIELU_EPS = 0.5, -1e-6  # XIELUActivation's defaults, where a checkpoint holds no buffers


def plain_activation(name: str, x: torch.Tensor, params: torch.Tensor | None = None) -> torch.Tensor:
    """act(x) for the non-gated MLP's activation `name`; `params` its learned scalars (xielu)."""
    if name == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu(x)
    if name == "relu2":
        return torch.square(F.relu(x))
    if name == "xielu":
        return xielu(x, params)
    return F.silu(x)


def xielu(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """xIELU of `x` with `params` float32 [alpha_p, alpha_n, beta, eps] (see the module docstring)."""
    alpha_p, alpha_n, beta, eps = params.to(x.dtype).unbind()
    return torch.where(x > 0, alpha_p * x * x + beta * x, (torch.expm1(torch.minimum(x, eps)) - x) * alpha_n + beta * x)


def xielu_parameters(alpha_p: torch.Tensor, alpha_n: torch.Tensor, beta: torch.Tensor | None,
                     eps: torch.Tensor | None) -> torch.Tensor:
    """The ``mlp_act`` slot [alpha_p, alpha_n, beta, eps] float32 of a checkpoint's raw xIELU
    parameters (alpha_p, alpha_n: one value each) and its buffers (None: the defaults)."""
    beta = torch.tensor(XIELU_BETA) if beta is None else beta.float().reshape(())
    eps = torch.tensor(XIELU_EPS) if eps is None else eps.float().reshape(())
    alpha_p = F.softplus(alpha_p.float().reshape(()))
    alpha_n = beta + F.softplus(alpha_n.float().reshape(()))
    return torch.stack((alpha_p, alpha_n, beta, eps))
