"""The def-use index's own questions: what fed a name (walked back), the statements in order, a loop's body."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
from integrate.defuse import ALL, ASSIGNS, GROWS, PLAIN, defuse
from integrate.source import parse_source

CODE = '''
def forward(self, x, mask=None):
    n = x.shape[1]
    a = b = self.proj(x)
    ids: list = []
    for i in range(n):
        h = a + i
        ids.append(h)
    y = a * b
    extra = torch.cat(ids)
    return y
'''


def _index():
    src = parse_source(Path("defuse_snippet.py"), CODE)
    fn = src.module.body[0]
    return src, fn, defuse(src, fn)


def test_reach_walks_back_through_every_definition_that_fed_a_name_once_each_in_name_order():
    src, _, index = _index()
    seen = [(name, line, d.line if d else None) for name, line, d in index.reach("y", 10)]
    # y (line 9) reads a and b, bound on line 4 from x; x is a parameter; `self` is never followed
    assert seen == [("y", 10, 9), ("b", 9, 4), ("x", 4, None), ("a", 9, 4)]


def test_reach_leaves_out_the_definitions_keep_rejects():
    _, _, index = _index()
    got = {name: d for name, _, d in index.reach("y", 10, keep=lambda d: d.line != 4)}
    assert got["a"] is None and got["b"] is None and "x" not in got


def test_a_definition_knows_every_name_its_statement_binds():
    _, _, index = _index()
    (a,), (b,) = index.of("a"), index.of("b")
    assert a.names == ("a",) and a.bound == b.bound == ("a", "b")


def test_statements_by_kind_in_source_order_appends_only_when_asked():
    _, _, index = _index()

    def lines(kinds):
        return [(line, names) for line, names, _, _ in index.statements(kinds)]

    assert lines(PLAIN) == [(3, ("n",)), (4, ("a", "b")), (7, ("h",)), (9, ("y",)), (10, ("extra",))]
    assert (5, ("ids",)) in lines(ASSIGNS) and (6, ("i",)) in lines(ALL)
    assert lines(GROWS) == [(8, ("ids",))]
    assert all(kind_line != 8 for kind_line, _ in lines(ALL))
    assert not [d for d in index.defs if d.line == 8]  # an append binds nothing


def test_a_loop_body_has_an_index_of_its_own():
    src, fn, _ = _index()
    loop = next(s for s in fn.body.body if isinstance(s, cst.For))
    body = defuse(src, loop)
    assert [(line, names) for line, names, _, _ in body.statements(PLAIN)] == [(7, ("h",))]
