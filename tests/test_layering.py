"""Imports point one way: entry points -> runtime -> tuning -> sampling / learning ->
config -> plumbing -> cuda -> algo, and the envs import nothing of the trainer
(docs/design.md, "Layers"). Read from the sources with ast, every import counted,
those inside functions too: a lazy import is still a dependency."""
import ast
import os

from helpers import REPO

# Layer of each group; a module may import its own group or a lower layer. Two
# groups on one layer (sampling and learning) do not import each other: a helper
# both need belongs a layer down.
RANK = {
    "root": -1,  # fastrl/__init__.py, which every import of fastrl runs anyway; but see lazy_exports
    "algo": 0, "envs": 0,
    "cuda": 1,  # below plumbing: the published weights keep a device copy (plumbing.params)
    "plumbing": 2,
    "config": 3,
    "sampling": 4, "learning": 4,
    "tuning": 5,
    "runtime": 6,
    "entry": 7,
}
SUBPACKAGES = ("algo", "envs", "plumbing", "cuda", "sampling", "learning", "tuning", "runtime")
TOP_LEVEL = {"config": "config", "presets": "config", "train": "entry", "enjoy": "entry", "bench": "entry",
             "plot": "entry", "export": "entry", "api": "entry", "agent": "entry", "policy": "entry",
             # Below both registries (envs/ and algo/, one layer, which cannot import each other); imports nothing.
             "registering": "root"}


def group_of(module: str):
    """The group a fastrl module belongs to, or None for one nobody placed yet."""
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    if parts[1] in SUBPACKAGES:
        return parts[1]
    return TOP_LEVEL.get(parts[1]) if len(parts) == 2 else None


def module_name(path: str) -> str:
    """fastrl/learning/learner.py -> fastrl.learning.learner; envs/ installs as fastrl.envs."""
    rel = os.path.relpath(path, REPO)[:-len(".py")].split(os.sep)
    if rel[0] == "envs":
        rel = ["fastrl", *rel]
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def imports_of(source: str, module: str, is_package: bool, modules=frozenset()) -> set:
    """The module names `source` (the code of `module`) imports. `from a import b`
    names a.b where that is one of `modules` (b is a submodule), else a: importing a
    submodule runs its package too, but that is no dependency on the package's code."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package, then up
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    return found


def source_files(*folders: str) -> list:
    """The project's .py files under `folders`, leaving out hidden folders: a
    developer's benchmarks/.venv-sf holds a whole virtualenv of other projects' code,
    some of it in syntax this Python does not parse."""
    found = []
    for folder in folders:
        for d, dirs, files in os.walk(os.path.join(REPO, folder)):
            dirs[:] = [name for name in dirs if not name.startswith(".")]
            found += [os.path.join(d, f) for f in files if f.endswith(".py")]
    return sorted(found)


def module_graph() -> dict:
    """{fastrl module: the fastrl modules it imports}, for fastrl/ and envs/."""
    paths = {module_name(path): path for path in source_files("fastrl", "envs")}
    graph = {}
    for module, path in paths.items():
        with open(path) as fh:
            names = imports_of(fh.read(), module, path.endswith("__init__.py"), paths.keys())
        graph[module] = {name for name in names if name in paths and name != module}
    return graph


def lazy_exports() -> dict:
    """The root's _LAZY table {name: module}: what `fastrl.<name>` imports on first use."""
    with open(os.path.join(REPO, "fastrl", "__init__.py")) as fh:
        tree = ast.parse(fh.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["_LAZY"]:
            return ast.literal_eval(node.value)
    return {}


def violations(graph: dict, lazy=frozenset()) -> list:
    """One sentence for each import that points the wrong way. `lazy`: the modules the
    root re-exports through its module __getattr__ (lazy_exports)."""
    found = []
    for module, imported in sorted(graph.items()):
        group = group_of(module)
        if group is None:
            found.append(f"{module} belongs to no layer: place it in a subpackage, or in TOP_LEVEL here")
            continue
        for target in sorted(imported):
            to = group_of(target)
            if to is None:
                continue  # reported as a module of its own
            if group == "root" and target in lazy:
                # The root may name the public API of any layer, since it imports it only when a user touches the
                # name, long after every import of fastrl ran it (test_the_root_imports_its_exports_only_when_used).
                continue
            if group == "envs" and to not in ("envs", "root"):  # the root group imports nothing of the trainer
                found.append(f"{module} imports {target}: the envs know nothing of the trainer")
            elif to != group and RANK[to] >= RANK[group]:
                found.append(f"{module} ({group}) imports {target} ({to}), which is not below it")
    return found


def cycles(graph: dict) -> list:
    """The import cycles of `graph`, each as the list of modules around it."""
    found, done, path = [], set(), []

    def visit(module):
        if module in path:
            found.append(path[path.index(module):] + [module])
            return
        if module in done:
            return
        path.append(module)
        for target in sorted(graph.get(module, ())):
            visit(target)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
    return found


def test_every_import_points_down_and_none_goes_round():
    graph = module_graph()
    assert "fastrl.learning.learner" in graph and "fastrl.envs.registry" in graph  # the walk found the tree
    lazy = set(lazy_exports().values())
    assert "fastrl.api" in lazy  # the table was read
    assert sorted(lazy - set(graph)) == []  # every lazy name comes from a module of the tree
    # Upward edges the root may have; they close no cycle, as importing the root runs none of them.
    assert violations({**graph, "fastrl": graph["fastrl"] | lazy}, lazy) == []
    assert cycles(graph) == []


def test_the_root_imports_its_exports_only_when_used():
    import subprocess
    import sys

    names = sorted(lazy_exports())
    code = ("import sys, fastrl; before = sorted(m for m in sys.modules if m.startswith('fastrl') or m == 'torch'); "
            f"missing = [n for n in {names!r} if getattr(fastrl, n, None) is None]; print(before, missing)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out.strip() == "['fastrl'] []"  # nothing of the tree, and no torch, until a name is used; then each is


def test_nothing_imports_envs_by_its_old_top_level_name():
    old = []
    for path in source_files("fastrl", "envs", "tests", "benchmarks"):
        with open(path) as fh:
            names = imports_of(fh.read(), "x", False)
        old += [f"{os.path.relpath(path, REPO)}: {n}" for n in sorted(names) if n == "envs" or n.startswith("envs.")]
    assert old == []


def test_the_checker_catches_imports_that_point_the_wrong_way():
    # A lazy import inside a function, from the maths up to the runner: the walk sees it.
    source = "import torch\n\ndef vtrace():\n    from fastrl.runtime.runner import Runner\n"
    assert imports_of(source, "fastrl.algo.vtrace", False) == {"torch", "fastrl.runtime.runner"}
    planted = {
        "fastrl.algo.vtrace": {"fastrl.runtime.runner"},  # up four layers
        "fastrl.sampling.rollout_worker": {"fastrl.learning.learner"},  # sideways, between siblings
        "fastrl.envs.registry": {"fastrl.config"},  # an env reading the trainer's config
        "fastrl.plumbing.buffers": {"fastrl.algo.model"},  # down: fine
        "fastrl.tuning.planner": {"fastrl.tuning.profiling"},  # within a group: fine, but ...
        "fastrl.tuning.profiling": {"fastrl.tuning.planner"},  # ... not round again
        "fastrl.helpers": set(),  # a new top-level module nobody placed
        "fastrl.runtime.runner": set(), "fastrl.learning.learner": set(), "fastrl.config": set(),
        "fastrl.algo.model": set(),
    }
    assert violations(planted) == [
        "fastrl.algo.vtrace (algo) imports fastrl.runtime.runner (runtime), which is not below it",
        "fastrl.envs.registry imports fastrl.config: the envs know nothing of the trainer",
        "fastrl.helpers belongs to no layer: place it in a subpackage, or in TOP_LEVEL here",
        "fastrl.sampling.rollout_worker (sampling) imports fastrl.learning.learner (learning), which is not below it",
    ]
    assert cycles(planted) == [["fastrl.tuning.planner", "fastrl.tuning.profiling", "fastrl.tuning.planner"]]


def test_relative_imports_resolve_against_their_package():
    modules = {"fastrl.tuning.planner", "fastrl.plumbing.proc"}
    source = "from . import planner\nfrom ..plumbing.proc import usable_cores\n"
    assert imports_of(source, "fastrl.tuning.profiling", False, modules) == modules
    assert imports_of("from . import planner\n", "fastrl.tuning", True, modules) == {"fastrl.tuning.planner"}


def test_the_root_may_name_upper_layers_only_through_its_lazy_table():
    planted = {"fastrl": {"fastrl.api", "fastrl.runtime.runner"}, "fastrl.api": set(), "fastrl.runtime.runner": set()}
    assert violations(planted, lazy={"fastrl.api"}) == [
        "fastrl (root) imports fastrl.runtime.runner (runtime), which is not below it"]
