"""The README's usage examples run as written (from the repository root) and print what they
say."""

import contextlib
import io
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))


def test_readme_example_runs_and_prints():
  with open(os.path.join(HERE, "..", "README.md")) as fh:
    blocks = re.findall(r"```python\n(.*?)```", fh.read(), re.S)
  assert len(blocks) == 2, "the README has two Python examples"
  outs = []
  cwd = os.getcwd()
  os.chdir(os.path.join(HERE, ".."))
  try:
    for block in blocks:
      out = io.StringIO()
      with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), {})
      outs.append(out.getvalue().splitlines())
  finally:
    os.chdir(cwd)
  lines = outs[0]
  assert lines[0] == "y: (2, 8, 128) float32", lines
  norm = float(lines[1].split(":")[1])
  assert lines[1].startswith("committed state norm:") and norm > 0
  assert lines[2] == "packed y: (35, 128)", lines
  assert outs[1] == ["verify logits: (1, 4, 64) next state_row: [1]"], outs[1]
