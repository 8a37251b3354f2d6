"""Fuzz of the vectors issue 33 named (hypothesis): a forward's signature and decorators, a journal planted in a
cache-dit tree, and a model folder's name. Each must hold: nothing of the input runs, nothing is written outside
the tree, and a refusal is an InputError (exit 2), never a crash."""

from __future__ import annotations

import ast
import base64
import json
import shutil
from pathlib import Path

import libcst as cst
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from integrate.templates import signature

from integrate import journal
from integrate.errors import InputError

SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# expressions a model may write where a signature holds one: literals, names, calls, anything Python accepts
EXPRESSIONS = st.sampled_from([
    "None", "True", "1", "-2", "1e-6", "'a'", '"x\\"y"', "b'x'", "(1, 2)", "[1]", "{}", "torch.float32", "DEFAULT",
    "__import__('os').system('touch m')", "lambda x=open('m', 'w'): x", "f'{x}'", "-x", "1 + 2", "(yield)",
    "3j", "...", "'a' 'b'", "not 1", "x if y else z", "[i for i in range(3)]", "*", "x := 1",
])
NAMES = st.sampled_from(["a", "b", "c", "scale", "kw", "MODEL_DEFAULT", "model_default", "self"])


@st.composite
def forwards(draw) -> str:
    names = draw(st.lists(NAMES.filter(lambda n: n != "self"), unique=True, max_size=4))
    parts = ["self"]
    for name in names:
        annotation = f": {draw(EXPRESSIONS)}" if draw(st.booleans()) else ""
        default = f" = {draw(EXPRESSIONS)}" if draw(st.booleans()) or (parts and "=" in parts[-1]) else ""
        parts.append(f"{name}{annotation}{default}")
    if draw(st.booleans()):
        parts.append(f"**kwargs: {draw(EXPRESSIONS)}")
    decorators = "".join(f"@{draw(st.sampled_from(['torch.no_grad()', 'name', 'a.b(1, k=-2)', 'f(x)', 'f(*a)']))}\n"
                         for _ in range(draw(st.integers(0, 2))))
    returns = f" -> {draw(EXPRESSIONS)}" if draw(st.booleans()) else ""
    return f"{decorators}def forward({', '.join(parts)}){returns}:\n    '''doc'''\n    return a\n"


def _literal_or_name(node: ast.AST) -> bool:
    return isinstance(node, (ast.Constant, ast.Name)) or (
        isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant))


@SETTINGS
@given(forwards())
def test_a_rewritten_signature_holds_names_kinds_and_literals_only(source):
    try:
        fn = cst.parse_module(source).body[0]
    except cst.ParserSyntaxError:
        return  # not Python: no model source is made of it
    data = signature.as_data(fn, "forward", "M.forward")
    if data.function is None:
        assert data.why
        return
    code = cst.Module(body=[data.function]).code
    tree = ast.parse(code).body[0]
    assert not tree.decorator_list and tree.returns is None
    args = tree.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        assert arg is None or arg.annotation is None
    for default in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
        assert _literal_or_name(default), ast.unparse(default)
        if isinstance(default, ast.Name):
            assert default.id in (signature.SENTINEL, "True", "False", "None")
    wrapped = ast.parse(data.wrapped, mode="eval").body
    for node in ast.walk(wrapped):  # a decorator: dotted names called with literals, around the function's name
        assert isinstance(node, (ast.Call, ast.Name, ast.Attribute, ast.Constant, ast.UnaryOp, ast.USub, ast.Load,
                                 ast.keyword)), ast.dump(node)


ENTRY = st.fixed_dictionaries({
    "path": st.sampled_from(["caching/__init__.py", "../x.py", "evil/x.py", "/etc/x.py", "caching/../../x.py",
                             "caching", "a\\b.py", "", "x.txt", 5, None]),
    "tmp": st.sampled_from([".__init__.py.integrate-0123456789ab.tmp", "../../victim", "/victim", "victim",
                            ".__init__.py.integrate-XYZ.tmp", ".x.py.integrate-0123456789ab.tmp", 3, None]),
    "backup": st.sampled_from([None, base64.b64encode(b"payload").decode(), "!!notbase64", 7, ["x"]]),
    "mode": st.sampled_from([None, 0o644, -1, 0o170000, "rw", True]),
})


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("journal")
    package = root / "site" / "cache_dit"
    (package / "caching").mkdir(parents=True)
    (package / "caching" / "__init__.py").write_text("original = True\n")
    (root / "outside").mkdir()
    (package / "evil").symlink_to(root / "outside", target_is_directory=True)
    return package


@SETTINGS
@given(st.one_of(st.lists(ENTRY, max_size=3).map(lambda e: {"entries": e}), st.sampled_from([[], {}, 1, "x"])))
def test_a_planted_journal_touches_nothing_outside_the_tree(tree, data):
    root = tree.parent.parent
    victim = root / "victim"
    victim.write_text("keep")
    (tree / journal.JOURNAL).write_text(json.dumps(data))
    try:
        journal.recover(tree)
    except InputError:
        pass
    assert victim.read_text() == "keep" and not list((root / "outside").iterdir())
    assert not (root / "site" / "x.py").exists() and not (root / "x.py").exists()
    (tree / journal.JOURNAL).unlink(missing_ok=True)
    (tree / "caching" / "__init__.py").write_text("original = True\n")


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.sampled_from(list("\"'\\ x#;(){}$`\n")), min_size=1, max_size=12))
def test_a_model_folder_name_never_becomes_code(tmp_path_factory, name):
    """The folder's name reaches PLAN.md, plan.json, every generated module's docstrings and the test matrix."""
    from integrate import api

    base = tmp_path_factory.mktemp("name")
    folder = name.replace("/", "_").replace("\x00", "_").strip() or "x"
    if folder in (".", ".."):
        folder = "x" + folder
    model = base / folder
    shutil.copytree(Path(__file__).resolve().parents[1] / "examples" / "motif-video", model)
    try:
        api.write_plan(api.plan(api.flags_for(str(model)), probe=False), base / "plan")
        api.approve(base / "plan", "".join(c if c.isprintable() else " " for c in name).strip() or "R")
        api.generate(base / "plan", out=base / "out")
    except InputError as exc:
        pytest.fail(f"a folder named {folder!r} was refused: {exc}")
    for module in (base / "out").rglob("*.py"):
        tree = ast.parse(module.read_text())
        calls = {getattr(n.func, "attr", getattr(n.func, "id", "")) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        assert "system" not in calls and "__import__" not in calls, module
