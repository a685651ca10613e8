"""`onnx2jax bench`: the table's rows and columns, and the ratio as the two medians' quotient (no timings asserted)."""

import math
import pathlib
import statistics
import sys

import pytest

from onnx2jax import benchmark
from onnx2jax.cli.app import main

DATA = pathlib.Path(__file__).parents[1] / "data"


def test_bench_table_has_one_row_per_model_and_the_ratio_of_the_medians(tmp_path, capsys):
    out = tmp_path / "bench.md"
    assert main(["bench", str(DATA / "tiny_gpt2.onnx"), "--repeats", "3", "--warmup", "1", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    table = [line for line in out.read_text().splitlines() if line.startswith("|")]
    assert table[0] == "| " + " | ".join(benchmark.COLUMNS) + " |"
    assert len(table) == 3  # header, rule, one model at its stored inputs
    cells = dict(zip(benchmark.COLUMNS, (c.strip() for c in table[2].strip("|").split("|")), strict=True))
    assert cells["model"] == "tiny_gpt2" and cells["inputs"] == "input_ids[2, 16]"
    ours, theirs, ratio = (float(cells[k]) for k in ("onnx2jax ms", "onnxruntime ms", "ratio"))
    # The medians are printed to 4 significant digits (each off by at most 0.05%), the ratio to 3.
    last_digit = 10.0 ** (math.floor(math.log10(ratio)) - 2)
    assert ratio == pytest.approx(ours / theirs, abs=last_digit / 2 + 1e-3 * ratio)
    assert float(cells["max abs diff"]) < 1e-4  # the two runtimes agree (stored onnxruntime outputs: test_fixtures)
    assert table[2] in printed


def test_row_ratio_is_the_quotient_of_the_medians():
    row = benchmark.Row("m", "x[1]", [3.0, 1.0, 2.0], [4.0, 8.0, 6.0, 5.0], 1.0, 0.1, 0.0)
    assert row.ratio == statistics.median([3.0, 1.0, 2.0]) / statistics.median([4.0, 8.0, 6.0, 5.0])
    assert benchmark.iqr([1.0, 2.0, 3.0, 4.0, 5.0]) == 2.0


def test_bench_refuses_a_wrong_output_suffix_before_timing(capsys):
    assert main(["bench", str(DATA / "tiny_gpt2.onnx"), "--output", "table.txt"]) == 2
    assert "--output writes a .md file" in capsys.readouterr().err


def test_bench_plot_without_matplotlib_is_one_line_naming_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["bench", str(DATA / "tiny_gpt2.onnx"), "--plot", str(tmp_path / "p.png")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("onnx2jax bench: error: --plot needs matplotlib: pip install matplotlib "
                   "(in a clone of onnx2jax: pip install -e '.[plot]')")
