"""The committed notebooks are in step with themselves: executed top to bottom, no errors, small pictures.

CI also re-executes every notebook from a clean clone (notebooks/execute.py); this test checks what a reader
sees on a code-hosting site without running anything.
"""
import base64
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# the reading order is the file names' order; the study's notebook comes last (written with the study)
EXPECTED = ["01_wordpiece.ipynb", "02_masks.ipynb", "03_pmlm.ipynb", "04_ernie_gen.ipynb", "05_palm.ipynb",
            "06_decoding.ipynb"]
STUDY = "07_study.ipynb"
ORDER = EXPECTED + [STUDY]


def test_the_notebooks_are_numbered_and_the_readme_lists_them_in_order():
    names = [p.name for p in NOTEBOOKS]
    assert names in (EXPECTED, ORDER), names
    readme = (ROOT / "README.md").read_text()
    where = [readme.index(f"notebooks/{name}") for name in ORDER]
    assert where == sorted(where), "the README lists the notebooks out of order"


@pytest.mark.parametrize("name", EXPECTED)
def test_every_notebook_ends_by_naming_the_next_one(name):
    nb = json.loads((ROOT / "notebooks" / name).read_text())
    last = nb["cells"][-1]
    text = "".join(last["source"])
    assert last["cell_type"] == "markdown" and "Next:" in text, f"{name} does not end with 'Next:'"
    following = ORDER[ORDER.index(name) + 1]
    assert following in text.split("Next:")[-1], f"{name}'s 'Next:' does not name {following}"


def test_a_missing_checkpoint_is_announced_first_with_the_command_that_builds_it(tmp_path, monkeypatch, capsys,
                                                                                 corpus_docs, cache_dir):
    """A notebook opened on a fresh clone: its first output names the missing file and the command."""
    import shutil
    import sys
    # the corpus conftest.py parsed once for every test, not parsed again: the task file is built from it
    for parsed in cache_dir.glob("stdlib-docstrings-*.json"):
        shutil.copy(parsed, tmp_path)
    sys.path.insert(0, str(ROOT / "notebooks"))
    import common
    runs = []

    def train(args):
        # stands in for `python train.py ARGS`: records them, leaves a (not loadable) checkpoint file
        runs.append(args)
        out = Path(args[args.index("--out_dir") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "ckpt.pt").write_bytes(b"stand-in")

    monkeypatch.setattr(common, "CACHE", tmp_path)
    monkeypatch.setattr(common, "MAIN_JOB", tmp_path / "out" / "pmlm-pretrain" / "ckpt.pt")
    monkeypatch.setattr(common, "ROOT", tmp_path)
    monkeypatch.setattr(common, "run", train)
    path = common.tiny_checkpoint("palm", "lead")
    lines = capsys.readouterr().out.splitlines()
    assert "out/pmlm-pretrain/ckpt.pt is missing" in lines[0] and "python notebooks/common.py" in lines[1]
    assert any("palm-lead/ckpt.pt is missing" in line for line in lines[2:])
    # the main job exactly as the README runs it, then the fine-tuning from it on the lead task
    assert runs[0][:2] == ["--objective", "pmlm"] and "--max_steps" not in runs[0]
    fine_tune = dict(zip(runs[1][::2], runs[1][1::2]))
    assert fine_tune["--objective"] == "palm" and fine_tune["--init_from"] == str(common.MAIN_JOB)
    assert fine_tune["--out_dir"] == str(path.parent)
    # the task file: each target is its source's first sentence
    rows = [json.loads(line) for line in Path(fine_tune["--data"]).read_text().splitlines()]
    assert len(rows) > 1000 and all(r["src"].startswith(r["tgt"]) for r in rows)


def test_ernie_gen_demo_task_is_the_lead_pairs_with_shorter_sources():
    """"lead-short" (04_ernie_gen.ipynb's task) holds the lead task's pairs, each source cut to its first 32
    words and still holding its target; a pair of objective and task without a recipe is refused."""
    import sys
    sys.path.insert(0, str(ROOT / "notebooks"))
    import common
    lead, short = common.lead_pairs("lead"), common.lead_pairs("lead-short")
    assert set(short) == set(lead) == {"train", "valid", "test"}
    for split in lead:
        assert [t for _, t in short[split]] == [t for _, t in lead[split]]
        for (whole, target), (cut, _) in zip(lead[split], short[split]):
            assert whole.startswith(cut) and cut.startswith(target) and len(cut.split()) <= 32
    assert any(len(s.split()) > 32 for s, _ in lead["train"])          # the cut is real
    with pytest.raises(ValueError, match="fine-tune"):
        common.tiny_checkpoint("ernie_gen", "lead")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_are_fresh_and_small(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, "a notebook without code"
    # every code cell executed, once, in order, from a fresh kernel
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1))
    images = 0
    for cell in code:
        for out in cell["outputs"]:
            assert out["output_type"] != "error", (path.name, out.get("ename"), out.get("evalue"))
            png = out.get("data", {}).get("image/png")
            if png:
                images += 1
                assert len(base64.b64decode(png)) < 200_000, f"{path.name}: an image over 200 kB"
    assert images >= 1, f"{path.name} draws no picture"
    assert path.stat().st_size < 1_000_000
    # it imports the project's code rather than re-implementing it
    source = "\n".join("".join(c["source"]) for c in code)
    assert "import common" in source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_saved_without_execution_timestamps(path):
    """A run's timestamps in a cell's metadata change on every run and churn every diff: execute.py --save writes a
    notebook without them, and --strip drops them from one already saved."""
    import sys
    sys.path.insert(0, str(ROOT / "notebooks"))
    import execute
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    stamped = [n for n, cell in enumerate(cells) if set(execute.VOLATILE) & set(cell["metadata"])]
    assert not stamped, (f"{path.name}: execution timestamps in cells {stamped}; "
                         f"python notebooks/execute.py {path.name} --strip drops them")


def test_strip_drops_the_timestamps_and_nothing_else(tmp_path):
    import sys
    sys.path.insert(0, str(ROOT / "notebooks"))
    import execute
    saved = (ROOT / "notebooks" / "01_wordpiece.ipynb").read_text(encoding="utf-8")
    nb = json.loads(saved)
    for cell in nb["cells"]:
        cell["metadata"]["execution"] = {"iopub.status.busy": "2026-11-26T17:41:12.886525Z",
                                         "shell.execute_reply": "2026-11-26T17:41:15.470858Z"}
    path = tmp_path / "stamped.ipynb"
    path.write_text(json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    execute.strip_file(path)
    # the notebook as it was, byte for byte: outputs, ids, kernel metadata and the layout nbformat writes
    assert path.read_text(encoding="utf-8") == saved
