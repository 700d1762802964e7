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
EXPECTED = ["decoding.ipynb", "ernie_gen.ipynb", "masks.ipynb", "palm.ipynb", "pmlm.ipynb", "wordpiece.ipynb"]


def test_the_six_notebooks_exist_and_the_readme_lists_them():
    assert [p.name for p in NOTEBOOKS] == EXPECTED
    readme = (ROOT / "README.md").read_text()
    for name in EXPECTED:
        assert f"notebooks/{name}" in readme, name


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
