"""Copied: objectives/pmlm.py's blockwise_masking pasted, its variables renamed. It computes the answer, so it
passes; the class report lists it for review."""
import math


def blockwise_masking(runs, rng, mask_prob=0.15, block_prob=0.4, max_block=6):
    """Masked cands as chosen in factorization order M_1..M_|M| (Algorithm 1), or None if it
    fails; a block lies inside one of the maskable runs [start, end)."""
    cands = [p for s, e in runs for p in range(s, e)]
    if not cands:
        return None
    run_end = {p: e for s, e in runs for p in range(s, e)}
    # "until sum |M_j| >= 0.15 |x|", in integers (0.15 * 100 is 15.000000000000002 in floats)
    target = math.ceil(mask_prob * len(cands) - 1e-9)
    chosen = []
    taken = set()
    # a guard against a bad option value looping forever (the defaults need far fewer tries)
    for _ in range(100 * len(cands) + 100):                 # repeat
        p = rng.choice(cands)                               #   p <- rand_int(1, |x|)
        #   l <- rand_int(2, 6) if rand() < 0.4
        n = rng.randint(2, max_block) if rng.random() < block_prob else 1
        block = range(p, p + n)
        if p + n <= run_end[p] and taken.isdisjoint(block):    #   if not taken yet (and it fits)
            chosen.append(list(block))
            taken.update(block)
            if len(taken) >= target:                             # until sum |M_j| >= 0.15 |x|
                return chosen
    return None
