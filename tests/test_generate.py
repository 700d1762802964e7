"""generate.py: the cached decoder equals recomputation for every objective (both block layouts), beam search on
hand-built score tables, fine-tuning layout == decoding loop (teacher-forced log-probs agree), and the command line.
The fast layer's static-shape step (CUDA graphs) is held equal to this readable decoder in tests/test_fast.py."""
import json
import math
import os
import random
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import evaluate as E
import generate as G
import model as M
import utils
from objectives import get_objective
from tests.helpers import tiny_model
from tokenizer import SPECIAL_TOKENS, WordPiece

TOK = WordPiece(list(SPECIAL_TOKENS) + ["."] + [f"w{i}" for i in range(56)])      # 64 pieces, "." = 7
DOT, EOS = TOK.token_to_id("."), TOK.eos_id
NAMES = ("unilm", "pmlm", "ernie_gen", "palm")
# options that turn the training noise off, so a training row sees exactly what the decoder shows it
QUIET = dict(unilm=dict(target_mask_prob=0.0), pmlm=dict(target_noise_prob=0.0), ernie_gen=dict(rho_f=0.0),
             palm={})


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread is ~10x faster than two on a loaded 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def make_model(name, buckets=32, seed=0, post_ln=False):
    """A tiny random model with weights large enough for peaked distributions (no near-ties in argmax/top-k,
    and masks that matter: a wrong visibility changes the scores clearly)."""
    m = tiny_model(len(TOK), seed=seed, rel_pos_buckets=buckets, max_position=64, copy_head=name == "palm",
                   post_ln=post_ln)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    return m


def random_ids(rng, n):
    return [rng.randrange(DOT, len(TOK)) for _ in range(n)]


def sources(lengths=(0, 3, 9, 14), seed=0):
    rng = random.Random(seed)
    return [random_ids(rng, n) for n in lengths]


# --- cache == recomputation, batching, beams, for the four decoding styles ----------------------------------------


LAYOUTS = pytest.mark.parametrize("post_ln", [False, True], ids=["pre-LN", "post-LN"])


@LAYOUTS
@pytest.mark.parametrize("buckets", [0, 32])
@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("name", NAMES)
def test_cache_equals_no_cache(name, beam, buckets, post_ln):
    model, obj = make_model(name, buckets, post_ln=post_ln), get_objective(name, TOK, task="seq2seq", max_len=64)
    kw = dict(beam_size=beam, n_best=beam, max_len=8, min_len=2, batch_size=4)
    cached = G.generate(model, obj, sources(), **kw)
    full = G.generate(model, obj, sources(), use_cache=False, **kw)
    assert [[ids for ids, _ in h] for h in cached] == [[ids for ids, _ in h] for h in full]
    for hc, hf in zip(cached, full):
        assert len(hc) == beam
        assert [s for _, s in hc] == pytest.approx([s for _, s in hf], abs=1e-4)
        assert all(len(ids) >= 2 for ids, _ in hc)                    # min_len
    # a batch of different lengths decodes each source as if it were alone (padding never attended)
    alone = [G.generate(model, obj, [s], **kw)[0] for s in sources()]
    assert [[ids for ids, _ in h] for h in alone] == [[ids for ids, _ in h] for h in cached]


@LAYOUTS
@pytest.mark.parametrize("name", NAMES)
def test_teacher_forced_scores_cache_equals_no_cache(name, post_ln):
    model, obj = make_model(name, post_ln=post_ln), get_objective(name, TOK, task="seq2seq", max_len=64)
    srcs, tgts = sources(), sources((5, 1, 7, 3), seed=1)
    a = G.score_targets(model, obj, srcs, tgts)
    b = G.score_targets(model, obj, srcs, tgts, use_cache=False)
    model.config.attn_impl = "naive"                   # the readable attention path on the cache's views
    c = G.score_targets(model, obj, srcs, tgts)
    for x, y, z, t in zip(a, b, c, tgts):
        assert x.shape == (len(t),) and torch.allclose(x, y, atol=1e-5) and torch.allclose(x, z, atol=1e-5)
        assert (x < 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_next_inputs_are_the_step_logprobs_runs(name):
    """Decoder.next_inputs (what 04_ernie_gen.ipynb draws): at step t, y_t-1 @ S+t-1 and the query token @ S+t
    (no query token: y_t-1 @ S+t), whose mask row sees the source, y_<t and itself; logprobs runs exactly them."""
    model, obj = make_model(name), get_objective(name, TOK, task="seq2seq", max_len=64)
    src, ys = [9, 10, 11], [12, 13, 14]
    S = len(src) + 2
    dec = G.Decoder(model, obj, [src], 8)
    query = obj.query_token and TOK.token_to_id(obj.query_token)
    for t, y in enumerate(ys):
        ids, pos, seg, mask = dec.next_inputs()
        fed = ([ys[t - 1]] if t else [] if query else [TOK.sos_id]) + ([query] if query else [])
        assert ids[0].tolist() == fed
        assert pos[0].tolist() == list(range(S + t + 1 - len(fed), S + t + 1))   # ..., S+t: the query's place
        assert (seg[0] == obj.segments[1]).all()
        assert mask[0, -1].tolist() == [True] * (S + t + 1)           # the source, y_<t and itself
        # logprobs runs those columns: the same scores as a decoder that recomputes every column
        full = G.Decoder(model, obj, [src], 8, use_cache=False)
        for y_done in ys[:t]:
            full.append(torch.tensor([y_done]))
        assert torch.allclose(dec.logprobs(), full.logprobs(), atol=1e-5)
        dec.append(torch.tensor([y]))


def test_generate_py_door_into_the_fast_layer(monkeypatch):
    """generate.py's door (decoding_for): this file's readable decoder on a CPU, with --no_cache and with
    --no_cuda_graph; on CUDA the fast layer's graphed decoder, which refuses a CPU model in one line."""
    import argparse
    import fast
    model, obj = make_model("pmlm"), get_objective("pmlm", TOK, task="seq2seq", max_len=64)
    args = lambda **kw: argparse.Namespace(**{"no_cache": False, "no_cuda_graph": False, **kw})
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert G.decoding_for(model, cpu, args()) is G.READABLE
    assert G.decoding_for(model, cuda, args(no_cuda_graph=True)) is G.READABLE
    assert G.decoding_for(model, cuda, args(no_cache=True)) is G.READABLE
    on_cuda = G.decoding_for(model, cuda, args())                     # fast.speed_up changes nothing on a CPU model
    assert on_cuda.decoder.func is fast.StaticDecoder and on_cuda.decoder.keywords == {"graphed": True}
    with pytest.raises(ValueError, match="needs a CUDA device") as e:
        G.generate(model, obj, sources(), max_len=8, decoding=on_cuda)
    assert "\n" not in str(e.value)
    dec = G.Decoder(model, obj, sources(), 8)
    assert type(dec.cache) is M.KVCache
    assert G.Decoder(model, obj, sources(), 8, use_cache=False).cache is None
    with pytest.raises(ValueError, match="use_cache=False"):
        fast.StaticDecoder(model, obj, sources(), 8, use_cache=False)


@pytest.mark.parametrize("name", NAMES)
def test_beam_one_equals_greedy_search(name):
    """generate() runs greedy() for beam 1; beam_search() with K=1 must agree with it."""
    model, obj = make_model(name), get_objective(name, TOK, task="seq2seq", max_len=64)
    rules = G.decoding_rules(TOK, 1, 3, None, "cpu")
    g = G.greedy(G.Decoder(model, obj, sources(), 10), 10, 1.0, rules)
    b = G.beam_search(G.Decoder(model, obj, sources(), 10), 1, 10, 1.0, rules)
    assert [h[0][0] for h in g] == [h[0][0] for h in b]
    assert [h[0][1] for h in g] == pytest.approx([h[0][1] for h in b], abs=1e-5)


def test_long_source_truncated_with_warning():
    model, obj = make_model("unilm"), get_objective("unilm", TOK, task="seq2seq", max_len=64)
    long = random_ids(random.Random(0), 80)
    limit = G.max_source_len(model, 8)                                 # 64 - 8 - 2 = 54
    with pytest.warns(UserWarning, match="truncated"):
        out = G.generate(model, obj, [long], max_len=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert out == G.generate(model, obj, [long[:limit]], max_len=8)
    with pytest.raises(ValueError, match="max_len"):
        G.generate(model, obj, [long], max_len=70)


# --- the fine-tuning layout is the decoding loop ----------------------------------------------------------------


def training_rows(obj, model, batch, n_src):
    """Per labelled target row of a training batch: (example, decoding step, log P(label)) where the model's own
    training layout puts it. The step is read from the row's position id: position S_b + t predicts y_t."""
    with torch.no_grad():
        h = model(batch.input_ids, batch.position_ids, batch.segment_ids, batch.attn_mask)
    out = []
    for b, r in (batch.labels != -100).nonzero().tolist():
        S = n_src[b]
        step = int(batch.position_ids[b, r]) - S
        if step < 0 or (obj.query_token and batch.input_ids[b, r] != TOK.token_to_id(obj.query_token)):
            continue                                                    # a context row, or a corrupted query
        source = dict(hidden=h[b:b + 1, :S], ids=batch.input_ids[b:b + 1, :S], mask=torch.ones(1, S, dtype=bool))
        with torch.no_grad():
            logp = obj.decode_logprobs(model, h[b, r][None], source)[0, batch.labels[b, r]]
        out.append((b, step, logp.item()))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_training_layout_matches_decoding(name):
    """Teacher-forced log-probs of the fine-tuning batch == the decoder's per-step scores for the same target."""
    model = make_model(name)
    obj = get_objective(name, TOK, task="seq2seq", max_len=64, **QUIET[name])
    srcs, tgts = sources((4, 11, 0), seed=2), sources((6, 3, 2), seed=3)
    forced = G.score_targets(model, obj, srcs, [t + [EOS] for t in tgts])
    n_src = [len(s) + 2 for s in srcs]
    checked = set()
    for seed in range(40 if name == "unilm" else 1):                   # UniLM predicts one random row per example
        batch = obj.make_batch(list(zip(srcs, tgts)), random.Random(seed))
        rows = training_rows(obj, model, batch, n_src)
        for b, step, logp in rows:
            assert logp == pytest.approx(float(forced[b][step]), abs=1e-4), (b, step)
            checked.add((b, step))
        n_labels = int((batch.labels != -100).sum())
        if len(rows) == n_labels:       # every labelled row is a decoding step: the objective's loss agrees too
            with torch.no_grad():
                loss, _ = obj.loss(model, batch)
            want = -sum(float(forced[b][step]) for b, step, _ in rows) / len(rows)
            assert float(loss) == pytest.approx(want, abs=1e-4)
    every_step = {(b, t) for b, y in enumerate(tgts) for t in range(len(y) + 1)}
    assert checked == every_step if name != "unilm" else len(checked) >= 8


# --- beam search logic on hand-built score tables -----------------------------------------------------------------


class TableDecoder:
    """Stands in for generate.Decoder: next-token log-probs come from table(source, history) -> {token: logp};
    tokens not listed get `rest` (impossible by default)."""

    def __init__(self, table, n_sources=1, rest=-math.inf):
        self.table, self.rest, self.calls = table, rest, 0
        self.src_ids = torch.zeros(n_sources, 1, dtype=torch.long)
        self.src_len = torch.ones(n_sources, dtype=torch.long)
        self.source = torch.arange(n_sources)
        self.tgt = torch.zeros(n_sources, 0, dtype=torch.long)

    def logprobs(self):
        self.calls += 1
        out = torch.full((len(self.tgt), len(TOK)), self.rest)
        for r, (b, hist) in enumerate(zip(self.source.tolist(), self.tgt.tolist())):
            for tok, lp in self.table(b, tuple(hist)).items():
                out[r, tok] = lp
        return out

    def append(self, tokens):
        self.tgt = torch.cat([self.tgt, tokens[:, None]], dim=1)

    def reorder(self, index, same_sources=False):
        self.src_ids, self.src_len, self.source, self.tgt = (x[index] for x in (self.src_ids, self.src_len,
                                                                                self.source, self.tgt))


A, B_, C, D = 10, 11, 12, 13            # four word ids


def search(table, beam=1, max_len=10, alpha=1.0, min_len=0, ngram=0, ignore=None, n_sources=1):
    rules = G.decoding_rules(TOK, min_len, ngram, ignore if ignore is not None else [DOT], "cpu")
    dec = TableDecoder(table, n_sources)
    out = G.greedy(dec, max_len, alpha, rules) if beam == 0 else G.beam_search(dec, beam, max_len, alpha, rules)
    return out, dec.calls


def test_length_penalty_decides_between_short_and_long():
    # [EOS] now: -1.2 (1 token); "a b [EOS]": -0.2 - 0.2 - 1.0 = -1.4 (3 tokens)
    table = lambda b, h: {(): {EOS: -1.2, A: -0.2}, (A,): {B_: -0.2}, (A, B_): {EOS: -1.0}}.get(h, {})
    out, _ = search(table, beam=2, alpha=0.0)
    assert out[0][0] == ([], pytest.approx(-1.2))                      # alpha 0: the raw sum, short wins
    out, _ = search(table, beam=2, alpha=1.0)
    assert out[0][0] == ([A, B_], pytest.approx(-1.4 / (8 / 6)))        # ((5 + 3) / 6)^1: long wins
    assert out[0][1] == ([], pytest.approx(-1.2 / 1.0))                 # n-best: the short one second
    # greedy takes "a" first (-0.2 > -1.2) and is not fooled either way
    assert search(table, beam=0, alpha=0.0)[0][0][0][0] == [A, B_]


def test_ban_tokens_forbids_repeated_trigram_unless_it_holds_an_ignore_word():
    logp = torch.zeros(3, len(TOK))
    tgt = torch.tensor([[A, B_, C, A, B_], [A, DOT, B_, A, DOT], [C, A, B_, C, A]])
    G.ban_tokens(logp, tgt, 5, EOS, 0, torch.tensor([], dtype=torch.long), 3, torch.tensor([DOT]))
    assert logp[0, C] == -math.inf and (logp[0] == 0).sum() == len(TOK) - 1     # "a b c" again
    assert (logp[1] == 0).all()                                                  # "a . b" holds "."
    assert logp[2, B_] == -math.inf and (logp[2] == 0).sum() == len(TOK) - 1    # "c a b" again
    logp = torch.zeros(3, len(TOK))
    G.ban_tokens(logp, tgt, 5, EOS, 0, torch.tensor([], dtype=torch.long), 3, None)  # no ignore words
    assert logp[1, B_] == -math.inf
    logp = torch.zeros(1, len(TOK))
    G.ban_tokens(logp, tgt[:1], 5, EOS, 6, torch.tensor([0, 2]), 0, None)         # min_len, banned ids, no n-grams
    assert logp[0, [EOS, 0, 2]].eq(-math.inf).all() and (logp[0] == 0).sum() == len(TOK) - 3


def test_ngram_blocking_in_search():
    cycle = {A: B_, B_: C, C: A}
    # the model loves the cycle a b c a b c ...; d is always second best
    table = lambda b, h: {cycle.get(h[-1], A) if h else A: -0.1, D: -1.0}
    out, _ = search(table, beam=0, max_len=7, ngram=3)
    assert out[0][0][0] == [A, B_, C, A, B_, D, A]                  # "a b c" may not repeat; "b d a" is new
    out, _ = search(table, beam=0, max_len=7, ngram=0)
    assert out[0][0][0] == [A, B_, C, A, B_, C, A]
    dots = {A: DOT, DOT: B_, B_: A}                                  # with "." every trigram holds an ignore word
    out, _ = search(lambda b, h: {dots.get(h[-1], A) if h else A: -0.1, D: -1.0}, beam=3, max_len=7, ngram=3)
    assert out[0][0][0] == [A, DOT, B_, A, DOT, B_, A]


@pytest.mark.parametrize("beam", [0, 1, 3])
def test_min_and_max_length(beam):
    eager = lambda b, h: {EOS: -0.1, A: -1.0, B_: -1.5, C: -2.0}     # [EOS] is always best
    out, _ = search(eager, beam=beam, min_len=3, max_len=10)
    ids, score = out[0][0]
    assert len(ids) == 3 and score == pytest.approx((-3 * 1.0 - 0.1) / ((5 + 4) / 6))
    never = lambda b, h: {EOS: -9.0, A: -0.1, B_: -0.5}              # [EOS] never wins: max_len ends the search
    out, calls = search(never, beam=beam, max_len=6)
    assert len(out[0][0][0]) == 6 and calls == 6


def test_early_stop_when_every_beam_is_done():
    table = lambda b, h: {A: -0.1, B_: -0.2, C: -0.3, EOS: -5.0} if not h else {EOS: -0.01, D: -3.0}
    out, calls = search(table, beam=2, max_len=50)
    assert calls == 2                                                # two steps, not fifty
    assert [ids for ids, _ in out[0]] == [[A], [B_]]


def test_n_best_equals_exhaustive_search():
    """With a beam wide enough to keep every prefix, beam search is exhaustive: n-best = the true ranking."""
    def table(b, h):
        g = torch.Generator().manual_seed(hash((b,) + h) % 2**31)
        return dict(zip([A, B_, C, EOS], torch.randn(4, generator=g).mul(2).log_softmax(0).tolist()))

    max_len, alpha = 3, 0.7
    for b in range(3):
        hyps = []
        for n in range(max_len + 1):            # every sequence of n words, then [EOS] (or none at max_len)
            for words in __import__("itertools").product([A, B_, C], repeat=n):
                lp = sum(table(b, words[:k])[w] for k, w in enumerate(words))
                if n < max_len:
                    hyps.append((list(words), (lp + table(b, words)[EOS]) / G.gnmt_penalty(n + 1, alpha)))
                else:
                    hyps.append((list(words), lp / G.gnmt_penalty(n, alpha)))
        hyps.sort(key=lambda x: -x[1])
        out, _ = search(lambda _, h: table(b, h), beam=40, max_len=max_len, alpha=alpha)
        got = out[0]
        assert len(got) == len(hyps) == 40
        assert [ids for ids, _ in got] == [ids for ids, _ in hyps]
        assert [s for _, s in got] == pytest.approx([s for _, s in hyps])
    # several sources at once: each gets its own ranking, scores sorted best first
    out, _ = search(table, beam=3, max_len=4, n_sources=3)
    assert len(out) == 3 and all(len(h) >= 3 and h == sorted(h, key=lambda x: -x[1]) for h in out)


@pytest.mark.parametrize("seed", range(4))
def test_beam_one_equals_greedy_on_tables(seed):
    def table(b, h):
        g = torch.Generator().manual_seed(seed * 1000 + hash((b,) + h) % 2**31)
        return dict(zip([A, B_, C, D, EOS], torch.randn(5, generator=g).mul(2).log_softmax(0).tolist()))
    g, _ = search(table, beam=0, max_len=8, ngram=2, min_len=2, n_sources=4)
    b, _ = search(table, beam=1, max_len=8, ngram=2, min_len=2, n_sources=4)
    assert [h[0][0] for h in g] == [h[0][0] for h in b]
    assert [h[0][1] for h in g] == pytest.approx([h[0][1] for h in b])


# --- command line and checkpoints -------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def save_checkpoint(path, name="unilm"):
    """train.py's format through utils.save_checkpoint: tensors and plain values only (the RNG
    states as a tensor and a tuple of ints), so utils.read_checkpoint loads it as data."""
    model = make_model(name)
    utils.save_checkpoint(path, {
        "model": model.state_dict(), "model_config": model.config.to_dict(), "vocab": TOK.vocab,
        "lowercase": True, "objective": name, "objective_options": {}, "task": "seq2seq",
        "rng": dict(python=random.getstate(), torch=torch.get_rng_state())})
    return model


class Exploit:
    """Unpickling this runs a shell command: what torch.load(weights_only=False) would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def save_exploit(path, marker):
    """A checkpoint with every expected key, and one value that runs code when unpickled."""
    torch.save({"model": {}, "model_config": {}, "vocab": [], "objective": "unilm",
                "task": "seq2seq", "rng": Exploit(marker)}, path)


def run_script(*args):
    """python generate.py ... in the repository, as a user runs it."""
    return subprocess.run([sys.executable, "generate.py", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def assert_one_line_error(proc, prog="generate.py"):
    """Exit status 2 and exactly one line on stderr, `prog: error: ...`, no traceback."""
    lines = proc.stderr.strip().split("\n")
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_cli_round_trip_keeps_blank_lines(tmp_path, suffix):
    ckpt = tmp_path / "model.pt"
    model = save_checkpoint(ckpt)
    texts = ["w1 w2 w3", "", "w4 w5 . w6", "   ", "w7"]
    inp, out = tmp_path / f"in{suffix}", tmp_path / "out.txt"
    lines = [json.dumps({"src": t}) if suffix == ".jsonl" and t.strip() else t for t in texts]
    inp.write_text("\n".join(lines) + "\n")
    G.main(["--ckpt", str(ckpt), "--input", str(inp), "--output", str(out), "--beam", "3",
            "--max_len", "6", "--device", "cpu"])
    got = out.read_text().split("\n")[:-1]
    assert len(got) == len(texts) and got[1] == got[3] == ""
    loaded, tok, obj = G.load_checkpoint(str(ckpt))
    assert all(torch.equal(p, q)
               for p, q in zip(model.state_dict().values(), loaded.state_dict().values()))
    want = G.generate_text(loaded, tok, obj, texts, beam_size=3, max_len=6)
    assert got == want and all(got[i] for i in (0, 2, 4))
    # --no_cache and n-best: the same best line, then a JSON list of hypotheses with scores
    G.main(["--ckpt", str(ckpt), "--input", str(inp), "--output", str(out), "--beam", "3",
            "--max_len", "6", "--no_cache", "--n_best", "2"])
    rows = out.read_text().split("\n")[:-1]
    assert rows[1] == ""
    assert [json.loads(rows[i])[0]["text"] for i in (0, 2, 4)] == [want[i] for i in (0, 2, 4)]
    assert all(len(json.loads(rows[i])) == 2 for i in (0, 2, 4))
    assert not list(tmp_path.glob("*.tmp"))                       # atomic_write left no temp file


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_cli_splits_lines_on_newline_only(tmp_path, suffix, capsys):
    """U+2028, U+2029, \x0c, \x1c, \x85 and a '\r' inside a line do not split it (str.splitlines
    would): one output line per input line, a CRLF ending is stripped, and evaluate.py pairs the
    output with the input line by line."""
    ckpt = tmp_path / "model.pt"
    save_checkpoint(ckpt)
    texts = ["w1 w2\u2028w3", "w4\x0cw5 w6", "", "w7\x1cw8\x85w9", "w10\rw11", "w12 w13\u2029"]
    # ensure_ascii=False: U+2028, U+2029 and \x85 stay raw inside the JSON strings
    lines = [json.dumps({"src": t}, ensure_ascii=False) if suffix == ".jsonl" and t else t
             for t in texts]
    inp, out = tmp_path / f"in{suffix}", tmp_path / "out.txt"
    # the last line ends in CRLF (a Windows editor): its '\r' is not part of the text
    inp.write_bytes(("\n".join(lines) + "\r\n").encode("utf-8"))
    assert G.read_sources(str(inp)) == texts
    G.main(["--ckpt", str(ckpt), "--input", str(inp), "--output", str(out), "--beam", "2",
            "--max_len", "5", "--device", "cpu"])
    got = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(got) == len(texts) and got[2] == ""
    loaded, tok, obj = G.load_checkpoint(str(ckpt))
    assert got == G.generate_text(loaded, tok, obj, texts, beam_size=2, max_len=5)
    # evaluate.py reads both files by the same rule: as many predictions as references
    capsys.readouterr()
    E.main(["rouge", "--pred", str(out), "--ref", str(inp), "--json"])
    assert set(json.loads(capsys.readouterr().out)) == set(E.ROUGE_TYPES)


def test_cli_no_cuda_graph_decodes_the_same(tmp_path, monkeypatch):
    """--no_cuda_graph asks the door for the readable decoder everywhere: the same lines as the default."""
    ckpt, inp = tmp_path / "model.pt", tmp_path / "in.txt"
    save_checkpoint(ckpt, "pmlm")
    inp.write_text("w1 w2 w3\nw4 w5 . w6\n")
    seen = []                                                          # the --no_cuda_graph the door saw
    door = G.decoding_for
    monkeypatch.setattr(G, "decoding_for", lambda model, device, args: seen.append(args.no_cuda_graph)
                        or door(model, device, args))
    outs = []
    for flags in ([], ["--no_cuda_graph"]):
        out = tmp_path / f"out{len(outs)}.txt"
        G.main(["--ckpt", str(ckpt), "--input", str(inp), "--output", str(out), "--beam", "3", "--max_len", "6",
                "--device", "cpu", *flags])
        outs.append(out.read_text())
        assert seen == [bool(flags)]
        seen.clear()
    assert outs[0] == outs[1] and all(outs[0].split("\n")[:2])


def test_cli_errors_are_clean(tmp_path, capsys):
    run = run_script("--ckpt", tmp_path / "nope.pt", "--input", tmp_path / "in.txt",
                     "--output", tmp_path / "o.txt")
    assert run.returncode == 2 and "checkpoint not found" in run.stderr
    assert_one_line_error(run)
    ckpt = tmp_path / "model.pt"
    save_checkpoint(ckpt, "palm")
    with pytest.raises(SystemExit) as e:
        G.main(["--ckpt", str(ckpt), "--input", str(tmp_path / "missing.txt"),
                "--output", str(tmp_path / "o")])
    assert e.value.code == 2 and "input not found" in capsys.readouterr().err
    torch.save({"model": {}}, tmp_path / "bad.pt")
    with pytest.raises(utils.UsageError, match="missing keys"):
        G.load_checkpoint(str(tmp_path / "bad.pt"))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(utils.UsageError, match="cannot read"):
        G.load_checkpoint(str(tmp_path / "junk.pt"))


def test_pretraining_checkpoint_is_refused_with_the_fine_tuning_command(tmp_path, capsys):
    """A checkpoint that says task: pretrain cannot decode: one line naming the fine-tuning command, exit
    2, no output file (it used to write lines of dots with exit 0)."""
    ckpt, inp, out = tmp_path / "pre.pt", tmp_path / "in.txt", tmp_path / "o.txt"
    model = make_model("pmlm")
    utils.save_checkpoint(ckpt, {"model": model.state_dict(), "model_config": model.config.to_dict(),
                                 "vocab": TOK.vocab, "lowercase": True, "objective": "pmlm",
                                 "objective_options": {}, "task": "pretrain"})
    inp.write_text("w1 w2\n")
    with pytest.raises(SystemExit) as e:
        G.main(["--ckpt", str(ckpt), "--input", str(inp), "--output", str(out), "--device", "cpu"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("generate.py: error: ")
    assert "task: pretrain" in err and f"python train.py --task seq2seq --init_from {ckpt}" in err
    assert not out.exists()


def test_checkpoint_that_does_not_fit_is_one_line(tmp_path):
    """Every key there, but weights of another shape: one line, not load_state_dict's page."""
    model = make_model("unilm")
    state = {"model": {"tok_emb.weight": torch.zeros(3, 3)},
             "model_config": model.config.to_dict(), "vocab": TOK.vocab, "objective": "unilm"}
    utils.save_checkpoint(tmp_path / "other.pt", state)
    with pytest.raises(utils.UsageError, match="does not fit") as e:
        G.load_checkpoint(str(tmp_path / "other.pt"))
    assert "\n" not in str(e.value)


def test_malicious_checkpoint_is_refused_not_run(tmp_path):
    """A checkpoint is data: a pickle that would run code is refused with one line, exit 2."""
    evil, marker = tmp_path / "evil.pt", tmp_path / "MARKER"
    save_exploit(evil, marker)
    # the file is a real exploit: the old way of loading it (weights_only=False) runs the command
    torch.load(evil, weights_only=False)
    assert marker.exists()
    marker.unlink()
    inp = tmp_path / "in.txt"
    inp.write_text("w1 w2\n")
    run = run_script("--ckpt", evil, "--input", inp, "--output", tmp_path / "o.txt")
    assert_one_line_error(run)
    assert "refused" in run.stderr and str(evil) in run.stderr
    assert not marker.exists() and not (tmp_path / "o.txt").exists()
    with pytest.raises(utils.UsageError, match="refused"):
        G.load_checkpoint(str(evil))
    assert not marker.exists()


def bad_flags(tmp_path):
    """(extra flags, words the message must hold): each is a user mistake, caught up front."""
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    a_file = tmp_path / "a_file"
    a_file.write_text("x\n")
    return [
        (["--beam", "0"], "--beam"),
        (["--max_len", "-1"], "--max_len"),
        (["--max_len", "0"], "--max_len"),
        (["--min_len", "-1"], "--min_len"),
        (["--min_len", "9", "--max_len", "8"], "--min_len"),
        (["--n_best", "0"], "--n_best"),
        (["--n_best", "3", "--beam", "2"], "--n_best"),
        (["--batch_size", "0"], "--batch_size"),
        (["--no_repeat_ngram", "-1"], "--no_repeat_ngram"),
        (["--length_penalty", "nan"], "--length_penalty"),
        (["--length_penalty=-inf"], "--length_penalty"),
        (["--device", "tpu"], "--device"),
        (["--input", str(empty)], "empty"),
        (["--input", str(tmp_path)], "input not found"),
        (["--output", str(tmp_path)], "is a directory"),
        (["--output", str(a_file / "sub" / "o.txt")], "a_file is a file"),
        (["--max_len", "70"], "no room"),              # longer than the model's max_position 64
    ]


def test_cli_bad_flags_one_line_exit_2(tmp_path, capsys):
    ckpt, inp = tmp_path / "model.pt", tmp_path / "in.txt"
    save_checkpoint(ckpt)
    inp.write_text("w1 w2\n")
    base = ["--ckpt", str(ckpt), "--input", str(inp), "--output", str(tmp_path / "o.txt"),
            "--device", "cpu"]
    for flags, words in bad_flags(tmp_path):
        with pytest.raises(SystemExit) as e:
            G.main(base + flags)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, (flags, err)
        assert err.startswith("generate.py: error: ") and words in err, (flags, err)
    assert not (tmp_path / "o.txt").exists()


def test_cli_bad_flags_through_the_script(tmp_path):
    """A handful of the above as a user runs them (beam 0 and max_len -1 were tracebacks)."""
    ckpt, inp = tmp_path / "model.pt", tmp_path / "in.txt"
    save_checkpoint(ckpt)
    inp.write_text("w1 w2\n")
    base = ["--ckpt", ckpt, "--input", inp, "--output", tmp_path / "o.txt"]
    cases = [["--beam", "0"], ["--max_len", "-1"], ["--length_penalty", "inf"],
             ["--device", "tpu"], ["--max_len", "70"]]
    # in parallel: each start imports torch
    procs = [subprocess.Popen([sys.executable, "generate.py", *map(str, base + flags)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for flags in cases]
    for flags, proc in zip(cases, procs):
        _, stderr = proc.communicate(timeout=120)
        assert_one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr))
        assert flags[0] in stderr or "no room" in stderr, (flags, stderr)


def test_checkpoint_of_a_compiled_or_ddp_model_loads(tmp_path):
    model = make_model("palm")
    torch.save({"model": {"module._orig_mod." + k: v for k, v in model.state_dict().items()},
                "model_config": model.config.to_dict(), "vocab": TOK.vocab, "objective": "palm"},
               tmp_path / "c.pt")
    loaded, tok, obj = G.load_checkpoint(str(tmp_path / "c.pt"))
    assert obj.name == "palm" and obj.query_token is None and len(tok) == len(TOK)
    assert not loaded.training
    srcs = sources()
    kw = dict(beam_size=2, max_len=8)
    assert G.generate(loaded, obj, srcs, **kw) == G.generate(model, obj, srcs, **kw)
    assert G.generate(loaded, obj, [], **kw) == []
