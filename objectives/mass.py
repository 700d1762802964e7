"""MASS (Song et al., ICML 2019): masked sequence-to-sequence pre-training, on the one backbone.

    # pre-training on passages
    obj = get_objective("mass", tok)
    # fine-tuning; decoding = next-token prediction
    obj = get_objective("mass", tok, task="seq2seq")
    # (train.py turns `options` into flags)
    python train.py --objective mass

This file is the reference solution of the exercises' capstone (exercises/capstone_mass.py): a fifth
objective written with nothing but the public interface (Objective, Example, collate, lm_loss, the
mask rule's kinds).

MASS masks ONE contiguous span x^{u:v} of about half a sentence in the encoder's input and has the
decoder predict that span left to right, seeing only the encoder and the span's tokens before the
one it predicts (the tokens the encoder sees are hidden from the decoder's own input). The paper's
example (Figure 1), x1..x8 with the span x3..x6:

    encoder input   x1 x2 [M] [M] [M] [M] x7 x8
    decoder input            _  x3  x4  x5   at the positions of x3 x4 x5 x6 (_: a start symbol)
    decoder output          x3  x4  x5  x6

On one backbone that is one sequence with the seq2seq mask (objectives/masks.py), described per
token:

    [SOS] x1 x2 [M] [M] [M] [M] x7 x8 [EOS] | [SOS] x3 x4 x5  context part | span part
    position   0 .. 9                       |  3    4  5  6   the span part sits at the span's own
                                            |                 positions
    segment    0                            |  1              (as the decoder does in fine-tuning)
    kind       CTX                          |  ORIG, steps 1..4
                                            |                 (row t sees the context + rows <= t)
    predicts   -                            |  x3   x4 x5 x6  next-token prediction

The context is the encoder: bidirectional over the masked passage, and it never sees the span part
(CTX sees only CTX). The span part is the decoder: its row t holds the span's token t-1 (the first
row the start symbol) at the position of token t, and predicts token t. Each row is ORIG of its own
step, so it sees the context and the rows before it: UniLM's seq2seq mask, and PALM's
continuation, with the encoder's text holed.

Why this layout (the decisions):
- Next-token prediction (query_token None), not a query token: generate.py's loop then decodes a
  fine-tuned model exactly as PALM does, [SOS] y_0 .. y_{t-1} at positions S, S+1, ..., the row at
  S+t predicting y_t. Pre-training uses the same convention: the row at position p predicts the
  token at position p, its input is the token before it. The decoder's first input is [SOS], the
  symbol it starts every target with in fine-tuning and decoding, so pre-training practises that
  first step.
- The span part reuses the span's positions (as UniLMv2's [P] and ERNIE-GEN's [ATTN] do): the
  decoder knows where in the passage it writes, and the [M] run in the context says how long the
  span is (MASS's too).
- One backbone plays encoder and decoder (the seq2seq mask of UniLM): decoder row t at layer l
  attends the context's layer-l states, where MASS's separate decoder attends the encoder's last
  layer.
- Every masked slot is [MASK]. BERT's 80/10/10 replacement is left out: a slot that kept its own
  token would show the span's decoder its answer through the context (the leakage the checker cannot
  see, because it reads kinds, not token values; see "The 10% kept slots" in objectives/pmlm.py).

Span: length k = round(span_frac x n) tokens (at least 1) of the passage's n tokens (MASS sets k to
about 50% of the sentence, the best k of its study), start u uniform over the n - k + 1 places. The
passage is the data's passage (one or several sentences, data.make_passages), truncated to
max_len - 2 tokens so that [SOS] x [EOS] fits the positions.
Fine-tuning: [SOS] src [EOS] (context, positions 0..S-1, segment 0) | [SOS] y_0 .. y_{T-1}
(positions S..S+T, segment 1) predicting y_0 .. y_{T-1} [EOS]; the source is cut to fit max_len,
then the target.
Loss: cross-entropy of the tied LM head at the span rows (metrics loss, acc).
Left out: the 80/10/10 replacement (above), MASS's separate encoder and decoder, its language
embeddings for translation.
"""
from objectives import Example, Objective, lm_loss, option, warn_once
from objectives.masks import CTX, ORIG


def span_layout(tokens, u, k, sos, eos, mask, segments=(0, 1)):
    """One pre-training Example: text `tokens` with its span tokens[u:u+k] masked in the context,
    and the span part that predicts it left to right (the module docstring's picture).

    Positions: text token i sits at position i + 1 ([SOS] is 0); span token t is predicted at its
    own position.
    """
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
    # next-token prediction: the previous token's own state predicts the next
    query_token = None
    segments = (0, 1)             # context (encoder) / span or target (decoder)

    span_frac = option(0.5, "share of a passage's tokens in the masked span (MASS: about 50%)")

    def check_options(self):
        if not 0 < self.span_frac <= 1:
            raise ValueError(f"objectives/mass.py: span_frac={self.span_frac} must be in (0, 1]")
        if self.max_len < 4:
            raise ValueError(f"objectives/mass.py: max_len={self.max_len} "
                             "cannot hold [SOS] x [EOS] [SOS] y")

    # --- examples ---------------------------------------------------------------------------------

    def pretrain_example(self, passage, rng):
        """A passage -> Example: the passage with one span masked (context), then the span left to
        right."""
        tokens = [int(t) for sentence in passage for t in sentence]
        # [SOS] x [EOS] must fit the position table
        if len(tokens) > self.max_len - 2:
            warn_once(f"mass: a passage is longer than max_len - 2 = {self.max_len - 2} tokens; "
                      "truncated")
            tokens = tokens[:self.max_len - 2]
        if not tokens:
            self.count_skip("empty passage")
            return None
        n = len(tokens)
        # the span's length
        k = min(n, max(1, round(self.span_frac * n)))
        # its start, uniform over the n - k + 1 places
        u = rng.randint(0, n - k)
        tok = self.tok
        return span_layout(tokens, u, k, tok.sos_id, tok.eos_id, tok.mask_id, self.segments)

    def seq2seq_example(self, src, tgt, rng):
        """(src_ids, tgt_ids) -> [SOS] src [EOS] | [SOS] y: generate.py's loop without a query
        token."""
        src, tgt = self.fit_pair([int(t) for t in src], [int(t) for t in tgt])
        sos, eos = self.tok.sos_id, self.tok.eos_id
        S = len(src) + 2        # [SOS] src [EOS]
        T = len(tgt) + 1        # [SOS] y
        return Example(input_ids=[sos] + src + [eos] + [sos] + tgt,
                       position_ids=list(range(S + T)),         # target row t at S + t
                       segment_ids=[self.segments[0]] * S + [self.segments[1]] * T,
                       labels=[-100] * S + tgt + [eos],         # row t predicts y_t ([EOS] last)
                       kind=[CTX] * S + [ORIG] * T,
                       step=[0] * S + list(range(1, T + 1)))

    # --- loss -------------------------------------------------------------------------------------

    def corpus_tokens(self, batch):
        """Pre-training reads the context part only: the span part is a (shifted) copy of its masked
        slots."""
        if self.task == "pretrain":
            return int((batch.kind == CTX).sum())
        return super().corpus_tokens(batch)

    def compute_loss(self, model, batch):
        """Cross-entropy of the span (or target) tokens, each predicted from the rows before it."""
        # the mask is built on the device
        h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.mask)
        loss, acc = lm_loss(model, h, batch.labels, self.label_smoothing, batch.labelled())
        return loss, {"loss": loss.detach(), "acc": acc}


OBJECTIVE = MassObjective
