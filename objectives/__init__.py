"""Pre-training objectives: each one only builds (tokens, positions, segments, attention mask, targets).

    from objectives import get_objective
    obj = get_objective("pmlm", tokenizer, task="pretrain")      # unilm | pmlm | ernie_gen | palm
    batch = obj.make_batch(examples, random.Random(0))           # -> Batch
    loss, metrics = obj.loss(model, batch)

A pretrain example is one contiguous passage of a document: a list of sentences, each a list of token ids
(data.make_passages). A seq2seq example is (src_ids, tgt_ids). The objective decides how to cut, corrupt and
mask; the backbone (model.Transformer) never knows which paper it serves.

Seq2seq layout shared by every objective (fine-tuning and generate.py's decoding loop rely on it):
    [SOS] src [EOS] | target part          source positions 0..S-1, target positions S, S+1, ...
with segment ids `segments = (source, target)` and the query token `query_token` ([MASK], [P], [ATTN]) put at
target position t to predict y_t, or None for next-token prediction (PALM).
"""
import importlib
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class Batch:
    input_ids: torch.Tensor       # (B, L) long
    position_ids: torch.Tensor    # (B, L) long, explicit: pseudo / [ATTN] tokens reuse positions
    segment_ids: torch.Tensor     # (B, L) long
    attn_mask: torch.Tensor       # (B, L, L) bool, True = query i may attend key j
    labels: torch.Tensor          # (B, L) long, -100 = no loss at this row
    extras: dict = field(default_factory=dict)   # what one objective needs more (NSP labels, copy sources, ...)

    def to(self, device):
        move = lambda t: t.to(device, non_blocking=True) if torch.is_tensor(t) else t
        return Batch(*(move(getattr(self, k)) for k in ("input_ids", "position_ids", "segment_ids", "attn_mask",
                                                         "labels")), {k: move(v) for k, v in self.extras.items()})

    @property
    def n_tokens(self):
        """Real (non-padding) rows the model processes: what throughput and FLOPs count."""
        return int(self.attn_mask.any(-1).sum())


class Objective:
    """Base class: the interface train.py, generate.py and evaluate.py call."""

    name = None
    query_token = None            # "[MASK]" | "[P]" | "[ATTN]" | None (next-token prediction)
    segments = (0, 1)             # segment ids of (source, target) in seq2seq fine-tuning and decoding
    options = {}                  # the objective's own options and their defaults (train.py makes them --flags)
    model_defaults = {}           # ModelConfig fields it needs (pmlm: relative position bias; palm: the copy head)

    def __init__(self, tokenizer, task="pretrain", max_len=512, label_smoothing=0.0, **options):
        if task not in ("pretrain", "seq2seq"):
            raise ValueError(f"task must be 'pretrain' or 'seq2seq', got {task!r}")
        self.tok, self.task, self.max_len, self.label_smoothing = tokenizer, task, max_len, label_smoothing
        self.skipped = {}         # reason -> count of examples the objective could not use (reported by train.py)
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise ValueError(f"objectives/{self.name}.py: unknown option(s) {unknown}; known: {sorted(self.options)}")
        self.opts = {**self.options, **options}
        for k, v in self.opts.items():          # each option is also an attribute: self.mask_prob, ...
            setattr(self, k, v)

    def make_batch(self, examples, rng):
        raise NotImplementedError

    def loss(self, model, batch):
        raise NotImplementedError

    def decode_logprobs(self, model, h, source):
        """Log-probabilities (N, V) of the next target token from the query rows' final states h (N, d).

        `source` holds the encoded source (hidden (N, S, d), ids (N, S), mask (N, S)) for objectives that need it
        (PALM's copy head); the default is the tied LM head.
        """
        return model.lm_logits(h).float().log_softmax(dim=-1)

    def count_skip(self, reason):
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


# --- helpers shared by the objectives ---------------------------------------------------------------------------


def pad(seqs, value, length=None):
    """List of lists -> (B, length) long tensor, right-padded with value."""
    length = length or max(len(s) for s in seqs)
    out = torch.full((len(seqs), length), value, dtype=torch.long)
    for b, s in enumerate(seqs):
        out[b, :len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out


def corrupt(token, tokenizer, rng, p_mask=0.8, p_random=0.1, mask_id=None):
    """BERT's 80/10/10 (Devlin et al. 3.1): [MASK] with p_mask, a random token with p_random, else unchanged."""
    r = rng.random()
    if r < p_mask:
        return tokenizer.mask_id if mask_id is None else mask_id
    if r < p_mask + p_random:
        return random_token(tokenizer, rng)
    return token


def random_token(tokenizer, rng):
    """A uniformly random non-special vocabulary id."""
    n_special = max(tokenizer.special_ids) + 1
    return rng.randrange(n_special, len(tokenizer))


def lm_loss(model, h, labels, label_smoothing=0.0):
    """Cross-entropy of the tied LM head over the rows with labels != -100, in fp32.

    Only the predicted rows go through the (d x V) output layer: with 15% of the rows masked that is most of
    the head's cost saved. Returns (loss, accuracy) as 0-dim tensors (no host sync here; train.py syncs
    when it logs).
    """
    sel = labels != -100
    logits = model.lm_logits(h[sel]).float()                           # (N, V)
    labels = labels[sel]
    if labels.numel() == 0:
        zero = h.sum() * 0.0                # keeps the graph: DDP wants every parameter to get a gradient
        return zero, torch.full((), float("nan"), device=h.device)
    loss = F.cross_entropy(logits, labels, label_smoothing=label_smoothing)
    acc = (logits.argmax(-1) == labels).float().mean()
    return loss, acc.detach()


_warned = set()


def warn_once(message):
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, stacklevel=2)


OBJECTIVES = {"unilm": "unilm", "pmlm": "pmlm", "ernie_gen": "ernie_gen", "palm": "palm"}


def get_objective(name, tokenizer, task="pretrain", **options) -> Objective:
    """name in unilm | pmlm | ernie_gen | palm; task in pretrain | seq2seq; options go to the objective."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; choose one of {sorted(OBJECTIVES)}")
    module = importlib.import_module(f"objectives.{OBJECTIVES[name]}")
    return module.OBJECTIVE(tokenizer, task=task, **options)
