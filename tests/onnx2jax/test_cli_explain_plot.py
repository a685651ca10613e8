"""`onnx2jax explain --plot`: a real PNG, and one line when matplotlib is missing."""

import sys
from pathlib import Path

import onnx
import pytest

from onnx2jax.cli.app import main
from sharding.megatron import megatron_plan

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def annotated(tmp_path_factory):
    path = tmp_path_factory.mktemp("plot") / "gpt2_tp.onnx"
    onnx.save(megatron_plan(onnx.load(DATA / "zoo" / "gpt2.onnx"), 8), path)
    return path


def test_plot_writes_a_png(annotated, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="--plot needs the plot extra; the test extra stays light")
    from PIL import Image

    out = tmp_path / "tiles.png"
    assert main(["explain", str(annotated), "--placed", "--input-shape", "input_ids=2,16", "--plot", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"wrote {out}" in captured.out
    with Image.open(out) as image:
        assert image.format == "PNG"
        width, height = image.size
    assert width >= 600 and height >= 600


def test_plot_without_matplotlib_is_one_line_before_any_work(annotated, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    out = tmp_path / "tiles.png"
    # A missing model file would fail later: the extra is checked first.
    assert main(["explain", str(tmp_path / "missing.onnx"), "--plot", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.err.strip() == ("onnx2jax explain: error: --plot needs matplotlib: "
                                    "pip install matplotlib (in a clone of onnx2jax: pip install -e '.[plot]')")
    assert "Traceback" not in captured.err + captured.out
    assert not out.exists()


def test_plot_wrong_suffix_is_a_usage_error(annotated, tmp_path, capsys):
    assert main(["explain", str(annotated), "--plot", str(tmp_path / "tiles.jpg")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--plot writes a .png file" in err
