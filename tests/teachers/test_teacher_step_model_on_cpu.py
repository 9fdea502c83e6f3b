"""The paper-scale per-step model of ``benchmarks/teacher_step.py`` against hand arithmetic, and
``docs/teachers.md``'s table against the model (the docs state what the benchmark prints)."""

import importlib.util
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("teacher_step", ROOT / "benchmarks" / "teacher_step.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["teacher_step"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_model_by_hand(bench):
    a = bench.Assumptions()
    today, new = bench.paper_model(a, 300, 0, False), bench.paper_model(a, 300, 0, True)
    # 768 sent samples x 3,600 tokens x 2 x 32.8e9 FLOPs on 64 x 989 TFLOP/s at MFU 0.35
    assert today["compute"] == pytest.approx(2 * 32.8e9 * 768 * 3600 / (64 * 989e12 * 0.35))
    # 2 teachers x 2 directions x 8.375 GB per GPU at 4 GB/s, pageable; none resident
    assert today["weights"] == pytest.approx(2 * 2 * 8.375e9 / 4e9) and new["weights"] == 0
    # 384 samples per teacher x 56.5 MB over 8 nodes, read at 2 GB/s and broadcast at 1.5 GB/s; / 8 per group
    per_node = 384 * 56.5e6 / 8
    assert today["fetch"] == pytest.approx(2 * (per_node / 2e9 + per_node / 1.5e9))
    assert new["fetch"] == pytest.approx(today["fetch"] / 8)
    assert new["teacher"] == pytest.approx(new["fetch"] / 2 + new["compute"])  # fetch < compute: one fetch shows
    assert today["teacher"] == pytest.approx(today["weights"] + today["fetch"] + today["compute"])


def test_the_docs_table_is_the_models(bench):
    a = bench.Assumptions()
    cols = [bench.paper_model(a, 300, 0, False), bench.paper_model(a, 300, 0, True),
            bench.paper_model(a, 2000, 1, False), bench.paper_model(a, 2000, 1, True)]
    doc = (ROOT / "docs" / "teachers.md").read_text()
    for label, key in (("teacher compute", "compute"), ("teacher input fetch + broadcast", "fetch"),
                       ("teacher weights load + offload", "weights"), ("step", "step")):
        row = re.search(rf"^\| {re.escape(label)} \|(.*)\|$", doc, re.M)
        assert row, label
        cells = [float(c) for c in row.group(1).split("|")]
        assert cells == pytest.approx([round(c[key], 1) for c in cols], abs=0.051), label
    shares = re.search(r"^\| \*\*teacher share\*\* \|(.*)\|$", doc, re.M).group(1)
    assert [int(c.strip(" *%")) for c in shares.split("|")] == [round(c["share"] * 100) for c in cols]
