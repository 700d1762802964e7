"""Copied, then rewritten: objectives/pmlm.py's blockwise_masking pasted, its names changed, its for loop made a
while loop and its if a continue. It computes the answer, so it passes; the class report lists it for review."""
import math


def blockwise_masking(runs, rng, mask_prob=0.15, block_prob=0.4, max_block=6):
    spots = [p for s, e in runs for p in range(s, e)]
    if not spots:
        return None
    run_end = {p: e for s, e in runs for p in range(s, e)}
    target = math.ceil(mask_prob * len(spots) - 1e-9)
    out = []
    taken = set()
    tries = 0
    while tries < 100 * len(spots) + 100:
        tries += 1
        p = rng.choice(spots)
        n = rng.randint(2, max_block) if rng.random() < block_prob else 1
        block = range(p, p + n)
        if p + n > run_end[p] or not taken.isdisjoint(block):
            continue
        out.append(list(block))
        taken.update(block)
        if len(taken) >= target:
            return out
    return None
