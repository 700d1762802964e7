"""bench/study.py: the protocol --tiny end to end on a CPU with two jobs at once (pre-training at equal corpus tokens,
a control, the dev grid, the choices, the finals on test, cells as json lines), interrupted and resumed without
recomputing a finished cell, then import and report; the splits; the choice, which reads dev scores only and
refuses any other; the grid, the same size for every system; the paired bootstrap; the pages; the scheduler."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import study  # noqa: E402

TINY = study.settings(study.parse_args(["--tiny"]))
FULL = study.settings(study.parse_args([]))


def run_study(*flags):
    cmd = [sys.executable, "bench/study.py", *flags]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_tiny_study_two_workers_interrupted_resumed_imported_reported(tmp_path):
    out = tmp_path / "work"
    cells = tmp_path / "cells.jsonl"
    flags = ["--tiny", "--per_gpu", "2", "--out", str(out), "--cells_out", str(cells),
             "--cache_dir", str(ROOT / ".cache")]
    # 3 systems x 2 fine-tunings of the grid on dev, then 3 finals; interrupted after the first finished cell
    first = run_study(*flags, "--stop_after_cells", "1")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "0 cells done, 9 to run" in first.stdout
    assert "1 new cell(s) reached: 1 job(s) in flight stopped" in first.stdout
    kept = cells.read_text().splitlines()
    assert len(kept) == 1 and json.loads(kept[0])["split"] == "dev"
    # resumed: the finished cell is not recomputed
    second = run_study(*flags)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert "1 cells done, 8 to run" in second.stdout
    lines = cells.read_text().splitlines()
    assert lines[0] == kept[0] and len(lines) == 9
    records = {study.stem_of(r): r for r in map(json.loads, lines)}
    dev = [r for r in records.values() if r["split"] == "dev"]
    finals = {r["system"]: r for r in records.values() if r["split"] == "test"}
    assert len(dev) == 6 and set(finals) == {"pmlm", "palm", "pmlm/no pre-training"}
    for r in dev:
        # every configuration decoded on the dev pairs at each length penalty, nothing of the test split
        assert set(r["by_lp"]) == {"1", "2"} and r["n_pairs"] == 8 and "pairs" not in r and "scores" not in r
        assert r["options"]["ft"] == dict(study.grid(r["system"], "docsum", TINY))[r["config"]]
    for name, r in finals.items():
        assert r["task"] == "docsum" and r["seed"] == 0 and r["card"] == "cpu" and r["n_pairs"] == 8
        assert all(0 <= r["scores"][m]["f"] <= 100 for m in ("rouge1", "rouge2", "rougeL", "bleu"))
        assert 0 <= r["teacher_forced_acc"] <= 100 and r["finetune"]["flops"] > 0
        assert all(0 <= r["decode"]["copied"][k] <= 100 for k in ("outputs", "references"))
        assert r["decode"]["words"]["references"] > 0 and len(r["examples"]) == 3
        # the choice is the best dev score of its grid, decoded once on test at the chosen length penalty
        best = max((got["rougeL"], c["config"], float(lp)) for c in dev if c["system"] == name
                   for lp, got in c["by_lp"].items())
        assert r["chosen"]["dev"] == best[0] and r["lp"] == r["chosen"]["lp"] and r["chosen"]["among"] == 4
        assert r["options"]["ft"] == dict(study.grid(name, "docsum", TINY))[r["chosen"]["config"]]
        # each pair's ROUGE-L, whose mean is the score
        assert len(r["pairs"]) == 8
        assert sum(r["pairs"]) / 8 == pytest.approx(r["scores"]["rougeL"]["f"], abs=1e-3)
    # a scored fine-tuning leaves its cell, not its checkpoint; the pre-trainings stay for the next cells
    assert not list(out.glob("work/*/ft-*/ckpt.pt")) and len(list(out.glob("work/*/pre/ckpt.pt"))) == 2
    # equal compute: the two objectives read the same corpus tokens, in different numbers of steps
    assert finals["pmlm/no pre-training"]["pretrain"] is None
    assert finals["pmlm"]["pretrain"]["steps"] != finals["palm"]["pretrain"]["steps"]
    assert finals["pmlm"]["pretrain"]["flops"] > 0 and finals["palm"]["pretrain"]["flops"] > 0
    third = run_study(*flags)
    assert third.returncode == 0 and "9 cells done, 0 to run" in third.stdout
    assert "6 of 6 dev cells, 3 of 3 finals" in third.stdout
    # import merges the cells into the committed file, one a line sorted by stem; report writes the pages
    committed = tmp_path / "committed.jsonl"
    imported = run_study("import", str(cells), "--cells", str(committed))
    assert imported.returncode == 0 and "9 new" in imported.stdout, imported.stderr
    stems = [study.stem_of(c) for c in map(json.loads, committed.read_text().splitlines())]
    assert stems == sorted(stems) and "pmlm__docsum__seed0" in stems and len(stems) == 9
    again = run_study("import", str(cells), "--cells", str(committed))
    assert "0 new, 9 replaced; 9 in" in again.stdout and len(committed.read_text().splitlines()) == 9
    pages = tmp_path / "pages"
    reported = run_study("report", "--tiny", "--cells", str(committed), "--pages", str(pages))
    assert reported.returncode == 0, reported.stderr
    front = (pages / "README.md").read_text()
    assert "| pmlm | " in front and "## The answer" in front and "On docsum, " in front
    tables = (pages / "tables.md").read_text()
    assert "| palm | docsum | 4 | lr " in tables and "## The dev grid, docsum" in tables
    assert "**palm**" in (pages / "samples.md").read_text()


def test_user_mistakes_are_one_line(tmp_path):
    bad = run_study("--only", "pmlm,nonsense", "--tiny")
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith("study.py: error: --only: unknown system(s) ['nonsense']")
    missing = run_study("import", "no/such/file.jsonl")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    folder = run_study("report", "--cells", "bench/study", "--pages", str(tmp_path))
    assert folder.returncode == 2 and folder.stderr.count("\n") == 1 and ".jsonl" in folder.stderr


# --- the splits ------------------------------------------------------------------------------------------------

def test_dev_is_carved_from_the_training_pairs_and_test_is_held_out(tmp_path):
    """Gigaword: dev is its last 1,000 training pairs, test its 1,000 validation pairs; SQuAD QG: test is the last
    tenth of the lines, dev the tenth before, each cut between two source sentences; the finals' training pairs are
    select + dev, and data of another size is refused in one line."""
    giga = tmp_path / "gigaword10k"
    giga.mkdir()
    for split, n in (("train", 10_000), ("valid", 1_000)):
        (giga / f"{split}.article.txt").write_text("".join(f"{split} article {i}\n" for i in range(n)))
        (giga / f"{split}.title.txt").write_text("".join(f"{split} title {i}\n" for i in range(n)))
    squad = tmp_path / "squad_qg"
    squad.mkdir()
    # two questions on each of the first 4,000 source sentences, one on each of the others
    sources = [f"sentence {i // 2}" if i < 8000 else f"sentence {i}" for i in range(10_570)]
    (squad / "src-dev.txt").write_text("".join(s + "\n" for s in sources))
    (squad / "tgt-dev.txt").write_text("".join(f"question {i}\n" for i in range(10_570)))
    args = study.parse_args(["--data_dir", str(tmp_path), "--out", str(tmp_path / "out")])
    parts = study.task_pairs("gigaword", FULL, args)
    assert {k: len(v) for k, v in parts.items()} == dict(select=9000, dev=1000, final=10_000, test=1000)
    assert parts["dev"][0] == ("train article 9000", "train title 9000")
    assert parts["final"] == parts["select"] + parts["dev"]
    assert parts["test"][0][0] == "valid article 0"
    parts = study.task_pairs("squad_qg", FULL, args)
    assert {k: len(v) for k, v in parts.items() if k != "final"} == study.SPLITS["squad_qg"]
    assert parts["final"] == parts["select"] + parts["dev"] and parts["test"][-1][1] == "question 10569"
    for before, after in (("select", "dev"), ("dev", "test")):
        # no source sentence on both sides of a cut
        assert not {s for s, _ in parts[before]} & {s for s, _ in parts[after]}
    # a cut that falls among the questions on one sentence moves past them
    assert study.sentence_cut(["a", "a", "b", "b", "b", "c"], 0.5) == 5
    (squad / "src-dev.txt").write_text("".join(f"sentence {i // 3}\n" for i in range(10_570)))
    with pytest.raises(study.UsageError, match="splits into"):
        study.task_pairs("squad_qg", FULL, args)
    (giga / "valid.title.txt").write_text("a title\n" * 999)
    (giga / "valid.article.txt").write_text("an article\n" * 999)
    with pytest.raises(study.UsageError, match="splits into"):
        study.task_pairs("gigaword", FULL, args)


# --- the grid and the choice -------------------------------------------------------------------------------------

def test_the_grid_has_the_same_size_for_every_objective_and_every_control():
    tuned = [n for n, s in study.SYSTEMS.items() if s["ablation_of"] is None]
    assert set(tuned) == set(study.OBJECTIVES) | {f"{o}/no pre-training" for o in study.OBJECTIVES}
    for task in ("gigaword", "squad_qg"):
        sizes = {n: len(study.grid(n, task, FULL)) for n in tuned}
        assert set(sizes.values()) == {8}, sizes
        assert {study.configurations(n, task, FULL) for n in study.SYSTEMS} == {32}
        for name in tuned:
            configs = study.grid(name, task, FULL)
            # eight different fine-tunings: lr x the objective's own target knob x dropout
            assert len({json.dumps(o, sort_keys=True) for _, o in configs}) == 8
            assert len({c for c, _ in configs}) == 8
            knob = study.TARGET[study.SYSTEMS[name]["objective"]][0]
            assert all(set(o) == {"lr", "dropout", knob} for _, o in configs)
        # a control is tuned on its objective's grid
        for o in study.OBJECTIVES:
            assert study.grid(o, task, FULL) == study.grid(f"{o}/no pre-training", task, FULL)
    # ERNIE-GEN's paper value is Table 1's for the task
    assert [o["rho_f"] for _, o in study.grid("ernie_gen", "squad_qg", FULL)][:2] == [0.7, 0.7]
    # every other system takes the choice of a system tuned on the grid
    for name in study.SYSTEMS:
        assert study.tuned(name) in tuned
    assert study.tuned("palm/no copy/no pre-training") == "palm/no pre-training"
    assert study.tuned("ernie_gen/ft from pmlm") == "ernie_gen"


def dev_cell(name, task, config, by_lp, split="dev"):
    return dict(system=name, task=task, seed=0, split=split, config=config,
                by_lp={lp: dict(rougeL=v, bleu=v, words=8.0) for lp, v in by_lp.items()})


def grid_of(name, task, scores):
    """Dev cells of a system's grid: configuration k scores scores[k] at length penalty 1 and one less elsewhere."""
    cells = {}
    for (config, _), value in zip(study.grid(name, task, FULL), scores):
        cell = dev_cell(name, task, config, {"0.6": value - 1, "1": value, "1.5": value - 1, "2": value - 1})
        cells[study.stem_of(cell)] = cell
    return cells


def test_the_choice_is_the_best_dev_score_and_every_final_of_the_family_takes_it(tmp_path):
    cells = grid_of("palm", "gigaword", [20, 21, 25, 19, 25, 18, 17, 16])
    chosen = study.choose(cells, "palm", "gigaword", FULL)
    config, options = study.grid("palm", "gigaword", FULL)[2]
    # the highest of 32 (the first of two equal ones), at its length penalty
    assert chosen == dict(system="palm", config=config, options=options, lp=1.0, dev=25, among=32)
    # an ablation fine-tunes with its parent's choice, its own options over it; a final decodes at the chosen lp
    spec = study.job_spec(("ft", "palm/no copy", "gigaword", 2), FULL, cells)
    assert spec["options"] == {**options, "copy": False} and spec["lps"] == [1.0] and spec["split"] == "test"
    assert spec["chosen"]["system"] == "palm" and spec["chosen"]["config"] == config
    dev = study.job_spec(("ft", "palm", "gigaword", 0, config), FULL, cells)
    assert dev["split"] == "dev" and dev["options"] == options and dev["lps"] == FULL["grid"]["lp"]
    # a diverged configuration is skipped; a missing one means no choice yet, and the final waits
    stem = study.cell_stem("palm", "gigaword", 0, config)
    cells[stem] = dict(cells[stem], diverged=True)
    assert study.choose(cells, "palm", "gigaword", FULL)["config"] == study.grid("palm", "gigaword", FULL)[4][0]
    del cells[stem]
    assert study.choose(cells, "palm", "gigaword", FULL) is None
    args = study.parse_args(["--out", str(tmp_path)])
    for name in ("palm", "palm/no pre-training"):
        study.pre_dir(args, name, 0).mkdir(parents=True, exist_ok=True)
        (study.pre_dir(args, name, 0) / "done.json").write_text("{}")
    assert not study.ready(("ft", "palm", "gigaword", 0), args, cells, FULL)
    assert study.ready(("ft", "palm", "gigaword", 0, config), args, cells, FULL)


def test_the_choice_refuses_a_score_of_the_held_out_split(tmp_path):
    """A selection reads dev scores only: a grid cell that holds scores of the test split (or records no split)
    stops it, in one line, on the command line too."""
    cells = grid_of("pmlm", "gigaword", range(8))
    config = study.grid("pmlm", "gigaword", FULL)[3][0]
    stem = study.cell_stem("pmlm", "gigaword", 0, config)
    for split in ("test", None):
        cells[stem] = dict(cells[stem], split=split)
        with pytest.raises(study.UsageError, match="selection reads dev scores only"):
            study.choose(cells, "pmlm", "gigaword", FULL)
        # an ablation's choice is its parent's: refused the same way
        with pytest.raises(study.UsageError, match="test split" if split else "unrecorded split"):
            study.choose(cells, "pmlm/AE only", "gigaword", FULL)
    store = tmp_path / "cells.jsonl"
    settings = study.settings_key(FULL)
    study.save_cells(store, {k: dict(c, settings=settings) for k, c in cells.items()})
    refused = run_study("report", "--cells", str(store), "--pages", str(tmp_path / "pages"), "--tasks", "gigaword")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "selection reads dev scores only" in refused.stderr


# --- the paired bootstrap over test pairs and seeds ------------------------------------------------------------

def final(name, task, seed, pairs, **rest):
    cell = dict(system=name, task=task, seed=seed, split="test", pairs=pairs,
                scores={"rougeL": dict(f=sum(pairs) / len(pairs))} if task == "gigaword" else {}, **rest)
    return {study.stem_of(cell): cell}


def test_the_paired_bootstrap_on_a_hand_made_example():
    rng = random.Random(0)
    base = [[rng.uniform(0, 60) for _ in range(200)] for _ in range(3)]
    cells = {}
    for seed in range(3):
        cells.update(final("b", "gigaword", seed, base[seed]))
        # a system 2 points above b on every pair of every seed
        cells.update(final("a", "gigaword", seed, [x + 2 for x in base[seed]]))
        # a system whose seeds differ by 10 points, each seed flat over the pairs
        cells.update(final("c", "gigaword", seed, [20.0 + 10 * seed] * 200))
    assert study.interval(cells, "a", "gigaword", "b") == pytest.approx((2.0, 2.0, 2.0, 3))
    point, low, high, seeds = study.interval(cells, "b", "gigaword")
    mean = sum(map(sum, base)) / 600
    assert point == pytest.approx(mean) and low < mean < high and seeds == 3
    # the pairs alone: a paired difference is far narrower than either score's own interval
    assert high - low > 1.0
    # the seeds alone: pairs that never vary still leave the seeds' spread (mean 30; 20 or 40 with all three
    # draws on one seed)
    point, low, high, _ = study.interval(cells, "c", "gigaword")
    assert point == pytest.approx(30.0) and 20.0 <= low < 30.0 < high <= 40.0
    # only the seeds both systems ran are paired
    del cells[study.cell_stem("b", "gigaword", 2)]
    assert study.interval(cells, "a", "gigaword", "b")[3] == 2
    assert study.interval(cells, "nothing", "gigaword") is None
    assert study.shown(None) == "-" and study.shown_gain((2.0, 1.5, 2.5, 3)) == "+2.00 [+1.50, +2.50]"


def test_bleu_of_summed_pair_statistics_is_corpus_bleu():
    import evaluate
    hyps = ["what is the capital of france ?", "who wrote it", "when did the war end ?", "how many ?"]
    refs = ["what is the capital city of france ?", "who wrote the book ?", "when did the war end ?", "why ?"]
    pairs = study.pair_stats(hyps, refs, "bleu")
    cells = final("s", "squad_qg", 0, pairs)
    assert study.interval(cells, "s", "squad_qg")[0] == pytest.approx(evaluate.bleu(hyps, refs))
    rouge = study.pair_stats(hyps, refs, "rougeL")
    assert sum(rouge) / 4 == pytest.approx(100 * evaluate.rouge(hyps, refs, stem=True)["rougeL"]["fmeasure"])


# --- the pages --------------------------------------------------------------------------------------------------

def fake_protocol(seeds=(0, 1, 2)):
    """Cells of the whole protocol on Gigaword: every dev cell, every final; a system's score rises with its
    position in SYSTEMS, controls 10 points down."""
    rng = random.Random(1)
    settings = study.settings_key(FULL)
    cells = {}
    for name in dict.fromkeys(study.tuned(n) for n in study.SYSTEMS):
        cells.update({k: dict(c, settings=settings) for k, c in grid_of(name, "gigaword", range(8)).items()})
    for i, name in enumerate(study.SYSTEMS):
        level = 20 + i / 2 - (10 if study.SYSTEMS[name]["control"] else 0)
        for seed in study.SYSTEMS[name]["seeds"] or seeds:
            pairs = [level + rng.gauss(0, 8) for _ in range(100)]
            cells.update(final(name, "gigaword", seed, pairs, settings=settings, teacher_forced_acc=30.0,
                               pretrain=dict(seconds=200.0, flops=5e15), finetune=dict(seconds=60.0, flops=8e14),
                               decode=dict(seconds=6.0, copied=dict(outputs=50.0, references=62.0),
                                           words=dict(outputs=7.0, references=8.0)),
                               examples=[dict(source="an article", reference="a title", output="an output")],
                               card="cpu", torch="2"))
    for c in cells.values():
        if c["split"] == "test":
            c["scores"].update(rouge1=dict(f=0.0), rouge2=dict(f=0.0))
    return cells


def test_the_pages_of_a_small_fake_set_of_cells(tmp_path, capsys):
    store = tmp_path / "cells.jsonl"
    pages = tmp_path / "pages"
    args = study.parse_args(["report", "--cells", str(store), "--pages", str(pages), "--tasks", "gigaword"])
    # no cells: the page says that nothing is a test result yet, and what the superseded cells are
    study.write_report(args)
    front = (pages / "README.md").read_text()
    assert "0 of 64 dev cells, 0 of 47 finals" in front
    assert "No number on this page is a test result yet: the protocol has not run." in front
    assert "not test results" in front and "Not measured yet" in front and "not yet measured" in front
    assert "No final has run yet." in (pages / "samples.md").read_text()
    superseded = (pages / "superseded" / "README.md").read_text()
    assert "**not test results**" in superseded and "| pmlm/ft lr 1e-3 noise 0.2 lp 1.5 dropout 0.2 | 5 |" in superseded
    # the whole protocol
    study.save_cells(store, fake_protocol())
    study.write_report(args)
    front = (pages / "README.md").read_text()
    assert "64 of 64 dev cells, 47 of 47 finals." in front
    assert "test result yet" not in front and "superseded cells" not in front and "an estimate from" not in front
    # one title a page
    for page in ("README.md", "tables.md", "samples.md", "superseded/README.md"):
        text = (pages / page).read_text()
        assert sum(line.startswith("# ") for line in text.splitlines()) == 1, page
    # one answer table: each objective, its control, the gain with its interval
    table = [line for line in front.splitlines() if line.startswith("| pmlm | ")][0]
    cells = study.read_cells(store)
    gain = study.interval(cells, "pmlm", "gigaword", "pmlm/no pre-training")
    assert table.endswith(f"| {study.shown_gain(gain)} |") and gain[1] > 0
    assert ("On Gigaword 10k, pre-training adds to unilm, pmlm, ernie_gen and palm (the gain's interval above zero)"
            in front)
    # ablations against their parents, the diagnostics, the links
    assert "| palm/no copy/no pre-training | palm/no pre-training | " in front
    assert "| ernie_gen/ft from pmlm | ERNIE-GEN's fine-tuning" in front and "50.0% (references 62.0%)" in front
    assert "[tables.md](tables.md)" in front and "[samples.md](samples.md)" in front
    tables = (pages / "tables.md").read_text()
    assert "| pmlm | gigaword | 32 | " in tables and " | 1 | 7.00 ROUGE-L |" in tables
    assert "| pmlm/AE only | 3 | " in tables and "| ernie_gen/ft from pmlm | 1 | " in tables
    assert "**palm/no copy**" in (pages / "samples.md").read_text()
    assert "the pages of" in capsys.readouterr().out


class Axes:
    """What a picture is asked to draw (matplotlib is the notebooks' optional requirement)."""
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *a, **kw: self.calls.append((name, a, kw))


def test_the_pictures_draw_the_intervals():
    cells = fake_protocol()
    ax = Axes()
    study.plot_answer(ax, cells, "gigaword")
    bars = [(a, kw) for name, a, kw in ax.calls if name == "bar"]
    # an objective and its control a bar each, the error bar its interval
    value = study.interval(cells, "palm/no pre-training", "gigaword")
    assert len(bars) == 8 and bars[-1][0][1] == value[0]
    assert bars[-1][1]["yerr"] == [[value[0] - value[1]], [value[2] - value[0]]]
    gain = study.interval(cells, "palm", "gigaword", "palm/no pre-training")
    assert ("text" in [n for n, _, _ in ax.calls]) and any(
        a[2] == f"{gain[0]:+.1f}\n[{gain[1]:+.1f}, {gain[2]:+.1f}]" for n, a, _ in ax.calls if n == "text")
    ax = Axes()
    pairs = [(study.SYSTEMS[n]["ablation_of"], n) for n in study.ABLATIONS]
    study.plot_differences(ax, cells, "gigaword", pairs, "ablations")
    points = [a for name, a, _ in ax.calls if name == "errorbar"]
    assert len(points) == 6 and points[1][0] == study.interval(cells, "pmlm/AE only", "gigaword", "pmlm")[0]
    # the superseded cells: mean and std over seeds, an objective and its control a bar each
    ax = Axes()
    study.plot_bars(ax, study.superseded_cells()["fine-tuning peak lr 1e-3"], "gigaword", "superseded")
    assert [round(a[1], 2) for name, a, _ in ax.calls if name == "bar"][:2] == [24.76, 11.47]
    # without cells: named, not drawn
    ax = Axes()
    study.plot_answer(ax, {}, "gigaword")
    assert not any(name == "bar" for name, _, _ in ax.calls)
    assert [a[2] for name, a, _ in ax.calls if name == "text"] == ["not run"] * 4


def test_the_time_estimate_adds_measured_job_minutes():
    cells = {"a": dict(system="pmlm", objective="pmlm", task="gigaword", seed=0, pretrained_as=None,
                       pretrain=dict(seconds=240.0), finetune=dict(seconds=60.0), decode=dict(seconds=6.0)),
             "b": dict(system="pmlm/no pre-training", objective="pmlm", task="gigaword", seed=0, pretrained_as=None,
                       pretrain=None, finetune=dict(seconds=120.0), decode=dict(seconds=12.0))}
    config = study.grid("pmlm", "gigaword", FULL)[0][0]
    jobs = [("pre", "pmlm", 1), ("ft", "pmlm", "gigaword", 1), ("ft", "pmlm", "gigaword", 0, config)]
    # 4 min + (1.5 + 0.15) + (1.5 + 4 x 0.15): the objective's mean fine-tuning, a decoding per length penalty
    assert study.estimate(jobs, cells, FULL) == pytest.approx(4 + 1.65 + 2.1)
    assert study.estimate(jobs, {}, FULL) is None


# --- the scheduler ---------------------------------------------------------------------------------------------

def test_plan_shares_pretraining_and_puts_seed_zero_first(tmp_path):
    args = study.parse_args(["--out", str(tmp_path), "--only",
                             "ernie_gen,ernie_gen/ft from pmlm,palm/no pre-training", "--tasks", "gigaword"])
    names = study.systems_of(args)
    assert names == ["ernie_gen", "palm/no pre-training", "ernie_gen/ft from pmlm"]
    finals = study.wanted_cells(names, ["gigaword"], args.seeds)
    # the diagnostic runs one seed; the grids of the two tuned systems come along
    assert ("ernie_gen/ft from pmlm", "gigaword", 1) not in finals and len(finals) == 7
    cfg = study.settings(args)
    wanted, todo = study.todo_cells(args, cfg, names, {})
    assert len(wanted) == 16 + 7 and wanted[:16] == study.grid_cells(names, ["gigaword"], FULL)
    jobs = study.plan(todo, args)
    pres = [j for j in jobs if j[0] == "pre"]
    # one pre-training per seed serves ernie_gen and its diagnostics' seeds; none for a control
    assert pres == [("pre", "ernie_gen", 0), ("pre", "pmlm", 0), ("pre", "ernie_gen", 1), ("pre", "ernie_gen", 2)]
    assert study.pre_of(("ft", "ernie_gen/ft from pmlm", "gigaword", 0)) == ("pre", "pmlm", 0)
    # the pre-training before a control's dev cell, which needs nothing; no final before its choice
    assert study.next_job(jobs, args, {}, cfg) == ("pre", "ernie_gen", 0)
    without_pre = [j for j in jobs if j[0] != "pre"]
    assert study.next_job(without_pre, args, {}, cfg)[:2] == ("ft", "palm/no pre-training")
    # a pre-training done on this machine is not planned again; its dev cells come before the next pre-training
    study.pre_dir(args, "ernie_gen", 0).mkdir(parents=True)
    (study.pre_dir(args, "ernie_gen", 0) / "done.json").write_text("{}")
    assert ("pre", "ernie_gen", 0) not in study.plan(todo, args)
    left = [j for j in jobs if j != ("pre", "ernie_gen", 0)]
    assert study.next_job(left, args, {}, cfg)[:4] == ("ft", "ernie_gen", "gigaword", 0)
    # once ernie_gen's choice is made, its final of seed 0 goes first
    cells = grid_of("ernie_gen", "gigaword", range(8))
    assert study.next_job(left, args, cells, cfg) == ("ft", "ernie_gen", "gigaword", 0)


def test_plan_starts_the_longest_pretraining_of_a_seed_first(tmp_path):
    """Within a seed the pre-trainings go longest first (their wall time in earlier cells), so the
    last to start, when the slots run out, are the short ones."""
    args = study.parse_args(["--out", str(tmp_path), "--only", "unilm,palm,pmlm"])
    todo = study.wanted_cells(study.systems_of(args), ["gigaword"], 2)
    cells = {f"{n}-{k}": dict(system=n, seed=k, pretrained_as=None, pretrain=dict(seconds=s))
             for n, s in [("unilm", 250.0), ("palm", 430.0), ("pmlm", 500.0)] for k in (0, 1)}
    # a diagnostic that reuses palm's pre-training adds no second time for it
    cells["diag"] = dict(system="palm/x", seed=0, pretrained_as="palm", pretrain=dict(seconds=430.0))
    cells["control"] = dict(system="unilm/no pre-training", seed=0, pretrained_as=None, pretrain=None)
    seconds = study.pretrain_seconds(cells)
    assert seconds == {"unilm": 250.0, "palm": 430.0, "pmlm": 500.0}
    pres = [j[1:] for j in study.plan(todo, args, seconds) if j[0] == "pre"]
    assert pres == [("pmlm", 0), ("palm", 0), ("unilm", 0), ("pmlm", 1), ("palm", 1), ("unilm", 1)]
    # without earlier times: SYSTEMS' order within a seed
    assert [j[1:] for j in study.plan(todo, args) if j[0] == "pre"][:3] == [
        ("unilm", 0), ("pmlm", 0), ("palm", 0)]


def test_cells_round_trip_and_other_settings_are_ignored(tmp_path, capsys):
    cell = dict(system="ernie_gen/no span flow", task="gigaword", seed=2, settings=study.settings_key(TINY))
    assert study.stem_of(cell) == "ernie_gen-no-span-flow__gigaword__seed2"
    assert study.cell_stem("pmlm", "gigaword", 0, "lr 1e-3 dropout 0.1") == "pmlm__gigaword__seed0__lr-1e-3-dropout-0-1"
    study.write_cell(tmp_path / "a.jsonl", cell)
    other = dict(cell, seed=1, settings=dict(cell["settings"], batch=999))
    study.write_cell(tmp_path / "a.jsonl", other)
    # a later line of the same stem replaces the earlier one
    study.write_cell(tmp_path / "a.jsonl", dict(cell, note="again"))
    cells = study.read_cells(tmp_path / "a.jsonl")
    assert list(cells) == ["ernie_gen-no-span-flow__gigaword__seed2", "ernie_gen-no-span-flow__gigaword__seed1"]
    assert cells["ernie_gen-no-span-flow__gigaword__seed2"]["note"] == "again"
    # saved: one cell a line, sorted by stem, read back the same
    study.save_cells(tmp_path / "b.jsonl", cells)
    assert study.read_cells(tmp_path / "b.jsonl") == cells
    assert list(study.read_cells(tmp_path / "b.jsonl")) == sorted(cells)
    assert study.read_cells(tmp_path / "none.jsonl") == {}
    with pytest.raises(study.UsageError, match="a folder"):
        study.read_cells(tmp_path)
    done = study.done_cells([tmp_path / "b.jsonl", ""], TINY)
    assert list(done) == ["ernie_gen-no-span-flow__gigaword__seed2"]
    assert "1 cell(s) ran with other settings" in capsys.readouterr().out
    # the superseded cells (another protocol) are never done cells of this one
    for cells in study.superseded_cells().values():
        assert cells and not any(c.get("settings") == study.settings_key(FULL) for c in cells.values())


def test_every_ablation_names_a_system_and_every_objective_a_control():
    for name, spec in study.SYSTEMS.items():
        # --only takes a comma-separated list
        assert "," not in name
        assert spec["ablation_of"] in (None, *study.SYSTEMS), name
        assert spec["pretrained_as"] in (None, *study.SYSTEMS), name
    for objective in study.OBJECTIVES:
        assert study.SYSTEMS[f"{objective}/no pre-training"]["control"]
    assert set(study.ABLATIONS) | set(study.SWAPS) | set(study.OBJECTIVES) >= {
        n for n in study.SYSTEMS if not study.SYSTEMS[n]["control"]}


def fake_run(tmp_path, monkeypatch, outcomes=None):
    """study.run_cell's train.main replaced by a recorder (each call's flags; outcomes: exit codes to raise in
    turn), its scoring and FLOPs by stand-ins; the pre-training of pmlm seed 0 done."""
    import train
    args = study.parse_args(["--out", str(tmp_path), "--data_dir", str(tmp_path)])
    seen = []
    outcomes = list(outcomes or [])

    def main(flags):
        seen.append(flags)
        if outcomes and (code := outcomes.pop(0)):
            raise SystemExit(code)
    monkeypatch.setattr(train, "main", main)
    monkeypatch.setattr(study, "finetune_flops", lambda *a: 1.0)
    monkeypatch.setattr(study, "score", lambda ckpt, task, split, lps, cfg, args: dict(scored=(split, lps)))
    Path(args.cache_dir).mkdir(parents=True)
    (Path(args.cache_dir) / f"study-vocab-{FULL['vocab']}.txt").write_text("")
    for name in ("pmlm", "ernie_gen"):
        study.pre_dir(args, name, 0).mkdir(parents=True)
        (study.pre_dir(args, name, 0) / "done.json").write_text("{}")
    return args, seen


def staged(args, stem):
    return json.loads((Path(args.out) / "staged" / f"{stem}.json").read_text())


def test_a_cell_fine_tunes_with_its_spec_on_its_part_of_the_data(tmp_path, monkeypatch):
    """A dev cell fine-tunes on the selection's training pairs with its grid options (the last flag wins over the
    study's) and is scored on dev at every length penalty; a final on every training pair and on test; a swap
    starts from the other system's pre-training."""
    import config
    args, seen = fake_run(tmp_path, monkeypatch)
    config_, options = study.grid("pmlm", "gigaword", FULL)[5]
    study.run_cell(study.job_spec(("ft", "pmlm", "gigaword", 0, config_), FULL, {}), FULL, args)
    train_cfg = config.parse_args(seen[-1])[0]
    assert train_cfg.lr == options["lr"] and train_cfg.data == str(study.split_file("gigaword", "select", args))
    assert train_cfg.init_from == str(study.pre_dir(args, "pmlm", 0) / "ckpt.pt") and train_cfg.compile == "false"
    assert config.parse_args(seen[-1])[1]["dropout"] == options["dropout"]
    cell = staged(args, study.cell_stem("pmlm", "gigaword", 0, config_))
    assert cell["split"] == "dev" and cell["config"] == config_ and cell["scored"] == ["dev", FULL["grid"]["lp"]]
    cells = grid_of("ernie_gen", "gigaword", range(8))
    study.run_cell(study.job_spec(("ft", "ernie_gen/ft from pmlm", "gigaword", 0), FULL, cells), FULL, args)
    train_cfg = config.parse_args(seen[-1])[0]
    assert train_cfg.data == str(study.split_file("gigaword", "final", args))
    assert train_cfg.init_from == str(study.pre_dir(args, "pmlm", 0) / "ckpt.pt")
    cell = staged(args, "ernie_gen-ft-from-pmlm__gigaword__seed0")
    assert cell["split"] == "test" and cell["scored"] == ["test", [1.0]] and cell["chosen"]["system"] == "ernie_gen"
    assert cell["pretrained_as"] == "pmlm" and cell["finetune"]["flops"] == FULL["ft_steps"]


def test_a_fine_tuning_that_diverges_on_sdpa_runs_again_written_out(tmp_path, monkeypatch, capsys):
    """A loss gone non-finite (train.py's exit DIVERGED) on SDPA: the same fine-tuning again on the written-out
    attention; diverged on both, the cell is done without scores (not run again) and a choice skips it. Any other
    failure stays a failure."""
    import config
    import train
    args, seen = fake_run(tmp_path, monkeypatch, [train.DIVERGED, 0])
    config_ = study.grid("pmlm", "gigaword", FULL)[0][0]
    spec = study.job_spec(("ft", "pmlm/no pre-training", "gigaword", 0, config_), FULL, {})
    study.run_cell(spec, FULL, args)
    assert [config.parse_args(f)[1]["attn_impl"] for f in seen] == ["sdpa", "naive"]
    stem = study.cell_stem("pmlm/no pre-training", "gigaword", 0, config_)
    assert staged(args, stem)["finetune"]["attn"] == "naive" and "scored" in staged(args, stem)
    args, seen = fake_run(tmp_path / "again", monkeypatch, [train.DIVERGED, train.DIVERGED])
    study.run_cell(spec, FULL, args)
    store = tmp_path / "store.jsonl"
    assert study.collect(("ft", "pmlm/no pre-training", "gigaword", 0, config_), args, store, {}) == 1
    assert f"cell {stem}: diverged" in capsys.readouterr().out
    cell = study.read_cells(store)[stem]
    assert cell["diverged"] is True and "by_lp" not in cell and cell["finetune"]["attn"] is None
    args, _ = fake_run(tmp_path / "other", monkeypatch, [1])
    with pytest.raises(SystemExit):
        study.run_cell(spec, FULL, args)


def test_copy_rate_counts_the_words_found_in_their_own_source():
    assert study.copy_rate(["a b c d", "x y"], ["a c e", "y"]) == 100 * 3 / 6
    assert study.copy_rate([""], ["a"]) == 0.0
    # a word counts where its OWN source has it, not another's
    assert study.copy_rate(["a", "b"], ["b", "a"]) == 0.0


def test_pack_reaches_every_job_and_records_the_layout(tmp_path, monkeypatch):
    """--pack (auto: packed on CUDA) goes to train.py for pre-training and its resumption, --ft_pack
    (false: eager fine-tunings ran slower packed) for fine-tuning; a pre-training and a cell record
    whether their batches were packed, and the study's settings leave it out (a layout: the same
    per-token losses, tests/test_packing.py), so packed and unpacked cells are one study."""
    import config
    import train
    args = study.parse_args(["--out", str(tmp_path), "--data_dir", str(tmp_path), "--pack", "true",
                             "--ft_pack", "auto"])
    job = study.parse_args(["job", "[]"] + study.forwarded(args))
    assert (job.pack, job.ft_pack) == ("true", "auto")
    default = study.parse_args(["--out", str(tmp_path)])
    assert (default.pack, default.ft_pack) == ("auto", "false")
    assert "pack" not in study.settings_key(FULL) and "ft_pack" not in study.settings_key(FULL)
    seen = {}
    monkeypatch.setattr(train, "main", lambda flags: seen.update(flags=flags))
    monkeypatch.setattr(study, "pretrain_steps", lambda *a: (10, 1.0))
    study.run_pretraining("pmlm", 0, FULL, args)
    pre = study.pre_dir(args, "pmlm", 0)
    assert config.parse_args(seen["flags"])[0].pack == "true"
    assert json.loads((pre / "done.json").read_text())["packed"] is True
    # a pre-training stopped by the time limit resumes with the same layout
    (pre / "done.json").unlink()
    (pre / "ckpt.pt").write_text("")
    study.run_pretraining("pmlm", 0, FULL, args)
    assert seen["flags"][:1] == ["--resume"] and "--pack" in seen["flags"]
    assert seen["flags"][seen["flags"].index("--pack") + 1] == "true"
    monkeypatch.setattr(study, "score", lambda *a: {})
    Path(args.cache_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.cache_dir) / f"study-vocab-{FULL['vocab']}.txt").write_text("")
    config_ = study.grid("pmlm", "gigaword", FULL)[0][0]
    spec = study.job_spec(("ft", "pmlm/no pre-training", "gigaword", 0, config_), FULL, {})
    for pack, layout in (("true", True), ("false", False)):
        args.ft_pack = pack
        study.run_cell(spec, FULL, args)
        assert config.parse_args(seen["flags"])[0].pack == pack
        cell = staged(args, study.cell_stem("pmlm/no pre-training", "gigaword", 0, config_))
        assert cell["finetune"]["packed"] is layout
    # the tables say how the cells' batches were laid out
    cells = {"a": dict(system="pmlm", seed=0, pretrained_as=None, pretrain=dict(packed=True),
                       finetune=dict(packed=False)),
             "b": dict(system="pmlm/AE only", seed=0, pretrained_as=None, pretrain=dict(seconds=1.0),
                       finetune=dict(packed=True, attn="naive")),
             "c": dict(system="pmlm/no pre-training", seed=0, pretrained_as=None, pretrain=None, finetune={})}
    assert study.layout(cells) == ("Batches (study.py --pack, --ft_pack; the others one passage a row): pre-trainings "
                                   "1 of 2 packed, fine-tunings 1 of 3 packed. Fine-tunings finished on the "
                                   "written-out attention: 1 of 3.")
    # auto follows train.py's default device
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert study.packed("auto") is True
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert study.packed("auto") is False


def test_tasks_and_attention_reach_the_jobs(tmp_path):
    """--tasks runs a subset of the tasks, whose cells stay those of the whole study; --ft_attn is the
    fine-tunings' first attention, forwarded to every job."""
    args = study.parse_args(["--out", str(tmp_path), "--tasks", "squad_qg", "--ft_attn", "naive"])
    cfg = study.settings(args)
    assert cfg["tasks"] == ["squad_qg"]
    job = study.parse_args(["job", "[]"] + study.forwarded(args))
    assert study.settings(job) == cfg and job.ft_attn == "naive"
    assert study.settings_key(cfg) == study.settings_key(FULL)
    assert study.settings(study.parse_args(["--tasks", "squad_qg,gigaword"]))["tasks"] == ["gigaword", "squad_qg"]
    for bad in ("", "cnn", "gigaword,cnn"):
        with pytest.raises(study.UsageError, match="--tasks"):
            study.parse_args(["--tasks", bad])


def test_jobs_go_to_the_gpus_the_run_may_use(tmp_path, monkeypatch):
    """A job's slot picks its GPU among the run's own: 0..gpus-1, or the CUDA_VISIBLE_DEVICES the
    scheduler was started with (several studies side by side, one a GPU)."""
    seen = []
    monkeypatch.setattr(study.subprocess, "Popen", lambda cmd, *a, env=None, **kw: seen.append(env))
    job = ("pre", "pmlm", 0)
    for visible, gpus, wanted in (("", 2, ["0", "1", "0"]), ("3", 1, ["3", "3", "3"]),
                                  ("2,5", 2, ["2", "5", "2"])):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        args = study.parse_args(["--gpus", str(gpus), "--per_gpu", "2", "--out", str(tmp_path)])
        seen.clear()
        for slot in range(3):
            study.start_job(job, job, slot, args, tmp_path)
        assert [e["CUDA_VISIBLE_DEVICES"] for e in seen] == wanted
    # the CPU's threads: the scheduler's own OMP_NUM_THREADS where set, else the cores over the slots
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    study.start_job(job, job, 0, args, tmp_path)
    monkeypatch.delenv("OMP_NUM_THREADS")
    study.start_job(job, job, 0, args, tmp_path)
    assert [e["OMP_NUM_THREADS"] for e in seen[-2:]] == ["3", str(max(1, (os.cpu_count() or 2) // 4))]


def test_mps_daemon_is_the_runs_own_and_reaches_every_job(tmp_path, monkeypatch):
    """--mps: the control daemon starts with this run's own pipe and log folders, every job's
    environment names them, and the daemon is told to quit when the run ends, even by an error.
    (A stand-in for NVIDIA's control program records how it is called: CI has no GPU.)"""
    calls = tmp_path / "calls.jsonl"
    fake = tmp_path / "bin" / study.MPS_CONTROL
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    f"open({str(calls)!r}, 'a').write(json.dumps([sys.argv[1:], sys.stdin.read() if "
                    "len(sys.argv) == 1 else '', os.environ.get('CUDA_MPS_PIPE_DIRECTORY')]) + '\\n')\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    with pytest.raises(study.UsageError, match="--mps shares GPUs"):
        study.parse_args(["--mps"])
    args = study.parse_args(["--mps", "--gpus", "2", "--per_gpu", "4", "--out", str(tmp_path / "out")])
    seen = {}
    real_popen = subprocess.Popen

    def popen(cmd, *rest, env=None, **kwargs):
        if cmd[0] == study.MPS_CONTROL:          # the daemon's control program itself (subprocess.run)
            return real_popen(cmd, *rest, env=env, **kwargs)
        seen.setdefault("envs", []).append(env)
        return "a job's process"
    monkeypatch.setattr(study.subprocess, "Popen", popen)
    with pytest.raises(RuntimeError, match="a job went wrong"):
        with study.multi_process_service(args) as env:
            args.job_env = env
            assert Path(env["CUDA_MPS_PIPE_DIRECTORY"]).is_dir() and Path(env["CUDA_MPS_LOG_DIRECTORY"]).is_dir()
            for slot in (0, 5):
                study.start_job(("pre", "pmlm", 0), ("pre", "pmlm", 0), slot, args, tmp_path)
            raise RuntimeError("a job went wrong")
    started, stopped = [json.loads(line) for line in calls.read_text().splitlines()]
    assert started == [["-d"], "", env["CUDA_MPS_PIPE_DIRECTORY"]]
    assert stopped == [[], "quit\n", env["CUDA_MPS_PIPE_DIRECTORY"]]
    assert [e["CUDA_MPS_PIPE_DIRECTORY"] for e in seen["envs"]] == [env["CUDA_MPS_PIPE_DIRECTORY"]] * 2
    assert [e["CUDA_VISIBLE_DEVICES"] for e in seen["envs"]] == ["0", "1"]
    assert not Path(env["CUDA_MPS_PIPE_DIRECTORY"]).exists()           # its folders go with it
    # without --mps: no daemon, the jobs' environment is the scheduler's own
    with study.multi_process_service(study.parse_args(["--gpus", "1"])) as env:
        assert env == {}
    assert len(calls.read_text().splitlines()) == 2


# --- UniLMv2's AE-only ablation (pmlm's `par` option) ------------------------------------------------------------

def test_pmlm_ae_only_appends_nothing_and_is_l_ae():
    """UniLMv2 4.6, Table 6 '- PAR': the same corrupted context, no block appended, the loss is L_AE."""
    import data
    import model as M
    from objectives import get_objective
    from objectives.masks import ORIG, PSEUDO
    tok, splits, _ = data.prepare_pretrain(None, 2048, str(ROOT / ".cache"), max_tokens=61,
                                           progress=False)
    full = get_objective("pmlm", tok, max_len=64)
    ae = get_objective("pmlm", tok, max_len=64, par=False)
    examples = splits["train"][:4]
    b_full = full.make_batch(examples, random.Random(0))
    b_ae = ae.make_batch(examples, random.Random(0))
    appended = (ORIG, PSEUDO)
    assert not any(bool((b_ae.kind == k).any()) for k in appended)
    assert all(bool((b_full.kind == k).any()) for k in appended)
    n = b_ae.input_ids.size(1)
    real = b_ae.input_ids != tok.pad_id
    # the context part is the same draw; equal corpus tokens
    assert torch.equal(b_ae.input_ids[real], b_full.input_ids[:, :n][real])
    assert ae.corpus_tokens(b_ae) == full.corpus_tokens(b_full)
    torch.manual_seed(0)
    model = M.Transformer(M.ModelConfig(**{**M.PRESETS["tiny"], **ae.model_defaults,
                                           "vocab_size": len(tok)})).eval()
    loss, metrics = ae.loss(model, b_ae)
    assert set(metrics) == {"loss", "loss_ae", "acc_ae"} and torch.isfinite(loss)
    _, full_metrics = full.loss(model, b_full)
    # the AE loss sees a context no [P] row changes: the same value in both layouts
    assert float(metrics["loss_ae"]) == pytest.approx(float(full_metrics["loss_ae"]), abs=1e-4)


def test_pmlm_par_option_does_not_change_fine_tuning():
    import data
    from objectives import get_objective
    tok, _, _ = data.prepare_pretrain(None, 2048, str(ROOT / ".cache"), progress=False)
    pair = [(tok.encode("a source text"), tok.encode("a target"))]
    a = get_objective("pmlm", tok, task="seq2seq", max_len=64).make_batch(pair, random.Random(1))
    b = get_objective("pmlm", tok, task="seq2seq", max_len=64, par=False).make_batch(
        pair, random.Random(1))
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)
