"""`onnx2jax explain` on a pipeline-staged model: counts per stage and in total.

The counts are checked against the annotated and the completed (``--write``)
models read with onnx, node by node, with each node's ``pipeline_stage``; the
collectives against the unstaged model's, grouped by those stages.
"""

import collections
import json
import re
from pathlib import Path

import onnx
import pytest

from onnx2jax.cli.app import main

DATA = Path(__file__).resolve().parents[1] / "data"
ANNOTATE = ["--plan", "megatron", "--devices", "8", "--name-nodes"]


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """The tiny Llama annotated in two pipeline stages (4 devices each) and unstaged (4 devices)."""
    folder = tmp_path_factory.mktemp("explain_stages")
    staged, unstaged = folder / "staged.onnx", folder / "unstaged.onnx"
    source = str(DATA / "tiny_llama.onnx")
    assert main(["annotate", source, *ANNOTATE, "--stages", "auto:2", "-o", str(staged)]) == 0
    assert main(["annotate", source, "--plan", "megatron", "--devices", "4", "--name-nodes", "-o", str(unstaged)]) == 0
    return {"staged": staged, "unstaged": unstaged, "folder": folder}


def _slots_with_specs(path: Path) -> dict[str, tuple[int | None, bool, int]]:
    """Per node, read with onnx: (pipeline_stage, has a spec, how many input/output slots name a spec'd tensor)."""
    model = onnx.load(path, load_external_data=False)
    result = {}
    for node in model.graph.node:
        configs = [c for c in node.device_configurations if c.configuration_id == "tp"]
        named = {s.tensor_name for c in configs for s in c.sharding_spec}
        stages = {c.pipeline_stage for c in configs if c.HasField("pipeline_stage")}
        slots = sum(1 for t in [*node.input, *node.output] if t and t in named)
        result[node.name] = (stages.pop() if stages else None, bool(named), slots)
    return result


def _collective_nodes(path: Path, capsys) -> list[str]:
    assert main(["explain", str(path), "--json"]) == 0
    return [d["node"] for d in json.loads(capsys.readouterr().out)["diagnostics"] if d["code"] == "collective"]


def test_counts_per_stage_match_the_models_read_with_onnx(models, capsys):
    full = models["folder"] / "full.onnx"
    assert main(["explain", str(models["staged"]), "--json", "--write", str(full)]) == 0
    report = json.loads(capsys.readouterr().out)
    written, completed = _slots_with_specs(models["staged"]), _slots_with_specs(full)
    stage_of = {name: stage for name, (stage, _, _) in written.items()}
    assert set(stage_of.values()) == {0, 1}
    expected = collections.defaultdict(collections.Counter)
    for name, stage in stage_of.items():
        expected[stage]["nodes"] += 1
        expected[stage]["placed"] += completed[name][1]
        expected[stage]["written"] += written[name][2]
        expected[stage]["inferred"] += completed[name][2] - written[name][2]
    # The collectives the unstaged model implies, each at a node of one stage.
    for node in _collective_nodes(models["unstaged"], capsys):
        expected[stage_of[node]]["collectives"] += 1
    got = {s["stage"]: s for s in report["stages"]}
    assert sorted(got) == [0, 1]
    for stage in (0, 1):
        counts = expected[stage]
        assert counts["placed"] and counts["written"] and counts["inferred"] and counts["collectives"]  # not vacuous
        assert got[stage] == {"stage": stage, "reshards": 0, **counts}, stage

    # The text summary: one total line (the sums) and one line per stage with the same counts.
    assert main(["explain", str(models["staged"])]) == 0
    out = capsys.readouterr().out
    total = {key: sum(expected[s][key] for s in (0, 1)) for key in ("placed", "written", "inferred")}
    assert (f"configuration 'tp', 2 pipeline stages: {total['placed']} nodes placed, {total['written']} specs written, "
            f"{total['inferred']} inferred, 0 reshard(s) in all") in out
    for stage in (0, 1):
        c = expected[stage]
        assert (f"  stage {stage}: {c['placed']} of its {c['nodes']} nodes placed, {c['written']} specs written, "
                f"{c['inferred']} inferred, 0 reshard(s), {c['collectives']} collective(s)") in out, out
    assert f"collectives the specs imply: {sum(expected[s]['collectives'] for s in (0, 1))}," in out


def test_unstaged_summary_has_no_stage_counts(models, capsys):
    full = models["folder"] / "unstaged_full.onnx"
    assert main(["explain", str(models["unstaged"]), "--json", "--write", str(full)]) == 0
    assert "stages" not in json.loads(capsys.readouterr().out)
    completed, written = _slots_with_specs(full), _slots_with_specs(models["unstaged"])
    placed = sum(c[1] for c in completed.values())
    specs_written = sum(w[2] for w in written.values())
    inferred = sum(c[2] for c in completed.values()) - specs_written
    assert main(["explain", str(models["unstaged"])]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^configuration 'tp': {placed} nodes placed, {specs_written} specs written, "
                     rf"{inferred} inferred, 0 reshard\(s\)$", out, re.MULTILINE), out
    assert "stage" not in out
