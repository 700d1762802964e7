"""Execute the notebooks from a clean state and fail on the first error (what CI runs).

    python notebooks/execute.py                         # every notebook: runs, times, checks the 90 s budget
    python notebooks/execute.py --save                  # re-execute every notebook and write the outputs back
    python notebooks/execute.py 02_masks.ipynb --save   # one notebook
    python notebooks/execute.py --skip 01_wordpiece.ipynb   # all but one (CI: nbconvert has just run it)
    python notebooks/execute.py 04_ernie_gen.ipynb --strip  # drop the timestamps of a saved notebook, no run

First the checkpoints the notebooks read are built or refreshed (common.prepare: missing, out of date, or no
longer fitting the code), outside the budget; then each notebook runs in notebooks/ with a fresh kernel. Without
--save or --strip nothing in the repository changes. A notebook is written without the cell metadata that
changes on every run (VOLATILE: the execution timestamps), so its diff shows only what its cells changed; --strip
drops that metadata from notebooks as they were saved, without running them (outputs stay byte for byte). Left
out: running notebooks in parallel, timing single cells.
"""
import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUDGET_S = 90                      # each notebook, on two CPU cores
# cell metadata a run writes anew every time: the kernel's timestamps (nbclient's, and Jupyter's ExecuteTime)
VOLATILE = ("execution", "ExecuteTime")


def strip(nb):
    """The notebook (a dict, as json or nbformat reads it) without VOLATILE metadata; changed in place."""
    for cell in nb["cells"]:
        for key in VOLATILE:
            cell["metadata"].pop(key, None)
    return nb


def strip_file(path):
    """Strip a saved notebook in place, without running it; written as nbformat writes (sorted keys, indent 1)."""
    nb = strip(json.loads(path.read_text(encoding="utf-8")))
    path.write_text(json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def execute(path, save):
    # the notebook packages (notebooks/requirements.txt) are needed only to run one: strip works without them
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(path, as_version=4)
    start = time.time()
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
    seconds = time.time() - start
    if save:
        nbformat.write(strip(nb), path)
    return seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("notebooks", nargs="*", help="names under notebooks/ (default: all)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--save", action="store_true", help="write the executed outputs back into the notebooks")
    mode.add_argument("--strip", action="store_true",
                      help="do not run: write the notebooks back without their execution timestamps")
    ap.add_argument("--skip", nargs="+", default=[], metavar="NAME",
                    help="notebooks not to run here (CI: the one the README's nbconvert command has just run)")
    args = ap.parse_args()
    paths = [HERE / n for n in args.notebooks] or sorted(HERE.glob("*.ipynb"))
    missing = [p.name for p in paths + [HERE / n for n in args.skip] if not p.exists()]
    if missing:
        print(f"execute.py: error: no such notebook under notebooks/: {', '.join(missing)}", file=sys.stderr)
        sys.exit(2)
    if args.strip:
        for path in paths:
            if path.name not in args.skip:
                strip_file(path)
                print(f"{path.name}: stripped", flush=True)
        return
    sys.path.insert(0, str(HERE))
    import common
    common.prepare()
    slow = []
    for path in paths:
        if path.name in args.skip:
            print(f"{path.name}: skipped (--skip)", flush=True)
            continue
        seconds = execute(path, args.save)
        print(f"{path.name}: ran in {seconds:.0f} s", flush=True)
        if seconds > BUDGET_S:
            slow.append(f"{path.name} ({seconds:.0f} s)")
    if slow:
        sys.exit(f"over the {BUDGET_S} s budget: {', '.join(slow)}")


if __name__ == "__main__":
    main()
