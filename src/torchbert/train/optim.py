"""Optimizers and learning-rate schedules for BERT.

* Parameter groups: weight decay on the weight matrices and embeddings only, never on biases or
  LayerNorm parameters (as Google's BERT optimizer excludes "bias" and "LayerNorm").
* AdamW (decoupled weight decay), the optimizer of BERT's pretraining and fine-tuning.
* LAMB (You et al., 2020, "Large Batch Optimization for Deep Learning: Training BERT in 76
  minutes"): Adam's update scaled per tensor by the trust ratio ||w|| / ||update||, for batches
  in the thousands.
* Schedules are pure functions of the step: `lr_factor(name, step, ...)` multiplies the peak lr.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from ..fast.rows import SparseRows

SCHEDULES = ("constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial")
OPTIMIZERS = ("adamw", "lamb")


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: decayed (weights of Linear layers and embeddings) and not (biases, LayerNorm, and
    scalars such as a learned temperature)."""
    no_decay: set[int] = set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            # LSTMs name their biases bias_ih_l0, bias_hh_l0_reverse, ...
            if isinstance(module, nn.LayerNorm) or name == "bias" or name.endswith("_bias") or name.startswith("bias_") \
                    or p.ndim == 0:
                no_decay.add(id(p))
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if id(p) not in no_decay], "weight_decay": weight_decay},
        {"params": [p for p in params if id(p) in no_decay], "weight_decay": 0.0},
    ]


def make_optimizer(model: nn.Module, name: str = "adamw", lr: float = 1e-4, weight_decay: float = 0.01,
                   betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6) -> torch.optim.Optimizer:
    """BERT's defaults: lr 1e-4, betas (0.9, 0.999), eps 1e-6, weight decay 0.01 (paper, A.2).

    AdamW runs fused (one kernel over all tensors) on CPU and CUDA: about 4x faster than the
    per-tensor loop on CPU, which matters in fine-tuning, where a step is short and the embedding
    matrix alone is half of a small BERT's parameters."""
    groups = parameter_groups(model, weight_decay)
    if name == "adamw":
        fused = all(p.device.type in ("cpu", "cuda") for g in groups for p in g["params"])
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None)
    if name == "lamb":
        return Lamb(groups, lr=lr, betas=betas, eps=eps)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


def clipped_step(optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor], max_norm: float,
                 rows: SparseRows | None = None, loss: torch.Tensor | None = None,
                 defer: bool = False) -> bool | torch.Tensor:
    """optimizer.step() after clipping the gradients of `params` to a total norm of max_norm (none
    when max_norm <= 0), as torch.nn.utils.clip_grad_norm_ then step(). Returns False, and takes no
    step, when the gradients' norm is NaN or inf: a finite loss can still have an exploded gradient,
    which would reach the weights and every later checkpoint. With `loss` (a tensor), a NaN or inf
    loss skips the step too, read in the same host sync: the one this function makes.

    With a fused torch AdamW over plain tensors the scaling rides in its step: the step divides
    each gradient by the optimizer's grad_scale, as when AMP unscales, so clipping costs no pass of
    its own over the gradients (the word embeddings' alone are half of a small BERT's).

    `rows`: the embeddings' gradients came as rows (SparseRows): they are made dense before the
    step, their norms read from their rows only, and the rows cleared after it.

    `defer` (for GPUs, where a host read stalls the device): no host read at all; returns the
    verdict as a bool tensor on the device, and a non-finite step is skipped on the device, by the
    fused AdamW's found_inf (as under AMP's GradScaler: no update of the weights or the moments, the
    step count put back). Other optimizers, and FSDP's sharded gradients, read the verdict on the
    host as without `defer`, and return it as a tensor."""
    if rows is not None:
        rows.densify()
    try:
        return _clipped_step(optimizer, params, max_norm, rows.norms() if rows is not None else {}, loss, defer)
    finally:
        if rows is not None:
            rows.reset()


def _clipped_step(optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor], max_norm: float,
                  norms: dict[torch.Tensor, torch.Tensor], loss: torch.Tensor | None, defer: bool) -> bool | torch.Tensor:
    params = [p for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm([p.grad for p in params if p not in norms])
    if norms:
        total = torch.linalg.vector_norm(torch.stack([total, *norms.values()]))
    full = total.full_tensor() if hasattr(total, "full_tensor") else total  # FSDP: a DTensor
    finite = torch.isfinite(full) if loss is None else torch.isfinite(full) & torch.isfinite(loss)
    fused = isinstance(optimizer, torch.optim.AdamW) and all(g.get("fused") for g in optimizer.param_groups)
    fused = fused and all(type(p.grad) is torch.Tensor for p in params)  # not FSDP's DTensors
    if defer and fused:
        optimizer.found_inf = (~finite).float()  # the fused kernel skips the whole update where it is 1
        _fused_step(optimizer, total, max_norm)
        return finite
    if not bool(finite):
        return torch.tensor(False) if defer else False
    if fused:
        _fused_step(optimizer, total, max_norm)
    else:
        if max_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        optimizer.step()
    return torch.tensor(True) if defer else True


def _fused_step(optimizer: torch.optim.Optimizer, total: torch.Tensor, max_norm: float) -> None:
    """A fused AdamW step with the clipping riding in it (none when max_norm <= 0): the step divides
    each gradient by the optimizer's grad_scale, as when AMP unscales, so clipping costs no pass of
    its own over the gradients. clip_grad_norm_ multiplies by max_norm / (total + 1e-6) when that is
    below 1; dividing by 1 changes nothing."""
    if max_norm > 0:
        optimizer.grad_scale = ((total + 1e-6) / max_norm).clamp(min=1).float()
    try:
        optimizer.step()
    finally:
        optimizer.grad_scale = optimizer.found_inf = None


class Lamb(torch.optim.Optimizer):
    """LAMB: per tensor, u = m_hat / (sqrt(v_hat) + eps) + wd * w; w -= lr * (||w|| / ||u||) * u.

    The trust ratio is 1 where either norm is zero (fresh zero-initialized biases, zero updates)."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0):
        if lr <= 0 or not 0 <= betas[0] < 1 or not 0 <= betas[1] < 1 or eps <= 0:
            raise ValueError(f"invalid LAMB settings lr={lr} betas={betas} eps={eps}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"].item()
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.lerp_(p.grad, 1 - beta1)  # m = beta1 m + (1 - beta1) g
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                m_hat = m / (1 - beta1 ** t)
                v_hat = v / (1 - beta2 ** t)
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                w_norm, u_norm = p.norm(), update.norm()
                trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                p.sub_(group["lr"] * trust * update)
        return loss


def lr_factor(name: str, step: int, warmup_steps: int = 0, total_steps: int = 1, *, num_cycles: float | None = None,
              power: float = 1.0, end_factor: float = 0.0) -> float:
    """The multiplier of the peak learning rate at `step` (0-based: the factor for the update that
    follows `step` updates). Warmup is linear from 0; decays reach their end at `total_steps`.

    cosine: half a cosine to 0 (num_cycles 0.5 by default); cosine_with_restarts: num_cycles (1 by
    default) hard restarts; polynomial: (1 - progress)^power down to end_factor."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    if name == "constant":
        return 1.0
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    if name == "constant_with_warmup":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if name == "linear":
        return max(0.0, 1.0 - progress)
    if name == "cosine":
        cycles = 0.5 if num_cycles is None else num_cycles
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 2.0 * cycles * progress)))
    if name == "cosine_with_restarts":
        if progress >= 1.0:
            return 0.0
        cycles = 1.0 if num_cycles is None else num_cycles
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((cycles * progress) % 1.0))))
    # polynomial
    return (1.0 - end_factor) * (1.0 - progress) ** power + end_factor


def make_scheduler(optimizer: torch.optim.Optimizer, name: str, warmup_steps: int, total_steps: int,
                   **kwargs) -> torch.optim.lr_scheduler.LambdaLR:
    lr_factor(name, 0, warmup_steps, total_steps, **kwargs)  # fail early on a bad name
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(name, step, warmup_steps, total_steps, **kwargs))
