"""The parity rule of tests/parity.py: what it passes, what it fails, what it refuses."""

import numpy as np
import pytest
import torch
from parity import ULPS, assert_parity, scale

EPS = torch.finfo(torch.float32).eps


def test_one_sum_in_two_orders_is_at_parity_and_a_real_difference_is_not():
    x = torch.randn(64, 384, generator=torch.Generator().manual_seed(0)) * 3
    w = torch.randn(384, 384, generator=torch.Generator().manual_seed(1))
    forward = x @ w
    backward = (x.flip(1) @ w.flip(0))  # the same products, summed in the other order
    assert not torch.equal(forward, backward)
    assert_parity(forward, backward)
    assert_parity(forward, (x.double() @ w.double()))  # against the exact sums: eps comes from fp32
    with pytest.raises(AssertionError, match="not equal up to torch.float32 rounding"):
        assert_parity(forward * (1 + 4 * ULPS * EPS), forward)


def test_the_bound_follows_the_scale_of_the_nonzero_elements():
    big = torch.tensor([1000.0, -1000.0, 0.0, 0.0])
    assert scale(big) == 1000.0  # the zeros (rows of tokens not in a batch) do not shrink it
    assert_parity(big + torch.tensor([0.0, 0.0, 0.5 * ULPS * EPS * 1000, 0.0]), big)  # small next to the big ones
    with pytest.raises(AssertionError):
        assert_parity(big + torch.tensor([0.0, 0.0, 2 * ULPS * EPS * 1000, 0.0]), big)
    with pytest.raises(AssertionError):  # all zeros: only zeros are at parity with them
        assert_parity(torch.tensor([1e-30]), torch.tensor([0.0]))


def test_numpy_arrays_and_their_dtypes_are_read_and_plain_numbers_refused():
    a = np.linspace(0, 1, 10, dtype=np.float32)
    assert_parity(a, torch.from_numpy(a.copy()))
    assert_parity(np.float64(0.1) + np.float64(0.2), np.float64(0.3))  # fp64 rounding
    with pytest.raises(AssertionError):  # fp64: a fp32-sized difference is not rounding there
        assert_parity(np.float64(0.3) * (1 + 1e-7), np.float64(0.3))
    with pytest.raises(TypeError, match="a plain number carries no dtype"):
        assert_parity(0.3, torch.tensor(0.3))
    with pytest.raises(TypeError, match="use torch.equal"):
        assert_parity(torch.tensor([1]), torch.tensor([1]))
    with pytest.raises(AssertionError, match="shapes differ"):
        assert_parity(torch.zeros(2), torch.zeros(3))
    with pytest.raises(AssertionError, match="nothing to compare"):
        assert_parity(torch.zeros(0), torch.zeros(0))
