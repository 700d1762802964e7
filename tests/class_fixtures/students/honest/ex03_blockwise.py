"""An honest exercise 3: Algorithm 1 with a list of (run start, run end) looked up per draw."""
import math


def blockwise_masking(runs, rng, mask_prob=0.15, block_prob=0.4, max_block=6):
    maskable = []
    for start, end in runs:
        maskable += [(p, end) for p in range(start, end)]
    if not maskable:
        return None
    goal = math.ceil(mask_prob * len(maskable) - 1e-9)
    taken, blocks = set(), []
    tries = 0
    while tries < 100 * len(maskable) + 100:
        tries += 1
        p, end = rng.choice(maskable)
        length = 1
        if rng.random() < block_prob:
            length = rng.randint(2, max_block)
        span = list(range(p, p + length))
        if p + length > end or any(q in taken for q in span):
            continue
        blocks.append(span)
        taken.update(span)
        if len(taken) >= goal:
            return blocks
    return None
