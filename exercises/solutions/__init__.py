"""The answer key: the project's own code behind each exercise's names, what a grader grades with
UNIGEN_REFERENCE=1 (and then says so: "graded: the solutions, not your files").

For teachers (and for students who are done: reading this is reading the answers). A student's file that
imports this package, however it does it, is flagged as copied by the copy check (exercises/_copycheck.py), and
the class grader (exercises/grade_class.py) does not even copy it next to the students' files. Each entry below is the
exercise's contract served by the project's implementation, adapted to the exercise's signature and nothing
more, so that a grader passing here means the grader agrees with the project. Exercise 7 has no one function
in generate.py to point at (beam_search runs the step inside its loop over a batch of sources): its entry is
that loop's body for one source, built on generate.ban_tokens and generate.gnmt_penalty, and the grader holds whole
searches driven by it equal to generate.beam_search.
"""
import functools
import math
from types import SimpleNamespace

import torch

import evaluate
import generate as G
from model import PointerGenerator
from objectives import masks, mass, pmlm
from objectives.masks import CTX, ORIG, SPAN
from tokenizer import SPECIAL_TOKENS, WordPiece


# --- 1. WordPiece: tokenizer.WordPiece._wordpiece ---------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _tokenizer(vocab):
    return WordPiece(list(SPECIAL_TOKENS) + sorted(vocab - set(SPECIAL_TOKENS)))


def encode_word(word, vocab):
    tok = _tokenizer(frozenset(vocab))
    return [tok.id_to_token(i) for i in tok._wordpiece(word)]


ex01_wordpiece = SimpleNamespace(encode_word=encode_word)


# --- 2. UniLM's masks: objectives/masks.py ---------------------------------------------------------------------

ex02_unilm_mask = SimpleNamespace(
    seq2seq_mask=lambda n_src, n, L: masks.seq2seq([n_src], [n], L)[0],
    left_to_right_mask=lambda n, L: masks.left_to_right([n], L)[0],
    right_to_left_mask=lambda n, L: masks.right_to_left([n], L)[0])


# --- 3. Algorithm 1: objectives/pmlm.py ------------------------------------------------------------------------

ex03_blockwise = SimpleNamespace(blockwise_masking=pmlm.blockwise_masking)


# --- 4. Figure 5: objectives/masks.py ---------------------------------------------------------------------------

ex04_pseudo_mask = SimpleNamespace(pseudo_masked_mask=masks.pseudo_masked)


# --- 5. ERNIE-GEN's span flow: masks.multi_flow on the kinds of [S'; T'; A_S] -------------------------------------

def span_flow_mask(n_src, spans):
    T = spans[-1][1]
    kind = [CTX] * n_src + [ORIG] * T + [SPAN] * T
    step = [0] * n_src + list(range(1, T + 1)) + [b + 1 for b, e in spans for _ in range(b, e)]
    return masks.multi_flow(torch.tensor([kind]), torch.tensor([step]))[0]


ex05_span_flow = SimpleNamespace(span_flow_mask=span_flow_mask)


# --- 6. PALM's mixture: model.PointerGenerator.mix ---------------------------------------------------------------

def copy_distribution(alpha, src_ids, vocab_size):
    shut = torch.full(alpha.shape[:-1], -math.inf)                   # lambda = 0: the mixture is P^c alone
    return PointerGenerator.mix(torch.zeros(*alpha.shape[:-1], vocab_size), alpha, shut, src_ids).exp()


ex06_pointer = SimpleNamespace(copy_distribution=copy_distribution, mixture_logprobs=PointerGenerator.mix)


# --- 7. One beam step: the body of generate.beam_search's loop, for one source ----------------------------------

def beam_step(totals, logp, history, beam_size, eos, step, alpha=1.0, no_repeat_ngram=3):
    K = beam_size
    no_ban = torch.tensor([], dtype=torch.long)
    logp = G.ban_tokens(logp.clone(), history, step, eos, 0, no_ban, no_repeat_ngram, None)
    V = logp.size(-1)
    top, idx = (totals[:, None] + logp).flatten().topk(2 * K)
    beams, tokens = idx // V, idx % V
    rank = torch.arange(2 * K)
    live = (rank + 2 * K * (tokens == eos)).argsort()[:K]            # the K best not ending in [EOS], in order
    finished = [(history[beams[c]].tolist(), top[c].item() / G.gnmt_penalty(step + 1, alpha))
                for c in range(K) if tokens[c] == eos and top[c] > -math.inf]
    return finished, (beams[live], tokens[live], top[live])


ex07_beam_step = SimpleNamespace(beam_step=beam_step, gnmt_penalty=G.gnmt_penalty)


# --- 8. ROUGE-L: evaluate.py ------------------------------------------------------------------------------------

ex08_rouge_l = SimpleNamespace(lcs_length=lambda a, b: evaluate._lcs_table(a, b)[-1][-1],
                               rouge_l=lambda prediction, reference:
                               evaluate.rouge_scores(prediction, reference)["rougeL"])


# --- capstone: objectives/mass.py -------------------------------------------------------------------------------

capstone_mass = mass
