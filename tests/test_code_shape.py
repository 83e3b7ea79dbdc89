"""Limits that keep fastrl's code readable to a newcomer, held by a test rather than
by review: a function with many parameters wants a named bundle of them."""
import ast
import pathlib

FASTRL = pathlib.Path(__file__).resolve().parent.parent / "fastrl"
# At most this many parameters, self and cls aside: past it, values travel as named
# types (planner.Layout, appo_loss.LossSettings, ...) rather than loose arguments.
MAX_PARAMETERS = 9


def parameters(node) -> list:
    a = node.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]


def test_no_function_in_fastrl_takes_more_than_a_handful_of_parameters():
    wide = []
    for path in sorted(FASTRL.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(parameters(node)) > MAX_PARAMETERS:
                wide.append(f"{path.relative_to(FASTRL.parent)}:{node.lineno} {node.name} "
                            f"({len(parameters(node))} parameters)")
    assert not wide, "functions past the parameter limit:\n" + "\n".join(wide)


def test_the_check_sees_a_wide_function():
    wide = ast.parse("def f(a, b, c, d, e, f, g, h, i, j): pass").body[0]
    method = ast.parse("def m(self, a, b, c, d, e, f, g, h, i): pass").body[0]
    assert len(parameters(wide)) == 10 > MAX_PARAMETERS and len(parameters(method)) == MAX_PARAMETERS
