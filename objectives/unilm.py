"""UniLM (Dong et al. 2019, section 2): four language models in one Transformer, told apart only by
the mask. docs/objectives.md ("UniLM") gives the rates, the cuts and where we differ from the
official code.

Pre-training (2.3, 2.4): each BATCH draws one LM (bidirectional 1/3, seq2seq 1/3, left-to-right
1/6, right-to-left 1/6) on [SOS] S1 [EOS] S2 [EOS] (the one-way LMs: [SOS] x [EOS]), segment ids
as LM identifiers (2.1); cloze (2.4) on 15% of the tokens, in spans, 80/10/10; NSP (2.3) for the
bidirectional LM. Fine-tuning (2.5): [SOS] src [EOS] tgt [EOS], 70% of the target masked.
Left out: whole-word masking, the NLU fine-tuning heads, the official label smoothing's eps/(V-2).
"""
import torch.nn.functional as F

from objectives import Example, Objective, cloze, cut_segments, lm_loss, option, warn_once
from objectives.masks import unilm_kinds

LM_TYPES = ("bidirectional", "left_to_right", "right_to_left", "seq2seq")
# official segment ids as LM identifiers (type_vocab_size 6): (first segment, second segment)
SEGMENT_IDS = {"bidirectional": (0, 1), "left_to_right": (2, 2), "right_to_left": (3, 3),
               "seq2seq": (4, 5)}


def choose_positions(candidates, n_pred, rng, span_prob=0.0, max_span=1):
    """Cloze positions (2.4): n_pred of the candidates -> (sorted positions, spans). From each
    start in random order, a span of 2..max_span tokens with probability span_prob, else one token;
    a span stops at a non-candidate, a chosen position or the budget."""
    allowed = set(candidates)
    order = list(candidates)
    rng.shuffle(order)
    chosen = set()
    spans = []
    for start in order:
        if len(chosen) >= n_pred:
            break
        if start in chosen:
            continue
        n = rng.randint(2, max_span) if max_span >= 2 and rng.random() < span_prob else 1
        span = []
        for p in range(start, start + n):
            if p not in allowed or p in chosen or len(chosen) + len(span) >= n_pred:
                break
            span.append(p)
        chosen.update(span)
        spans.append(span)
    return sorted(chosen), spans


class UniLMObjective(Objective):
    name = "unilm"
    query_token = "[MASK]"        # decoding's query at the next target position (2.5)
    min_passage = 2               # two non-empty segments S1 and S2
    segments = SEGMENT_IDS["seq2seq"]
    n_segments = 6                # the six segment ids above: the model needs n_segment >= 6
    tags = ("lm_type",)           # the LM drawn for the batch (LM_TYPES), no measurement

    mask_prob = option(0.15, "share of the text tokens predicted by the cloze task (2.4: 15%)")
    span_prob = option(0.2, "chance that a cloze pick is a bigram or trigram, not one token (2.4)")
    max_span = option(3, "longest cloze span in tokens (2.4: trigram)")
    max_pred = option(0, "cap on predictions per sequence (the official --max_pred); 0 = no cap")
    nsp = option(True, "add the next-sentence prediction loss to bidirectional batches (2.3)")
    nsp_negative_prob = option(0.5, "share of NSP pairs whose S2 comes from another passage (2.3)")
    lm_type = option("mix", "mix (draw per batch) or one of bidirectional, left_to_right, "
                            "right_to_left, seq2seq")
    weight_bidirectional = option(2.0, "relative frequency of the bidirectional LM (2.4: 1/3)")
    weight_seq2seq = option(2.0, "relative frequency of the seq2seq LM (2.4: 1/3)")
    weight_left_to_right = option(1.0, "relative frequency of the left-to-right LM (2.4: 1/6)")
    weight_right_to_left = option(1.0, "relative frequency of the right-to-left LM (2.4: 1/6)")
    target_mask_prob = option(0.7, "fine-tuning: share of target tokens masked (2.5: 70%)")

    def check_options(self):
        if self.lm_type not in ("mix",) + LM_TYPES:
            raise ValueError(f"objectives/unilm.py: lm_type={self.lm_type!r}; "
                             f"choose mix or one of {LM_TYPES}")
        self.weights = [float(getattr(self, f"weight_{t}")) for t in LM_TYPES]
        if min(self.weights) < 0 or sum(self.weights) <= 0:
            raise ValueError(f"objectives/unilm.py: LM weights {self.weights} "
                             "must be >= 0 with a positive sum")
        self.check_probabilities("mask_prob", "span_prob", "nsp_negative_prob", "target_mask_prob")
        self.check_room(5, "[SOS] a [EOS] b [EOS]")

    # --- the cloze task ---------------------------------------------------------------------------
    def _n_pred(self, n, p):
        # official: min(max_pred, max(1, round(n * p)))
        n_pred = max(1, round(n * p))
        return min(n_pred, self.max_pred) if self.max_pred > 0 else n_pred

    def _example(self, tokens, n_src, lm, labels_from, rng, span_prob, nsp_label=None):
        """[SOS] ... [EOS] tokens -> Example: the LM's segment ids, kinds and steps, the cloze."""
        first, second = SEGMENT_IDS[lm]
        segments = [first] * n_src + [second] * (len(tokens) - n_src)
        candidates, n_pred = labels_from
        # the cloze (2.4): n_pred of the candidates, 80/10/10
        positions, _ = choose_positions(candidates, n_pred, rng, span_prob, self.max_span)
        inputs, labels = cloze(tokens, positions, self.tok, rng)
        kind, step = unilm_kinds(lm, len(tokens), n_src)
        extras = {} if nsp_label is None else {"nsp_labels": nsp_label}
        return Example(inputs, list(range(len(tokens))), segments, labels, kind, step, extras)

    # --- pre-training: one passage -> one LM's example --------------------------------------------
    def _pair(self, s1, s2):
        """Fit [SOS] S1 [EOS] S2 [EOS] in max_len: the longer segment gives way (as BERT's)."""
        budget = self.max_len - 3
        if len(s1) + len(s2) > budget:
            warn_once(f"unilm: a segment pair is longer than max_len={self.max_len}; truncated")
            n1 = min(len(s1), max(budget - len(s2), budget // 2))
            # keep the text around the split point
            s1 = s1[len(s1) - n1:]
            s2 = s2[:budget - n1]
        sos, eos = self.tok.sos_id, self.tok.eos_id
        return [sos] + s1 + [eos] + s2 + [eos], len(s1) + 2

    def _usable(self, passage):
        """The passage without empty sentences, or None (counted) if it has fewer than 2 tokens."""
        passage = [s for s in passage if s]
        n = sum(len(s) for s in passage)
        if n < 2:
            self.count_skip("empty passage" if n == 0 else "one-token passage (needs two segments)")
            return None
        return passage

    def pretrain_example(self, passage, rng, lm="bidirectional", other=None):
        """One usable passage -> Example of the batch's LM; other: a passage for NSP negatives."""
        nsp_label = None
        if lm in ("left_to_right", "right_to_left"):
            text = self.truncate([t for s in passage for t in s], self.max_len - 2, "a passage")
            tokens = [self.tok.sos_id] + text + [self.tok.eos_id]
            n_src = len(tokens)
        else:
            s1, s2 = cut_segments(passage, rng)
            if lm == "bidirectional" and self.nsp:
                # NSP (2.3, after BERT): 0 = S2 follows S1, 1 = a suffix of another passage
                nsp_label = 0
                if other is not None and rng.random() < self.nsp_negative_prob:
                    # no longer than the S2 it replaces: the length gives no hint, and fits
                    suffix = [t for s in other[rng.randrange(len(other)):] for t in s]
                    nsp_label = 1
                    s2 = suffix[:len(s2)]
            tokens, n_src = self._pair(s1, s2)
        # every token but [SOS] and the [EOS]s may be predicted
        candidates = [i for i in range(len(tokens)) if i not in (0, n_src - 1, len(tokens) - 1)]
        n_pred = self._n_pred(len(candidates), self.mask_prob)
        return self._example(tokens, n_src, lm, (candidates, n_pred), rng, self.span_prob,
                             nsp_label)

    def make_batch(self, examples, rng, lm_type=None):
        """examples -> Batch of one LM: lm_type (argument or option), or drawn per batch (2.4)."""
        if self.task == "seq2seq":
            return super().make_batch(examples, rng)
        lm = lm_type or self.lm_type
        if lm == "mix":
            lm = rng.choices(LM_TYPES, self.weights)[0]
        passages = [p for p in map(self._usable, examples) if p is not None]
        rows = []
        for b, passage in enumerate(passages):
            # an NSP negative comes from another passage of the SAME batch
            others = [i for i in range(len(passages)) if i != b]
            nsp = lm == "bidirectional" and self.nsp and others
            other = passages[rng.choice(others)] if nsp else None
            rows.append(self.pretrain_example(passage, rng, lm, other))
        return self.collate(rows, lm_type=LM_TYPES.index(lm))

    # --- fine-tuning (2.5) ------------------------------------------------------------------------
    def seq2seq_example(self, src, tgt, rng):
        """(src, tgt) -> [SOS] src [EOS] tgt [EOS], segments 4/5, target_mask_prob of it masked."""
        src, tgt = self.fit_pair(src, tgt)
        sos, eos = self.tok.sos_id, self.tok.eos_id
        tokens = [sos] + src + [eos] + tgt + [eos]
        n_src = len(src) + 2
        # the target tokens and its final [EOS] (2.5); the source is never masked
        candidates = list(range(n_src, len(tokens)))
        n_pred = self._n_pred(len(tgt), self.target_mask_prob)
        return self._example(tokens, n_src, "seq2seq", (candidates, n_pred), rng, 0.0)

    def collate(self, rows, lm_type=LM_TYPES.index("seq2seq")):
        return super().collate(rows, lm_type=lm_type)

    # --- the loss ---------------------------------------------------------------------------------
    def loss(self, model, batch):
        loss, metrics = super().loss(model, batch)
        metrics["lm_type"] = float(batch.extras["lm_type"])
        return loss, metrics

    def compute_loss(self, model, batch):
        """Masked-token cross-entropy (2.3) + NSP for bidirectional batches, from ONE forward."""
        h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.mask)  # (B, L, d)
        loss_mlm, acc = lm_loss(model, h, batch.labels, self.label_smoothing, batch.labelled())
        loss = loss_mlm
        metrics = {"loss_mlm": loss_mlm.detach(), "acc_mlm": acc}
        if "nsp_labels" in batch.extras:
            nsp_logits = model.nsp_logits(h[:, 0]).float()          # (B, 2) at [SOS]
            loss_nsp = F.cross_entropy(nsp_logits, batch.extras["nsp_labels"])
            loss = loss + loss_nsp
            metrics["loss_nsp"] = loss_nsp.detach()
            # over the examples: a padding row (the fast layer's fixed shapes) has label -100
            nsp_labels = batch.extras["nsp_labels"]
            nsp_correct = (nsp_logits.argmax(-1) == nsp_labels) & (nsp_labels != -100)
            metrics["acc_nsp"] = nsp_correct.sum() / (nsp_labels != -100).sum()
        metrics["loss"] = loss.detach()
        return loss, metrics
