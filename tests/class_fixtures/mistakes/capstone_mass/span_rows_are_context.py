"""Wrong: the span rows are context (CTX) too, so the context sees them.
First message: kind ORIG"""
from objectives import Example, Objective, lm_loss, option
from objectives.masks import CTX, ORIG


class MassObjective(Objective):
    name = "mass"
    query_token = None
    segments = (0, 1)

    span_frac = option(0.5, "share of a passage's tokens in the masked span (MASS: about 50%)")

    def pretrain_example(self, passage, rng):
        text = [t for sentence in passage for t in sentence][:self.max_len - 2]
        if not text:
            self.count_skip("nothing to mask")
            return None
        n = len(text)
        k = max(1, round(self.span_frac * n))
        u = rng.randrange(n - k + 1)
        span = text[u:u + k]
        context = text[:u] + [self.tok.mask_id] * k + text[u + k:]
        ids = [self.tok.sos_id] + context + [self.tok.eos_id]
        ex = Example(input_ids=ids, position_ids=list(range(len(ids))), segment_ids=[0] * len(ids),
                     labels=[-100] * len(ids), kind=[CTX] * len(ids), step=[0] * len(ids))
        shifted = [self.tok.sos_id] + span[:-1]
        for t in range(k):
            ex.input_ids.append(shifted[t])
            ex.position_ids.append(u + 1 + t)
            ex.segment_ids.append(1)
            ex.labels.append(span[t])
            ex.kind.append(CTX)
            ex.step.append(0)
        return ex

    def seq2seq_example(self, src, tgt, rng):
        tgt = list(tgt)[:self.max_len - 3]
        src = list(src)[:self.max_len - 3 - len(tgt)]
        ids = [self.tok.sos_id] + src + [self.tok.eos_id]
        S = len(ids)
        ex = Example(input_ids=ids, position_ids=list(range(S)), segment_ids=[0] * S, labels=[-100] * S,
                     kind=[CTX] * S, step=[0] * S)
        rows = [self.tok.sos_id] + tgt
        answers = tgt + [self.tok.eos_id]
        for t in range(len(rows)):
            ex.input_ids.append(rows[t])
            ex.position_ids.append(S + t)
            ex.segment_ids.append(1)
            ex.labels.append(answers[t])
            ex.kind.append(ORIG)
            ex.step.append(t + 1)
        return ex

    def compute_loss(self, model, batch):
        h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.mask)
        loss, accuracy = lm_loss(model, h, batch.labels, self.label_smoothing)
        return loss, {"loss": loss.detach(), "accuracy": accuracy}


OBJECTIVE = MassObjective
