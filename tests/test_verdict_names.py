"""Every verdict a notebook records has a valid, literal, unique name (a static check of notebooks/src/*.py).

A printed verdict is recorded under a stable dotted name (``bench.record_verdict(name, word)``, or
``name=`` on ``Comparison.verdict`` / ``describe`` and ``bench.band_verdict``), so that the report can
compare two machines verdict by verdict. The check reads each notebook's paired source without running
it: every such name must be a string literal (an f-string only where a loop puts its own key in the
name), dotted lower-case, led by a topic the notebook's headline results use (``bench.record``), and
written once per notebook. (Two f-strings that spell the same template from different loop keys, such
as two loops over disjoint variants, are only checkable at run time: the results file shows it.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from course_utils import config, results

SOURCES = sorted((config.REPO_ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))
#: Methods that take ``name=`` and record the verdict they return.
NAMED = {"verdict", "describe", "band_verdict"}


def _template(node: ast.expr) -> str | None:
    """Return the name a literal spells, an f-string's with ``{}`` for each placeholder; None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.replace("{", "{{").replace("}", "}}")
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value).replace("{", "{{").replace("}", "}}"))
            else:
                parts.append("{}")
        return "".join(parts)
    return None


def _literal_words(node: ast.expr) -> list[str]:
    """Return the string literals a verdict argument can evaluate to (through ``a if c else b``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _literal_words(node.body) + _literal_words(node.orelse)
    return []


def verdict_names(source: str, filename: str = "<source>") -> tuple[list[tuple[int, str]], list[str]]:
    """Return ((line, name template), ...) of every valid verdict name in ``source``, and the problems found.

    A problem is a name that is not a literal, a template that is not dotted lower-case words (each
    ``{}`` read as one word), a placeholder in the topic (the first word), a literal verdict word that
    ``record_verdict`` would refuse, a topic that none of the notebook's ``bench.record`` names uses (the
    first verdict's topic where it records none), or a name written twice (the same literal, or the
    same f-string with the same placeholders).
    """
    names: list[tuple[int, str]] = []
    spelled_as: dict[int, str] = {}  # line -> the name as written, for the duplicate check
    topics: set[str] = set()
    problems: list[str] = []
    tree = ast.parse(source, filename)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "record" \
                and node.args and (template := _template(node.args[0])) and "{}" not in template.split(".")[0]:
            topics.add(template.split(".")[0])
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        attr = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        if attr == "record_verdict":
            name_node = node.args[0] if node.args else keywords.get("name")
            word_node = node.args[1] if len(node.args) > 1 else keywords.get("verdict")
            for word in _literal_words(word_node) if word_node is not None else []:
                if not results._VERDICT_RE.match(word.strip().lower()):
                    problems.append(f"line {node.lineno}: verdict {word!r} is not a short lower-case phrase")
        elif attr in NAMED and "name" in keywords:
            name_node = keywords["name"]
        else:
            continue
        if name_node is None:
            problems.append(f"line {node.lineno}: record_verdict() without a name")
            continue
        template = _template(name_node)
        if template is None:
            problems.append(f"line {node.lineno}: the verdict name is not a string literal "
                            f"({ast.unparse(name_node)}); write it out so this check can read it")
            continue
        spelled = template.replace("{}", "x0").replace("{{", "{").replace("}}", "}")
        if not results._NAME_RE.match(spelled):
            problems.append(f"line {node.lineno}: verdict name {template!r} is not dotted lower-case words")
        elif "{}" in template.split(".")[0]:
            problems.append(f"line {node.lineno}: verdict name {template!r} must start with a literal topic")
        else:
            names.append((node.lineno, template))
            spelled_as[node.lineno] = template if isinstance(name_node, ast.Constant) else ast.unparse(name_node)
    names.sort()
    if names:
        topics = topics or {names[0][1].split(".")[0]}
        problems += [f"line {line}: verdict name {name!r} does not start with this notebook's topic "
                     f"({' or '.join(repr(t) for t in sorted(topics))})"
                     for line, name in names if name.split(".")[0] not in topics]
    seen: dict[str, int] = {}
    for line, name in names:
        if spelled_as[line] in seen:
            problems.append(f"line {line}: verdict name {name!r} is already used on line {seen[spelled_as[line]]}")
        seen.setdefault(spelled_as[line], line)
    return names, problems


def test_every_stored_notebook_has_a_paired_source():
    notebooks = sorted(p.stem for p in (config.REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert len(notebooks) == 14 and notebooks == [p.stem for p in SOURCES]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_verdict_names_are_valid_literals_used_once(path: Path):
    _, problems = verdict_names(path.read_text(encoding="utf-8"), str(path))
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


def test_the_check_finds_each_kind_of_bad_name():
    source = '''
word = t.verdict("a", "b", name="func.x.a_vs_b")
t.describe("a", "b", name="func.x.a_vs_b")
bench.band_verdict(1.0, 2.0, name=f"func.sizes.{n}")
bench.band_verdict(1.0, 2.0, name=f"func.sizes.{n}")
bench.band_verdict(1.0, 2.0, name=f"func.sizes.{m}")
bench.record_verdict("Func.Bad Name", "pays")
bench.record_verdict(label, "pays")
bench.record_verdict("func.words", "Pays back!" if ok else "does not pay")
bench.record_verdict(f"{topic}.x", "met")
bench.record_verdict("onnx.elsewhere", "met")
t.verdict("a", "b")
'''
    names, problems = verdict_names(source)
    text = "\n".join(problems)
    assert [n for _, n in names][:2] == ["func.x.a_vs_b", "func.x.a_vs_b"]
    assert "line 3: verdict name 'func.x.a_vs_b' is already used on line 2" in text
    assert "line 5: verdict name 'func.sizes.{}' is already used on line 4" in text
    assert "line 7: verdict name 'Func.Bad Name' is not dotted lower-case words" in text
    assert "line 8: the verdict name is not a string literal (label)" in text
    assert "line 9: verdict 'Pays back!' is not a short lower-case phrase" in text
    assert "line 10: verdict name '{}.x' must start with a literal topic" in text
    assert "line 11: verdict name 'onnx.elsewhere' does not start with this notebook's topic ('func')" in text
    # f"func.sizes.{m}" (line 6) spells the same template from another key: only a run can tell
    assert len(problems) == 7, text  # the unnamed t.verdict() and the good names raise nothing


def test_the_topics_are_those_of_the_notebooks_headline_results():
    source = ('bench.record("attn.flex.err", 1.0, "abs")\nbench.record("compile.real.speedup", 1.0, "x")\n'
              't.verdict("a", "b", name="compile.real.a_vs_b")\nt.verdict("a", "b", name="attn.flex.a_vs_b")\n'
              't.verdict("a", "b", name="serve.a_vs_b")\n')
    _, problems = verdict_names(source)
    assert problems == ["line 5: verdict name 'serve.a_vs_b' does not start with this notebook's topic "
                        "('attn' or 'compile')"]


def test_a_clean_source_passes():
    source = 'for n in (1, 2):\n    t.verdict("a", "b", name=f"func.ensemble.n{n}")\n' \
             'bench.record_verdict("func.payback", "pays" if ok else "does not pay")\n'
    names, problems = verdict_names(source)
    assert problems == [] and [n for _, n in names] == ["func.ensemble.n{}", "func.payback"]
