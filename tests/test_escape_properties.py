"""Every filter of the one escaping path, over arbitrary strings (hypothesis): the module it lands in parses, holds
nothing but what the template put there, and the value reads back as itself (or, for prose, as its one-line form).

The strategies lean on what breaks escapers: runs of quotes and backslashes beside text, at either end of the value,
line breaks of every kind, NULs, surrogates and identifiers that Python folds to other names."""

from __future__ import annotations

import ast
import shlex
import string

import jinja2
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from integrate import escape
from integrate.escape import UnsafeValue

# short runs of the characters that close or escape Python strings, mixed with any text at all
HOSTILE = st.lists(st.one_of(st.sampled_from(['"', "'", "\\", '"""', "'''", "\n", "\r", " ", "x", "\\N{", "#",
                                              "\x00", "\u2028", "\x0c", "{{", "$("]), st.text(max_size=4)),
                   max_size=12).map("".join)
ANY = st.one_of(HOSTILE, st.text())
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# the project's own way of rendering: a plain string cannot be printed, every insertion names its filter
ENV = jinja2.Environment(finalize=escape.finalize, undefined=jinja2.StrictUndefined)
ENV.filters.update(escape.FILTERS)


def one_line(value: str) -> str:
    return "".join(ch if ch.isprintable() else " " for ch in value)


def docstring_and_comment(rendered: str) -> tuple[str, list]:
    """A module must hold the docstring and `x = 1` only (a comment is no statement)."""
    escape.check_python(rendered, "m.py")
    tree = ast.parse(rendered)
    assert [type(n).__name__ for n in tree.body] == ["Expr", "Assign"], rendered
    return ast.get_docstring(tree, clean=False), tree.body


@SETTINGS
@given(ANY)
@example('m"""""')
@example('"""')
@example('\\')
@example('a"')
def test_text_reads_back_in_a_docstring_at_either_end_and_in_a_comment(value):
    for template in ('"""{{ v | text }}"""\n# {{ v | text }}\nx = 1\n',
                     '"""Start {{ v | text }} end."""\nx = 1  # {{ v | text }}\n',
                     'def f():\n    """{{ v | text }}"""\n\n\nx = 1\n'):
        rendered = ENV.from_string(template).render(v=value)
        tree = ast.parse(rendered)
        assert len(tree.body) == 2, rendered
        node = tree.body[0]
        if isinstance(node, ast.FunctionDef):
            assert len(node.body) == 1
        doc = ast.get_docstring(node if isinstance(node, ast.FunctionDef) else tree, clean=False)
        expected = one_line(value)
        assert doc in (expected, f"Start {expected} end."), (value, escape.text(value), doc)


@SETTINGS
@given(st.lists(ANY, max_size=5), st.integers(min_value=10, max_value=40))
@example(values=["00AA-AA0000"], width=10)  # a hyphen is not a place to wrap: the word stays whole
def test_joined_and_wrapped_prose_stays_inside_its_docstring(values, width):
    rendered = ENV.from_string('"""{{ vs | joined("; ") }}\n\n{{ w | wrapped(width, "    ") }}"""\nx = 1\n').render(
        vs=values, w=" ".join(values), width=width)
    doc, _ = docstring_and_comment(rendered)
    head, _, tail = doc.partition("\n\n")
    assert head == "; ".join(one_line(v) for v in values)
    assert tail.split() == " ".join(one_line(v) for v in values).split()


SCALAR = st.one_of(ANY, st.integers(), st.booleans(), st.none(),
                   st.floats(allow_nan=False, allow_infinity=False))
VALUE = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(SCALAR, inner, max_size=4)), max_leaves=12)


@SETTINGS
@given(VALUE)
def test_py_reads_back_as_the_value_itself(value):
    rendered = ENV.from_string("X = {{ v | py }}\n").render(v=value)
    tree = ast.parse(rendered)
    assert len(tree.body) == 1 and isinstance(tree.body[0], ast.Assign)
    assert escape._plain(ast.literal_eval(tree.body[0].value)) == escape._plain(value)


@SETTINGS
@given(st.dictionaries(SCALAR, VALUE, max_size=6))
def test_py_dict_reads_back_one_entry_a_line(value):
    rendered = ENV.from_string("CONFIG = {{ v | py_dict }}\n").render(v=value)
    tree = ast.parse(rendered)
    assert len(tree.body) == 1
    assert escape._plain(ast.literal_eval(tree.body[0].value)) == escape._plain(value)


@SETTINGS
@given(st.one_of(ANY, st.text(alphabet=string.digits, min_size=1, max_size=3)))
def test_pykey_is_a_number_only_for_ascii_digits(value):
    rendered = ENV.from_string("D = {% raw %}{{% endraw %}{{ k | pykey }}: 1}\n").render(k=value)
    back = next(iter(ast.literal_eval(ast.parse(rendered).body[0].value)))
    assert back == (int(value) if value.isascii() and value.isdigit() else value)


@SETTINGS
@given(ANY)
@example("ｅｖａｌ")
@example("ﬁle")
@example("class")
@example("a.b")
def test_an_identifier_is_refused_or_reads_back_as_that_name(value):
    for name, template in (("ident", "{{ v | ident }} = 1\n"), ("dotted", "import {{ v | dotted }}\n")):
        try:
            rendered = ENV.from_string(template).render(v=value)
        except UnsafeValue:
            continue
        tree = ast.parse(rendered)
        node = tree.body[0]
        back = node.targets[0].id if name == "ident" else node.names[0].name
        assert back == value, (name, value, back)


@SETTINGS
@given(ANY)
def test_a_module_path_is_refused_or_only_names_indices_and_stars(value):
    try:
        path = escape.module_path(value)
    except UnsafeValue:
        return
    for part in path.split("."):
        assert part == "*" or (part.isdigit()) or escape.ident(part) == part


@SETTINGS
@given(st.one_of(ANY, st.integers()))
def test_a_shell_word_stays_one_word(value):
    try:
        word = ENV.from_string("{{ v | sh }}").render(v=value)
    except UnsafeValue:
        assert "\x00" in str(value)
        return
    assert shlex.split(f"echo {word}") == ["echo", str(value)]


def test_only_code_is_indented_and_a_raw_string_is_never_printed():
    with pytest.raises(UnsafeValue):
        escape.indented("x = 1", 4)
    with pytest.raises(UnsafeValue):
        ENV.from_string("{{ v }}").render(v="raw")
