"""Pre-training objectives: each one only builds (tokens, positions, segments, attention mask,
targets). docs/objectives.md ("The interface") and docs/how-it-fits-together.md ("Contracts")
describe the interface in full: obj = get_objective("pmlm", tokenizer, task="pretrain") (or unilm,
ernie_gen, palm, mass), then obj.make_batch(examples, rng) -> Batch, obj.loss(model, batch).

Every objective has the same shape: pretrain_example(passage, rng) and seq2seq_example(src, tgt,
rng) give an Example or None (skipped and counted); make_batch pads them through `collate` into a
Batch; compute_loss(model, batch) is one forward pass. Options are class attributes (`option`);
hooks tell train.py what it needs, so it names no objective. Seq2seq layout: [SOS] src [EOS] at
positions 0..S-1, then the target part at S, S+1, ...; `query_token` at S+t predicts y_t.
"""
import random
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from objectives import masks
from objectives.masks import CTX, ORIG, PAD


# --- What an objective produces: Examples, then a Batch -------------------------------------------
@dataclass
class Example:
    """One sequence on its way to a batch: per-token lists of one length, and per-example extras."""
    input_ids: list
    position_ids: list            # explicit: [P] and [ATTN] reuse the position of their token
    segment_ids: list
    labels: list                  # the token to predict at this row, -100 = none
    kind: list                    # masks.CTX / ORIG / PSEUDO / SPAN: the mask's description ...
    step: list                    # ... and the factorization step of each token (masks.may_attend)
    extras: dict = field(default_factory=dict)      # per-example numbers (UniLM's NSP label)

    def __len__(self):
        return len(self.input_ids)


@dataclass
class Batch:
    """Examples padded to (B, L); the attention mask is built from kind and step where the batch
    is. extras: lm_type (UniLM: index in LM_TYPES), nsp_labels (UniLM: (B,) 1 = S2 from another
    passage), stage (PALM: 1 or 2), source_width (PALM: S, where continuations start)."""
    input_ids: torch.Tensor       # (B, L) long
    position_ids: torch.Tensor    # (B, L) long
    segment_ids: torch.Tensor     # (B, L) long
    labels: torch.Tensor          # (B, L) long, -100 = no loss at this row
    kind: torch.Tensor            # (B, L) long, masks.PAD at padding
    step: torch.Tensor            # (B, L) long
    extras: dict = field(default_factory=dict)
    n_labels: dict = None         # kind -> rows with a label (counted by collate), or None

    @property
    def attn_mask(self):
        """(B, L, L) bool, True = query i may attend key j: the one rule of objectives/masks.py."""
        return masks.attention_mask(self.kind, self.step)

    @property
    def mask(self):
        """The mask described (kind, step): what objectives hand the model (built on its device)."""
        return masks.MaskSpec(self.kind, self.step)

    def labels_at(self, *kinds):
        """The labels at the rows of these kinds only (-100 elsewhere): one loss term's targets,
        wherever the layout puts its rows."""
        keep = self.kind == kinds[0]
        for k in kinds[1:]:
            keep |= self.kind == k
        return self.labels.masked_fill(~keep, -100)

    def labelled(self, *kinds):
        """How many rows of these kinds (any kind if none is named) carry a label, or None: counted
        on the CPU, so lm_loss need not wait for the GPU to count them."""
        if self.n_labels is None:
            return None
        return sum(n for k, n in self.n_labels.items() if not kinds or k in kinds)

    def to(self, device):
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self):
        # a DataLoader's pin_memory: batches from worker processes, copied to the GPU asynchronously
        return self._map(lambda t: t.pin_memory())

    def _map(self, fn):
        """A new Batch with fn applied to every tensor (extras included)."""
        apply = lambda t: fn(t) if torch.is_tensor(t) else t
        names = ("input_ids", "position_ids", "segment_ids", "labels", "kind", "step")
        tensors = [apply(getattr(self, k)) for k in names]
        extras = {k: apply(v) for k, v in self.extras.items()}
        return Batch(*tensors, extras, self.n_labels)

    def __len__(self):
        return self.input_ids.size(0)

    @property
    def n_tokens(self):
        """Real (non-padding) rows the model processes: what throughput and FLOPs count."""
        return int((self.kind != PAD).sum())


def pad(seqs, value, length=None):
    """List of lists -> (B, length) long tensor, right-padded with value."""
    length = length or max((len(s) for s in seqs), default=0)
    out = torch.full((len(seqs), length), value, dtype=torch.long)
    for b, s in enumerate(seqs):
        out[b, :len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out


def leading_context(example):
    """How many tokens at the start of an example are context (CTX): its source part."""
    return next((i for i, k in enumerate(example.kind) if k != CTX), len(example))


# --- Options: declared on the objective's class; train.py makes each a --flag ---------------------
@dataclass
class Option:
    """An objective's setting: a default and a one-line description (train.py --help prints it)."""
    default: object
    help: str


option = Option


# --- The interface train.py, generate.py and evaluate.py call -------------------------------------
class Objective:
    """Base class: the one shape of every objective (see the module docstring)."""

    name = None
    query_token = None            # "[MASK]" | "[P]" | "[ATTN]" | None (next-token prediction)
    segments = (0, 1)             # segment ids of (source, target) in fine-tuning and decoding
    model_defaults = {}           # ModelConfig fields it needs (pmlm: relative bias; palm: copy)
    align_source = False          # collate pads every context part to one width (PALM's layout)
    n_segments = 2                # segment ids used: the model needs ModelConfig.n_segment >= this
    pad_multiple = 1              # collate pads the batch length up to a multiple of this
    tags = ()                     # metric keys that say what a batch was (PALM's stage), no score
    min_passage = 1               # the shortest pre-training passage (tokens) giving an example
    # pre-training reads the context part only: PMLM's originals, MASS's span part copy its slots
    pretrain_reads_context_only = False

    def __init__(self, tokenizer, task="pretrain", max_len=512, label_smoothing=0.0, **options):
        if task not in ("pretrain", "seq2seq"):
            raise ValueError(f"task must be 'pretrain' or 'seq2seq', got {task!r}")
        self.tok = tokenizer
        self.task = task
        self.max_len = max_len
        self.label_smoothing = label_smoothing
        self.skipped = {}         # reason -> count of examples it could not use (train.py says)
        table = self.option_table()
        unknown = sorted(set(options) - set(table))
        if unknown:
            raise ValueError(f"objectives/{self.name}.py: unknown option(s) {unknown}; "
                             f"known: {sorted(table)}")
        # each option becomes an instance attribute: self.mask_prob, ...
        for key, opt in table.items():
            setattr(self, key, options.get(key, opt.default))
        self.check_options()

    @classmethod
    def option_table(cls):
        """{name: Option} of every option declared on the class and its bases."""
        table = {}
        for klass in reversed(cls.__mro__):
            table.update({k: v for k, v in vars(klass).items() if isinstance(v, Option)})
        return table

    @property
    def opts(self):
        """The current option values, by name (what train.py stores in a checkpoint)."""
        return {key: getattr(self, key) for key in self.option_table()}

    # --- hooks a subclass may define --------------------------------------------------------------
    def check_options(self):
        """Raise ValueError for an option value that makes no sense (the end of __init__)."""

    def check_probabilities(self, *keys):
        """For check_options: a ValueError naming the first of these options outside [0, 1]."""
        for k in keys:
            if not 0 <= getattr(self, k) <= 1:
                raise ValueError(f"objectives/{self.name}.py: {k}={getattr(self, k)} is not a "
                                 "probability (in [0, 1])")

    def check_room(self, least, layout):
        """For check_options: a ValueError where max_len is below `least`, the shortest layout."""
        if self.max_len < least:
            raise ValueError(f"objectives/{self.name}.py: max_len={self.max_len} "
                             f"cannot hold {layout}")

    def set_step(self, step, total_steps):
        """train.py calls this before building the batch of step `step` (0-based) of total_steps."""

    @classmethod
    def prepare(cls, options, tokenizer, examples, cache_dir, task="pretrain", progress=True):
        """Work on the training examples before the objective is built (ERNIE-GEN's span vocabulary;
        cache_dir keyed by corpus and tokenizer) -> the options to build it with (checkpointed)."""
        return options

    def heads(self, model):
        """The parameters of the output heads beside the tied LM head (NSP, copy): train.LossModule
        adds them to every loss times zero, so that DDP sees a gradient for every parameter."""
        return [p for name, p in model.named_parameters() if name.split(".")[0].endswith("_head")]

    # --- examples -> batch ------------------------------------------------------------------------
    def pretrain_example(self, passage, rng):
        raise NotImplementedError

    def seq2seq_example(self, src, tgt, rng):
        raise NotImplementedError

    def fit_pair(self, src, tgt):
        """Fit a seq2seq pair in max_len positions beside three special tokens ([SOS] src [EOS] tgt
        and one more [EOS] or [SOS]): a target that cannot fit alone is cut, then the source."""
        room = self.max_len - 3
        tgt = self.truncate(list(tgt), room, "a target")
        return self.truncate(list(src), room - len(tgt), "a source + target", self.max_len), tgt

    def next_token_example(self, ctx, ctx_labels, cont):
        """PALM's and MASS's layout: [SOS] ctx [EOS] (context, bidirectional), then unless cont is
        None [SOS] y (causal): row t holds y_t-1 ([SOS] first) and predicts y_t ([EOS] last)."""
        sos, eos = self.tok.sos_id, self.tok.eos_id
        S = len(ctx) + 2
        ex = Example(input_ids=[sos] + ctx + [eos], position_ids=list(range(S)),
                     segment_ids=[self.segments[0]] * S, labels=[-100] + ctx_labels + [-100],
                     kind=[CTX] * S, step=[0] * S)
        if cont is not None:
            T = len(cont) + 1
            ex.input_ids += [sos] + cont
            ex.position_ids += list(range(S, S + T))
            ex.segment_ids += [self.segments[1]] * T
            ex.labels += cont + [eos]
            # the seq2seq mask: continuation row t sees the context and rows <= t
            ex.kind += [ORIG] * T
            ex.step += list(range(1, T + 1))
        return ex

    def truncate(self, ids, room, what, limit=None):
        """ids cut to their first `room` tokens; the first `what` longer than `limit` (room)
        warns."""
        if len(ids) > room:
            warn_once(f"{self.name}: {what} is longer than {limit or room} tokens; truncated")
        return ids[:room]

    def make_batch(self, examples, rng):
        """Pretrain passages or seq2seq (src, tgt) pairs -> Batch (skipped examples left out)."""
        if self.task == "seq2seq":
            rows = [self.seq2seq_example(src, tgt, rng) for src, tgt in examples]
        else:
            rows = [self.pretrain_example(passage, rng) for passage in examples]
        return self.collate([row for row in rows if row is not None])

    def collate(self, rows, **batch_extras):
        """Examples -> Batch, right-padded (with align_source, context and rest apart) with PAD
        kind, pad_id, position 0, label -100; per-example extras stacked into (B,) tensors."""
        extras = dict(batch_extras)
        keys = rows[0].extras if rows else {}
        extras.update({k: torch.tensor([row.extras[k] for row in rows]) for k in keys})
        if self.align_source and rows:
            S = max(leading_context(row) for row in rows)
            extras["source_width"] = S
            rows = [self._aligned(row, S) for row in rows]
        L = max((len(row) for row in rows), default=0)
        # rounded up to a multiple: fewer distinct shapes for compiled blocks (train.py on CUDA)
        L = -(-L // self.pad_multiple) * self.pad_multiple
        column = lambda name, value: pad([getattr(row, name) for row in rows], value, L)
        labels, kind = column("labels", -100), column("kind", PAD)
        kinds, counts = kind[labels != -100].unique(return_counts=True)
        return Batch(column("input_ids", self.tok.pad_id), column("position_ids", 0),
                     column("segment_ids", self.segments[1] if self.align_source else 0), labels,
                     kind, column("step", 0), extras, dict(zip(kinds.tolist(), counts.tolist())))

    def _aligned(self, row, S):
        """Insert padding after the context part so that it is S tokens wide."""
        n = leading_context(row)
        gap = S - n
        cut = lambda values, fill: values[:n] + [fill] * gap + values[n:]
        return Example(cut(row.input_ids, self.tok.pad_id), cut(row.position_ids, 0),
                       cut(row.segment_ids, self.segments[0]), cut(row.labels, -100),
                       cut(row.kind, PAD), cut(row.step, 0), row.extras)

    # --- the loss ---------------------------------------------------------------------------------
    def loss(self, model, batch):
        """(loss, metrics); an empty batch gives a zero that touches every parameter (DDP)."""
        if len(batch) == 0:
            zero = sum(p.sum() for p in model.parameters()) * 0.0
            return zero, {"loss": zero.detach()}
        return self.compute_loss(model, batch)

    def compute_loss(self, model, batch):
        raise NotImplementedError

    def lm_loss_at(self, model, h, batch, *kinds):
        """lm_loss, with this objective's label smoothing, at the labelled rows of these kinds."""
        return lm_loss(model, h, batch.labels_at(*kinds), self.label_smoothing,
                       batch.labelled(*kinds))

    def corpus_tokens(self, batch):
        """Tokens of the corpus a batch reads (CTX, ORIG; no query, no padding): fair throughput."""
        read = batch.kind == CTX
        if self.task == "seq2seq" or not self.pretrain_reads_context_only:
            read |= batch.kind == ORIG
        return int(read.sum())

    def decode_logprobs(self, model, h, source):
        """Log-probabilities (N, V) of the next target token from the query rows' states h (N, d);
        `source` (hidden, ids, mask of the encoded source) serves PALM's copy head."""
        return model.lm_logits(h).float().log_softmax(dim=-1)

    def count_skip(self, reason):
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    # --- what the model predicts, for a reader watching it learn ----------------------------------
    @torch.no_grad()
    def show_fills(self, model, example, device="cpu", autocast=None, n_tokens=48):
        """The model's predictions on one pretrain example as [prediction|answer]: the text's
        slots, then the query rows ([P], [ATTN], the continuation)."""
        batch = self.make_batch([example], random.Random("fills")).to(device)
        if len(batch) == 0:
            return "  (the fixed held-out passage was skipped by the objective)"
        was_training = model.training
        model.eval()
        with autocast or nullcontext():
            h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.mask)[0]
        model.train(was_training)
        labels = batch.labels[0]
        kind = batch.kind[0]
        ids = batch.input_ids[0]
        rows = (labels != -100).nonzero().flatten()
        guess = dict(zip(rows.tolist(), model.lm_logits(h[rows]).argmax(-1).tolist()))
        piece = self.tok.id_to_token
        cell = lambda r: f"[{piece(guess[r])}|{piece(int(labels[r]))}]"
        context = [cell(r) if r in guess else piece(int(ids[r]))
                   for r in range(len(ids)) if kind[r] == CTX]
        queries = [cell(r) for r in guess if kind[r] != CTX]
        right = sum(guess[r] == int(labels[r]) for r in guess)
        lines = [f"  fills [prediction|answer], {right}/{len(guess)} right:",
                 "  the text, its masked slots filled: " + " ".join(context[:n_tokens])]
        if queries:
            # [P] (UniLMv2), [ATTN] (ERNIE-GEN) or the continuation's own rows (PALM)
            name = f"the {self.query_token} rows" if self.query_token else "the continuation"
            lines.append(f"  {name}: " + " ".join(queries[:n_tokens // 2]))
        return "\n".join(lines)


def fills_example(examples, tok):
    """The held-out example the fills show: the first of 40 tokens or more that reads as prose."""
    def words(ids):
        pieces = [tok.id_to_token(i) for i in ids]
        return sum(p.lstrip("#").isalpha() for p in pieces) / max(1, len(pieces))
    flat = lambda ex: ex[0] if isinstance(ex, tuple) else [t for s in ex for t in s]
    prose = (ex for ex in examples if len(flat(ex)) >= 40 and words(flat(ex)) > 0.8)
    return next(prose, examples[0])


# --- Helpers shared by the objectives -------------------------------------------------------------
def corrupt(token, tokenizer, rng, p_mask=0.8, p_random=0.1):
    """BERT's 80/10/10 (Devlin et al. 3.1): [MASK] p_mask, a random token p_random, else kept."""
    r = rng.random()
    if r < p_mask:
        return tokenizer.mask_id
    if r < p_mask + p_random:
        return random_token(tokenizer, rng)
    return token


def cloze(tokens, positions, tokenizer, rng):
    """BERT's masked LM at the given positions (in this order) -> (inputs, labels): each label its
    token, each input drawn by `corrupt`."""
    inputs = list(tokens)
    labels = [-100] * len(tokens)
    for p in positions:
        labels[p] = tokens[p]
        inputs[p] = corrupt(tokens[p], tokenizer, rng)
    return inputs, labels


def random_token(tokenizer, rng):
    """A uniformly random ordinary id: between the special tokens at the head of the vocabulary
    (a BERT vocab.txt's up to [MASK]) and any appended at its end."""
    hi = len(tokenizer)
    while hi - 1 in tokenizer.special_ids:
        hi -= 1
    lo = max(i for i in tokenizer.special_ids if i < hi) + 1
    return rng.randrange(lo, hi)


def cut_segments(sentences, rng):
    """A passage (non-empty sentences) -> (S1, S2) (UniLM 2.3, UniLMv2 2.2): cut at a uniformly
    random sentence boundary, or inside a lone sentence at a random token; one token: ([t], [])."""
    if len(sentences) >= 2:
        k = rng.randint(1, len(sentences) - 1)
        return [t for s in sentences[:k] for t in s], [t for s in sentences[k:] for t in s]
    s = sentences[0]
    if len(s) == 1:
        return list(s), []
    k = rng.randint(1, len(s) - 1)
    return s[:k], s[k:]


def lm_loss(model, h, labels, label_smoothing=0.0, n=None):
    """Cross-entropy (fp32) of the tied LM head at the rows with labels != -100 -> (loss, accuracy).
    Only those rows go through the (d x V) head; n, their count (Batch.labelled), spares a sync."""
    sel = (labels != -100).flatten()
    if n is None:
        rows = sel.nonzero().squeeze(1)
    else:
        # n above the labelled count (the fast layer's fixed shapes): the spare indices are -1, the
        # last row, which must then be padding: its label -100 is ignored below
        if not labels.is_cuda:
            # where checking costs nothing (the tests run here), check the count
            count = int(sel.sum())
            assert n == count or (n > count and not sel[-1]), f"lm_loss: n={n}, {count} labelled"
        rows = torch.nonzero_static(sel, size=n).squeeze(1)           # no wait for the GPU
    if rows.numel() == 0:
        # keeps the graph: DDP wants every parameter to get a gradient
        zero = h.sum() * 0.0
        return zero, torch.full((), float("nan"), device=h.device)
    logits = model.lm_logits(h.reshape(-1, h.size(-1))[rows]).float()     # (N, V)
    labels = labels.flatten()[rows]
    loss = F.cross_entropy(logits, labels, label_smoothing=label_smoothing)
    labelled = labels != -100
    acc = ((logits.argmax(-1) == labels) & labelled).sum() / labelled.sum()
    return loss, acc.detach()


_warned = set()


def warn_once(message):
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, stacklevel=2)


# --- The registry (last: each objective's file imports the base class above) ----------------------
from objectives.unilm import UniLMObjective          # noqa: E402
from objectives.pmlm import PMLMObjective            # noqa: E402
from objectives.ernie_gen import ErnieGenObjective   # noqa: E402
from objectives.palm import PalmObjective            # noqa: E402
from objectives.mass import MassObjective            # noqa: E402

OBJECTIVES = {c.name: c for c in (UniLMObjective, PMLMObjective, ErnieGenObjective, PalmObjective,
                                  MassObjective)}


def objective_class(name):
    """The Objective subclass registered as `name`, without building one."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; choose one of {sorted(OBJECTIVES)}")
    return OBJECTIVES[name]


def get_objective(name, tokenizer, task="pretrain", **options) -> Objective:
    """name in OBJECTIVES; task pretrain | seq2seq; options go to the objective."""
    return objective_class(name)(tokenizer, task=task, **options)
