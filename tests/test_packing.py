"""packing.py on its own: padded and packed layouts turned into each other, the Layout attention works
on, and pooling of packed tokens, each against the plain padded computation on small known inputs.
The models' parity padded against packed is in test_model.py and the heads' tests."""

import pytest
import torch

from torchbert.packing import Layout, length_groups, pack, packed_layout, pad, pool_packed, unpad

SEQS = [[5, 6, 7], [8], [9, 10]]


def test_pack_lays_sequences_end_to_end_with_int32_cumulative_lengths():
    ids, cu, longest = pack(SEQS)
    assert ids.tolist() == [5, 6, 7, 8, 9, 10] and ids.dtype == torch.int64
    assert cu.tolist() == [0, 3, 4, 6] and cu.dtype == torch.int32  # what varlen attention kernels take
    assert longest == 3
    ids, cu, longest = pack([])
    assert ids.numel() == 0 and cu.tolist() == [0] and longest == 0


def test_unpad_and_pad_are_inverses_and_unpad_agrees_with_pack():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]])
    ids = torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0], [9, 10, 0, 0]])
    types = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0]])
    packed_ids, packed_types, cu, longest = unpad(ids, mask, types)
    ref_ids, ref_cu, ref_longest = pack(SEQS)
    assert torch.equal(packed_ids, ref_ids) and packed_types.tolist() == [0, 1, 1, 0, 1, 1]
    assert torch.equal(cu, ref_cu) and cu.dtype == torch.int32 and longest == ref_longest == 3  # the longest real
    features = torch.arange(12.0).view(6, 2)  # [N, F]
    block = pad(features, cu, longest, value=-1.0)  # [B, T, F]
    assert block.shape == (3, 3, 2)
    assert block[0].tolist() == [[0, 1], [2, 3], [4, 5]]
    assert block[1].tolist() == [[6, 7], [-1, -1], [-1, -1]]  # padding holds the value asked for
    assert block[2].tolist() == [[8, 9], [10, 11], [-1, -1]]
    assert torch.equal(pad(packed_ids, cu, 4), ids)  # and back: the padded ids, zeros at padding


def test_a_packed_layout_puts_each_token_in_its_row_of_the_block():
    _, cu, _ = pack(SEQS)
    layout, pos = packed_layout(cu.long(), None, 6)  # max_seqlen read from the lengths
    assert pos.tolist() == [0, 1, 2, 0, 0, 1]
    assert (layout.batch, layout.seqlen, layout.packed) == (3, 3, True)
    assert layout.index.tolist() == [0, 1, 2, 3, 6, 7]  # sequence s, position p: row s * T + p
    assert layout.key_mask.view(3, 3).tolist() == [[True, True, True], [True, False, False], [True, True, False]]
    assert layout.cu_seqlens.dtype == torch.int32
    x = torch.arange(1.0, 7.0)[:, None]  # [N, 1]
    block = layout.to_block(x)  # [B, T, 1], zeros at padding
    assert block[..., 0].tolist() == [[1, 2, 3], [4, 0, 0], [5, 6, 0]]
    assert torch.equal(layout.from_block(block), x)
    wide, _ = packed_layout(cu, 5, 6)  # a longer max_seqlen given: the block is that long
    assert wide.seqlen == 5 and wide.index.tolist() == [0, 1, 2, 5, 10, 11]


def test_sequences_all_of_one_length_are_the_block_itself():
    layout, pos = packed_layout(torch.tensor([0, 2, 4, 6], dtype=torch.int32), 2, 6)
    assert layout.index is None and layout.key_mask is None and pos.tolist() == [0, 1, 0, 1, 0, 1]
    x = torch.arange(6.0)[:, None]
    assert layout.to_block(x).shape == (3, 2, 1) and torch.equal(layout.from_block(layout.to_block(x)), x)
    padded = Layout(2, 3, None)  # padded input: the block is the tokens' own layout
    y = torch.randn(2, 3, 4)
    assert padded.from_block(y) is y and torch.equal(padded.to_block(y), y)


def test_score_bias_masks_padding_keys_and_later_keys_when_causal():
    like = torch.zeros(1, dtype=torch.bfloat16)
    low = torch.finfo(torch.bfloat16).min  # in the dtype of the scores: -10^4 is no mask in bf16 next to 10^4
    mask = torch.tensor([[True, True, False], [True, False, False]]).view(2, 1, 1, 3)
    bias, beta = Layout(2, 3, mask).score_bias(like, heads=2)
    assert beta == 1 and bias.shape == (4, 1, 3) and bias.dtype == torch.bfloat16
    assert bias[:, 0].tolist() == [[0, 0, low], [0, 0, low], [0, low, low], [0, low, low]]  # each head its sequence's
    bias, beta = Layout(2, 3, None).score_bias(like, heads=2)
    assert beta == 0 and bias.numel() == 1  # no padding: baddbmm ignores the bias
    bias, beta = Layout(2, 3, mask, causal=True).score_bias(like, heads=2)
    assert beta == 1 and bias[0].tolist() == [[0, low, low], [0, 0, low], [0, 0, 0]]


def test_pooling_packed_tokens_is_pooling_each_sequence():
    torch.manual_seed(0)
    _, cu, _ = pack(SEQS)
    features = torch.randn(6, 4) - 3  # all negative: a max that started at 0 would show
    parts = [features[0:3], features[3:4], features[4:6]]
    assert torch.equal(pool_packed(features, cu, "cls"), torch.stack([p[0] for p in parts]))
    assert torch.allclose(pool_packed(features, cu, "mean"), torch.stack([p.mean(0) for p in parts]))
    assert torch.equal(pool_packed(features, cu, "max"), torch.stack([p.amax(0) for p in parts]))
    with pytest.raises(ValueError, match="pooling must be one of cls, mean, max, got 'sum'"):
        pool_packed(features, cu, "sum")


def test_length_groups_sort_short_to_long_and_drop_nothing():
    lengths = [100, 15, 256, 14, 120]
    groups = length_groups(lengths, most=2)
    # 4 x 120^2 + 256^2 = 123,136 is less than 2 x 15^2 + 3 x 256^2 (or one group, 5 x 256^2)
    assert groups == [[3, 1, 0, 4], [2]]
    assert length_groups([], most=3) == []
    assert length_groups([7, 7, 7], most=2) == [[0, 1, 2]]  # equal lengths: one group, the fewest among equals
    # the work grows with the square of a group's longest: 4 x 40^2 + 128^2 = 22,784, not 3 x 10^2 + 2 x 128^2
    assert length_groups([8, 10, 40, 8, 128], most=2) == [[0, 3, 1, 2], [4]]
