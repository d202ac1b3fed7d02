"""Parity: the one rule by which these tests call two computations of the same numbers equal.

Two computations of one function that differ only in the order of their floating-point operations
(another kernel, another thread split of a reduction, packed instead of padded tokens, ours against
transformers, ONNX Runtime against PyTorch) agree up to rounding. Each operation rounds by half a unit
in the last place, eps / 2 of the magnitude it produces (eps = torch.finfo(dtype).eps), and a network
adds up thousands of such errors: a reduction errs in proportion to the size of what it summed, and a
LayerNorm spreads one element's error over the whole vector. So the bound has a relative part, for the
large elements, and an absolute part set by the tensor's typical size, for the small ones:

    |actual - expected| <= ULPS * eps * (scale + |expected|)   element-wise

where scale is the root mean square of expected's nonzero elements (an embedding's gradient is zero in
every row of a token the batch did not hold, and those rows say nothing of the others' size): that is
torch.testing.assert_close(rtol=ULPS * eps, atol=ULPS * eps * scale), with eps from the coarser
dtype of the two sides (plain numbers, such as losses read back from JSON, are wrapped in a tensor of the
dtype they were computed in).

ULPS is measured, not guessed (TORCHBERT_PARITY_LOG below records what each call needed). On 2 AMD
EPYC cores, over the whole suite: forward comparisons need at most 82 (MiniLM's six layers against
transformers' eager attention; our fp32 model against itself in fp64 needs 62), gradients at most 202
(the fused MLM decoder's against the plain head's: sums over a 30k-word vocabulary). Small real bugs
need far more: a LayerNorm eps of 1e-6 instead of 1e-12 about 6,900, the tanh GELU for the erf one
about 100,000 (test_model.py holds both). ULPS = 1024 leaves a factor of 5 to 12 for other hosts'
kernels and thread splits (the host that filed issue 34 differed from transformers by 1.6x this one's
largest difference) and still fails those bugs.

Set TORCHBERT_PARITY_LOG=FILE to append, for every call, its caller and the ULPS it needed.
"""

import os
import sys

import numpy as np
import torch

ULPS = 1024


def _as_tensor(x, side: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (np.ndarray, np.generic)):
        return torch.from_numpy(np.asarray(x).copy())
    raise TypeError(f"assert_parity: {side} is {type(x).__name__}; give a tensor or an array (a plain number "
                    "carries no dtype: wrap it in the one it was computed in, e.g. torch.tensor(x, dtype=torch.float32))")


def scale(expected: torch.Tensor) -> float:
    """The root mean square of the nonzero elements (0 when there are none)."""
    nonzero = expected.double()[expected != 0]
    return nonzero.pow(2).mean().sqrt().item() if nonzero.numel() else 0.0


def tolerance(expected: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) of the rule for `expected`, computed in `dtype`."""
    eps = torch.finfo(dtype).eps
    return ULPS * eps, ULPS * eps * scale(expected)


def needed_ulps(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> float:
    """The smallest ULPS under which actual and expected would pass."""
    a, e = actual.double(), expected.double()
    bound = torch.finfo(dtype).eps * (scale(expected) + e.abs())
    gap = (a - e).abs()
    return float((gap / bound.clamp_min(torch.finfo(torch.float64).tiny)).max()) if gap.any() else 0.0


def assert_parity(actual, expected, msg: str | None = None) -> None:
    """Assert that `actual` equals `expected` up to the rounding of their dtype (the rule above).

    Both sides are tensors or numpy arrays of one shape, floating point; the tolerance comes from the
    coarser of their dtypes and from the scale of `expected` (the reference)."""
    a, e = _as_tensor(actual, "actual"), _as_tensor(expected, "expected")
    if not (a.is_floating_point() and e.is_floating_point()):
        raise TypeError(f"assert_parity compares floating-point numbers, not {a.dtype} and {e.dtype}; "
                        "use torch.equal for exact ones")
    if a.shape != e.shape:
        raise AssertionError(f"{msg + ': ' if msg else ''}shapes differ: {tuple(a.shape)} and {tuple(e.shape)}")
    if e.numel() == 0:
        raise AssertionError(f"{msg + ': ' if msg else ''}nothing to compare (empty tensors)")
    dtype = max(a.dtype, e.dtype, key=lambda t: torch.finfo(t).eps)
    if os.environ.get("TORCHBERT_PARITY_LOG"):
        caller = sys._getframe(1)
        with open(os.environ["TORCHBERT_PARITY_LOG"], "a") as f:
            f.write(f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}\t{caller.f_code.co_name}\t"
                    f"{needed_ulps(a, e, dtype):.1f}\t{msg or ''}\n")
    rtol, atol = tolerance(e, dtype)
    torch.testing.assert_close(a.double(), e.double(), rtol=rtol, atol=atol,
                               msg=lambda m: f"{msg + ': ' if msg else ''}not equal up to {dtype} rounding "
                                             f"(|a - e| <= {ULPS} eps (scale(e) + |e|)): {m}")
