r"""UniLMv2's pseudo-masked LM (Bao et al. 2020): autoencoding + partially autoregressive MLM in ONE
forward pass.

    # pre-training (sections 2.2, 3.1-3.3, 4.1)
    obj = get_objective("pmlm", tok)
    # fine-tuning (3.4); decoding queries with [P]
    obj = get_objective("pmlm", tok, task="seq2seq")
    # (train.py turns `options` into flags)
    torchrun train.py --objective pmlm

The paper's example (Table 1, Figures 4-5): x1..x6, x2 x4 x5 masked, factorization order
{4,5} -> {2}:

    input     x1 [M] x3 [M] [M] x6 | x4 x5 [P] [P] | x2 [P]  context part | block 1 | block 2
    position   1  2   3  4   5   6 |  4  5  4   5  |  2  2   appended tokens REUSE the positions
    predicts      x2     x4  x5    |        x4  x5 |     x2  [M]: L_AE (Eq. 3)   [P]: L_PAR (Eq. 6)

1. Input (2.2): "[SOS] S1 [EOS] S2 [EOS]", S1 | S2 cut from the passage at a uniformly random
   sentence boundary (inside the sentence at a random token if the passage is one sentence;
   "[SOS] S1 [EOS]" if it is one token). There is no NSP in UniLMv2, so S2 is always the true
   continuation. Segment ids S1 = 0, S2 = 1.
2. Blockwise masking (Algorithm 1): blocks of 1 token (60%) or 2..6 tokens (40%) at uniform starts,
   kept only if none of their tokens is masked yet, until >= 15% of the text tokens are masked. A
   block must lie inside S1 or inside S2: special tokens are never masked. The blocks in sampled
   order are the factorization order M_1..M_|M|.
3. Corruption (4.1): each masked slot of the context becomes [M] 80%, a random token 10%, or stays
   itself 10%.
4. Pseudo masking (3.2, Figure 4): for every block in factorization order its ORIGINAL tokens, then
   one [P] per token are appended, each with the position id and segment id of the token it stands
   for. (Any order of the appended tokens computes the same thing: the mask depends only on kinds
   and blocks, positions are explicit.)
5. Mask (3.2, Figure 5; masks.pseudo_masked): the context part (text, [M], specials) sees only
   itself; the originals of block i see the context + originals of blocks <= i; the [P]s of block i
   see the context + originals of blocks < i + the [P]s of block i. A [P] never sees its own token
   (no explicit leakage) and no context token sees an appended token (no implicit leakage through
   the context).
6. Loss (Eq. 7): L = L_AE + L_PAR, each a mean over its predicted tokens, from ONE forward pass.

The 10% kept slots (our decision). A slot that keeps its original token sits in the context part,
which every [P] sees: it would show a [P] its own answer, and show the [P]s of EARLIER blocks a
future token (implicit leakage). So a kept position leaves the PAR factorization: it gets no
original and no [P] appended and is plain context for PAR, while L_AE still predicts it exactly as
BERT does. PAR then factorizes p(x_M' | x_\M') over M' = the masked positions whose slot is [M] or
an independent uniformly random token (Eq. 5 with M' for M; a block may lose tokens, an emptied
block is dropped). Proof of no leakage: a [P] of block i sees context slots and the originals of
blocks < i; a context slot at a position of M'_{>=i} holds [M] or a token drawn independently of the
text, so nothing it sees depends on x_{M'_{>=i}}. (Setting mask_token_prob=0.9,
random_token_prob=0.1 instead never keeps a token, the other leak-free choice.) The decision to keep
is the random draw, not a token comparison: a random draw that happens to equal the original stays
in PAR, carrying no information.

Relative position bias (4.1): a model setting, T5 bidirectional buckets computed once per forward
from the POSITION ids, so a [P] gets the same bias row as the token it stands for. `model_defaults`
asks train.py to turn it on for pmlm (rel_pos_buckets=32, rel_pos_max_distance=128;
--rel_pos_buckets 0 turns it off, "- rel pos").

Seq2seq fine-tuning (3.4; official s2s-ft "pseudo-masking", mask_way v2):
    [SOS] src [EOS] | y_1 .. y_T [EOS] | [P] x (T+1)    positions 0..S-1 | S..S+T | S..S+T again
    segments 0 (source) | 1 (target) | 1 (pseudo)      target y_j = block j,
                                                       [P]_j = the pseudo of block j
y_j sees the source + y_<=j; [P]_j sees the source + y_<j + itself; the loss is on the [P]s only
(the target [EOS] included). This is generate.py's loop: [P] at position S+t predicts y_t, committed
y_t sees source + y_<=t.
Target noise (official target_mask_prob=0.5): each VISIBLE target token is, with probability
target_noise_prob, replaced by the 80/10/10 draw ([M] / random / itself), as the official code does;
labels stay clean. Where we differ: the official code also puts its draw into the pseudo slot (10%
of the queries then hold their own answer, 10% a random token); our query is always [P], as in
pre-training and decoding. Label smoothing (0.1 in the paper) is the base class's option (ours
spreads eps over all V classes; the official eps/(V-2)).

Too long / too short (counted, never a crash): passages are truncated BEFORE masking so that the
original length fits max_len (appended tokens reuse positions) and, if max_seq_len > 0, the
worst-case total length with the appended tokens fits max_seq_len; an empty passage is skipped and
counted (a one-token passage is fine: its token is masked). Seq2seq: the source is cut from the
right to fit (S + T <= max_len, and S + 2T <= max_seq_len if set), the target only if it alone does
not fit.

Left out: the pre-training code was never released, so the S1/S2 cut, the budget rules and the
kept-slot rule above are ours; whole-word masking; the NLU fine-tuning heads.
"""
import math

from objectives import (Example, Objective, corrupt, cut_segments, lm_loss, option, random_token,
                        warn_once)
from objectives.masks import CTX, ORIG, PSEUDO


# --- 2.2: "[SOS] S1 [EOS] S2 [EOS]" (the passage is cut by objectives.cut_segments, as UniLM's) ---

def pack_segments(s1, s2, sos, eos):
    """-> tokens, segment ids, and the maskable runs [start, end) of S1 and S2 (specials never
    masked)."""
    tokens = [sos] + s1 + [eos] + (s2 + [eos] if s2 else [])
    segments = [0] * (len(s1) + 2) + ([1] * (len(s2) + 1) if s2 else [])
    runs = [(1, 1 + len(s1))] + ([(len(s1) + 2, len(s1) + 2 + len(s2))] if s2 else [])
    return tokens, segments, runs


# --- Algorithm 1: blockwise masking ---------------------------------------------------------------

def blockwise_masking(runs, rng, mask_prob=0.15, block_prob=0.4, max_block=6):
    """Masked positions as blocks in factorization order M_1..M_|M| (Algorithm 1), or None if it
    fails.

    runs: the maskable stretches [start, end) of the sequence; a block must lie inside one of them.
    """
    positions = [p for s, e in runs for p in range(s, e)]
    if not positions:
        return None
    run_end = {p: e for s, e in runs for p in range(s, e)}
    # "until sum |M_j| >= 0.15 |x|"; ceil in integers:
    # 0.15 * 100 is 15.000000000000002 in floating point
    goal = math.ceil(mask_prob * len(positions) - 1e-9)
    blocks = []
    masked = set()
    # guard: with the defaults a try takes a single unmasked token with probability > 0.5, so
    # reaching the goal needs far fewer tries than this; it only stops a bad option value from
    # looping forever
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
    """Append, for each block of par_blocks in factorization order, its originals and its [P]s
    (Figure 4).

    tokens: the original sequence; context: the same after corruption ([M] slots); ae_positions: the
    slots L_AE predicts; par_blocks: lists of positions, the factorization order of L_PAR. Appended
    tokens take the position and segment of the token they stand for. -> Example, with kind / block
    (CTX, ORIG, PSEUDO; factorization step 1..|M|) for masks.pseudo_masked.
    """
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
    # 4.1: T5 relative position bias
    model_defaults = dict(rel_pos_buckets=32, rel_pos_max_distance=128)

    mask_prob = option(0.15, "stop blockwise masking once this share of the text is masked "
                             "(Algorithm 1: 15%)")
    block_prob = option(0.4, "probability that a block is 2..max_block tokens long, else one token "
                             "(Alg. 1: 0.4)")
    max_block = option(6, "longest block in tokens (Algorithm 1: 6)")
    mask_token_prob = option(0.8, "a masked slot becomes [M] with this probability (4.1: 80%)")
    random_token_prob = option(0.1, "... a random token with this one (4.1: 10%); "
                                    "it stays itself otherwise")
    max_seq_len = option(0, "bound on the whole sequence with the appended tokens; 0 = no bound")
    target_noise_prob = option(0.5, "fine-tuning: share of visible target tokens noised 80/10/10 "
                                    "(official s2s-ft)")
    par = option(True, "pre-training with the partially autoregressive part; false = L_AE only, "
                       "no block appended (4.6, Table 6 '- PAR')")

    def check_options(self):
        probabilities = ("mask_prob", "block_prob", "mask_token_prob", "random_token_prob",
                         "target_noise_prob")
        for k in probabilities:
            if not 0 <= getattr(self, k) <= 1:
                raise ValueError(f"objectives/pmlm.py: {k}={getattr(self, k)} is not a probability")
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
        """Most text tokens a passage may keep: 3 specials + n <= max_len, and, with max_seq_len,
        the worst case n + 3 + 2 * (ceil(mask_prob * n) + max_block - 1) appended tokens
        <= max_seq_len (Algorithm 1 stops at the goal, so it overshoots by at most one block minus
        one token)."""
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
        """Source [SOS] src [EOS] + target tgt [EOS]: S + T <= max_len (positions),
        S + 2T <= max_seq_len."""
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
        """Corrupt the masked slots (4.1) and append the blocks (Figure 4): blocks in factorization
        order."""
        context, kept = self._corrupt(tokens, blocks, rng)
        # a kept slot shows its own token to every [P]: it becomes PAR context
        # (docstring, "The 10% kept slots")
        par_blocks = [b for b in ([p for p in blk if p not in kept] for blk in blocks) if b]
        # the ablation without PAR (4.6, Table 6) appends nothing: the input is BERT's, the loss L_AE
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

    def corpus_tokens(self, batch):
        """Pre-training reads the context part only: the appended originals are copies of its masked
        tokens."""
        if self.task == "pretrain":
            return int((batch.kind == CTX).sum())
        return super().corpus_tokens(batch)

    def compute_loss(self, model, batch):
        """L = L_AE (at the masked context slots) + L_PAR (at the [P]s), from ONE forward pass
        (Eq. 7)."""
        h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.mask)  # (B, L, d)
        if self.task == "pretrain" and not self.par:
            loss_ae, acc_ae = lm_loss(model, h, batch.labels, self.label_smoothing,
                                      batch.labelled(CTX))
            return loss_ae, {"loss": loss_ae.detach(), "loss_ae": loss_ae.detach(), "acc_ae": acc_ae}
        par = batch.kind == PSEUDO
        # L_PAR (Eq. 6): at the [P]s
        par_labels = batch.labels.masked_fill(~par, -100)
        loss_par, acc_par = lm_loss(model, h, par_labels, self.label_smoothing,
                                    batch.labelled(PSEUDO))
        if self.task == "seq2seq":
            return loss_par, {"loss": loss_par.detach(), "loss_par": loss_par.detach(),
                              "acc_par": acc_par}
        # L_AE (Eq. 3): at the masked context slots
        ae_labels = batch.labels.masked_fill(par, -100)
        loss_ae, acc_ae = lm_loss(model, h, ae_labels, self.label_smoothing, batch.labelled(CTX, ORIG))
        loss = loss_ae + loss_par                                                       # Eq. 7
        return loss, {"loss": loss.detach(), "loss_ae": loss_ae.detach(),
                      "loss_par": loss_par.detach(), "acc_ae": acc_ae, "acc_par": acc_par}


OBJECTIVE = PMLMObjective
