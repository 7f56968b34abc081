"""Every `#include "..."` under cuda/ goes down the layer map.

The allowed edges live in cuda/README.md, section "Include rules": lines `folder -> folder, ...`
inside its code block. A folder may always include its own files. Folders: the first directory
under cuda/ (`backend` covers backend/multihost/), except transport/: `transport` is the interface
headers transport/*.h, `transport/<name>` an engine folder (with everything below it), and
`transport/*` in the list stands for every engine. A failure names file:line, the include and
the forbidden edge. Pure text checks: no build needed.
"""
from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA = os.path.join(ROOT, "cuda")
README = os.path.join(CUDA, "README.md")
SOURCE_EXTS = (".h", ".hpp", ".cuh", ".cpp", ".cc", ".cu", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
RULE = re.compile(r"^([\w/*]+)\s*->\s*([^#]*?)\s*(?:#.*)?$")
ENGINES = "transport/*"


def parse_rules(text: str) -> dict[str, set[str]]:
    """The edges of the README's "Include rules" code block: {folder: folders it may include}."""
    m = re.search(r"^### Include rules\n(.*?)^```\n(.*?)^```", text, re.S | re.M)
    if not m:
        raise AssertionError('cuda/README.md has no "### Include rules" section with a ``` block of edges')
    rules: dict[str, set[str]] = {}
    for n, line in enumerate(m.group(2).splitlines(), 1):
        if not line.strip():
            continue
        r = RULE.match(line.strip())
        if not r:
            raise AssertionError(f"cuda/README.md, Include rules, line {n}: cannot parse {line!r} "
                                 "(expected `folder -> folder, folder`)")
        src, targets = r.group(1), [t.strip() for t in r.group(2).split(",") if t.strip()]
        if src in rules:
            raise AssertionError(f"cuda/README.md, Include rules: {src} is listed twice")
        rules[src] = set(targets)
    return rules


def folder_of(rel: str) -> str:
    """The layer folder of a path relative to cuda/."""
    parts = rel.split("/")
    if parts[0] == "transport" and len(parts) > 2:
        return "transport/" + parts[1]
    return parts[0] if len(parts) > 1 else "."


def allowed(rules: dict[str, set[str]], src: str, dst: str) -> bool:
    if src == dst:
        return True
    targets = set(rules.get(src, ()))
    if src.startswith("transport/"):
        targets |= rules.get(ENGINES, set())
    return dst in targets or (dst.startswith("transport/") and ENGINES in targets)


def source_files(cuda: str) -> list[str]:
    out = []
    for d, dirs, files in os.walk(cuda):
        dirs.sort()
        out += [os.path.join(d, f) for f in sorted(files) if f.endswith(SOURCE_EXTS)]
    return out


def resolve(cuda: str, including: str, name: str) -> str | None:
    """The included file relative to cuda/: include paths name files from cuda/ (setup.py's
    include dir); a kernel's `#include "reduce_args.h"` names one beside it."""
    for base in (cuda, os.path.dirname(including)):
        p = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(p):
            rel = os.path.relpath(p, cuda)
            return None if rel.startswith("..") else rel.replace(os.sep, "/")
    return None


def violations(cuda: str, rules: dict[str, set[str]]) -> list[str]:
    """Every include of the tree at `cuda` against `rules`, each named by file:line under the
    tree's folder name."""
    label = os.path.basename(cuda)
    problems = []
    for path in source_files(cuda):
        rel = os.path.relpath(path, cuda).replace(os.sep, "/")
        where = f"{label}/{rel}"
        src = folder_of(rel)
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = resolve(cuda, path, m.group(1))
                if target is None:
                    problems.append(f'{where}:{n}: #include "{m.group(1)}" names no file under {label}/ '
                                    "(use <...> for headers outside the core)")
                    continue
                dst = folder_of(target)
                if not allowed(rules, src, dst):
                    problems.append(f'{where}:{n}: #include "{m.group(1)}": {src} -> {dst} is not an '
                                    "allowed edge (cuda/README.md, Include rules)")
    return problems


def known_folders(cuda: str) -> set[str]:
    return {folder_of(os.path.relpath(p, cuda).replace(os.sep, "/")) for p in source_files(cuda)}


def _rules() -> dict[str, set[str]]:
    with open(README, encoding="utf-8") as f:
        return parse_rules(f.read())


def test_every_include_follows_the_layer_map():
    problems = violations(CUDA, _rules())
    assert not problems, f"{len(problems)} include(s) against the layer map:\n" + "\n".join(problems)


def test_the_rules_name_every_folder_and_only_real_ones():
    rules = _rules()
    folders = known_folders(CUDA)
    engines = {f for f in folders if f.startswith("transport/")}
    names = folders | {ENGINES}
    unlisted = sorted(f for f in folders - set(rules) if not (f in engines and ENGINES in rules))
    assert not unlisted, f"folders of cuda/ with no line in cuda/README.md's Include rules: {unlisted}"
    unknown = sorted({f for f in rules if f not in names} |
                     {t for ts in rules.values() for t in ts if t not in names})
    assert not unknown, f"cuda/README.md's Include rules name folders cuda/ does not have: {unknown}"


def test_the_rules_keep_the_lower_layers_low():
    """The list itself stays a downward map: nothing below the backend includes it, plans include
    no executor or transport, the executor reaches transports only through their interfaces, no
    transport includes plans or the executor, and common/ sits at the bottom (varipath, a library
    the plans consult, sits on it)."""
    rules = _rules()
    for low in ("plan", "exec", "transport", ENGINES, "common", "varipath"):
        assert "backend" not in rules.get(low, ()) and "python" not in rules.get(low, ()), low
    assert rules["plan"] <= {"common", "varipath"}, rules["plan"]
    assert rules["exec"] <= {"common", "plan", "transport"}, rules["exec"]  # interfaces, no engine
    for t in ("transport", ENGINES, *(f for f in rules if f.startswith("transport/"))):
        assert not rules.get(t, set()) & {"plan", "exec"}, (t, rules[t])
    assert rules["common"] == set() and rules["varipath"] <= {"common"}


RULES_TEXT = """### Include rules

```
backend      -> plan, transport/*, common
plan         -> common
transport    -> common
transport/*  -> transport, common
common       ->
```
"""


def _tree(tmp_path, files: dict[str, str]) -> str:
    for rel, text in files.items():
        p = tmp_path / "core" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return str(tmp_path / "core")


def test_the_checker_names_file_line_and_edge(tmp_path):
    rules = parse_rules(RULES_TEXT)
    cuda = _tree(tmp_path, {
        "common/types.h": "#pragma once\n",
        "plan/plan.h": '#pragma once\n#include "common/types.h"\n',
        "transport/x.h": '#include "common/types.h"\n',
        "transport/ce/a.cpp": '#include "transport/ce/a.h"\n#include "transport/x.h"\n\n#include "plan/plan.h"\n',
        "transport/ce/a.h": "",
        "transport/ce/kernels/k.cu": '#include "k_args.inc"\n#include <cuda.h>\n',
        "transport/ce/kernels/k_args.inc": "",
        "transport/shm/s.h": '#include "transport/ce/a.h"\n',
        "backend/multihost/m.cpp": '#include "backend/b.h"\n#include "transport/shm/s.h"\n#include "exec/e.h"\n',
        "backend/b.h": "",
        "exec/e.h": '#include "missing.inc"\n',
    })
    assert violations(cuda, rules) == [
        'core/backend/multihost/m.cpp:3: #include "exec/e.h": backend -> exec is not an allowed edge '
        "(cuda/README.md, Include rules)",
        'core/exec/e.h:1: #include "missing.inc" names no file under core/ (use <...> for headers outside the core)',
        'core/transport/ce/a.cpp:4: #include "plan/plan.h": transport/ce -> plan is not an allowed edge '
        "(cuda/README.md, Include rules)",
        'core/transport/shm/s.h:1: #include "transport/ce/a.h": transport/shm -> transport/ce is not an allowed '
        "edge (cuda/README.md, Include rules)",
    ]


def test_the_parser_refuses_what_it_cannot_read():
    with pytest.raises(AssertionError, match="no .*Include rules"):
        parse_rules("## Layer map\n")
    with pytest.raises(AssertionError, match="cannot parse"):
        parse_rules("### Include rules\n\n```\nplan => common\n```\n")
    with pytest.raises(AssertionError, match="listed twice"):
        parse_rules("### Include rules\n\n```\nplan -> common\nplan ->\n```\n")
    assert parse_rules("### Include rules\n\n```\nx -> a, b   # why\ny ->\n```\n") == {"x": {"a", "b"}, "y": set()}
