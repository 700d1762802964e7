"""PALM (Bi et al. 2020, section 2): autoencoding + autoregressive pre-training, context ->
continuation, with copying. docs/objectives.md ("PALM") tells the windows, the cut and the stages.

ONE backbone plays the paper's encoder and decoder through the seq2seq mask (their weights are
shared, which the paper's are not); it is generate.py's loop with query_token None:

    [SOS] ctx [EOS] | [SOS] y1 .. yn       positions 0..S-1 | S, S+1, ..., segments 0 | 1
    labels  (MLM at masked ctx)  |  y1 .. yn [EOS]    the label at [SOS] is y1, at yn it is [EOS]

Pre-training: a window of the passage (3.1) cut 80% / 20% (2.2). Stage 1 (2.1): BERT's MLM on the
context alone; stage 2: -log P(y_t) of the pointer-generator mixture (2.3) + mlm_weight x MLM.
Left out: RoBERTa initialisation, the separate decoder, the extended vocabulary.
"""
import itertools

import torch

from objectives import Objective, cloze, option, warn_once
from objectives.masks import CTX, ORIG


def split_passage(passage, context_frac=0.8, boundary_slack=0.1):
    """A passage (sentences of ids) -> (context, continuation), cut at round(context_frac x n)
    (2.2), or at the nearest inner sentence boundary within boundary_slack x n tokens."""
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
    """The windows of two tokens or more of a passage, with the stride of one sentence (3.1):
    sentence k (cut to the budget) and the sentences after it that fit in budget tokens."""
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
    tags = ("stage",)             # the stage of the batch (2.1), no measurement
    model_defaults = dict(copy_head=True)       # the pointer-generator (2.3)

    context_frac = option(0.8, "share of a passage's tokens in the context; "
                               "the rest is the continuation (3.1)")
    boundary_slack = option(0.1, "cut at a sentence boundary within this share of the passage")
    mask_prob = option(0.15, "share of context tokens masked for the MLM (2.1: BERT's 15%)")
    stage1_frac = option(0.1, "share of training steps in stage 1 (MLM only) before stage 2 (2.1)")
    mlm_weight = option(0.0, "weight of the MLM loss in stage 2 "
                             "(0: the paper's stage 2 trains the decoder only)")
    copy = option(True, "copy with the pointer-generator (2.3); false = Table 6's ablation")
    copy_chunk = option(0, "compute the copy attention k continuation steps at a time "
                           "(less memory); 0 = at once")

    def check_options(self):
        if not 0 < self.context_frac < 1:
            raise ValueError(f"objectives/palm.py: context_frac={self.context_frac} "
                             "must be in (0, 1)")
        self.check_probabilities("mask_prob", "stage1_frac")
        if self.boundary_slack < 0 or self.mlm_weight < 0 or self.copy_chunk < 0:
            raise ValueError("objectives/palm.py: boundary_slack, mlm_weight and copy_chunk "
                             "must be >= 0")
        if self.mask_prob == 0 and (self.stage1_frac > 0 or self.mlm_weight > 0):
            raise ValueError("objectives/palm.py: mask_prob=0 leaves the MLM (stage 1, mlm_weight) "
                             "nothing to predict")
        self.check_room(5, "[SOS] x [EOS] [SOS] y")
        self.special_ids = sorted(self.tok.special_ids)
        self.stage = 2 if self.task == "seq2seq" else None

    @property
    def align_source(self):
        # the copy head reads every context at columns :S, so collate pads each context to one
        # width S (continuation rows h[:, S:]); without it nothing needs S: no padding in between
        return self.copy

    def set_step(self, step, total_steps):
        # 2.1's two stages
        self.stage = 1 if self.task == "pretrain" and step < self.stage1_frac * total_steps else 2

    # --- examples ---------------------------------------------------------------------------------
    def pretrain_example(self, passage, rng):
        """A passage -> Example of one window (the continuation in stage 2 only), or None."""
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
        # BERT's MLM on mask_prob of the context tokens (2.1)
        n_mask = max(1, round(self.mask_prob * len(ctx))) if self.mask_prob > 0 else 0
        inputs, labels = cloze(ctx, rng.sample(range(len(ctx)), n_mask), self.tok, rng)
        # stage 1 trains the encoder alone: the continuation would be compute for nothing
        return self.next_token_example(inputs, labels, cont if self.stage == 2 else None)

    def seq2seq_example(self, src, tgt, rng):
        """(src_ids, tgt_ids) -> Example, truncated to max_len, or None for an empty target."""
        if not tgt:
            self.count_skip("empty target")
            return None
        src, tgt = self.fit_pair(src, tgt)
        return self.next_token_example(src, [-100] * len(src), tgt)

    def make_batch(self, examples, rng):
        if self.stage is None:
            if self.stage1_frac > 0:
                warn_once("palm: set_step() was never called, so there is no stage 1; "
                          "training stage 2")
            self.stage = 2
        return super().make_batch(examples, rng)

    def collate(self, rows):
        return super().collate(rows, stage=self.stage)

    def copy_mask(self, batch):
        """Copy support (B, S) of a batch: its real context tokens that are not special."""
        S = batch.extras["source_width"]
        return self.copyable(batch.input_ids[:, :S], batch.kind[:, :S] == CTX)

    def copyable(self, ids, real):
        """Copy support (B, S): real context tokens that are not special ([MASK], [UNK], ...)."""
        # one comparison per special id: torch.isin's host-to-device copy would wait for the GPU
        special = torch.zeros_like(real)
        for i in self.special_ids:
            special |= ids == i
        return real & ~special

    # --- loss -------------------------------------------------------------------------------------
    def compute_loss(self, model, batch):
        h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.mask)
        stage = batch.extras["stage"]
        metrics = {"stage": stage}
        total = 0.0
        if self.task == "pretrain":
            train_mlm = stage == 1 or self.mlm_weight > 0  # else a metric only
            with torch.set_grad_enabled(torch.is_grad_enabled() and train_mlm):
                loss_mlm, acc_mlm = self.lm_loss_at(model, h, batch, CTX)
            metrics.update(loss_mlm=loss_mlm.detach(), acc_mlm=acc_mlm)
            if stage == 1:
                metrics["loss"] = loss_mlm.detach()
                return loss_mlm, metrics
            total = self.mlm_weight * loss_mlm if self.mlm_weight > 0 else 0.0
        loss_ar, acc_ar, lam = self._ar_loss(model, h, batch)
        metrics.update(loss_ar=loss_ar.detach(), acc_ar=acc_ar)
        if lam is not None:
            metrics["lambda_mean"] = lam
        total = total + loss_ar
        metrics["loss"] = total.detach()
        return total, metrics

    def _ar_loss(self, model, h, batch):
        """-log P(y_t | y_<t, x) at the continuation rows: the mixture (Eq. 7), or P^v alone."""
        if not self.copy:
            loss, acc = self.lm_loss_at(model, h, batch, ORIG)
            return loss, acc, None
        S = batch.extras["source_width"]
        s = h[:, S:]                                                        # (B, T, d)
        labels = batch.labels[:, S:]                                        # (B, T)
        head = self._head(model)
        # every continuation row, the padding ones weighted 0: selecting the predicted rows
        # (labels[sel]) would wait for the GPU to count them, five times a step
        weight = (labels != -100).float()                                   # (B, T)
        n = weight.sum().clamp_min(1)
        y = labels.clamp_min(0)                                             # padding: any real id
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
        """For notebooks: log P (B, T, V), lambda (B, T), alpha (B, T, S) of the continuation."""
        h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.mask)
        S = batch.extras["source_width"]
        s = h[:, S:]
        head = self._head(model)
        return head(model.lm_logits(s), s, h[:, :S], batch.input_ids[:, :S], self.copy_mask(batch))

    def decode_logprobs(self, model, h, source):
        """log P (N, V) of the next token from states h (N, d): the mixture over the source."""
        if not self.copy:
            return super().decode_logprobs(model, h, source)
        s = h[:, None]                                      # (N, 1, d): one step
        mask = self.copyable(source["ids"], source["mask"].bool())
        logp, _, _ = self._head(model)(model.lm_logits(s), s, source["hidden"], source["ids"], mask)
        return logp[:, 0]
