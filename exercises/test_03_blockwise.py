"""Grader of exercise 3 (UniLMv2's blockwise masking, Algorithm 1): invariants on every draw, and statistics
over thousands of draws compared with objectives/pmlm.py's blockwise_masking (not one random stream: any
correct implementation passes, whatever order it draws its random numbers in).

    python -m pytest exercises/test_03_blockwise.py
"""
import collections
import math
import random
import statistics

from exercises import _grading as grading
from objectives.pmlm import blockwise_masking as project_masking

ex = grading.load("ex03_blockwise")


def random_runs(rng):
    """S1 and S2 between [SOS] S1 [EOS] S2 [EOS] (S2 may be absent): 1..100 and 0..100 tokens."""
    a, b = rng.randint(1, 100), rng.randint(0, 100)
    return [(1, 1 + a)] + ([(a + 2, a + 2 + b)] if b else [])


def check_invariants(blocks, runs, mask_prob=0.15, max_block=6):
    """Every rule that holds on EVERY draw, with a message that says which rule a draw broke."""
    n = sum(e - s for s, e in runs)
    goal = math.ceil(mask_prob * n - 1e-9)
    assert isinstance(blocks, list) and all(isinstance(b, list) and b for b in blocks), \
        f"return a list of blocks, each a non-empty list of positions; got {blocks!r:.200}"
    seen = {}
    for blk in blocks:
        assert all(isinstance(p, int) for p in blk), f"positions must be ints, got {blk}"
        assert blk == list(range(blk[0], blk[0] + len(blk))), f"block {blk} is not contiguous: a block is [p, p + l)"
        assert 1 <= len(blk) <= max_block, f"block {blk} has {len(blk)} tokens; lengths are 1 or 2..{max_block}"
        run = next(((s, e) for s, e in runs if s <= blk[0] < e), None)
        assert run is not None, f"block {blk} starts at {blk[0]}, which is not maskable (runs {runs}): special " \
                                "tokens are never masked"
        assert blk[-1] < run[1], f"block {blk} runs past the end of its run {run}: a block must lie inside S1 or " \
                                 "inside S2 (it may not cover the [EOS] between them)"
        for p in blk:
            assert p not in seen, f"blocks {seen[p]} and {blk} overlap at position {p}: Algorithm 1 keeps a block " \
                                  "only if none of its tokens is masked yet"
            seen[p] = blk
    assert len(seen) >= goal, \
        f"masked {len(seen)} of {n} maskable tokens: the goal is {mask_prob:.0%} of {n} = {mask_prob * n:.4g} " \
        f"rounded UP, {goal} tokens (Algorithm 1 repeats until the blocks cover >= {mask_prob:.0%})"
    before = len(seen) - len(blocks[-1])
    if before < goal:
        return
    # the goal was reached before the last block: say why, from what the blocks show
    assert not (before == goal and math.ceil(mask_prob * n) > goal), \
        f"masked {len(seen)} of {n} tokens: the goal ({goal}) was reached before the last block {blocks[-1]}. In " \
        f"floats {mask_prob} * {n} is {mask_prob * n!r}, which math.ceil rounds up to {math.ceil(mask_prob * n)}: " \
        "subtract a tiny amount (1e-9) before rounding up (and stop at >= goal, not > goal)"
    starts = [blk[0] for blk in blocks]
    could_end = [blk for blk in blocks if len(seen) - len(blk) < goal]
    assert not (len(blocks) >= 3 and starts == sorted(starts) and could_end), \
        f"your blocks come sorted by position ({blocks[:4]}...), but the contract returns them in the order drawn " \
        f"(the factorization order M_1..M_|M|): the last block is the one that reached the goal ({goal}), and " \
        f"{blocks[-1]} is not"
    raise AssertionError(
        f"the goal ({goal}) was already reached ({before} tokens) before the last block {blocks[-1]}: stop at the "
        "FIRST block that brings the count to >= goal (>=, not >), and return the blocks in the order drawn")


def draws(fn, n_draws, seed, runs=None, **kw):
    rng = random.Random(seed)
    out = []
    for _ in range(n_draws):
        r = runs or random_runs(rng)
        out.append((r, fn(r, rng, **kw)))
    return out


def stats(results):
    """Mean masked share, share of multi-token blocks among the kept blocks, kept length distribution."""
    ratios, lengths = [], collections.Counter()
    for runs, blocks in results:
        n = sum(e - s for s, e in runs)
        ratios.append(sum(map(len, blocks)) / n)
        lengths.update(len(b) for b in blocks)
    total = sum(lengths.values())
    return statistics.mean(ratios), {k: v / total for k, v in sorted(lengths.items())}


def test_invariants_on_every_draw():
    for runs, blocks in draws(ex.blockwise_masking, 1500, seed=0):
        assert blocks is not None, f"runs {runs}: returned None, but there is plenty to mask"
        check_invariants(blocks, runs)


def test_the_goal_in_integers():
    """100 maskable tokens at mask_prob=0.55: the goal is 55, although 0.55 * 100 is 55.00000000000001 in floats."""
    for runs, blocks in draws(ex.blockwise_masking, 300, seed=8, runs=[(1, 101)], mask_prob=0.55):
        check_invariants(blocks, runs, mask_prob=0.55)


def test_statistics_match_the_project():
    """The masked share, and the 60/40 mix of one-token and 2..6-token blocks (as kept: long ones are rejected
    more often, so a little less than 40% of the KEPT blocks are long), measured on both implementations."""
    mine, want = stats(draws(ex.blockwise_masking, 3000, 1)), stats(draws(project_masking, 3000, 2))
    assert abs(mine[0] - want[0]) < 0.01, \
        f"you mask {mine[0]:.3f} of the text on average, the project {want[0]:.3f}: stop at the first block that " \
        "reaches 15%"
    multi = 1 - mine[1].get(1, 0.0)
    multi_want = 1 - want[1].get(1, 0.0)
    assert abs(multi - multi_want) < 0.03, \
        f"{multi:.1%} of your kept blocks are 2..6 tokens long, {multi_want:.1%} of the project's: draw l from " \
        "rand_int(2, 6) with probability 0.4, else 1 (Algorithm 1)"
    for k in range(1, 7):
        assert abs(mine[1].get(k, 0) - want[1].get(k, 0)) < 0.025, \
            f"blocks of {k} tokens: {mine[1].get(k, 0):.1%} of yours, {want[1].get(k, 0):.1%} of the project's " \
            "(lengths 2..6 are uniform when a block is long)"


def test_every_position_is_masked_as_often_as_in_the_project():
    """Uniform starts over the maskable tokens: the first and last token of each run included."""
    runs = [(1, 13), (14, 20)]
    freq = lambda fn, seed: collections.Counter(p for _, blocks in draws(fn, 4000, seed, runs=runs)
                                                for blk in blocks for p in blk)
    mine, want = freq(ex.blockwise_masking, 3), freq(project_masking, 4)
    share = lambda counts, s, e: sum(counts[p] for p in range(s, e)) / (4000 * (e - s))
    for s, e in runs:                  # each run as a whole: are the starts uniform over ALL maskable positions?
        assert abs(share(mine, s, e) - share(want, s, e)) < 0.02, \
            f"the positions of run {(s, e)} are masked in {share(mine, s, e):.1%} of your draws on average, " \
            f"{share(want, s, e):.1%} of the project's (runs {runs}): is every maskable position a possible start, " \
            "p uniform over all of them (not a run first, then a position in it)?"
    for p in [p for s, e in runs for p in range(s, e)]:
        end = next(e for s, e in runs if s <= p < e)
        assert abs(mine[p] - want[p]) / 4000 < 0.04, \
            f"position {p} is masked in {mine[p] / 4000:.1%} of your draws, {want[p] / 4000:.1%} of the project's " \
            f"(runs {runs}; its run ends at {end}): the starts are right on average, but the blocks cover the " \
            f"run's positions unevenly. A block that does not fit inside its run is not kept: it is drawn again " \
            "(a new p and a new l), never shortened or moved to fit"


def test_options_are_honoured():
    for kw in (dict(mask_prob=0.5), dict(block_prob=0.0), dict(block_prob=1.0, max_block=3),
               dict(mask_prob=0.3, max_block=2)):
        results = draws(ex.blockwise_masking, 400, 5, **kw)
        for runs, blocks in results:
            check_invariants(blocks, runs, kw.get("mask_prob", 0.15), kw.get("max_block", 6))
        mine, want = stats(results), stats(draws(project_masking, 400, 6, **kw))
        assert abs(mine[0] - want[0]) < 0.02, f"options {kw}: you mask {mine[0]:.3f}, the project {want[0]:.3f}"
        assert set(mine[1]) == set(want[1]), \
            f"options {kw}: your block lengths are {sorted(mine[1])}, the project's {sorted(want[1])}"


def test_nothing_to_mask_gives_none():
    for runs in ([], [(1, 1)], [(3, 3), (5, 5)]):
        got = ex.blockwise_masking(runs, random.Random(0))
        assert got is None, f"runs {runs} hold no maskable token: return None, got {got}"


def test_one_token_runs():
    for runs, blocks in draws(ex.blockwise_masking, 200, 7, runs=[(1, 2), (3, 4)]):
        check_invariants(blocks, runs)


def test_draws_come_from_the_rng_given():
    """A seeded rng replays exactly (train.py's resume relies on it), whatever the global random state."""
    runs = [(1, 40), (41, 70)]
    random.seed(0)
    a = ex.blockwise_masking(runs, random.Random(11))
    random.seed(1)
    b = ex.blockwise_masking(runs, random.Random(11))
    assert a == b, "the same rng seed gave two different results: draw every random number from `rng`, never " \
                   "from the module `random` or numpy"
    assert any(ex.blockwise_masking(runs, random.Random(s)) != a for s in range(12, 20)), \
        "every seed gives the same blocks: the masking must be random"


def test_written_by_you():
    """The copy check (exercises/_copycheck.py): your file must not reach the answer; then one case."""
    grading.written_by_you(ex)
    check_invariants(ex.blockwise_masking([(1, 30)], random.Random(0)), [(1, 30)])
