"""ERNIE-GEN (objectives/ernie_gen.py): masks against Fig. 3d, leakage by autograd, Eq. 5 against the per-flow
computation (separate_flows), fragment / noise / span-vocabulary statistics, the seq2seq layout against the
decoding loop."""
import json
import random

import pytest
import torch

import model as M
from objectives import get_objective
from objectives.ernie_gen import (LENGTH_DISTRIBUTIONS, SpanVocab, build_span_vocab, load_span_vocab,
                                  separate_flows, t_statistic, word_ranges)
from objectives.masks import CTX, ORIG, PSEUDO, SPAN
from tests.helpers import input_gradients, tiny_model
from tokenizer import SPECIAL_TOKENS, WordPiece

WORDS = ["a", "b", "c", "d", "e", "f", "g", "h", "new", "york", "is", "big", "to", "##night", "city"]


@pytest.fixture(scope="module")
def toy():
    return WordPiece(list(SPECIAL_TOKENS) + WORDS)


def ids(tok, text):
    return tok.encode(text)


def rows(text):
    """'1101 ...' lines -> bool tensor; spaces are only for the eye."""
    return torch.tensor([[c == "1" for c in line.replace(" ", "")] for line in text.strip().splitlines()])


# --- masks and layouts, cell by cell ---------------------------------------------------------------------------

def test_pretrain_layout_and_masks_fig3d(toy):
    """Passage a b c d | e f g h, fragments {b} and {e f} (forced), V_span = {e f}: spans [b], [e f]."""
    vocab = SpanVocab([tuple((i,) for i in ids(toy, "e f"))])
    obj = get_objective("ernie_gen", toy, rho_p=0.0, span_vocab=vocab)
    obj.sample_fragments = lambda words, rng: ([(1, 2), (4, 6)], (1, 4))
    batch = obj.make_batch([[ids(toy, "a b c d"), ids(toy, "e f g h")]], random.Random(0))
    S, E, A = toy.sos_id, toy.eos_id, toy.attn_id
    want_ids = [S] + ids(toy, "a c d g h") + [E] + ids(toy, "b e f") + [A] * 6
    assert batch.input_ids[0].tolist() == want_ids
    # every token keeps its place in [SOS] a b c d e f g h [EOS]; [ATTN]s share their token's position
    assert batch.position_ids[0].tolist() == [0, 1, 3, 4, 7, 8, 9] + [2, 5, 6] * 3
    assert batch.segment_ids[0].tolist() == [0] * 7 + [1] * 9
    assert batch.labels[0].tolist() == [-100] * 10 + ids(toy, "b e f") * 2
    assert batch.kind[0].tolist() == [CTX] * 7 + [ORIG] * 3 + [PSEUDO] * 3 + [SPAN] * 3
    #            S' (SOS a c d g h EOS) | T' b e f | A_W W1 W2 W3 | A_S S1 S2 S3
    want = rows("""
        1111111 000 000 000
        1111111 000 000 000
        1111111 000 000 000
        1111111 000 000 000
        1111111 000 000 000
        1111111 000 000 000
        1111111 000 000 000
        1111111 100 000 000
        1111111 110 000 000
        1111111 111 000 000
        1111111 000 100 000
        1111111 100 010 000
        1111111 110 001 000
        1111111 000 000 100
        1111111 100 000 010
        1111111 100 000 001
    """)
    # M_C: rows 0-9 over columns 0-9 (S' bidirectional, T' causal); M_W: rows 10-12; M_S: rows 13-15 (S2 and S3
    # belong to the span [e f] starting at target 2: both see S' + t1 only)
    assert torch.equal(batch.attn_mask[0], want)


def test_seq2seq_layout_written_out(toy):
    obj = get_objective("ernie_gen", toy, task="seq2seq", rho_f=0.0, lam_finetune=0.5,
                        span_vocab=SpanVocab([tuple((i,) for i in ids(toy, "c d"))]))
    batch = obj.make_batch([(ids(toy, "a b"), ids(toy, "c d"))], random.Random(0))
    S, E, A = toy.sos_id, toy.eos_id, toy.attn_id
    a, b, c, d = ids(toy, "a b c d")
    assert batch.input_ids[0].tolist() == [S, a, b, E, c, d, E, A, A, A, A, A, A]
    assert batch.position_ids[0].tolist() == [0, 1, 2, 3, 4, 5, 6, 4, 5, 6, 4, 5, 6]
    assert batch.segment_ids[0].tolist() == [0] * 4 + [1] * 9
    assert batch.labels[0].tolist() == [-100] * 7 + [c, d, E] * 2
    #        src    T'    A_W   A_S: spans [c d] (V_span) and [EOS] (its own)
    want = rows("""
        1111 000 000 000
        1111 000 000 000
        1111 000 000 000
        1111 000 000 000
        1111 100 000 000
        1111 110 000 000
        1111 111 000 000
        1111 000 100 000
        1111 100 010 000
        1111 110 001 000
        1111 000 000 100
        1111 000 000 010
        1111 110 000 001
    """)
    assert torch.equal(batch.attn_mask[0], want)
    # the default fine-tuning (lambda = 1) builds no span flow
    plain = get_objective("ernie_gen", toy, task="seq2seq", rho_f=0.0).make_batch(
        [(ids(toy, "a b"), ids(toy, "c d"))], random.Random(0))
    assert torch.equal(plain.attn_mask[0], want[:10, :10])


def test_seq2seq_training_equals_infilling_decoding(tok, pairs):
    """The [ATTN] rows of a fine-tuning forward (rho_f = 0) equal generate.py's loop with a KV cache: the source
    encoded once; at step t, [y_t-1 @ S+t-1, [ATTN] @ S+t], y_t-1 sees cache + itself, the query cache + all."""
    model = tiny_model(len(tok), n_layer=3)
    obj = get_objective("ernie_gen", tok, task="seq2seq", rho_f=0.0)
    src, tgt = pairs["train"][0]
    batch = obj.make_batch([(src, tgt)], random.Random(0))
    with torch.no_grad():
        h_train = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.attn_mask)[0]
        S, y = len(src) + 2, tgt + [tok.eos_id]
        cache = M.KVCache(model.config.n_layer)
        src_ids = torch.tensor([[tok.sos_id] + src + [tok.eos_id]])
        model(src_ids, torch.arange(S)[None], torch.zeros_like(src_ids), torch.ones(1, S, S, dtype=torch.bool),
              cache=cache)
        cache.commit(S)
        for t in range(len(y)):
            new = ([y[t - 1]] if t else []) + [tok.attn_id]
            pos = list(range(S + t - len(new) + 1, S + t + 1))
            mask = torch.ones(1, len(new), len(cache) + len(new), dtype=torch.bool)
            if len(new) == 2:
                mask[0, 0, -1] = False                       # y_t-1 does not see the query
            h = model(torch.tensor([new]), torch.tensor([pos]), torch.ones(1, len(new), dtype=torch.long), mask,
                      cache=cache)
            cache.commit(len(new) - 1)                       # keep y_t-1, drop [ATTN]
            torch.testing.assert_close(h[0, -1], h_train[S + len(y) + t], rtol=1e-5, atol=1e-5)


# --- leakage and Eq. 5 -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("impl", ["naive", "sdpa"])
def test_no_leakage_by_autograd(tok, passages, impl):
    """Through all layers: an [ATTN] gets exactly zero gradient from its own target token and every later one (word
    flow) or from every target token from its span's start on (span flow); non-zero from every allowed input."""
    short = [p for p in passages["train"] if 30 <= sum(map(len, p)) <= 40][:2]     # keeps the test fast
    every_ngram = build_span_vocab(short, tok, min_t=0.0, progress=False)       # so that spans are long
    batch = get_objective("ernie_gen", tok, rho_p=0.3, span_vocab=every_ngram).make_batch(short, random.Random(0))
    model = tiny_model(len(tok), attn_impl=impl)
    n_checked = 0
    for b in range(batch.input_ids.size(0)):
        k, blk = batch.kind[b], batch.step[b]       # step: target index / span start
        m = int((k == ORIG).sum())
        assert blk[k == ORIG].tolist() == blk[k == PSEUDO].tolist() == list(range(1, m + 1))
        span_start = blk[k == SPAN]
        assert torch.all(span_start <= torch.arange(1, m + 1)) and torch.all(span_start.diff() >= 0)
        assert (span_start < torch.arange(1, m + 1)).any()                 # some span has several tokens
        for row in torch.nonzero((k == PSEUDO) | (k == SPAN)).flatten().tolist():
            g = input_gradients(model, batch, b, row)
            allowed = (k == CTX) | ((k == ORIG) & (blk < blk[row]))
            allowed[row] = True
            forbidden_targets = (k == ORIG) & (blk >= blk[row])           # own token and later / span onwards
            assert forbidden_targets.any() and torch.all(g[forbidden_targets] == 0.0), (b, row)
            assert torch.all(g[~allowed] == 0.0), (b, row)   # nor other [ATTN] rows, nor padding
            assert torch.all(g[allowed] > 0.0), (b, row)     # every allowed input does reach the prediction
            n_checked += 1
    assert n_checked >= 30


@pytest.mark.parametrize("post_ln", [False, True], ids=["pre-LN", "post-LN"])
@pytest.mark.parametrize("impl", ["naive", "sdpa"])
def test_one_sequence_equals_separate_flows(tok, passages, impl, post_ln):
    """Eq. 5: [X; A_W; A_S] with one mask and one attention call per layer == the three flows computed apart, in
    both block layouts."""
    data = passages["train"][:3]
    obj = get_objective("ernie_gen", tok, rho_p=0.3, span_vocab=build_span_vocab(data, tok, min_t=0, progress=False))
    examples = [obj.pretrain_example(p, random.Random(i)) for i, p in enumerate(data)]
    batch = obj.collate(examples)
    model = tiny_model(len(tok), n_layer=3, attn_impl=impl, post_ln=post_ln)
    with torch.no_grad():
        h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.attn_mask)
        for b, ex in enumerate(examples):
            t = lambda key: torch.tensor(getattr(ex, key))
            x, a_w, a_s = separate_flows(model, t("input_ids"), t("position_ids"), t("segment_ids"), t("kind"),
                                          t("step"))
            k = batch.kind[b]
            real = (k == CTX) | (k == ORIG)
            torch.testing.assert_close(h[b][real], x, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(h[b][k == PSEUDO], a_w, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(h[b][k == SPAN], a_s, rtol=1e-5, atol=1e-5)
            assert len(a_s) == len(a_w) > 0
            assert (t("step")[t("kind") == SPAN] < t("step")[t("kind") == PSEUDO]).any()    # multi-token spans


# --- 3.1 fragments, 3.2 noise ----------------------------------------------------------------------------------

def test_fragment_statistics(toy):
    obj = get_objective("ernie_gen", toy)
    rng = random.Random(0)
    n = 1000       # single-piece words: lengths in tokens = in words; ~50 long fragments a passage, so that the
                   # last one (cut to the budget left, and more often a long one) barely biases the others
    words = [(k, k + 1) for k in range(n)]
    lengths = {(1, 4): [], (4, 32): []}
    regimes, coverage = [], []
    for _ in range(300):
        frags, regime = obj.sample_fragments(words, rng)
        regimes.append(regime)
        ordered = sorted(frags)
        assert all(a[1] < b[0] for a, b in zip(ordered, ordered[1:]))      # no overlap, not even touching
        sizes = [w1 - w0 for w0, w1 in frags]                # in drawing order
        coverage.append(sum(sizes) / n)
        lengths[regime] += sizes[:-1]                        # the last drawn may be cut to the remaining budget
    assert set(regimes) == {(1, 4), (4, 32)}
    assert abs(regimes.count((1, 4)) / 300 - LENGTH_DISTRIBUTIONS[0][0]) < 0.1
    assert all(c == 0.25 for c in coverage)                  # budget = round(0.25 * 1000) tokens, spent exactly
    short, long = lengths[(1, 4)], lengths[(4, 32)]
    assert min(short) == 1 and max(short) == 4 and abs(sum(short) / len(short) - 2.5) < 0.15    # U(1,4): 2.5
    assert min(long) == 4 and max(long) == 32 and abs(sum(long) / len(long) - 18) < 1.0         # U(4,32): 18


def fragments_of(batch, b):
    """Runs of consecutive positions among the T' rows: the fragments (they never touch)."""
    pos = batch.position_ids[b][batch.kind[b] == ORIG].tolist()
    runs = [[pos[0]]]
    for p, q in zip(pos, pos[1:]):
        assert q > p                                         # fragments in passage order
        runs[-1].append(q) if q == p + 1 else runs.append([q])
    return runs


def test_fragments_on_real_passages(tok, passages):
    """Word pieces respected, order kept, S' + T = the passage, budget near 25% on real text."""
    obj = get_objective("ernie_gen", tok, rho_p=0.0)
    cont = obj.continuation
    examples = passages["train"][:200]
    batch = obj.make_batch(examples, random.Random(1))
    ratios, n_frag_cut = [], 0
    for b, passage in enumerate(examples):
        flat = [tok.sos_id] + [t for s in passage for t in s] + [tok.eos_id]
        k, ids_b, pos_b = batch.kind[b], batch.input_ids[b], batch.position_ids[b]
        real = (k == CTX) | (k == ORIG)
        rebuilt = dict(zip(pos_b[real].tolist(), ids_b[real].tolist()))
        assert rebuilt == dict(enumerate(flat))              # every token once, at its own position
        for run in fragments_of(batch, b):
            assert flat[run[0]] not in cont or run[0] == 1     # starts at a word start (or the passage start)
            assert flat[run[-1] + 1] not in cont             # the next token starts a word
            n_frag_cut += 1
        ratios.append(int((k == ORIG).sum()) / (len(flat) - 2))
    assert n_frag_cut > 200
    assert 0.24 < sum(ratios) / len(ratios) < 0.32           # word ends may run past the drawn length


def test_noise_rate_and_clean_labels(tok, pairs):
    for task, key, rho in (("seq2seq", "rho_f", 0.7), ("seq2seq", "rho_f", 0.5), ("pretrain", "rho_p", 0.05)):
        obj = get_objective("ernie_gen", tok, task=task, **{key: rho})
        batch = obj.make_batch(pairs["train"][:300] if task == "seq2seq" else
                               [[p[0] + p[1]] for p in pairs["train"][:300]], random.Random(0))
        k = batch.kind
        noised = batch.input_ids[k == ORIG]
        clean = batch.labels[k == PSEUDO]                    # labels of A_W: T in the same order
        assert noised.shape == clean.shape and noised.numel() > 2000
        changed = (noised != clean).float().mean().item()
        assert abs(changed - rho * (1 - 1 / len(tok))) < 0.03, (task, rho, changed)
        assert not any(int(i) in tok.special_ids for i in noised[noised != clean])
        if task == "seq2seq":                                # labels are the clean target + [EOS]
            for b, (_, tgt) in enumerate(pairs["train"][:300]):
                assert batch.labels[b][k[b] == PSEUDO].tolist() == tgt + [tok.eos_id]


def greedy_spans(tokens, continuation, ngrams):
    """3.3 written out: the words of tokens (a piece and the `##` pieces after it), then from the current word the
    trigram, the bigram, else the unigram that V_span holds -> span token ranges [(b, e)]."""
    starts = [k for k, t in enumerate(tokens) if k == 0 or t not in continuation]
    bounds = list(zip(starts, starts[1:] + [len(tokens)]))
    words = [tuple(tokens[a:b]) for a, b in bounds]
    out, i = [], 0
    while i < len(words):
        n = next((n for n in (3, 2) if i + n <= len(words) and tuple(words[i:i + n]) in ngrams), 1)
        out.append((bounds[i][0], bounds[i + n - 1][1]))
        i += n
    return out


def test_spans_are_cut_in_the_noised_target(toy):
    """3.3 samples the spans "consecutively in T'": with every target token noised, the span flow's blocks follow
    the V_span lookups on the noised T' (random tokens) and not on the clean T (where no n-gram is in V_span)."""
    w = lambda text: tuple((i,) for i in ids(toy, text))
    vocab = SpanVocab([w(f"{x} {y}") for x in "ab" for y in "ab"])     # every bigram of a and b
    clean = ids(toy, " ".join("efgh"[k % 4] for k in range(160)))     # no a, no b: clean spans are single words
    cont = frozenset(ids(toy, "tonight")[1:])                          # ##night: a noised one joins its word
    n_long = 0
    pre = get_objective("ernie_gen", toy, rho_p=1.0, span_vocab=vocab)
    batch = pre.make_batch([[clean]] * 12, random.Random(0))
    for b in range(12):
        k = batch.kind[b]
        noised, starts = batch.input_ids[b][k == ORIG].tolist(), batch.step[b][k == SPAN].tolist()
        want, f0 = [], 0
        for run in fragments_of(batch, b):                   # spans never cross a fragment boundary
            want += [(f0 + s, f0 + e) for s, e in greedy_spans(noised[f0:f0 + len(run)], cont, vocab.ngrams)]
            f0 += len(run)
        assert starts == [s + 1 for s, e in want for _ in range(s, e)]
        n_long += sum(e - s > 1 for s, e in want)
    assert n_long >= 5                                       # bigrams of the noise (and ##night joining words)
    # fine-tuning with the span flow: spans cut in T' without its last token, which is a span of its own
    ft = get_objective("ernie_gen", toy, task="seq2seq", rho_f=1.0, lam_finetune=0.5, span_vocab=vocab)
    batch = ft.make_batch([(clean[:10], clean[:60])] * 8, random.Random(0))
    n_long = 0
    for b in range(8):
        k = batch.kind[b]
        noised, starts = batch.input_ids[b][k == ORIG].tolist(), batch.step[b][k == SPAN].tolist()
        want = greedy_spans(noised[:-1], cont, vocab.ngrams) + [(60, 61)]
        assert starts == [s + 1 for s, e in want for _ in range(s, e)]
        n_long += sum(e - s > 1 for s, e in want)
    assert n_long >= 5


def test_default_rates_and_lambda(toy):
    pre, ft = get_objective("ernie_gen", toy), get_objective("ernie_gen", toy, task="seq2seq")
    assert (pre.rho, pre.lam, ft.rho, ft.lam) == (0.05, 0.5, 0.7, 1.0)
    assert pre.query_token == "[ATTN]" and pre.segments == (0, 1)


# --- 3.3 span vocabulary ---------------------------------------------------------------------------------------

TOY_CORPUS = ["new york is big tonight", "new york is a city", "a city is big", "tonight new york"]


def test_t_statistic_by_hand(toy, tmp_path):
    # words (tonight = "to ##night" is ONE word): new 3, york 3, is 3, big 2, tonight 2, a 2, city 2 -> N1 = 17
    # bigrams (within sentences): new york 3, york is 2, is big 2, a city 2, big tonight 1, is a 1, city is 1,
    #   tonight new 1                                                                            -> N2 = 13
    # t(new york) = (3/13 - (3/17)^2) / sqrt((3/13)(10/13) / 13) = (0.230769 - 0.031142) / 0.116855 = 1.70834
    # t(a city)   = (2/13 - (2/17)^2) / sqrt((2/13)(11/13) / 13) = (0.153846 - 0.013841) / 0.100068 = 1.39910
    # t(is big)   = (2/13 - 6/289) / 0.100068 = 1.32994;   t(york is) = (2/13 - 9/289) / 0.100068 = 1.22621
    # t(big tonight) = (1/13 - 4/289) / sqrt((1/13)(12/13) / 13) = 0.063082 / 0.073905 = 0.85356
    # trigrams: new york is 2, the 5 others once -> N3 = 9
    # t(new york is) = (2/9 - 27/4913) / sqrt((2/9)(7/9) / 9) = 0.216727 / 0.138580 = 1.56391
    # t(is big tonight) = (1/9 - 12/4913) / sqrt((1/9)(8/9) / 9) = 1.03734; t(york is big) = 1.02568
    assert t_statistic(3, 13, (3 / 17) ** 2) == pytest.approx(1.70834, abs=1e-4)
    assert t_statistic(2, 13, 4 / 289) == pytest.approx(1.39910, abs=1e-4)
    assert t_statistic(1, 13, 4 / 289) == pytest.approx(0.85356, abs=1e-4)
    assert t_statistic(2, 9, 27 / 4913) == pytest.approx(1.56391, abs=1e-4)
    cache = tmp_path / "spans.json"
    vocab = build_span_vocab(TOY_CORPUS, toy, n_bigrams=3, n_trigrams=1, min_t=1.0, cache_path=str(cache),
                             progress=False)
    table = json.loads(cache.read_text())
    assert table["words"] == 17
    assert [(text, c) for text, _, c in table["ngrams"]] == [("new york", 3), ("a city", 2), ("is big", 2),
                                                             ("new york is", 2)]
    assert [t for _, t, _ in table["ngrams"]] == pytest.approx([1.70834, 1.39910, 1.32994, 1.56391], abs=1e-4)
    w = lambda text: tuple((i,) for i in ids(toy, text))
    assert vocab.ngrams == {w("new york"), w("a city"), w("is big"), w("new york is")}
    # the threshold: at min_t = 1.5 only new york (1.708) and new york is (1.564) are significant
    strict = build_span_vocab(TOY_CORPUS, toy, n_bigrams=3, n_trigrams=1, min_t=1.5, progress=False)
    assert strict.ngrams == {w("new york"), w("new york is")}
    # a word = its pieces: "big tonight" is a bigram of two words, the second one "to ##night"
    every = build_span_vocab(TOY_CORPUS, toy, min_t=0.0, progress=False)
    assert ((ids(toy, "big")[0],), tuple(ids(toy, "tonight"))) in every.ngrams
    # the cache is read back (same tokenizer and settings), even with an empty corpus, and also by path
    assert build_span_vocab([], toy, n_bigrams=3, n_trigrams=1, min_t=1.0, cache_path=str(cache)).ngrams == vocab.ngrams
    assert load_span_vocab(str(cache), toy).ngrams == vocab.ngrams
    assert get_objective("ernie_gen", toy, span_vocab=str(cache)).spans_table.ngrams == vocab.ngrams


def test_greedy_segmentation_by_hand(toy):
    w = lambda text: tuple((i,) for i in ids(toy, text))
    vocab = SpanVocab([w("new york is"), w("new york"), w("is big"), w("a city")])
    obj = get_objective("ernie_gen", toy, span_vocab=vocab)
    sentence = ids(toy, "new york is big tonight a city")    # pieces: new york is big to ##night a city
    assert len(sentence) == 8
    # trigram "new york is" first, so "is big" is not reachable; "tonight" is one word of two pieces
    assert obj.spans(sentence) == [(0, 3), (3, 4), (4, 6), (6, 8)]
    assert vocab.segment([tuple(sentence[a:b]) for a, b in word_ranges(sentence, obj.continuation)]) == [3, 1, 1, 2]
    # without a vocabulary every word is a span (and word pieces stay together)
    plain = get_objective("ernie_gen", toy, lam_pretrain=1.0)
    assert plain.spans(sentence) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 6), (6, 7), (7, 8)]


# --- training, determinism, bad input ----------------------------------------------------------------------------

def test_word_and_span_losses_fall(tok, passages):
    vocab = build_span_vocab(passages["train"], tok, progress=False)
    assert len(vocab) > 20
    obj = get_objective("ernie_gen", tok, span_vocab=vocab)
    model = tiny_model(len(tok), n_embd=64, ffn_dim=128).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng, data = random.Random(0), passages["train"]
    history = {"loss_word": [], "loss_span": []}
    for step in range(60):
        batch = obj.make_batch(rng.sample(data, 16), rng)
        loss, metrics = obj.loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        for key in history:
            history[key].append(float(metrics[key]))
        assert set(metrics) == {"loss", "loss_word", "loss_span", "acc_word", "acc_span"}
        assert float(metrics["loss"]) == pytest.approx(0.5 * history["loss_word"][-1] + 0.5 * history["loss_span"][-1],
                                                       rel=1e-5)
    for key, values in history.items():
        first, last = sum(values[:10]) / 10, sum(values[-10:]) / 10
        assert last < first - 0.8, (key, first, last)


def test_determinism(tok, passages, pairs):
    for task, data in (("pretrain", passages["train"][:8]), ("seq2seq", pairs["train"][:8])):
        obj = get_objective("ernie_gen", tok, task=task, lam_finetune=0.5)
        a, b = obj.make_batch(data, random.Random(7)), obj.make_batch(data, random.Random(7))
        c = obj.make_batch(data, random.Random(8))
        for key in ("input_ids", "position_ids", "segment_ids", "attn_mask", "labels"):
            assert torch.equal(getattr(a, key), getattr(b, key))
        assert not torch.equal(a.input_ids, c.input_ids)    # another seed: other fragments / other noise


def test_bad_input_is_skipped_or_truncated(toy):
    obj = get_objective("ernie_gen", toy, max_len=12)
    batch = obj.make_batch([[], [ids(toy, "a")], [ids(toy, "tonight")]], random.Random(0))
    assert obj.skipped == {"passage too short for a fragment (needs two words)": 3}
    model = tiny_model(len(toy))
    loss, metrics = obj.loss(model, batch)                   # nothing to predict: zero loss, no crash
    assert float(loss.detach()) == 0.0 and batch.labels.eq(-100).all()
    with pytest.warns(UserWarning, match="truncated"):
        long = obj.make_batch([[ids(toy, "a b c d e f g h") * 3]], random.Random(0))
    assert int(long.position_ids.max()) == 11 and (long.labels != -100).any()
    loss, _ = obj.loss(model, long)
    assert torch.isfinite(loss)
    s2s = get_objective("ernie_gen", toy, task="seq2seq", max_len=8)
    with pytest.warns(UserWarning, match="truncated"):
        batch = s2s.make_batch([(ids(toy, "a b c d e f"), ids(toy, "a b c d e f g h")), (ids(toy, "a") * 9, [])],
                               random.Random(0))
    assert int(batch.position_ids.max()) == 7
    assert batch.labels[1][batch.kind[1] == PSEUDO].tolist() == [toy.eos_id]   # empty target: [EOS]
    with pytest.raises(ValueError, match="unknown option.*rho"):
        get_objective("ernie_gen", toy, rhoo=0.1)
    with pytest.raises(ValueError, match="gamma"):
        get_objective("ernie_gen", toy, gamma=1.5)
    with pytest.raises(FileNotFoundError, match="span vocabulary"):
        get_objective("ernie_gen", toy, span_vocab="/nonexistent/spans.json")


# --- bench/study.py's diagnostics of ERNIE-GEN's gap ------------------------------------------------------------

def test_study_swaps_pretraining_and_fine_tuning_recipe(tmp_path):
    """The two cross systems of bench/study.py: ERNIE-GEN's fine-tuning and infilling decoding on pmlm's
    pre-training, pmlm's fine-tuning on ERNIE-GEN's. Each reuses the other system's pre-training (no new
    one is planned) and runs end to end: train.py from the other objective's checkpoint, then decoding."""
    import sys
    from pathlib import Path
    import pydoc_data.topics
    import generate
    import train
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "bench"))
    import study
    args = study.parse_args(["--out", str(tmp_path / "study"), "--only",
                             "ernie_gen/ft from pmlm,pmlm/ft from ernie_gen"])
    todo = study.wanted_cells(study.systems_of(args), ["gigaword"], args.seeds)
    assert todo == [("ernie_gen/ft from pmlm", "gigaword", 0), ("pmlm/ft from ernie_gen", "gigaword", 0)]
    assert [j for j in study.plan(todo, args) if j[0] == "pre"] == [("pre", "pmlm", 0), ("pre", "ernie_gen", 0)]
    # what a cell runs, at toy size: pre-train one objective, fine-tune and decode with the other
    texts = [" ".join(text.split())[:600] for _, text in sorted(pydoc_data.topics.topics.items())[:30]]
    (tmp_path / "docs.txt").write_text("\n\n".join(texts))
    pairs = [{"src": t[:200], "tgt": t[:40]} for t in texts]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    small = ["--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--ffn_dim", "64", "--vocab_size", "400",
             "--batch_size", "4", "--max_steps", "2", "--progress", "false", "--eval_batches", "1",
             "--cache_dir", str(tmp_path / "cache")]
    for pre, ft in (("pmlm", "ernie_gen"), ("ernie_gen", "pmlm")):
        train.main(small + ["--objective", pre, "--seq_len", "48", "--data", str(tmp_path / "docs.txt"),
                            "--out_dir", str(tmp_path / f"pre-{pre}")])
        train.main(small + ["--objective", ft, "--task", "seq2seq", "--data", str(tmp_path / "pairs.jsonl"),
                            "--init_from", str(tmp_path / f"pre-{pre}" / "ckpt.pt"),
                            "--out_dir", str(tmp_path / f"ft-{ft}")])
        model, tok, objective = generate.load_checkpoint(str(tmp_path / f"ft-{ft}" / "ckpt.pt"))
        assert objective.name == ft
        # the checkpoint fixes the shapes: pmlm's relative position bias comes along, or stays away
        assert model.config.rel_pos_buckets == (32 if pre == "pmlm" else 0)
        out = generate.generate(model, objective, [tok.encode(texts[0][:100])], beam_size=2, max_len=5, n_best=2)
        assert len(out) == 1 and len(out[0]) == 2 and all(len(tokens) <= 5 for tokens, _ in out[0])


def test_study_ernie_gen_with_the_relative_bias(toy, tmp_path):
    """bench/study.py's "ernie_gen/relative bias": ERNIE-GEN pre-trained with pmlm's relative position bias, to
    tell the objective from the architecture in the swaps' result. Its option reaches the model (for the FLOPs
    and corpus-token count) and train.py's flags; an objective's own option still reaches the objective."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import study
    spec = study.SYSTEMS["ernie_gen/relative bias"]
    assert spec["pre"] == {"rel_pos_buckets": 32} and spec["ablation_of"] == "ernie_gen"
    cfg = {"preset": "tiny", "vocab": len(toy)}
    obj, model = study.objective_and_model(cfg, "ernie_gen", toy, "pretrain", {**spec["pre"], "lam_pretrain": 0.7})
    assert model.rel_bias is not None and model.config.rel_pos_buckets == 32 and obj.lam_pretrain == 0.7
    _, plain = study.objective_and_model(cfg, "ernie_gen", toy, "pretrain", {})
    assert plain.rel_bias is None
    args = study.parse_args(["--out", str(tmp_path)])
    flags = study.train_flags(cfg, "ernie_gen", tmp_path, "cache", args, "auto", "false") + study.option_flags(spec["pre"])
    assert flags[flags.index("--rel_pos_buckets") + 1] == "32"
