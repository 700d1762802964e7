"""Capstone: a fifth pre-training objective, MASS, in one file (about 2 to 3 hours).

Read first: docs/how-it-fits-together.md, objectives/__init__.py (Example, Objective, the "Seq2seq layout"),
objectives/masks.py (the kinds), generate.py's module docstring, and objectives/palm.py (the closest relative:
next-token prediction on the seq2seq mask). Do exercises 2 and 4 first.
Grade it:   python -m pytest exercises/test_09_capstone_mass.py      (trains a tiny model: 7-18 s, 2 CPU cores)

MASS (Song et al., ICML 2019, "Masked Sequence to Sequence Pre-training for Language Generation") pre-trains an
encoder-decoder: it masks ONE contiguous span x^{u:v} of about half a sentence in the encoder's input, and the
decoder predicts the span left to right, seeing the encoder and the span's tokens before the one it predicts
(Figure 1: x1..x8 with x3..x6 masked; the decoder's input is the span shifted right by one, at the span's
positions). Your job is to express that on unigen's ONE backbone, with nothing but the public interface: an
objective only builds (tokens, positions, segments, kind/step, labels); the mask rule, the model, train.py,
generate.py and the leakage checker do the rest.

What the grader checks (exercises/test_09_capstone_mass.py):
- pre-training examples: the labels are one contiguous span of about span_frac of the passage, predicted in
  order; the context holds the rest of the passage, not the span's tokens;
- the project's leakage checker proves your batches leak-free, in pre-training and in fine-tuning;
- fine-tuning follows generate.py's decoding loop: the log-probabilities your training batch gives each target
  token equal those generate.score_targets gets by decoding (same layout in training and decoding);
- train.py trains it (the loss falls) and generate.py decodes a fine-tuned checkpoint.
The grader registers your class under the name "mass" while it runs.

Plan (the hints unfold: read one, try, then the next)

Hint 1 (the layout). One sequence: a context part (kind CTX: everyone sees it, it sees only itself: the
    encoder) and a target part (kind ORIG, step t for its t-th row: row t sees the context and rows <= t: the
    decoder). In fine-tuning the context is "[SOS] src [EOS]" at positions 0..S-1, segment 0, and the target
    part must look exactly like generate.py's loop without a query token (the class's query_token is None):
    the row at position S + t holds y_{t-1} ([SOS] for t = 0), segment 1, and predicts y_t; the last row
    predicts [EOS].
Hint 2 (pre-training). The context is "[SOS] passage [EOS]" with the span's tokens replaced by [MASK]: text
    token i at position i + 1. The target part is the span shifted right by one: [SOS], x_u, ..., x_{v-2}, at
    the span's own positions u + 1, ..., v (the row at the position of x_p predicts x_p), segment 1, labels
    x_u .. x_{v-1}. Draw the span with the rng you are given: k tokens, span_frac of the n text tokens
    rounded and at least 1, starting at u, uniform over the n - k + 1 places where the span fits.
Hint 3 (details). kind: CTX on every context token, ORIG on every span row; step: 0 on the context and
    1..k on the span rows (row t is factorization step t); labels: -100 on the context, the span's tokens on
    its rows. Truncate a passage to max_len - 2 tokens first (positions must fit); skip an empty one (count
    it with self.count_skip and a short reason, then return None). compute_loss: ONE forward pass of the model
    on the batch's ids, positions, segments and batch.mask (the mask described by kind and step; the model builds it
    on its device), then objectives.lm_loss on the hidden states and the labels (with self.label_smoothing)
    gives (loss, accuracy); return the loss and a dict of metrics holding the detached loss.
Why every span slot must be [MASK] (not BERT's 80/10/10): a slot that kept its token would show the decoder its
answer through the context, and the leakage checker cannot see that (it reads kinds, not token values).
"""
from objectives import Example, Objective, lm_loss, option  # noqa: F401  (the public interface)
from objectives.masks import CTX, ORIG  # noqa: F401  (the kinds you need)


class MassObjective(Objective):
    name = "mass"
    query_token = None            # next-token prediction, as generate.py decodes PALM (see Hint 1)
    segments = (0, 1)             # (context, target) segment ids, as generate.py uses them

    span_frac = option(0.5, "share of a passage's tokens in the masked span (MASS: about 50%)")

    def pretrain_example(self, passage, rng):
        """A passage (a list of sentences of token ids) -> Example: the passage with one span masked, then the
        span predicted left to right (Hint 2); None for an empty passage."""
        # TODO 1: flatten and truncate the passage; skip an empty one.
        # TODO 2: draw the span (k tokens from u) with rng.
        # TODO 3: build the Example: context part, then the span part (Hints 2 and 3).
        raise NotImplementedError("capstone: write pretrain_example (see the hints)")

    def seq2seq_example(self, src, tgt, rng):
        """(src_ids, tgt_ids) -> Example in generate.py's layout without a query token (Hint 1)."""
        # TODO 4: [SOS] src [EOS] | [SOS] y_0 .. y_{T-1}, labels y_0 .. y_{T-1} [EOS]; cut the source if
        #         len(src) + len(tgt) + 3 > self.max_len (then the target, if it alone does not fit).
        raise NotImplementedError("capstone: write seq2seq_example (see the hints)")

    def compute_loss(self, model, batch):
        """One forward pass -> (loss, metrics): cross-entropy at the rows with a label."""
        # TODO 5: Hint 3's last sentence.
        raise NotImplementedError("capstone: write compute_loss (see the hints)")


OBJECTIVE = MassObjective
