"""House rules read from the source (no engine): no private name (``_x``) of one workbook module
used by another, and no import circle among the modules of one folder (function-level imports
and imports under ``TYPE_CHECKING`` count too: a circle is a circle wherever its import sits)."""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "workbook")


def _modules() -> dict[str, str]:
    """Dotted module name -> path, for every module of the package (``pkg.__init__`` as ``pkg``)."""
    out = {}
    for root, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = path
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _absolute(mod: str, path: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    pkg = mod.split(".") if path.endswith("__init__.py") else mod.split(".")[:-1]
    base = pkg[:len(pkg) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def private_uses(mods: dict[str, str]) -> list[str]:
    """``from workbook.a import _x`` and ``a._x`` (``a`` an imported workbook module) in
    another module."""
    found = []
    for mod, path in mods.items():
        tree = ast.parse(open(path, encoding="utf-8").read())
        bound: dict[str, str] = {}  # local name -> the workbook module / name it is
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom):
                src = _absolute(mod, path, n)
                if not src.startswith("workbook"):
                    continue
                for a in n.names:
                    if _private(a.name):
                        found.append(f"{os.path.relpath(path, ROOT)}:{n.lineno} imports "
                                     f"{src}.{a.name}")
                    else:
                        bound[a.asname or a.name] = f"{src}.{a.name}"
            elif isinstance(n, ast.Import):
                for a in n.names:
                    if a.name.startswith("workbook"):
                        bound[a.asname or a.name.split(".")[0]] = a.name
        for n in ast.walk(tree):
            if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                    and n.value.id in bound and bound[n.value.id] in mods and _private(n.attr)):
                found.append(f"{os.path.relpath(path, ROOT)}:{n.lineno} uses "
                             f"{bound[n.value.id]}.{n.attr}")
    return found


def import_edges(mods: dict[str, str]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for n in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            targets = []
            if isinstance(n, ast.ImportFrom):
                src = _absolute(mod, path, n)
                targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in mods else src
                           for a in n.names]
            elif isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            edges[mod].update(t for t in targets if t in mods and t != mod)
    return edges


def folder_circles(mods: dict[str, str]) -> list[list[str]]:
    """Strongly connected sets (> 1 module) of the import graph restricted to one folder's
    modules (its ``__init__`` aside: a package's front door may import its rooms)."""
    edges = import_edges(mods)
    folders: dict[str, set[str]] = {}
    for m, path in mods.items():
        if not path.endswith("__init__.py"):
            folders.setdefault(m.rsplit(".", 1)[0], set()).add(m)
    circles = []
    for nodes in folders.values():
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []

        def strong(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            for w in edges[v] & nodes:
                if w not in index:
                    strong(w)
                    low[v] = min(low[v], low[w])
                elif w in stack:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    circles.append(sorted(comp))

        for v in sorted(nodes):
            if v not in index:
                strong(v)
    return circles


def test_no_private_name_crosses_a_module():
    assert private_uses(_modules()) == []


def test_no_import_circle_inside_a_folder():
    assert folder_circles(_modules()) == []


def test_the_checks_see_what_they_forbid(tmp_path):
    """The two checks on a made-up package: a private import, a private attribute and a
    two-module circle are each found."""
    pkg = tmp_path / "workbook" / "room"
    pkg.mkdir(parents=True)
    (tmp_path / "workbook" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from workbook.room.b import _hidden\n")
    (pkg / "b.py").write_text("def f():\n    from workbook.room import a\n    return a._x\n")
    mods = {"workbook": str(tmp_path / "workbook" / "__init__.py"),
            "workbook.room": str(pkg / "__init__.py"),
            "workbook.room.a": str(pkg / "a.py"), "workbook.room.b": str(pkg / "b.py")}
    global ROOT
    saved, ROOT = ROOT, str(tmp_path)
    try:
        uses = private_uses(mods)
    finally:
        ROOT = saved
    assert any("workbook.room.b._hidden" in u for u in uses)
    assert any("workbook.room.a._x" in u for u in uses)
    assert folder_circles(mods) == [["workbook.room.a", "workbook.room.b"]]


def test_no_module_shadows_a_name_of_its_package():
    """A submodule, once imported, becomes an attribute of its package: one named like a
    function or constant of the package's ``__init__`` replaces it (``hooks.watch_options``
    did, for a module of that name)."""
    clashes = []
    for root, _, files in os.walk(PKG):
        if "__init__.py" not in files:
            continue
        tree = ast.parse(open(os.path.join(root, "__init__.py"), encoding="utf-8").read())
        names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                  if isinstance(t, ast.Name)}
        subs = {f[:-3] for f in files if f.endswith(".py")} | {
            d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "__init__.py"))}
        clashes += [f"{os.path.relpath(root, ROOT)}.{n}" for n in sorted(names & subs)]
    assert clashes == []


# --- rooms: the studies of run/ and the concerns of hooks/ ------------------------------------
# (folder, room) -> the rooms of the same folder it may import besides its root's spine; a room
# not listed may import none. The root modules of a folder (run's spine) import no room of it,
# except the front doors: a package's ``__init__`` and the plugin (vLLM's processes' front door).
FRONT_DOORS = {"workbook.run", "workbook.hooks", "workbook.hooks.plugin"}
ROOMS = {
    "run": {"budget": set(), "constraints": set(), "writer": set(),
            "servers": {"constraints"}},  # check-server --constraints sends the grid's cases
    "hooks": {"faults": set(), "guard": set(), "observe": {"faults"}, "watch": {"faults"}},
}


def _room(mod: str) -> tuple[str, str | None] | None:
    """(folder, room or None for the folder's root) of a ``workbook.run`` / ``workbook.hooks``
    module; None for other modules."""
    parts = mod.split(".")
    if len(parts) < 2 or parts[1] not in ROOMS:
        return None
    room = parts[2] if len(parts) > 2 and parts[2] in ROOMS[parts[1]] else None
    return parts[1], room


def room_arrows(mods: dict[str, str]) -> list[str]:
    """Imports between rooms that the table above does not allow: a study importing another
    study, a concern another concern, or a folder's spine importing one of its rooms (the
    folder's ``__init__`` front door aside)."""
    bad = []
    for mod, targets in import_edges(mods).items():
        src = _room(mod)
        if src is None or mod in FRONT_DOORS:
            continue
        for t in targets:
            dst = _room(t)
            if dst is None or dst[0] != src[0] or dst[1] == src[1] or dst[1] is None:
                continue
            if src[1] is None or dst[1] not in ROOMS[src[0]][src[1]]:
                bad.append(f"{mod} -> {t}")
    return sorted(bad)


def test_rooms_import_only_the_spine_and_what_they_build_on():
    assert room_arrows(_modules()) == []


def test_every_room_says_what_it_is_and_may_import():
    """Each room's ``__init__`` docstring names its study or concern and what it may import."""
    missing = []
    for folder, rooms in ROOMS.items():
        for room in rooms:
            path = os.path.join(PKG, folder, room, "__init__.py")
            doc = ast.get_docstring(ast.parse(open(path, encoding="utf-8").read())) or ""
            if "May import" not in doc:
                missing.append(f"{folder}/{room}")
    assert missing == []


def test_the_room_check_sees_a_study_importing_another():
    mods = {"workbook.run.budget.a": "a.py", "workbook.run.writer.b": "b.py",
            "workbook.run.pipeline": "p.py", "workbook.run.servers.c": "c.py",
            "workbook.run.constraints.d": "d.py"}
    edges = {"workbook.run.budget.a": {"workbook.run.writer.b", "workbook.run.pipeline"},
             "workbook.run.pipeline": {"workbook.run.budget.a"},
             "workbook.run.servers.c": {"workbook.run.constraints.d"},
             "workbook.run.writer.b": set(), "workbook.run.constraints.d": set()}
    global import_edges
    saved, import_edges = import_edges, lambda m: edges
    try:
        got = room_arrows(mods)
    finally:
        import_edges = saved
    assert got == ["workbook.run.budget.a -> workbook.run.writer.b",
                   "workbook.run.pipeline -> workbook.run.budget.a"]
