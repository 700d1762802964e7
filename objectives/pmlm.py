r"""UniLMv2's pseudo-masked LM (Bao et al. 2020): autoencoding + partially autoregressive MLM in
ONE forward pass. docs/objectives.md ("UniLMv2") tells the steps, the decisions and why no
prediction sees its answer.

    input     x1 [M] x3 [M] [M] x6 | x4 x5 [P] [P] | x2 [P]  context part | block 1 | block 2
    position   1  2   3  4   5   6 |  4  5  4   5  |  2  2   appended tokens REUSE the positions
    predicts      x2     x4  x5    |        x4  x5 |     x2  [M]: L_AE (Eq. 3)   [P]: L_PAR (Eq. 6)

The steps, in file order: input (2.2), blockwise masking (Algorithm 1), corruption 80/10/10 (4.1),
the blocks appended (3.2, Figure 4), mask (masks.pseudo_masked), loss L_AE + L_PAR (Eq. 7). A slot
that keeps its token (the 10%) leaves the PAR factorization: it would show its answer.
Fine-tuning (3.4): [SOS] src [EOS] | y_1 .. y_T [EOS] | one [P] per target token.
Left out: whole-word masking, the NLU heads. The pre-training code was never released: the S1/S2
cut, the length budgets and the kept-slot rule are ours.
"""
import math

from objectives import Example, Objective, corrupt, cut_segments, option, random_token, warn_once
from objectives.masks import CTX, ORIG, PSEUDO


# --- 2.2: "[SOS] S1 [EOS] S2 [EOS]" (the passage is cut by objectives.cut_segments, as UniLM's) ---
def pack_segments(s1, s2, sos, eos):
    """-> tokens, segment ids, the maskable runs [start, end) of S1 and S2 (never a special)."""
    tokens = [sos] + s1 + [eos] + (s2 + [eos] if s2 else [])
    segments = [0] * (len(s1) + 2) + ([1] * (len(s2) + 1) if s2 else [])
    runs = [(1, 1 + len(s1))] + ([(len(s1) + 2, len(s1) + 2 + len(s2))] if s2 else [])
    return tokens, segments, runs


# --- Algorithm 1: blockwise masking ---------------------------------------------------------------
def blockwise_masking(runs, rng, mask_prob=0.15, block_prob=0.4, max_block=6):
    """Masked positions as blocks in factorization order M_1..M_|M| (Algorithm 1), or None if it
    fails; a block lies inside one of the maskable runs [start, end)."""
    positions = [p for s, e in runs for p in range(s, e)]
    if not positions:
        return None
    run_end = {p: e for s, e in runs for p in range(s, e)}
    # "until sum |M_j| >= 0.15 |x|", in integers (0.55 * 100 is 55.00000000000001 in floats)
    goal = math.ceil(mask_prob * len(positions) - 1e-9)
    blocks = []
    masked = set()
    # a guard against a bad option value looping forever (the defaults need far fewer tries)
    for _ in range(100 * len(positions) + 100):                 # repeat
        p = rng.choice(positions)                               #   p <- rand_int(1, |x|)
        #   l <- rand_int(2, 6) if rand() < 0.4
        n = rng.randint(2, max_block) if rng.random() < block_prob else 1
        block = range(p, p + n)
        if p + n <= run_end[p] and masked.isdisjoint(block):    #   if not masked yet (and it fits)
            blocks.append(list(block))
            masked.update(block)
            if len(masked) >= goal:                             # until sum |M_j| >= 0.15 |x|
                return blocks
    return None


# --- 3.2, Figure 4: the pseudo-masked input -------------------------------------------------------
def pseudo_masked_layout(tokens, segments, context, ae_positions, par_blocks, pseudo_id):
    """The context (tokens after corruption), then for each block of par_blocks (L_PAR's order) its
    originals and [P]s at their token's position and segment (Figure 4); L_AE at ae_positions."""
    n = len(tokens)
    out = Example(input_ids=list(context), position_ids=list(range(n)), segment_ids=list(segments),
                  labels=[-100] * n, kind=[CTX] * n, step=[0] * n)
    for p in ae_positions:
        out.labels[p] = tokens[p]                       # Eq. 3: predicted at the [M] slot
    for r, blk in enumerate(par_blocks, start=1):
        for kind in (ORIG, PSEUDO):
            for p in blk:
                out.input_ids.append(tokens[p] if kind == ORIG else pseudo_id)
                out.position_ids.append(p)              # the SAME position as the token
                out.segment_ids.append(segments[p])
                # Eq. 5: predicted at its [P]
                out.labels.append(tokens[p] if kind == PSEUDO else -100)
                out.kind.append(kind)
                out.step.append(r)
    return out


class PMLMObjective(Objective):
    name = "pmlm"
    query_token = "[P]"
    segments = (0, 1)             # seq2seq: source 0, target and pseudo 1 (official s2s-ft)
    model_defaults = dict(rel_pos_buckets=32, rel_pos_max_distance=128)    # 4.1: T5's relative bias
    pretrain_reads_context_only = True      # the appended originals copy masked slots

    mask_prob = option(0.15, "share of the text that blockwise masking masks (Algorithm 1: 15%)")
    block_prob = option(0.4, "probability that a block is 2..max_block tokens long, else one token "
                             "(Alg. 1: 0.4)")
    max_block = option(6, "longest block in tokens (Algorithm 1: 6)")
    mask_token_prob = option(0.8, "a masked slot becomes [M] with this probability (4.1: 80%)")
    random_token_prob = option(0.1, "... a random token with this one (4.1: 10%), else itself")
    max_seq_len = option(0, "bound on the whole sequence with the appended tokens; 0 = no bound")
    target_noise_prob = option(0.5, "fine-tuning: share of visible target tokens noised 80/10/10 "
                                    "(official s2s-ft)")
    par = option(True, "pre-training with the partially autoregressive part; false = L_AE only, "
                       "no block appended (4.6, Table 6 '- PAR')")

    def check_options(self):
        self.check_probabilities("mask_prob", "block_prob", "mask_token_prob", "random_token_prob",
                                 "target_noise_prob")
        if self.mask_token_prob + self.random_token_prob > 1:
            raise ValueError("objectives/pmlm.py: mask_token_prob + random_token_prob must be <= 1")
        if self.mask_prob <= 0 or self.max_block < 2:
            raise ValueError(f"objectives/pmlm.py: need mask_prob > 0 and max_block >= 2, "
                             f"got {self.mask_prob}, {self.max_block}")
        if self.max_len < 4 or self.max_seq_len and self.max_seq_len < 6:
            raise ValueError(f"objectives/pmlm.py: max_len={self.max_len} (needs >= 4) or "
                             f"max_seq_len={self.max_seq_len} (needs 0 = no bound, or >= 6) "
                             "too small for [SOS] x [EOS] plus one masked token")
        self.text_budget = self._text_budget()

    # --- lengths: positions are reused, so only the ORIGINAL length must fit max_len --------------
    def _text_budget(self):
        """Most text tokens a passage may keep: 3 specials + n <= max_len and, with max_seq_len,
        the worst case of Algorithm 1 (one block past its goal) fits it."""
        n = self.max_len - 3
        while self.max_seq_len and n > 0:
            worst_case = n + 3 + 2 * min(n, math.ceil(self.mask_prob * n) + self.max_block - 1)
            if worst_case <= self.max_seq_len:
                break
            n -= 1
        if n < 1:
            raise ValueError(f"objectives/pmlm.py: max_len={self.max_len}, "
                             f"max_seq_len={self.max_seq_len} leave "
                             "no room for a single text token")
        return n

    def _truncate(self, sentences):
        sentences = [s for s in sentences if s]
        if sum(map(len, sentences)) <= self.text_budget:
            return sentences
        warn_once(f"pmlm: passages longer than {self.text_budget} tokens are truncated "
                  f"(max_len={self.max_len}, max_seq_len={self.max_seq_len})")
        kept = []
        room = self.text_budget
        for s in sentences:
            if room > 0:
                kept.append(s[:room])
                room -= len(kept[-1])
        return kept

    def _fit_seq2seq(self, src, tgt):
        """[SOS] src [EOS] + tgt [EOS]: S + T <= max_len (positions), S + 2T <= max_seq_len."""
        total = self.max_seq_len or float("inf")
        # target tokens without [EOS]
        t_max = int(min(self.max_len - 2, (total - 2) // 2)) - 1
        if len(tgt) > t_max:
            warn_once(f"pmlm: targets longer than {t_max} tokens are truncated "
                      f"(max_len={self.max_len})")
            tgt = tgt[:t_max]
        # source tokens without specials
        s_max = int(min(self.max_len - 3 - len(tgt), total - 4 - 2 * len(tgt)))
        if len(src) > s_max:
            warn_once(f"pmlm: a source + target is longer than max_len={self.max_len}; "
                      "source truncated")
            src = src[:s_max]
        return src, tgt

    # --- one example ------------------------------------------------------------------------------
    def _corrupt(self, tokens, blocks, rng):
        """4.1: 80% [M] / 10% random / 10% kept -> (context, positions that kept their token)."""
        context = list(tokens)
        kept = set()
        for blk in blocks:
            for p in blk:
                r = rng.random()
                if r < self.mask_token_prob:
                    context[p] = self.tok.mask_id
                elif r < self.mask_token_prob + self.random_token_prob:
                    context[p] = random_token(self.tok, rng)  # drawn independently of the original
                else:
                    kept.add(p)
        return context, kept

    def pretrain_example(self, passage, rng):
        sentences = self._truncate(passage)
        if not sentences:
            self.count_skip("empty passage")
            return None
        s1, s2 = cut_segments(sentences, rng)
        tokens, segments, runs = pack_segments(s1, s2, self.tok.sos_id, self.tok.eos_id)
        blocks = blockwise_masking(runs, rng, self.mask_prob, self.block_prob, self.max_block)
        if blocks is None:
            self.count_skip("blockwise masking did not reach mask_prob")
            return None
        return self.mask_blocks(tokens, segments, blocks, rng)

    def mask_blocks(self, tokens, segments, blocks, rng):
        """Corrupt the masked slots (4.1), append the blocks in factorization order (Figure 4)."""
        context, kept = self._corrupt(tokens, blocks, rng)
        # a kept slot shows its own token to every [P]: it becomes PAR context (docs/objectives.md)
        par_blocks = [b for b in ([p for p in blk if p not in kept] for blk in blocks) if b]
        # the ablation without PAR (4.6, Table 6) appends nothing: BERT's input, the loss L_AE
        par_blocks = par_blocks if self.par else []
        ae_positions = [p for blk in blocks for p in blk]
        return pseudo_masked_layout(tokens, segments, context, ae_positions, par_blocks,
                                    self.tok.pseudo_id)

    def seq2seq_example(self, src, tgt, rng):
        """3.4: [SOS] src [EOS] | targets (noised) | one [P] per target, target j and [P]_j forming
        block j."""
        src, tgt = self._fit_seq2seq(list(src), list(tgt))
        source = [self.tok.sos_id] + src + [self.tok.eos_id]
        target = tgt + [self.tok.eos_id]
        S = len(source)
        T = len(target)
        visible = [corrupt(y, self.tok, rng, self.mask_token_prob, self.random_token_prob)
                   if rng.random() < self.target_noise_prob else y for y in target]
        steps = list(range(1, T + 1))
        return Example(
            input_ids=source + visible + [self.tok.pseudo_id] * T,
            position_ids=list(range(S)) + list(range(S, S + T)) * 2,  # [P]_j shares y_j's position
            segment_ids=[self.segments[0]] * S + [self.segments[1]] * 2 * T,
            labels=[-100] * (S + T) + target,                         # loss on the [P]s only
            kind=[CTX] * S + [ORIG] * T + [PSEUDO] * T,
            step=[0] * S + steps + steps,
        )

    # --- Eq. 7 ------------------------------------------------------------------------------------
    def compute_loss(self, model, batch):
        """L = L_AE (masked context slots) + L_PAR (the [P]s), from ONE forward pass (Eq. 7)."""
        h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.mask)  # (B, L, d)
        losses, accs = {}, {}
        if self.task == "pretrain":
            # L_AE (Eq. 3): at the masked context slots
            losses["loss_ae"], accs["acc_ae"] = self.lm_loss_at(model, h, batch, CTX, ORIG)
        if self.task == "seq2seq" or self.par:
            # L_PAR (Eq. 6): at the [P]s (none appended without PAR, 4.6)
            losses["loss_par"], accs["acc_par"] = self.lm_loss_at(model, h, batch, PSEUDO)
        loss = sum(losses.values())                                                     # Eq. 7
        return loss, {"loss": loss.detach(), **{k: v.detach() for k, v in losses.items()}, **accs}
