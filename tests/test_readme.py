"""The README's commands are what CI runs, verbatim and in order: set-up, main job and tests; then the
notebook commands, where CI replaces the one that starts a server by two checks it can run headless."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# the README's server command, and what CI runs in its place: the server's version, then the first notebook
# executed headless into a temporary folder
SERVER = "jupyter notebook notebooks/"
SERVER_IN_CI = ['jupyter notebook --version',
                'jupyter nbconvert --to notebook --execute notebooks/01_wordpiece.ipynb --output-dir "$(mktemp -d)"']


def commands(block):
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def readme_commands(section="## Set up, run, test"):
    """The commands of the first ```bash block after `section`, comments stripped."""
    text = (ROOT / "README.md").read_text()
    text = text[text.index(section):]
    return commands(re.search(r"```bash\n(.*?)```", text, re.S).group(1))


def ci_commands(which="commands"):
    text = (ROOT / ".ci" / "run").read_text()
    block = text.split(f"# --- the README's {which} ---\n")[1].split(f"# --- end of the README's {which} ---")[0]
    return commands(block)


def test_ci_runs_exactly_the_readmes_commands():
    commands = readme_commands()
    assert commands == ci_commands()
    # install, main job, tests: in that order
    assert commands[0].startswith("pip install torch") and "cpu" in commands[0]
    assert commands[1] == "pip install -r requirements.txt -r tests/requirements.txt"
    assert commands[-2] == "python train.py --objective pmlm" and commands[-1] == "python -m pytest -q -n 2"


def test_ci_runs_the_readmes_notebook_commands():
    commands = readme_commands("## Read the notebooks")
    assert SERVER in commands, "the README no longer starts the notebook server: update SERVER here"
    at = commands.index(SERVER)
    assert commands[:at] + SERVER_IN_CI + commands[at + 1:] == ci_commands("notebook commands")
    # the server's package is installed by the line before, and every notebook is prepared first
    assert commands[0] == "pip install -r notebooks/requirements.txt"
    assert "python notebooks/common.py" in commands[:at]
    notebook_reqs = (ROOT / "notebooks" / "requirements.txt").read_text().split()
    for package in ("notebook", "nbconvert", "ipykernel", "matplotlib"):
        assert package in notebook_reqs, package
    # and the runtime packages, through a path pip resolves from the notebooks' folder
    at_runtime = notebook_reqs[notebook_reqs.index("-r") + 1]
    assert (ROOT / "notebooks" / at_runtime).resolve() == ROOT / "requirements.txt"
    # the notebook block follows the set-up block, which installed torch from the CPU index
    text = (ROOT / ".ci" / "run").read_text()
    assert text.index("# --- end of the README's commands ---") < text.index("# --- the README's notebook commands ---")


def test_requirements_never_pull_a_cuda_build_first():
    """torch is installed by the README's first line, CPU build; requirements.txt only admits what is there."""
    req = (ROOT / "requirements.txt").read_text().split()
    assert any(r.startswith("torch") for r in req)
    dev = (ROOT / "tests" / "requirements.txt").read_text()
    assert "pytest" in dev
    for oracle in ("rouge-score", "sacrebleu", "nltk", "tokenizers"):
        assert oracle in dev
