"""The README's commands are what CI runs: set-up, main job and tests, verbatim and in order."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands():
    """The commands of the README's first ```bash block (the set-up block), comments stripped."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def ci_commands():
    text = (ROOT / ".ci" / "run").read_text()
    block = text.split("# --- the README's commands ---\n")[1].split("# --- end of the README's commands ---")[0]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_ci_runs_exactly_the_readmes_commands():
    commands = readme_commands()
    assert commands == ci_commands()
    # install, main job, tests: in that order
    assert commands[0].startswith("pip install torch") and "cpu" in commands[0]
    assert commands[1] == "pip install -r requirements.txt -r requirements-dev.txt"
    assert commands[-2] == "python train.py --objective pmlm" and commands[-1] == "python -m pytest -q"


def test_requirements_never_pull_a_cuda_build_first():
    """torch is installed by the README's first line, CPU build; requirements.txt only admits what is there."""
    req = (ROOT / "requirements.txt").read_text().split()
    assert any(r.startswith("torch") for r in req)
    dev = (ROOT / "requirements-dev.txt").read_text()
    assert "pytest" in dev
    for oracle in ("rouge-score", "sacrebleu", "nltk", "tokenizers"):
        assert oracle in dev
