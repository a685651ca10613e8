"""`onnx2jax explain --auto`: the automatic plan's top candidates, predicted, and its winner measured.

The shipped tiny Llama on the 8 fake CPU devices, batch 2, sequence 16. The printed candidates and
hand plan are those of `sharding.auto_plan`'s report at the same (cached) rates; the measured
collectives and their bytes are those read here, independently, from the HLO text of the plan
`auto_plan` writes, compiled by `onnx2jax.compile`; and they equal the prediction.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import math
import re

import jax
import numpy as np
import onnx
import pytest

import onnx2jax
from onnx2jax.cli.app import main
from onnx2jax.runtime import calibration
from sharding import auto_plan

MODEL = onnx2jax.data_path("tiny_llama.onnx")
ARGV = ["explain", str(MODEL), "--auto", "--devices", "8", "--batch", "2", "--seq", "16"]
_COLLECTIVE = re.compile(r"=\s*([a-z]+)([0-9]+)\[([0-9,]*)\]\S*\s+(all-reduce|all-gather|all-to-all|"
                         r"collective-permute|reduce-scatter)(?:-start)?\(")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One rates cache for the module: the CLI calibrates once, the tests read the same rates."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("rates")))
        yield


@pytest.fixture(scope="module")
def printed(cache) -> dict:
    """``explain --auto --json``'s output, the report `auto_plan` gives at the CLI's rates, and its plan's
    collectives read from the compiled HLO."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*ARGV, "--json"]) == 0
    annotated, report = auto_plan(onnx.load(MODEL), 8, batch=2, seq=16, rates=calibration.rates(jax.devices()[:8]))
    return {"json": json.loads(out.getvalue()), "report": report, "hlo": _hlo_collectives(annotated)}


def _hlo_collectives(annotated: onnx.ModelProto) -> tuple[dict[str, int], int]:
    """Collectives by kind and the bytes of their (single-array) results, read off the compiled HLO."""
    compiled = onnx2jax.compile(annotated, configuration="auto")
    text = compiled.compiled_text(input_ids=np.zeros((2, 16), np.int64))
    found = _COLLECTIVE.findall(text)
    counts = collections.Counter(kind for *_, kind in found)
    size = sum(int(bits) // 8 * math.prod(int(d) for d in dims.split(",") if d) for _, bits, dims, _ in found)
    return dict(counts), size


def test_json_names_the_candidates_and_the_winner_measured_from_its_hlo(printed):
    auto, report = printed["json"]["auto"], printed["report"]
    assert printed["json"]["configuration"] == "auto"
    assert auto["winner"]["name"] == report.winner.name == auto["top"][0]["name"]
    assert [r["name"] for r in auto["top"]] == [r.name for r in report.rows[:5]]
    assert [r["seconds"] for r in auto["top"]] == [r.seconds for r in report.rows[:5]]
    assert auto["hand"]["name"] == "hand plan (megatron_plan)"
    assert auto["hand"]["collective_bytes"] == report.hand.collective_bytes
    counts, size = printed["hlo"]
    assert counts == {"all-reduce": 5}  # the tiny Llama's two layers: 2 x (attention, MLP) + the vocabulary split
    assert {k: v for k, v in auto["measured"]["collectives"].items() if v} == counts
    assert {k: v for k, v in auto["winner"]["collectives"].items() if v} == counts
    assert auto["measured"]["collective_bytes"] == auto["winner"]["collective_bytes"] == size
    assert auto["differences"] == [] and auto["run_notes"] == []


def test_text_prints_the_report_then_explains_the_winner(printed, capsys):
    assert main(ARGV) == 0
    out = capsys.readouterr().out.splitlines()
    report = printed["report"]
    expected = report.lines()[1:]  # the first line holds the search's wall time
    hand = expected.index(f"hand plan: {report.hand.line()}")
    assert out[1:hand + 2] == expected[:hand + 1]
    counts, size = printed["hlo"]
    assert f"winner measured (compiled HLO): {counts['all-reduce']} all-reduce; {size:,} collective bytes," in out[hand + 2]
    assert out[hand + 3] == "measured = predicted (collectives, bytes, parameter bytes per device)"
    assert any(line.startswith("configuration 'auto': ") for line in out)


def test_auto_asks_for_devices_and_refuses_a_configuration(cache, capsys):
    """--auto without --devices, with --configuration, and its workload options without --auto are usage errors."""
    assert main(["explain", str(MODEL), "--auto"]) == 2
    assert "--auto needs --devices N" in capsys.readouterr().err
    assert main([*ARGV, "--configuration", "tp"]) == 2
    assert "goes without --configuration" in capsys.readouterr().err
    assert main(["explain", str(MODEL), "--devices", "8", "--batch", "2"]) == 2
    assert "--batch, --devices go with --auto" in capsys.readouterr().err
