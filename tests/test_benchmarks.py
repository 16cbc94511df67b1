"""The benchmark scripts run end to end on the CPU at a small geometry (smoke runs: the
numbers mean nothing here; the scripts' own checks must pass)."""

import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def run(script, *args):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], capture_output=True,
                        text=True, timeout=600, env=env)


def test_model_bench_modes_agree(tmp_path):
  out = tmp_path / "model.json"
  res = run("benchmarks/model_bench.py", "--geometry=small", "--batches=2", "--steps=4",
            "--repeats=1", "--layers=1", "--vocab=128", "--backend=reference", f"--out={out}")
  assert res.returncode == 0, res.stderr[-2000:]
  rows = json.loads(out.read_text())["rows"]
  assert [r["name"].split(" layers")[0] for r in rows] == [
      "model B=2 snapshot R=8", "model B=2 compact R=8", "model B=2 greedy R=1"]
  assert all(r["modes_bitwise_equal"] for r in rows)
  assert rows[0]["mean_tokens_per_call"] > 1 and rows[2]["mean_tokens_per_call"] == 1


def test_loop_and_flush_suites_name_their_variants(tmp_path):
  out = tmp_path / "bench.json"
  res = run("benchmarks/bench.py", "--geometry=small", "--backend=reference", "--suites=loop,flush",
            "--batches=2", "--vary_batches=", "--blocks=2", "--banks=2", "--copy_mib=16",
            "--state_dtypes=bfloat16", "--windows=16", "--min_calls=2", f"--out={out}")
  assert res.returncode == 0, res.stderr[-2000:]
  data = json.loads(out.read_text())
  names = [r["name"] for r in data["loop"]]
  assert "compact B=2 R=8 row=accept W=16 state=bf16 reference" in names, names
  assert [r["name"] for r in data["flush"]][1:] == [
      "compact B=2 R=8 row=mixed W=16 no flush reference",
      "compact B=2 R=8 row=mixed W=16 flush reference"]
  assert all(r["floor_us"] > 0 for r in data["loop"] + data["flush"])


def test_tree_suite_times_trees_beside_chains(tmp_path):
  out = tmp_path / "bench.json"
  res = run("benchmarks/bench.py", "--geometry=small", "--backend=reference", "--suites=tree",
            "--batches=2", "--blocks=2", "--banks=2", "--copy_mib=16", "--min_calls=2",
            "--tree_shapes=uniform,bfs", f"--out={out}")
  assert res.returncode == 0, res.stderr[-2000:]
  names = [r["name"] for r in json.loads(out.read_text())["tree"]]
  assert names == [f"{mode} B=2 R={R} row=accept{tree} reference"
                   for mode in ("snapshot", "compact")
                   for R, tree in [(8, ""), (8, " tree"), (8, " tree=bfs"), (16, ""),
                                   (16, " tree"), (16, " tree=bfs"), (16, " tree"),
                                   (16, " tree=bfs")]], names


def run_prefill_suite(out, *flags):
  """bench.py's prefill suite at the small geometry on the reference backend, briefly."""
  return run("benchmarks/bench.py", "--geometry=small", "--backend=reference",
             "--suites=prefill", "--blocks=2", "--banks=2", "--copy_mib=16", "--min_calls=2",
             f"--out={out}", *flags)


def test_prefill_suite_times_serial_tile_variants(tmp_path):
  out = tmp_path / "bench.json"
  res = run_prefill_suite(out, "--lengths=12", "--prefill_cases=serial",
                          "--serial_tiles=8:1:16:body_rows=8")
  assert res.returncode == 0, res.stderr[-2000:]
  names = [r["name"] for r in json.loads(out.read_text())["prefill"]]
  assert names == ["snapshot B=1 R=12 row=0 reference",
                   "snapshot B=1 R=12 row=0 serial 8:1:16:body_rows=8"], names
  res = run_prefill_suite(out, "--lengths=12", "--prefill_cases=chunked",
                          "--serial_tiles=8:1:16:body_rows=8")
  assert res.returncode != 0 and "must include serial" in res.stderr, res.stderr[-2000:]


def test_prefill_suite_takes_a_batch(tmp_path):
  out = tmp_path / "bench.json"
  res = run_prefill_suite(out, "--lengths=20", "--prefill_cases=serial,chunked",
                          "--prefill_batch=3")
  assert res.returncode == 0, res.stderr[-2000:]
  rows = json.loads(out.read_text())["prefill"]
  assert [r["name"].split(" row=")[0] for r in rows] == ["snapshot B=3 R=20"] * 2, rows
  assert rows[1]["scratch_mb"] > 0


def test_prefill_suite_times_compact_mode(tmp_path):
  """compact_serial and compact_chunked: compact mode at each length, one state written
  (a lower floor than snapshot's, which writes `capacity`), the same chunked scratch."""
  out = tmp_path / "bench.json"
  res = run_prefill_suite(out, "--lengths=20", "--prefill_batch=2",
                          "--prefill_cases=serial,chunked,compact_serial,compact_chunked")
  assert res.returncode == 0, res.stderr[-2000:]
  rows = {r["name"]: r for r in json.loads(out.read_text())["prefill"]}
  snap_s, snap_c, comp_s, comp_c = (rows[f"{mode} B=2 R=20 row=0 {kind}"] for mode, kind in (
      ("snapshot", "reference"), ("snapshot", "chunked bf16"), ("compact", "reference"),
      ("compact", "chunked bf16")))
  assert comp_s["floor_us"] < snap_s["floor_us"] and comp_c["floor_us"] < snap_c["floor_us"]
  assert comp_c["scratch_mb"] == snap_c["scratch_mb"] > 0
