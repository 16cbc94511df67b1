"""The README's usage example runs as written and prints y's shape and the state's norm."""

import contextlib
import io
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))


def test_readme_example_runs_and_prints():
  with open(os.path.join(HERE, "..", "README.md")) as fh:
    blocks = re.findall(r"```python\n(.*?)```", fh.read(), re.S)
  assert len(blocks) == 1, "the README has one Python example"
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(blocks[0], "README.md", "exec"), {})
  lines = out.getvalue().splitlines()
  assert lines[0] == "y: (2, 8, 128) float32", lines
  norm = float(lines[1].split(":")[1])
  assert lines[1].startswith("committed state norm:") and norm > 0
