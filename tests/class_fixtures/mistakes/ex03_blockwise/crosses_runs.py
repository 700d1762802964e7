"""Wrong: a block may cross the [EOS] between two runs (it is checked against the last run's end).
First message: inside S1 or inside S2"""
import math


def blockwise_masking(runs, rng, mask_prob=0.15, block_prob=0.4, max_block=6):
    positions = []
    end_of_run = {}
    for s, e in runs:
        for p in range(s, e):
            positions.append(p)
            end_of_run[p] = e
    if len(positions) == 0:
        return None
    goal = math.ceil(mask_prob * len(positions) - 1e-9)
    masked = set()
    blocks = []
    for attempt in range(100 * len(positions) + 100):
        p = rng.choice(positions)
        if rng.random() < block_prob:
            l = rng.randint(2, max_block)
        else:
            l = 1
        block = list(range(p, p + l))
        if p + l > runs[-1][1]:
            continue
        if any(q in masked for q in block):
            continue
        blocks.append(block)
        masked.update(block)
        if len(masked) >= goal:
            return blocks
    return None
