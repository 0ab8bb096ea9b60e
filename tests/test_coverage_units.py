"""simrig.coverage without vLLM: the analysis of a hand-written source file, the
reasons list (matching, blocks, malformed files) and merging."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from simrig.coverage.analysis import analyze
from simrig.coverage.collect import from_jsonable, merge, to_jsonable
from simrig.coverage.reasons import Reasons, load_reasons
from simrig.errors import UsageError

SOURCE = textwrap.dedent('''\
    def choose(x):
        """Docstring: not code."""
        if x > 0:
            y = 1
        else:
            y = 2
            y += 1
        return y


    class Box:
        def get(self, flag):
            if flag:
                return 1
            return 0

        def never(self):
            return 5
    ''')
REL = "vllm/v1/worker/gpu/fake.py"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / REL
    path.parent.mkdir(parents=True)
    path.write_text(SOURCE)
    return tmp_path


# Arcs as coverage.py records them: choose(1) takes the if-branch; Box.get(True).
REACHED = {REL: {(-1, 3), (3, 4), (4, 8), (8, -1), (-12, 13), (13, 14), (14, -12)}}
NO_REASONS = Reasons([])


def test_functions_lines_and_branches_of_a_hand_written_file(root):
    t = analyze(REACHED, NO_REASONS, root=root)
    fns = t.functions.set_index("function")
    # Box.never was never entered: not a driven function, so not listed.
    assert sorted(fns.index) == ["Box.get", "choose"]
    # choose: statements 3,4,6,7,8 (docstring excluded); 3,4,8 reached; branch 3 -> 4 / 6.
    assert fns.loc["choose", "lines"] == 5 and fns.loc["choose", "lines_reached"] == 3
    assert fns.loc["choose", "branches"] == 2 and fns.loc["choose", "branches_reached"] == 1
    assert fns.loc["Box.get", "unreached"] == 1
    missing = t.unreached[t.unreached.function == "choose"]
    assert list(missing.line) == [6, 7]
    assert list(missing.source.str.strip()) == ["y = 2", "y += 1"]
    assert not missing.explained.any()
    assert t.summary()["unexplained_lines"] == 3


def test_a_parsed_model_is_read_back_from_the_cache_as_parsed(root, tmp_path, monkeypatch):
    from simrig.coverage import analysis

    monkeypatch.setenv("SIMRIG_CACHE", str(tmp_path / "cache"))
    analysis.file_model.cache_clear()
    fresh = analysis.file_model(str(root), REL)
    kept = list((tmp_path / "cache" / "coverage-models").glob("*.pickle"))
    assert len(kept) == 1
    analysis.file_model.cache_clear()
    again = analysis.file_model(str(root), REL)  # from the file this time
    assert again is not fresh
    assert (again.statements, again.arcs, again.branch_lines, again.owner) == \
        (fresh.statements, fresh.arcs, fresh.branch_lines, fresh.owner)
    assert again.parser.translate_arcs(REACHED[REL]) == fresh.parser.translate_arcs(REACHED[REL])
    kept[0].write_bytes(b"torn")  # a half-written or foreign file is parsed again
    analysis.file_model.cache_clear()
    assert analysis.file_model(str(root), REL).statements == fresh.statements
    (root / REL).write_text(SOURCE + "\n\ndef later():\n    return 1\n")  # an edited file: a new key
    analysis.file_model.cache_clear()
    assert "later" in analysis.file_model(str(root), REL).functions()
    analysis.file_model.cache_clear()


def test_a_block_entry_explains_the_lines_under_its_line(root, tmp_path):
    reasons_file = tmp_path / "r.toml"
    reasons_file.write_text(textwrap.dedent(f'''\
        [[reason]]
        file = "{REL}"
        function = "choose"
        match = "else:"
        category = "feature-off"
        reason = "the else arm"

        [[reason]]
        file = "{REL}"
        function = "Box.get"
        category = "error-path"
        reason = "whole function"
        '''))
    t = analyze(REACHED, load_reasons(reasons_file), root=root)
    u = t.unreached.set_index(["function", "line"])
    assert u.loc[("choose", 6), "reason"] == "the else arm"
    assert u.loc[("choose", 7), "category"] == "feature-off"
    assert u.loc[("Box.get", 15), "reason"] == "whole function"
    assert t.summary()["unexplained_lines"] == 0


def test_an_entry_for_another_function_explains_nothing(root, tmp_path):
    reasons_file = tmp_path / "r.toml"
    reasons_file.write_text(f'[[reason]]\nfile = "{REL}"\nfunction = "Box.never"\n'
                            'category = "feature-off"\nreason = "x"\n')
    t = analyze(REACHED, load_reasons(reasons_file), root=root)
    assert t.summary()["unexplained_lines"] == 3


@pytest.mark.parametrize("text, problem", [
    ("[[reason]]\nfile = 'a'\n", "function: missing"),
    ("[[reason]]\nfile='a'\nfunction='f'\nreason='r'\ncategory='because'\n", "category"),
    ("[[reason]]\nfile='a'\nfunction='f'\nreason='r'\ncategory='feature-off'\nmatch=''\n", "match"),
    ("[[reason]]\nfile='a'\nfunction='f'\nreason='r'\ncategory='feature-off'\nline=3\n", "unknown key"),
    ("not toml [", "not TOML"),
])
def test_a_malformed_reasons_file_is_one_usage_error(tmp_path, text, problem):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=problem):
        load_reasons(path)


def test_the_shipped_reasons_list_parses_and_names_mrv2_files():
    reasons = load_reasons()
    assert len(reasons.entries) > 20
    assert all(e.file.startswith("vllm/v1/worker/gpu/") for e in reasons.entries)


def test_merge_is_the_union_and_survives_json():
    a = {"f.py": {(1, 2), (2, 3)}}
    b = {"f.py": {(2, 3), (3, -1)}, "g.py": {(-1, 1)}}
    merged = merge([a, None, b])
    assert merged == {"f.py": {(1, 2), (2, 3), (3, -1)}, "g.py": {(-1, 1)}}
    assert from_jsonable(to_jsonable(merged)) == merged


@pytest.mark.parametrize("flags, expected", [([], "--coverage"), (["--no-coverage"], "--no-coverage")])
def test_demo_passes_coverage_on_by_default_to_replay_and_fuzz(tmp_path, monkeypatch, flags, expected):
    import argparse

    import simrig.cli.dispatch
    from simrig.cli import demo_cmd as demo

    calls: list[list[str]] = []
    monkeypatch.setattr(simrig.cli.dispatch, "main", lambda argv: calls.append(list(argv)) or 0)
    monkeypatch.setenv("SIMRIG_HISTORY", "none")
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    demo.register(sub)
    args = parser.parse_args(["demo", "--out", str(tmp_path / "demo"), *flags])
    args.known = None
    assert args.func(args) == 0
    assert [c[0] for c in calls] == ["replay", "fuzz"]
    assert all(expected in c for c in calls)


@pytest.mark.parametrize("args, problem", [
    (["--out", "x.txt"], "--out"),
    (["--since", "yesterday"], "--since"),
    ([], "holds no history yet"),
])
def test_simrig_coverage_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, problem):
    from simrig.cli import main

    status = main(["coverage", "--store", str(tmp_path / "empty"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and problem in err[0]


def test_simrig_coverage_on_a_store_without_coverage_is_exit_2(tmp_path, capsys):
    from simrig.cli import main
    from simrig.history.store import append_run

    append_run(tmp_path, {"command": "replay", "suite": "replay x", "vllm_version": "0.33.0",
                          "exit_status": 0}, None)
    status = main(["coverage", "--store", str(tmp_path)])
    assert status == 2 and "no run with coverage" in capsys.readouterr().err


def test_begin_reads_the_list_and_leaves_the_environment_alone(tmp_path, monkeypatch):
    import argparse

    from simrig.coverage.session import CoverageRun

    monkeypatch.delenv("SIMRIG_UNREACHED", raising=False)
    good = tmp_path / "r.toml"
    good.write_text('[[reason]]\nfile="vllm/v1/worker/gpu/x.py"\nfunction="f"\ncategory="feature-off"\n'
                    'reason="r"\n')
    run = CoverageRun.begin(argparse.Namespace(coverage=True, unreached=str(good),
                                               fail_on_unexplained_coverage=False))
    assert run.enabled and len(run.reasons.entries) == 1
    assert "SIMRIG_UNREACHED" not in __import__("os").environ  # a later run reads its own list
