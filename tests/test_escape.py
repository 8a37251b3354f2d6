"""The one escaping path: what each filter lets through, what it refuses, and that nothing raw gets out."""

import ast

import pytest

from integrate.escape import Code, UnsafeValue, check_python, dotted, finalize, ident, py, sh, text

NASTY = ['M"""\nimport os; os.system("touch /tmp/x")\n"""', "x\\N{", 'a"', "$(touch /tmp/x)", "a\x00b\x1bc",
         "../../etc", "line\rbreak", "é ünïcödé", "'; import os #"]


@pytest.mark.parametrize("value", NASTY + [1, 2.5, True, None, ["a", 1, None], {"k": [1, "v"]}])
def test_py_reads_back_as_the_value_itself(value):
    out = py(value)
    back = ast.literal_eval(out)
    assert back == (list(value) if isinstance(value, tuple) else value)


@pytest.mark.parametrize("value", NASTY)
def test_text_stays_one_harmless_line_in_a_docstring_and_a_comment(value):
    out = text(value)
    assert "\n" not in out and "\r" not in out
    module = f'"""{out}"""\n# {out}\nx = 1\n'
    check_python(module, "m.py")
    tree = ast.parse(module)
    assert len(tree.body) == 2  # the docstring and `x = 1`: nothing else got in


@pytest.mark.parametrize("value", NASTY + ["", "a-b", "class", "1a", None, 3])
def test_identifiers_and_dotted_names_refuse_anything_else(value):
    with pytest.raises(UnsafeValue):
        ident(value)
    if value not in ("class",):
        with pytest.raises(UnsafeValue):
            dotted(value)
    assert ident("motif_video") == "motif_video" and dotted("diffusers.models.x") == "diffusers.models.x"


@pytest.mark.parametrize("value", NASTY)
def test_a_shell_word_stays_one_word(value):
    import shlex

    if "\x00" in value:  # no shell word can hold a NUL
        with pytest.raises(UnsafeValue):
            sh(value)
        return
    assert shlex.split(f"echo {sh(value)}") == ["echo", value]


def test_templates_cannot_print_a_raw_string():
    with pytest.raises(UnsafeValue, match="without saying where it lands"):
        finalize("raw")
    assert finalize(Code("x")) == "x" and finalize(3) == 3 and finalize(True) is True


def test_a_module_that_does_not_compile_is_refused():
    with pytest.raises(UnsafeValue, match="does not compile"):
        check_python('"""\\N"""\n', "bad.py")
