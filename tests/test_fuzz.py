"""Mutated sources never crash the analysers: untraceable things are reported as unknown."""

from pathlib import Path

from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from integrate.errors import InputError
from integrate.resolve import Workspace

SOURCE = (ROOT / "tests" / "fixtures" / "bfl" / "model.py").read_text() + "\n" + \
    (ROOT / "tests" / "fixtures" / "bfl" / "layers.py").read_text().replace("import torch\nfrom torch import nn\n", "")
LINES = SOURCE.splitlines()
WORDS = ["self", "block", "img", "txt", "x", "nn.ModuleList", "return", "(", ")", ",", "for", "in", "+=", "None",
         "enumerate", "[:2]", "len", "hidden_states", "encoder_hidden_states", ":", "if", "else"]


@st.composite
def mutated(draw):
    lines = list(LINES)
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["drop", "dup", "word", "swap"]))
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "word":
            words = lines[i].split(" ")
            j = draw(st.integers(0, len(words) - 1))
            words[j] = draw(st.sampled_from(WORDS))
            lines[i] = " ".join(words)
        else:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        if not lines:
            lines = ["pass"]
    return "\n".join(lines) + "\n"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(source=mutated())
def test_mutated_sources_never_crash(tmp_path_factory, source):
    from integrate.analyzers.analysis import analyze_transformer
    from integrate.analyzers.cfg import analyze_pipeline

    path = Path(tmp_path_factory.mktemp("fuzz")) / "model.py"
    path.write_text(source)
    ws = Workspace()
    try:
        src = ws.load(path)
    except InputError:
        return  # a syntax error is bad input, reported as such
    for cls in src.classes.values():
        facts = analyze_transformer(ws, src, cls)
        _plan_pieces(ws, src, cls, facts)
        for bl in facts.block_lists:
            assert bl.is_blocks in (True, False, None)
            if bl.is_blocks is None:
                assert bl.confidence == "unknown" and bl.why
            if bl.forward_pattern is None and bl.is_blocks:
                assert bl.confidence == "unknown"
    for fn in src.functions:
        analyze_pipeline(ws, src, None, fn)


def _plan_pieces(ws, src, cls, facts):
    """The parallelism readers and both charts run on whatever the analysis made of the class."""
    from integrate.analyzers.structure import parallel_facts
    from integrate.decisions.cp import decide_cp
    from integrate.decisions.tp import decide_tp
    from integrate.gate.records import Fact, GateReport

    gate = GateReport({"model_path": Fact(None, "test"), "pipeline_class": Fact(None, "test"),
                       "transformer_class": Fact(cls.name.value, "test"), "pipeline_file": Fact(None, "test"),
                       "transformer_file": Fact(str(src.path), "test"), "config_file": Fact(None, "test")},
                      "__call__")
    pf = parallel_facts(gate, ws, facts)
    cp = decide_cp(pf)
    assert cp.approach in ("hook", "hybrid", "unknown")
    decide_tp(pf)
