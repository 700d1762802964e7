"""MASS (Song et al., ICML 2019): masked sequence-to-sequence pre-training, on the one backbone.
The reference solution of the exercises' capstone (exercises/capstone_mass.py): a fifth objective
written with the public interface only. docs/objectives.md ("MASS") gives the decisions.

MASS masks ONE span of about half the passage in the encoder's input; the decoder predicts it left
to right. On one backbone that is one sequence with the seq2seq mask (Figure 1's example):

    [SOS] x1 x2 [M] [M] [M] [M] x7 x8 [EOS] | [SOS] x3 x4 x5  context part (CTX) | span part (ORIG)
    position   0 .. 9,  segment 0           |  3    4  5  6   at the span's own positions, segment 1
    predicts   -                            |  x3   x4 x5 x6  next-token prediction

Fine-tuning: [SOS] src [EOS] | [SOS] y (PALM's layout). Left out: BERT's 80/10/10 (a kept slot
would show the decoder its answer), MASS's separate encoder and decoder, its language embeddings.
"""
from objectives import Example, Objective, lm_loss, option
from objectives.masks import CTX, ORIG


def span_layout(tokens, u, k, sos, eos, mask, segments=(0, 1)):
    """One pre-training Example (the module docstring's picture): `tokens` with the span
    tokens[u:u+k] masked in the context, then the span part that predicts it left to right."""
    n = len(tokens)
    context = [sos] + tokens[:u] + [mask] * k + tokens[u + k:] + [eos]
    span = tokens[u:u + k]
    return Example(
        input_ids=context + [sos] + span[:-1],          # decoder input: shifted right by one
        position_ids=list(range(n + 2)) + list(range(u + 1, u + k + 1)),
        segment_ids=[segments[0]] * (n + 2) + [segments[1]] * k,
        labels=[-100] * (n + 2) + span,                 # row t predicts span token t
        kind=[CTX] * (n + 2) + [ORIG] * k,
        step=[0] * (n + 2) + list(range(1, k + 1)),    # row t sees rows <= t only
    )


class MassObjective(Objective):
    name = "mass"
    query_token = None            # next-token prediction: a token's own state predicts the next
    segments = (0, 1)             # context (encoder) / span or target (decoder)
    pretrain_reads_context_only = True      # the span part copies the masked slots

    span_frac = option(0.5, "share of a passage's tokens in the masked span (MASS: about 50%)")

    def check_options(self):
        if not 0 < self.span_frac <= 1:
            raise ValueError(f"objectives/mass.py: span_frac={self.span_frac} must be in (0, 1]")
        self.check_room(4, "[SOS] x [EOS] [SOS] y")

    # --- examples ---------------------------------------------------------------------------------
    def pretrain_example(self, passage, rng):
        """A passage -> Example: the passage with one span masked, then the span left to right."""
        # [SOS] x [EOS] must fit the position table
        tokens = self.truncate([int(t) for s in passage for t in s], self.max_len - 2, "a passage")
        if not tokens:
            self.count_skip("empty passage")
            return None
        n = len(tokens)
        k = min(n, max(1, round(self.span_frac * n)))   # the span's length
        u = rng.randint(0, n - k)                       # its start, uniform over n - k + 1 places
        tok = self.tok
        return span_layout(tokens, u, k, tok.sos_id, tok.eos_id, tok.mask_id, self.segments)

    def seq2seq_example(self, src, tgt, rng):
        """(src_ids, tgt_ids) -> [SOS] src [EOS] | [SOS] y, as generate.py decodes it."""
        src, tgt = self.fit_pair([int(t) for t in src], [int(t) for t in tgt])
        return self.next_token_example(src, [-100] * len(src), tgt)

    # --- loss -------------------------------------------------------------------------------------
    def compute_loss(self, model, batch):
        """Cross-entropy of the span (or target) tokens, each predicted from the rows before it."""
        h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.mask)
        loss, acc = lm_loss(model, h, batch.labels, self.label_smoothing, batch.labelled())
        return loss, {"loss": loss.detach(), "acc": acc}


OBJECTIVE = MassObjective
