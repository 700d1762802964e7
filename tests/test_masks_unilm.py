"""UniLM's four masks (section 2.3, Figure 1) checked cell by cell against the paper, with padding."""
import torch

from objectives import masks


def grid(rows):
    """Rows of '1'/'0' strings -> (L, L) bool, so a test reads like the paper's picture."""
    return torch.tensor([[c == "1" for c in r.replace(" ", "")] for r in rows])


def test_paper_example_t4_attends_exactly_first_six():
    # "[SOS] t1 t2 [EOS] t3 t4 t5 [EOS]": source = [SOS] t1 t2 [EOS] (4 tokens), target = t3 t4 t5 [EOS]
    m = masks.seq2seq([4], [8], 8)[0]
    t4, t1, t2 = 5, 1, 2
    assert m[t4].tolist() == [True] * 6 + [False] * 2               # "t4 can only attend to the first six tokens"
    for t in (t1, t2):                                              # "t1 and t2 have access to the first four"
        assert m[t].tolist() == [True] * 4 + [False] * 4


def test_seq2seq_full_matrix():
    #        S  t1 t2 E | t3 t4 t5 E
    want = grid(["1111 0000",
                 "1111 0000",
                 "1111 0000",
                 "1111 0000",
                 "1111 1000",
                 "1111 1100",
                 "1111 1110",
                 "1111 1111"])
    assert torch.equal(masks.seq2seq([4], [8], 8)[0], want)


def test_bidirectional_full_matrix():
    want = grid(["11111"] * 5)                                     # Eq. 2: M is all zeros -> everything allowed
    assert torch.equal(masks.bidirectional([5], 5)[0], want)


def test_left_to_right_full_matrix():
    # "x1 x2 [MASK] x4": the [MASK] (row 3) sees x1, x2 and itself only
    want = grid(["1000",
                 "1100",
                 "1110",
                 "1111"])
    assert torch.equal(masks.left_to_right([4], 4)[0], want)


def test_right_to_left_full_matrix():
    want = grid(["1111",
                 "0111",
                 "0011",
                 "0001"])
    assert torch.equal(masks.right_to_left([4], 4)[0], want)


def test_padding_rows_and_keys_in_every_mask():
    # two examples in one batch of width 6: lengths 6 and 4 (the second has two padding positions)
    lengths, L = [6, 4], 6
    built = {
        "bidirectional": masks.bidirectional(lengths, L),
        "left_to_right": masks.left_to_right(lengths, L),
        "right_to_left": masks.right_to_left(lengths, L),
        "seq2seq": masks.seq2seq([3, 2], lengths, L),
    }
    for name, m in built.items():
        assert m.shape == (2, L, L) and m.dtype == torch.bool, name
        assert not m[1, 4:].any() and not m[1, :, 4:].any(), name   # padding rows and keys all False
        assert m[1, :4].any(-1).all(), name                          # every real row sees something
    # the padded example's real part is the unpadded mask of length 4
    assert torch.equal(built["right_to_left"][1, :4, :4], masks.right_to_left([4], 4)[0])
    assert torch.equal(built["seq2seq"][1, :4, :4], grid(["1100", "1100", "1110", "1111"]))
    # with padding the right-to-left row 3 sees only itself (not the padding to its right)
    assert built["right_to_left"][1, 3].tolist() == [False, False, False, True, False, False]


def test_seq2seq_with_empty_target_part_is_bidirectional():
    # source of the whole length: the seq2seq mask degenerates to the bidirectional one
    assert torch.equal(masks.seq2seq([5], [5], 5), masks.bidirectional([5], 5))


def test_attention_mask_from_a_start_column_is_the_full_masks_rows():
    """A decoder with a KV cache asks only for its new tokens' rows: attention_mask(kind, step, start) is the full
    mask's rows start.. (the diagonal, `same`, shifted with them)."""
    gen = torch.Generator().manual_seed(0)
    kind = torch.randint(0, 5, (3, 9), generator=gen)
    step = torch.randint(0, 4, (3, 9), generator=gen)
    full = masks.attention_mask(kind, step)
    for start in (0, 1, 5, 8):
        assert torch.equal(masks.attention_mask(kind, step, start), full[:, start:])
    assert masks.attention_mask(kind, step, 9).shape == (3, 0, 9)
