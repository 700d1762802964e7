"""PALM (Bi et al. 2020, section 2): autoencoding + autoregressive pre-training, context ->
continuation, with copying.

    # pre-training: a window of a passage -> 80% + 20%
    obj = get_objective("palm", tok)
    # fine-tuning: source = context, target = continuation
    obj = get_objective("palm", tok, task="seq2seq")
    # train.py makes flags of `options` and calls set_step
    python train.py --objective palm --stage1_frac 0.1

ONE backbone plays both of the paper's networks. PALM uses a separate Transformer encoder and
decoder; here the seq2seq mask does the job: the context block is bidirectional (the encoder), each
continuation token sees the whole context and the continuation to its left (the decoder, with the
context states as its "cross-attention" memory). Encoder and decoder therefore share their weights,
which the paper's model does not.

Examples (2.2, 3.1). The paper builds its pairs "from the documents by a sliding window with the
stride of one sentence" (3.1): every sentence start is a window start, and a window is "multiple
consecutive sentences" cut into a context and "the subsequent consecutive sentences". Here a
pretrain example is a passage, consecutive sentences that data.make_passages packed to the length
budget, so each draw takes one window of it: the window's first sentence is drawn uniformly with the
rng among the passage's sentence starts, and the window runs over that sentence and the following
ones while they fit in max_len - 3 tokens (a first sentence longer than that is cut to it). Start 0
gives the whole passage, a later start a shorter window: the paper's windows run on through the
document, ours stop at the passage's end, where the next passage begins. That is the price of
windows inside packed passages: on the tests' corpus (96-token passages of 3.3 sentences on average)
a window holds 70% of its passage's tokens on average. In return a passage of k sentences gives k
pairs over the epochs instead of one.
Only starts whose window has two tokens or more are drawn: every window has a context and a
continuation.

Each window is cut as 2.2 says: its first `context_frac` = 80% of tokens are the context, the rest
(20%) the continuation. The cut moves to the sentence boundary nearest to it when one is "near":
within `boundary_slack` x the window's length (10%, so 8 of 80 tokens); otherwise it falls inside a
sentence (a one-sentence window is cut inside its sentence). A passage without a window of two
tokens (an empty or one-token passage) is skipped and counted; one longer than max_len - 3 gives a
warning (its windows are cut to fit).

    [SOS] ctx [EOS] | [SOS] y1 .. yn       positions 0..S-1 | S, S+1, ..., segments 0 | 1
    labels  (MLM at masked ctx)  |  y1 .. yn [EOS]    the label at [SOS] is y1, at yn it is [EOS]

That is generate.py's loop with query_token None exactly: the token at position S+t is y_t-1
(y_-1 = [SOS]) and its own state predicts y_t. In a batch every context block is padded to the
longest one before the continuations start, so the continuation rows of every example are
h[:, S_max:]; positions and visibility do not change.

Stage 1 (2.1): the encoder alone, BERT's MLM on the context: 15% (`mask_prob`) of the context
tokens, 80/10/10. The continuation is left out of stage-1 batches: it carries no loss and the
context may not see it, so it would be compute for nothing. Stage 2: the continuation by teacher
forcing, loss -log P(y_t) of the pointer-generator mixture (2.3, model.PointerGenerator), plus
`mlm_weight` x MLM (0 in the paper: then the MLM loss is still reported, computed without gradient).
The context stays masked in stage 2 (Figure 1d); the copy source is the context the model sees, and
[MASK] and the other special tokens are never copy targets.
train.py calls `set_step(step, total_steps)` before each batch: stage 1 for
steps < stage1_frac x total_steps.
`copy=False` drops the copy head from the loss (the paper's Table 6 ablation; the model's head then
sits unused: add --copy_head false to leave it out of the model). `model_defaults` tells train.py
the model needs copy_head.
`copy_chunk` k > 0 computes the copy attention k continuation steps at a time, checkpointed: less
memory, a little slower (numbers in model.PointerGenerator's docstring).

Fine-tuning: source as context (never masked), target as continuation, copy on; an empty target is
skipped and counted (there is no continuation to learn). Decoding: `decode_logprobs` mixes in the
copy distribution.

Left out: RoBERTa initialisation, the separate decoder, the extended vocabulary (no OOV words in
WordPiece).
Metrics: loss, loss_mlm, acc_mlm, loss_ar, acc_ar (argmax of the mixture),
lambda_mean (share generated), stage.
"""
import itertools

import torch

from objectives import Example, Objective, corrupt, lm_loss, option, warn_once
from objectives.masks import CTX, ORIG


def split_passage(passage, context_frac=0.8, boundary_slack=0.1):
    """A passage (list of sentences of ids) -> (context ids, continuation ids), cut near
    context_frac (2.2).

    The cut is round(context_frac x n), kept inside [1, n - 1]; the nearest inner sentence boundary
    replaces it if it lies within boundary_slack x n tokens (ties go to the earlier boundary). With
    n < 2 a part comes back empty.
    """
    tokens = [t for s in passage for t in s]
    n = len(tokens)
    cut = min(max(round(context_frac * n), 1), n - 1)
    # ends of all but the last sentence
    bounds = list(itertools.accumulate(len(s) for s in passage))[:-1]
    near = [b for b in bounds if 0 < b < n and abs(b - cut) <= boundary_slack * n]
    if near:
        cut = min(near, key=lambda b: (abs(b - cut), b))
    return tokens[:cut], tokens[cut:]


def sentence_windows(passage, budget):
    """The windows of a passage with the stride of one sentence (3.1), those of two tokens or more.

    Window k is sentence k and the sentences after it while they fit in budget tokens; a sentence k
    longer than the budget is cut to it. -> [window (a list of sentences)], in the order of their
    first sentence.
    """
    passage = [s for s in passage if s]
    windows = []
    for k in range(len(passage)):
        window = []
        used = 0
        for sentence in passage[k:]:
            if used + len(sentence) > budget:
                break
            window.append(sentence)
            used += len(sentence)
        # a first sentence longer than the budget: its first budget tokens
        window = window or [passage[k][:budget]]
        if sum(len(s) for s in window) >= 2:           # room for a context and a continuation
            windows.append(window)
    return windows


class PalmObjective(Objective):
    name = "palm"
    query_token = None            # next-token prediction: y_t-1's own state predicts y_t
    min_passage = 2               # a context and a continuation
    segments = (0, 1)             # context (encoder) / continuation (decoder)
    # a metric key that is no measurement: the stage of the batch (2.1)
    tags = ("stage",)
    # train.py builds the model with these (the pointer-generator)
    model_defaults = dict(copy_head=True)
    # every context padded to one width S: the continuation rows are h[:, S:]
    align_source = True

    context_frac = option(0.8, "share of a passage's tokens in the context; "
                               "the rest is the continuation (3.1)")
    boundary_slack = option(0.1, "move the cut to a sentence boundary "
                                 "within this share of the passage")
    mask_prob = option(0.15, "share of context tokens masked for the MLM (2.1: BERT's 15%)")
    stage1_frac = option(0.1, "share of the training steps in stage 1 (MLM only) "
                              "before stage 2 (2.1)")
    mlm_weight = option(0.0, "weight of the MLM loss in stage 2 "
                             "(0: the paper's stage 2 trains the decoder only)")
    copy = option(True, "use the pointer-generator's copy distribution (2.3); "
                        "false = Table 6's ablation")
    copy_chunk = option(0, "compute the copy attention k continuation steps at a time "
                           "(less memory); 0 = at once")

    def check_options(self):
        if not 0 < self.context_frac < 1:
            raise ValueError(f"objectives/palm.py: context_frac={self.context_frac} "
                             "must be in (0, 1)")
        for k in ("mask_prob", "stage1_frac"):
            if not 0 <= getattr(self, k) <= 1:
                raise ValueError(f"objectives/palm.py: {k}={getattr(self, k)} must be in [0, 1]")
        if self.boundary_slack < 0 or self.mlm_weight < 0 or self.copy_chunk < 0:
            raise ValueError("objectives/palm.py: boundary_slack, mlm_weight and copy_chunk "
                             "must be >= 0")
        if self.mask_prob == 0 and (self.stage1_frac > 0 or self.mlm_weight > 0):
            raise ValueError("objectives/palm.py: mask_prob=0 leaves the MLM (stage 1, mlm_weight) "
                             "nothing to predict")
        if self.max_len < 5:
            raise ValueError(f"objectives/palm.py: max_len={self.max_len} "
                             "cannot hold [SOS] x [EOS] [SOS] y")
        self.special_ids = sorted(self.tok.special_ids)
        self.stage = 2 if self.task == "seq2seq" else None

    def set_step(self, step, total_steps):
        """Call before building the batch of training step `step` (0-based) of `total_steps`
        (2.1's two stages)."""
        self.stage = 1 if self.task == "pretrain" and step < self.stage1_frac * total_steps else 2

    # --- examples ---------------------------------------------------------------------------------

    def _mask_context(self, ctx, rng):
        """BERT masking of mask_prob of the context tokens (80/10/10) -> (input ids, labels)."""
        n_mask = max(1, round(self.mask_prob * len(ctx))) if self.mask_prob > 0 else 0
        inputs = list(ctx)
        labels = [-100] * len(ctx)
        for i in rng.sample(range(len(ctx)), n_mask):
            labels[i] = ctx[i]
            inputs[i] = corrupt(ctx[i], self.tok, rng)
        return inputs, labels

    def pretrain_example(self, passage, rng):
        """A passage -> Example of one window: masked context (and in stage 2 the continuation), or
        None (skipped)."""
        budget = self.max_len - 3                  # [SOS] ctx [EOS] [SOS] y: positions 0 .. n + 2
        if sum(len(s) for s in passage) > budget:
            warn_once(f"palm: a passage is longer than max_len - 3 = {budget} tokens; "
                      "its windows are cut to fit")
        windows = sentence_windows(passage, budget)
        if not windows:
            self.count_skip("passage too short for a context and a continuation")
            return None
        # the sliding window (3.1): its first sentence is any sentence start of the passage
        window = windows[rng.randrange(len(windows))]
        # 80% context, 20% continuation (2.2)
        ctx, cont = split_passage(window, self.context_frac, self.boundary_slack)
        inputs, labels = self._mask_context(ctx, rng)
        # stage 1 trains the encoder alone: the continuation would be compute for nothing
        return self._example(inputs, labels, cont if self.stage == 2 else None)

    def seq2seq_example(self, src, tgt, rng):
        """(src_ids, tgt_ids) -> Example, truncated to max_len, or None for an empty target."""
        if not tgt:
            self.count_skip("empty target")
            return None
        src, tgt = self.fit_pair(src, tgt)
        return self._example(src, [-100] * len(src), tgt)

    def _example(self, ctx, ctx_labels, cont):
        """[SOS] ctx [EOS] (context, bidirectional), then [SOS] y (the continuation, causal) unless
        cont is None.

        The continuation's row t holds y_t-1 ([SOS] first) and predicts y_t ([EOS] last): next-token
        prediction.
        """
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

    def make_batch(self, examples, rng):
        if self.stage is None:
            if self.stage1_frac > 0:
                warn_once("palm: set_step() was never called, so there is no stage 1; "
                          "training stage 2")
            self.stage = 2
        return super().make_batch(examples, rng)

    def collate(self, rows):
        """The seq2seq layout with a gap: every [SOS] ctx [EOS] padded to S, then the
        continuations."""
        return super().collate(rows, stage=self.stage)

    def copy_mask(self, batch):
        """Copy support (B, S) of a batch: its real context tokens that are not special."""
        S = batch.extras["source_width"]
        return self.copyable(batch.input_ids[:, :S], batch.kind[:, :S] == CTX)

    def copyable(self, ids, real):
        """Copy support (B, S): real context tokens that are not special ([SOS], [EOS], [MASK],
        [UNK], ...)."""
        # one comparison per special id, not torch.isin against a tensor made here: that host-to-
        # device copy waits for the GPU at every decoding step, and a CUDA graph cannot hold it
        special = torch.zeros_like(real)
        for i in self.special_ids:
            special |= ids == i
        return real & ~special

    # --- loss -------------------------------------------------------------------------------------

    def compute_loss(self, model, batch):
        h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.mask)
        S = batch.extras["source_width"]
        stage = batch.extras["stage"]
        metrics = {"stage": stage}
        total = 0.0
        if self.task == "pretrain":
            train_mlm = stage == 1 or self.mlm_weight > 0  # else a metric only
            with torch.set_grad_enabled(torch.is_grad_enabled() and train_mlm):
                loss_mlm, acc_mlm = lm_loss(model, h[:, :S], batch.labels[:, :S],
                                            self.label_smoothing, batch.labelled(CTX))
            metrics.update(loss_mlm=loss_mlm.detach(), acc_mlm=acc_mlm)
            if stage == 1:
                metrics["loss"] = loss_mlm.detach()
                return loss_mlm, metrics
            total = self.mlm_weight * loss_mlm if self.mlm_weight > 0 else 0.0
        loss_ar, acc_ar, lam = self._ar_loss(model, h, batch, S)
        metrics.update(loss_ar=loss_ar.detach(), acc_ar=acc_ar)
        if lam is not None:
            metrics["lambda_mean"] = lam
        total = total + loss_ar
        metrics["loss"] = total.detach()
        return total, metrics

    def _ar_loss(self, model, h, batch, S):
        """-log P(y_t | y_<t, x) at the continuation rows, P the pointer-generator mixture (Eq. 7)
        or P^v alone."""
        s = h[:, S:]                                                        # (B, T, d)
        labels = batch.labels[:, S:]                                        # (B, T)
        if not self.copy:
            loss, acc = lm_loss(model, s, labels, self.label_smoothing, batch.labelled(ORIG))
            return loss, acc, None
        head = self._head(model)
        # every continuation row, the padding ones weighted 0: selecting the predicted rows
        # (labels[sel]) would wait for the GPU to count them, five times a step
        weight = (labels != -100).float()                                   # (B, T)
        n = weight.sum().clamp_min(1)
        y = labels.clamp_min(0)                                             # padding: any real id
        # (B, T, S), (B, T)
        alpha, gate = head.attend(s, h[:, :S], self.copy_mask(batch), self.copy_chunk or None)
        src = batch.input_ids[:, None, :S].expand(-1, s.size(1), -1)       # (B, T, S)
        logits = model.lm_logits(s)                                         # (B, T, V)
        eps = self.label_smoothing
        if eps:
            # smoothing needs log P of every token: the full mixture
            logp = head.mix(logits, alpha, gate, src)                       # (B, T, V)
            nll = -(1 - eps) * logp.gather(-1, y[..., None]).squeeze(-1) - eps * logp.mean(-1)
            pred = logp.detach().argmax(-1)
        else:
            # log P(y) alone: no (B, T, V) copy tensor kept for backward
            nll = -head.mix(logits, alpha, gate, src, target=y)
            # argmax of lambda P^v + (1 - lambda) P^c in one (B, T, V) tensor
            with torch.no_grad():
                lam = torch.sigmoid(gate)[..., None]
                p_mix = (logits.float().softmax(-1) * lam).scatter_add_(-1, src, alpha * (1 - lam))
                pred = p_mix.argmax(-1)
        acc = ((pred == y).float() * weight).sum() / n
        lam_mean = (torch.sigmoid(gate) * weight).sum() / n
        return (nll * weight).sum() / n, acc, lam_mean.detach()

    def _head(self, model):
        if getattr(model, "copy_head", None) is None:
            raise ValueError("objectives/palm.py: copy=True needs a model built with "
                             "ModelConfig(copy_head=True) (train.py sets it from "
                             "PalmObjective.model_defaults); or pass copy=False")
        return model.copy_head

    def pointer_outputs(self, model, batch):
        """For notebooks: (log P (B, T, V), lambda (B, T), alpha (B, T, S)) at the continuation
        rows of a batch."""
        h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.mask)
        S = batch.extras["source_width"]
        s = h[:, S:]
        head = self._head(model)
        return head(model.lm_logits(s), s, h[:, :S], batch.input_ids[:, :S], self.copy_mask(batch))

    def decode_logprobs(self, model, h, source):
        """log P (N, V) of the next token from states h (N, d): the mixture over
        source = dict(hidden, ids, mask)."""
        if not self.copy:
            return super().decode_logprobs(model, h, source)
        s = h[:, None]                                      # (N, 1, d): one step
        mask = self.copyable(source["ids"], source["mask"].bool())
        logp, _, _ = self._head(model)(model.lm_logits(s), s, source["hidden"], source["ids"], mask)
        return logp[:, 0]


OBJECTIVE = PalmObjective
