"""bench/study.py: --tiny end to end on a CPU with two jobs at once (pre-training at equal corpus
tokens, a control, fine-tuning, decoding, scores, cells as json lines), interrupted and resumed
without recomputing a finished cell, then import and report; the scheduler's plan; UniLMv2's AE-only
ablation (pmlm's `par` option)."""
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


def run_study(*flags):
    cmd = [sys.executable, "bench/study.py", *flags]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_tiny_study_two_workers_interrupted_resumed_imported_reported(tmp_path):
    out = tmp_path / "work"
    cells = tmp_path / "cells.jsonl"
    flags = ["--tiny", "--per_gpu", "2", "--out", str(out), "--cells_out", str(cells),
             "--cache_dir", str(ROOT / ".cache"), "--lp_sweep", "0,1,2"]
    # interrupted after the first finished cell: the job in flight is stopped
    first = run_study(*flags, "--stop_after_cells", "1")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "0 cells done, 3 to run" in first.stdout
    assert "1 new cell(s) reached: 1 job(s) in flight stopped" in first.stdout
    kept = cells.read_text().splitlines()
    assert len(kept) == 1
    # resumed: the finished cell is not recomputed
    second = run_study(*flags)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert "1 cells done, 2 to run" in second.stdout
    lines = cells.read_text().splitlines()
    assert lines[0] == kept[0] and len(lines) == 3
    records = [json.loads(line) for line in lines]
    assert {r["system"] for r in records} == {"pmlm", "palm", "pmlm/no pre-training"}
    for r in records:
        assert r["task"] == "docsum" and r["seed"] == 0 and r["card"] == "cpu"
        assert all(0 <= r["scores"][m]["f"] <= 100 for m in ("rouge1", "rouge2", "rougeL", "bleu"))
        assert 0 <= r["teacher_forced_acc"] <= 100 and r["finetune"]["flops"] > 0
        assert all(0 <= r["decode"]["copied"][k] <= 100 for k in ("outputs", "references"))
        # how long the outputs are, and (--lp_sweep) the same checkpoint decoded at the other penalties
        assert r["decode"]["words"]["references"] > 0 and r["decode"]["words"]["outputs"] >= 0
        sweep = r["decode"]["lp_sweep"]
        assert sweep["used"] == 1.0 and set(sweep) == {"0.0", "2.0", "used"}
        assert all(0 <= sweep[lp][m] <= 100 for lp in ("0.0", "2.0") for m in ("rougeL", "bleu"))
        assert len(r["examples"]) == 3 and set(r["examples"][0]) == {"source", "reference", "output"}
    by = {r["system"]: r for r in records}
    # equal compute: the two objectives read the same corpus tokens, in different numbers of steps
    assert by["pmlm/no pre-training"]["pretrain"] is None
    assert by["pmlm"]["pretrain"]["steps"] != by["palm"]["pretrain"]["steps"]
    assert by["pmlm"]["pretrain"]["flops"] > 0 and by["palm"]["pretrain"]["flops"] > 0
    third = run_study(*flags)
    assert third.returncode == 0 and "3 cells done, 0 to run" in third.stdout
    assert "| pmlm | 1 |" in third.stdout
    # import splits the json lines into cell files; report writes the page from them
    folder = tmp_path / "committed"
    imported = run_study("import", str(cells), "--cells", str(folder))
    assert imported.returncode == 0 and "3 new" in imported.stdout, imported.stderr
    assert (folder / "pmlm__docsum__seed0.json").exists()
    page = tmp_path / "page.md"
    reported = run_study("report", "--cells", str(folder), "--page", str(page))
    assert reported.returncode == 0, reported.stderr
    text = page.read_text()
    assert "| pmlm | 1 |" in text and "| unilm | not run yet |" in text
    assert "**palm, docsum**" in text
    assert "## Decoding length (study.py --lp_sweep)" in text and "| lp 0 | lp 1 | lp 2 |" in text


def test_user_mistakes_are_one_line():
    bad = run_study("--only", "pmlm,nonsense", "--tiny")
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith("study.py: error: --only: unknown system(s) ['nonsense']")
    missing = run_study("import", "no/such/file.jsonl")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1


def test_plan_shares_pretraining_and_puts_seed_zero_first(tmp_path):
    args = study.parse_args(["--out", str(tmp_path), "--only",
                             "ernie_gen,ernie_gen/ft noise 0,palm/no pre-training"])
    names = study.systems_of(args)
    assert names == ["ernie_gen", "palm/no pre-training", "ernie_gen/ft noise 0"]
    todo = study.wanted_cells(names, ["gigaword"], args.seeds)
    # the diagnostic runs one seed
    assert ("ernie_gen/ft noise 0", "gigaword", 1) not in todo
    jobs = study.plan(todo, args)
    pres = [j for j in jobs if j[0] == "pre"]
    # one pre-training per seed serves ernie_gen and its fine-tuning diagnostic; none for a control
    assert pres == [("pre", "ernie_gen", 0), ("pre", "ernie_gen", 1), ("pre", "ernie_gen", 2)]
    assert study.pre_of(("ft", "ernie_gen/ft noise 0", "gigaword", 0)) == ("pre", "ernie_gen", 0)
    # the pre-training (long, and it gates two cells) before the control, which needs nothing
    assert study.next_job(jobs, args) == ("pre", "ernie_gen", 0)
    without_pre = [j for j in jobs if j[0] != "pre"]
    assert study.next_job(without_pre, args) == ("ft", "palm/no pre-training", "gigaword", 0)
    # a pre-training done on this machine is not planned again
    (study.pre_dir(args, "ernie_gen", 0)).mkdir(parents=True)
    (study.pre_dir(args, "ernie_gen", 0) / "done.json").write_text("{}")
    assert ("pre", "ernie_gen", 0) not in study.plan(todo, args)
    assert study.ready(("ft", "ernie_gen/ft noise 0", "gigaword", 0), args)
    # its fine-tunings now come before the next pre-training: they finish cells
    left = [j for j in jobs if j != ("pre", "ernie_gen", 0)]
    assert study.next_job(left, args) == ("ft", "ernie_gen", "gigaword", 0)


def test_only_seed_runs_one_seed_of_each_system():
    """--only_seed K: one seed's cells, so a system's seeds can run on different GPUs or machines
    (eighteenth session: a recipe's seeds 1 and 2, one study a GPU)."""
    noise = "pmlm/AE only/ft lr 1e-3 noise 0.2"
    args = study.parse_args(["--seeds", "3", "--only_seed", "1", "--only", f"pmlm/AE only,{noise},"
                             "pmlm/AE only/ft lr 1e-3"])
    todo = study.wanted_cells(study.systems_of(args), ["gigaword"], args.seeds, args.only_seed)
    # a one-seed recipe (seed 0) has no seed 1
    assert todo == [("pmlm/AE only", "gigaword", 1), (noise, "gigaword", 1)]
    # its fine-tunings reuse seed 1's pre-training of pmlm/AE only, planned once
    assert [j for j in study.plan(todo, args) if j[0] == "pre"] == [("pre", "pmlm/AE only", 1)]
    assert len(study.wanted_cells([noise], ["gigaword"], 3)) == 3
    for bad in (["--only_seed", "3"], ["--only_seed", "-2"], ["--seeds", "1", "--only_seed", "1"]):
        with pytest.raises(study.UsageError, match="--only_seed"):
            study.parse_args(bad)


def test_plan_starts_the_longest_pretraining_of_a_seed_first(tmp_path):
    """Within a seed the pre-trainings go longest first (their wall time in earlier cells), so the
    last to start, when the slots run out, are the short ones (twelfth session's 4x H200 calls)."""
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
    cfg = study.settings(study.parse_args(["--tiny"]))
    cell = dict(system="ernie_gen/no span flow", task="gigaword", seed=2,
                settings=study.settings_key(cfg))
    assert study.cell_stem(cell["system"], "gigaword", 2) == "ernie_gen-no-span-flow__gigaword__seed2"
    study.write_cell(tmp_path / "a.jsonl", cell)
    study.write_cell(tmp_path / "dir", cell)
    assert study.read_cells(tmp_path / "a.jsonl") == study.read_cells(tmp_path / "dir")
    other = dict(cell, seed=1, settings=dict(cell["settings"], batch=999))
    study.write_cell(tmp_path / "dir", other)
    done = study.done_cells([tmp_path / "dir", ""], cfg)
    assert list(done) == ["ernie_gen-no-span-flow__gigaword__seed2"]
    assert "1 cell(s) ran with other settings" in capsys.readouterr().out


def test_every_ablation_names_a_system_and_every_objective_a_control():
    for name, spec in study.SYSTEMS.items():
        # --only takes a comma-separated list
        assert "," not in name
        assert spec["ablation_of"] in (None, *study.SYSTEMS), name
        assert spec["pretrained_as"] in (None, *study.SYSTEMS), name
    for objective in study.COLORS:
        assert study.SYSTEMS[f"{objective}/no pre-training"]["control"]


def test_a_recipe_system_fine_tunes_with_its_own_flags_and_decodes_with_its_length_penalty(
        tmp_path, monkeypatch):
    """The recipe search's systems: their fine-tuning options reach train.py after the study's own
    flags (the last one wins: config.parse_args reads lr 1e-3, not the study's 3e-4), their
    pre-training is pmlm/AE only's, and their length penalty replaces the task's in decoding."""
    import config
    import train
    args = study.parse_args(["--out", str(tmp_path), "--data_dir", str(tmp_path)])
    cfg = study.settings(args)
    seen = {}
    monkeypatch.setattr(train, "main", lambda flags: seen.update(flags=flags))
    monkeypatch.setattr(study, "finetune_flops", lambda ckpt, task, batch, args: seen.update(batch=batch) or 1.0)
    monkeypatch.setattr(study, "score", lambda ckpt, task, cfg, args, lp: seen.update(lp=lp) or {})
    (tmp_path / "squad_qg").mkdir()
    for name, line in (("src-dev.txt", "a paragraph ."), ("tgt-dev.txt", "a question ?")):
        (tmp_path / "squad_qg" / name).write_text(f"{line}\n" * 10)
    pre = study.pre_dir(args, "pmlm/AE only", 0)
    pre.mkdir(parents=True)
    (pre / "done.json").write_text("{}")
    study.run_cell("pmlm/AE only/ft lr 1e-3", "gigaword", 0, cfg, args)
    train_cfg = config.parse_args(seen["flags"])[0]
    assert train_cfg.lr == 1e-3 and train_cfg.init_from == str(pre / "ckpt.pt")
    # fine-tunings run eager unless --ft_compile says otherwise (pre-trainings follow --compile)
    assert train_cfg.compile == "false" and args.compile == "auto"
    assert seen["lp"] == study.TASKS["gigaword"]["lp"] == 0.6 and seen["batch"] == 64
    args.ft_compile = "true"
    study.run_cell("pmlm/AE only/ft batch 32", "squad_qg", 0, cfg, args)
    assert config.parse_args(seen["flags"])[0].compile == "true"
    assert config.parse_args(seen["flags"])[0].batch_size == 32 and seen["batch"] == 32
    study.run_cell("pmlm/AE only/ft lr 1e-3 longer outputs", "squad_qg", 0, cfg, args)
    assert config.parse_args(seen["flags"])[0].lr == 1e-3 and seen["lp"] == 2.0
    stem = "pmlm-ae-only-ft-lr-1e-3-longer-outputs__squad_qg__seed0"
    cell = json.loads((tmp_path / "staged" / f"{stem}.json").read_text())
    assert cell["pretrained_as"] == "pmlm/AE only" and cell["objective"] == "pmlm"


def test_another_fine_tuning_lr_is_another_study(tmp_path, capsys):
    """--ft_lr (the recipe search's lead, 1e-3): every job gets it, every cell records it, and the
    committed cells of the study's 3e-4 are not taken as done for it."""
    base = study.parse_args(["--out", str(tmp_path)])
    other = study.parse_args(["--out", str(tmp_path), "--ft_lr", "1e-3"])
    assert study.settings(base)["ft_lr"] == 3e-4 and study.settings(other)["ft_lr"] == 1e-3
    flags = study.forwarded(other)
    assert study.parse_args(["job", "[]"] + flags).ft_lr == 1e-3
    cell = dict(system="pmlm", task="gigaword", seed=0, settings=study.settings_key(study.settings(base)))
    study.write_cell(tmp_path / "cells", cell)
    assert len(study.done_cells([tmp_path / "cells"], study.settings(base))) == 1
    assert study.done_cells([tmp_path / "cells"], study.settings(other)) == {}
    assert "1 cell(s) ran with other settings" in capsys.readouterr().out
    with pytest.raises(study.UsageError, match="--pre_lr and --ft_lr must be > 0"):
        study.parse_args(["--ft_lr", "0"])


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
    cfg = study.settings(args)
    assert "pack" not in study.settings_key(cfg) and "ft_pack" not in study.settings_key(cfg)
    seen = {}
    monkeypatch.setattr(train, "main", lambda flags: seen.update(flags=flags))
    monkeypatch.setattr(study, "pretrain_steps", lambda *a: (10, 1.0))
    study.run_pretraining("pmlm", 0, cfg, args)
    pre = study.pre_dir(args, "pmlm", 0)
    assert config.parse_args(seen["flags"])[0].pack == "true"
    assert json.loads((pre / "done.json").read_text())["packed"] is True
    # a pre-training stopped by the time limit resumes with the same layout
    (pre / "done.json").unlink()
    (pre / "ckpt.pt").write_text("")
    study.run_pretraining("pmlm", 0, cfg, args)
    assert seen["flags"][:1] == ["--resume"] and "--pack" in seen["flags"]
    assert seen["flags"][seen["flags"].index("--pack") + 1] == "true"
    monkeypatch.setattr(study, "finetune_flops", lambda ckpt, task, batch, args: 1.0)
    monkeypatch.setattr(study, "score", lambda ckpt, task, cfg, args, lp: {})
    Path(args.cache_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.cache_dir) / f"study-vocab-{cfg['vocab']}.txt").write_text("")
    for pack, layout in (("true", True), ("false", False)):
        args.ft_pack = pack
        study.run_cell("pmlm/no pre-training", "gigaword", 0, cfg, args)
        assert config.parse_args(seen["flags"])[0].pack == pack
        cell = json.loads((tmp_path / "staged" / "pmlm-no-pre-training__gigaword__seed0.json").read_text())
        assert cell["finetune"]["packed"] is layout
    # the page says how the cells' batches were laid out; a record without the field predates --pack
    cells = {"a": dict(system="pmlm", seed=0, pretrained_as=None, pretrain=dict(packed=True),
                       finetune=dict(packed=False)),
             "b": dict(system="pmlm/AE only", seed=0, pretrained_as=None, pretrain=dict(seconds=1.0),
                       finetune=dict(packed=True)),
             "c": dict(system="pmlm/no pre-training", seed=0, pretrained_as=None, pretrain=None, finetune={})}
    assert study.layout(cells).endswith("pre-trainings 1 of 2 packed, fine-tunings 1 of 3 packed.")
    # auto follows train.py's default device
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert study.packed("auto") is True
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert study.packed("auto") is False


def test_a_diverged_fine_tuning_is_a_cell_without_scores(tmp_path, monkeypatch, capsys):
    """Fine-tuning from random weights at lr 1e-3 diverged twice at the same step (eleventh session):
    train.py stops such a run with exit status DIVERGED, and the study keeps it as a done cell
    without scores (not run again), leaves it out of the means and names it on the page. Any other
    failure stays a failure."""
    import train
    args = study.parse_args(["--out", str(tmp_path), "--data_dir", str(tmp_path), "--ft_lr", "1e-3"])
    cfg = study.settings(args)
    Path(args.cache_dir).mkdir(parents=True)
    (Path(args.cache_dir) / f"study-vocab-{cfg['vocab']}.txt").write_text("")

    def diverges(flags):
        raise SystemExit(train.DIVERGED)
    monkeypatch.setattr(train, "main", diverges)
    name, stem = "unilm/no pre-training", "unilm-no-pre-training__gigaword__seed1"
    study.run_cell(name, "gigaword", 1, cfg, args)
    store = tmp_path / "store"
    assert study.collect(("ft", name, "gigaword", 1), args, store) == 1
    assert f"cell {stem}: diverged" in capsys.readouterr().out
    cell = study.read_cells(store)[stem]
    assert cell["diverged"] is True and "scores" not in cell
    # a system whose every cell diverged is named so, not "not run yet"
    assert study.absent(study.read_cells(store), name, "gigaword") == "every seed diverged (1)"
    assert study.absent(study.read_cells(store), "pmlm", "gigaword") == "not run yet"
    full = {m: dict(f=20.0, low=19.0, high=21.0) for m in ("rouge1", "rouge2", "rougeL")}
    other = tmp_path / "other"
    study.write_cell(other, cell)
    study.write_cell(other, dict(cell, system="unilm", diverged=False, scores=full, teacher_forced_acc=30.0,
                                 decode=dict(seconds=1.0), finetune=dict(steps=1500, seconds=60.0, flops=1.0),
                                 examples=[], card="cpu", torch="2"))
    alone = study.read_cells(other)
    said = "- unilm vs its control on gigaword: its control: every seed diverged (1)"
    assert said in study.goals(alone, ["gigaword"])
    assert f"| unilm | {name} | {name}: every seed diverged (1) |" in study.gains(alone, ["gigaword"])
    # done: the next run does not try it again
    done = study.done_cells([store], cfg)
    todo = [c for c in study.wanted_cells([name], ["gigaword"]) if study.cell_stem(*c) not in done]
    assert todo == [(name, "gigaword", 0), (name, "gigaword", 2)]
    # the two seeds that trained make the mean; the page names the third
    for seed, rl in ((0, 10.0), (2, 12.0)):
        scores = {m: dict(f=rl, low=rl - 1, high=rl + 1) for m in ("rouge1", "rouge2", "rougeL")}
        study.write_cell(store, dict(cell, seed=seed, diverged=False, scores=scores,
                                     teacher_forced_acc=20.0, decode=dict(seconds=1.0),
                                     finetune=dict(steps=1500, seconds=60.0, flops=1.0),
                                     examples=[], card="cpu", torch="2"))
    cells = study.read_cells(store)
    mean, std, _, n = study.summary(cells, name, "gigaword", "rougeL")
    assert (mean, n) == (11.0, 2)
    page = study.report(cells, ["gigaword"], [name])
    assert f"| {name} | 2 (1 more diverged) | " in page
    assert f"{name}, gigaword, seed 1" in page
    # any other exit is a failure, not a cell
    monkeypatch.setattr(train, "main", lambda flags: sys.exit(1))
    with pytest.raises(SystemExit):
        study.run_cell(name, "gigaword", 0, cfg, args)


def test_copy_rate_counts_the_words_found_in_their_own_source():
    assert study.copy_rate(["a b c d", "x y"], ["a c e", "y"]) == 100 * 3 / 6
    assert study.copy_rate([""], ["a"]) == 0.0
    # a word counts where its OWN source has it, not another's
    assert study.copy_rate(["a", "b"], ["b", "a"]) == 0.0


def test_a_folder_page_names_the_three_seed_systems_and_the_others_it_ran(tmp_path, capsys):
    """A cells folder's page (report --cells): every three-seed system, a missing one as not run yet;
    a one-seed diagnostic or recipe variant only where the folder has its cells (the lr 1e-3 study
    runs none of them, and its page listed 13 of them as not run yet)."""
    store = tmp_path / "cells"
    scores = {m: dict(f=20.0, low=19.0, high=21.0) for m in ("rouge1", "rouge2", "rougeL")}
    for name in ("unilm", "unilm/no pre-training", "ernie_gen/ft noise 0.3"):
        study.write_cell(store, dict(system=name, task="gigaword", seed=0, settings={"ft_lr": 1e-3},
                                     scores=scores, teacher_forced_acc=20.0, decode=dict(seconds=1.0),
                                     pretrain=None, finetune=dict(steps=1500, seconds=60.0, flops=1.0),
                                     examples=[], card="cpu", torch="2"))
    page = tmp_path / "page.md"
    study.write_report(study.parse_args(["report", "--cells", str(store), "--page", str(page)]))
    assert "3 cell(s) of 3 systems" in capsys.readouterr().out
    text = page.read_text()
    assert "| unilm | 1 |" in text and "| ernie_gen/ft noise 0.3 | 1 |" in text
    # cells from before the copy rate was measured show none
    assert "| 0.00e+00 + 1.00e+00 | - |" in text
    assert "| unilm/no seq2seq LM | not run yet |" in text
    assert "ernie_gen/ft noise 0 |" not in text and "pmlm/AE only/ft lr 1e-4" not in text
    # what pre-training adds: the pairs of the systems on the page
    assert "| unilm | unilm/no pre-training | +0.00 ROUGE-L" in text
    assert "| ernie_gen/ft noise 0 | ernie_gen/ft noise 0/no pre-training |" not in text


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


def test_jobs_go_to_the_gpus_the_run_may_use(tmp_path, monkeypatch):
    """A job's slot picks its GPU among the run's own: 0..gpus-1, or the CUDA_VISIBLE_DEVICES the
    scheduler was started with (several studies side by side, one a GPU)."""
    seen = []
    monkeypatch.setattr(study.subprocess, "Popen", lambda cmd, *a, env=None, **kw: seen.append(env))
    for visible, gpus, wanted in (("", 2, ["0", "1", "0"]), ("3", 1, ["3", "3", "3"]),
                                  ("2,5", 2, ["2", "5", "2"])):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        args = study.parse_args(["--gpus", str(gpus), "--per_gpu", "2", "--out", str(tmp_path)])
        seen.clear()
        for slot in range(3):
            study.start_job(("pre", "pmlm", 0), slot, args, tmp_path)
        assert [e["CUDA_VISIBLE_DEVICES"] for e in seen] == wanted
    # the CPU's threads: the scheduler's own OMP_NUM_THREADS where set, else the cores over the slots
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    study.start_job(("pre", "pmlm", 0), 0, args, tmp_path)
    monkeypatch.delenv("OMP_NUM_THREADS")
    study.start_job(("pre", "pmlm", 0), 0, args, tmp_path)
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
                study.start_job(("pre", "pmlm", 0), slot, args, tmp_path)
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


def test_task_sources_corpus_adds_only_training_sources(tmp_path):
    """--corpus shared+task_sources: the shared corpus's files and, one document each, Gigaword's
    training articles and SQuAD QG's training sentences (once each); no target and no held-out source."""
    data_dir = tmp_path / "data"
    (data_dir / "corpus").mkdir(parents=True)
    (data_dir / "corpus" / "book.txt").write_text("first paragraph .\n\nsecond paragraph .\n")
    (data_dir / "gigaword10k").mkdir()
    (data_dir / "gigaword10k" / "train.article.txt").write_text("article one .\narticle two .\n")
    (data_dir / "gigaword10k" / "train.title.txt").write_text("title one\ntitle two\n")
    (data_dir / "squad_qg").mkdir()
    src = [f"sentence {i} ." for i in (0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9)]
    (data_dir / "squad_qg" / "src-dev.txt").write_text("".join(s + "\n" for s in src))
    (data_dir / "squad_qg" / "tgt-dev.txt").write_text("".join(f"question {i} ?\n" for i in range(12)))
    args = study.parse_args(["--out", str(tmp_path / "out"), "--data_dir", str(data_dir),
                             "--corpus", "shared+task_sources"])
    cfg = study.settings(args)
    assert cfg["corpus"] == "shared+task_sources"
    import data
    docs = [d.text for d in data.read_documents(study.corpus_path(cfg, args))]
    held_out = (tmp_path / "out" / "squad_qg" / "test.src").read_text().split("\n")
    # the last 10% (whole paragraphs: sentence 9's two questions) is held out
    assert held_out[:2] == ["sentence 9 .", "sentence 9 ."]
    assert sorted(docs) == sorted(["first paragraph .", "second paragraph .", "article one .",
                                   "article two ."] + [f"sentence {i} ." for i in range(9)])
    # the default corpus is the shared one, and the first study's cells name no corpus
    base = study.parse_args(["--out", str(tmp_path / "out"), "--data_dir", str(data_dir)])
    assert "corpus" not in study.settings(base)
    assert study.corpus_path(study.settings(base), base) == str(data_dir / "corpus")
    assert study.vocab_path(cfg, args) != study.vocab_path(study.settings(base), base)
    with pytest.raises(study.UsageError, match="--tiny reads the embedded corpus"):
        study.parse_args(["--tiny", "--corpus", "shared+task_sources"])


def test_ft_warmup_and_tasks_reach_the_jobs_and_the_cells(tmp_path, monkeypatch):
    """--ft_warmup is a setting (recorded where given, train.py's --warmup_steps in every fine-tuning);
    --tasks runs a subset of the tasks, whose cells stay those of the whole study."""
    import config
    import train
    args = study.parse_args(["--out", str(tmp_path), "--ft_warmup", "300", "--tasks", "squad_qg",
                             "--corpus", "shared+task_sources"])
    cfg = study.settings(args)
    assert cfg["ft_warmup"] == 300 and cfg["tasks"] == ["squad_qg"]
    job = study.parse_args(["job", "[]"] + study.forwarded(args))
    assert study.settings(job) == cfg
    assert "ft_warmup" not in study.settings(study.parse_args(["--out", str(tmp_path)]))
    seen = {}
    monkeypatch.setattr(train, "main", lambda flags: seen.update(flags=flags))
    monkeypatch.setattr(study, "finetune_flops", lambda *a: 1.0)
    monkeypatch.setattr(study, "score", lambda *a: {})
    monkeypatch.setattr(study, "train_file", lambda task, args: "unused")
    monkeypatch.setattr(study, "vocab_file", lambda cfg, args: "unused")
    study.run_cell("pmlm/no pre-training", "squad_qg", 0, cfg, args)
    assert config.parse_args(seen["flags"])[0].warmup_steps == 300
    # --ft_attn: train.py's --attn_impl, recorded in the cell, not in its settings
    assert config.parse_args(seen["flags"])[1]["attn_impl"] == "sdpa"
    args.ft_attn = "naive"
    assert study.parse_args(["job", "[]"] + study.forwarded(args)).ft_attn == "naive"
    study.run_cell("pmlm/no pre-training", "squad_qg", 1, cfg, args)
    assert config.parse_args(seen["flags"])[1]["attn_impl"] == "naive"
    cells = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "staged").glob("*.json")}
    assert sorted(c["finetune"]["attn"] for c in cells.values()) == ["naive", "sdpa"]
    assert all(c["settings"] == study.settings_key(cfg) for c in cells.values())
    assert "written-out attention (study.py --ft_attn naive; the others on SDPA): 1 of 2" in study.layout(cells)
    base = study.settings(study.parse_args(["--out", str(tmp_path), "--tasks", "squad_qg,gigaword"]))
    assert base["tasks"] == ["gigaword", "squad_qg"]
    for bad in ("", "cnn", "gigaword,cnn"):
        with pytest.raises(study.UsageError, match="--tasks"):
            study.parse_args(["--tasks", bad])
    with pytest.raises(study.UsageError, match="--ft_warmup"):
        study.parse_args(["--ft_warmup", "-2"])


def test_the_nan_probe_swaps_only_how_attention_is_computed():
    """bench/study_nan.py's three ways are one function: values and gradients equal the written-out attention's
    (the additive mask's most negative finite number gives a forbidden key exactly no weight), and it reads the
    step train.py names when it stops on a non-finite loss."""
    import model as M
    from bench import study_nan
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 7, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = (torch.rand(2, 7, 7, generator=g) > 0.5) | torch.eye(7, dtype=torch.bool)
    ref = M.naive_attention(q, k, v, mask)
    grads = torch.autograd.grad(ref.sum(), (q, k, v))
    for way in ("sdpa", "additive", "naive", "sdpa_math"):
        out = study_nan.WAYS[way](q, k, v, mask)
        torch.testing.assert_close(out, ref)
        for a, b in zip(torch.autograd.grad(out.sum(), (q, k, v)), grads):
            torch.testing.assert_close(a, b)
    # a forbidden key's value gets no gradient from the query that may not see it
    row = ~mask[0, 3]
    gv = torch.autograd.grad(study_nan.WAYS["additive"](q, k, v, mask)[0, :, 3].sum(), v)[0]
    assert row.any() and gv[0, :, row].abs().max() == 0
    log = "\nnon-finite loss nan at step 505 (batch of (64, 156), first example starts: ...)"
    assert study_nan.nan_step(log) == 505 and study_nan.nan_step("done: 1500 of 1500 steps") is None


def test_lp_sweep_is_read_as_numbers_and_a_mistake_is_one_line():
    assert study.parse_args(["--lp_sweep", "0, 1.5"]).lp_sweep == [0.0, 1.5]
    assert study.parse_args([]).lp_sweep == []
    args = study.parse_args(["--lp_sweep", "0.3,2"])
    assert study.forwarded(args)[-2:] == ["--lp_sweep", "0.3,2.0"]
    for bad in ("1,x", "-0.5", "nan", "1,inf"):
        result = run_study("--tiny", "--lp_sweep", bad)
        assert result.returncode == 2 and "--lp_sweep" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_length_sweep_averages_each_penalty_over_seeds_with_the_cells_own():
    def cell(seed, own, other):
        return dict(system="s", task="gigaword", seed=seed, scores={"rougeL": {"f": own}},
                    decode=dict(words=dict(outputs=6.0 + seed, references=8.0),
                                lp_sweep={"0.0": dict(rougeL=other, bleu=1.0, words=5.0 + seed),
                                          "used": 0.6}))
    cells = {str(k): cell(k, own, other) for k, (own, other) in enumerate([(30.0, 28.0), (29.0, 27.0)])}
    sweep = study.length_sweep(cells, "s", "gigaword")
    assert sweep == {0.0: (27.5, 5.5, 2), 0.6: (29.5, 6.5, 2)}
    assert study.reference_words(cells, "gigaword") == 8.0
    assert study.length_sweep(cells, "other", "gigaword") == {}
    table = study.length_table(cells, ["gigaword"], ["s"])
    assert "| s | 2 | 27.50 (5.5) | 29.50 (6.5) |" in table


def test_the_noise_sweep_holds_only_systems_that_change_the_noise():
    from config import objective_class
    default = objective_class("pmlm").option_table()["target_noise_prob"].default
    for base in study.NOISE_BASES:
        sweep = study.noise_sweep(base)
        assert sweep[default] == base and len(sweep) > 1
        for rate, name in sweep.items():
            spec = study.SYSTEMS[name]
            if name != base:
                # the same pre-training, the noise and lr 1e-3 only: no dropout, lr or length change
                assert spec["pretrained_as"] == base and not spec["lp"]
                assert spec["ft"] == {"lr": 1e-3, "target_noise_prob": rate}
    # pmlm's lr 1.4e-3 and no-dropout systems also fine-tune at 0.2: neither is the sweep's 0.2
    assert study.noise_sweep("pmlm")[0.2] == "pmlm/ft lr 1e-3 noise 0.2"
    assert study.noise_sweep("pmlm/AE only")[0.2] == "pmlm/AE only/ft lr 1e-3 noise 0.2"


def test_recipe_pairs_of_one_pre_training():
    assert all(base == "pmlm" for base, _ in study.recipe_pairs("pmlm"))
    assert {n for _, n in study.recipe_pairs("pmlm")} >= {"pmlm/ft lr 1e-3 noise 0.2 longer outputs"}
    assert len(study.recipe_pairs()) == len(study.recipe_pairs("pmlm")) + len(study.recipe_pairs("pmlm/AE only"))


def test_a_gigaword_only_system_wants_no_squad_cells_and_its_page_lists_it_once():
    name = "pmlm/ft lr 1e-3 noise 0.2 lp 1.5 dropout 0.2"
    assert study.SYSTEMS[name]["tasks"] == ("gigaword",) and study.SYSTEMS[name]["lp"] == {"gigaword": 1.5}
    wanted = study.wanted_cells([name, "pmlm"], ["gigaword", "squad_qg"], seeds=5)
    # five seeds of Gigaword alone; pmlm (every task, no seeds of its own) every seed of both
    assert sorted(k for n, t, k in wanted if n == name) == [0, 1, 2, 3, 4]
    assert {t for n, t, _ in wanted if n == name} == {"gigaword"}
    assert {(t, k) for n, t, k in wanted if n == "pmlm"} == {(t, k) for t in ("gigaword", "squad_qg")
                                                             for k in range(5)}
    cell = dict(system=name, task="gigaword", seed=0, pretrain=None, teacher_forced_acc=40.0,
                finetune=dict(seconds=60.0, flops=1.0), decode=dict(seconds=6.0),
                scores={m: dict(f=30.0, low=29.0, high=31.0) for m in ("rouge1", "rouge2", "rougeL")})
    cells = {"a": cell}
    assert f"| {name} | 1 |" in "\n".join(study.task_table(cells, "gigaword", [name]))
    # not "not run yet" on SQuAD: it never will be
    assert name not in "\n".join(study.task_table(cells, "squad_qg", [name]))


def test_paired_differences_take_only_the_seeds_both_ran():
    def cell(name, seed, f):
        return dict(system=name, task="gigaword", seed=seed, scores={"rougeL": {"f": f}})
    cells = {f"{n}{k}": cell(n, k, f) for n, runs in {"a": [29.0, 30.0, 28.0], "b": [29.5, 29.0]}.items()
             for k, f in enumerate(runs)}
    cells["d"] = dict(cell("b", 2, 99.0), diverged=True)
    assert study.by_seed(cells, "a", "gigaword") == {0: 29.0, 1: 30.0, 2: 28.0}
    # b's seed 2 diverged: no score, no pair
    assert study.paired(cells, "a", "b", "gigaword") == {0: 0.5, 1: -1.0}
    assert study.paired(cells, "a", "none", "gigaword") == {}


def test_plot_seeds_draws_a_line_a_system_through_its_seeds():
    class Axes:
        """What the picture is asked to draw (matplotlib is the notebooks' optional requirement)."""
        def __init__(self):
            self.calls = []

        def __getattr__(self, name):
            return lambda *a, **kw: self.calls.append((name, a, kw))
    cells = {f"{n}{k}": dict(system=n, task="gigaword", seed=k, scores={"rougeL": dict(f=f, low=f, high=f)})
             for n, runs in {"a": [29.0, 30.0, 28.0], "b": [29.5, 30.5]}.items() for k, f in enumerate(runs)}
    ax = Axes()
    study.plot_seeds(ax, cells, "gigaword", ["a", "b", "never ran"])
    lines = [(a, kw["label"]) for name, a, kw in ax.calls if name == "plot"]
    assert lines == [(([0, 1, 2], [29.0, 30.0, 28.0], "o-"), "a: 29.00 ± 1.00 (3 seeds)"),
                     (([0, 1], [29.5, 30.5], "o-"), "b: 30.00 ± 0.71 (2 seeds)")]
    assert ("axhline", (30,), {"color": "black", "linestyle": "--", "label": "issue 22's bar"}) in ax.calls
    assert ("set_xticks", ([0, 1, 2],), {}) in ax.calls
