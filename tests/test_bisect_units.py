"""simrig bisect and simrig repro without vLLM: the search, class keys, the import-hook
overlay, per-commit overlays from git, report/history plumbing and bad input."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from simrig.bisect import gitrepo
from simrig.bisect.search import BAD, FIXED, GOOD, INTRODUCED, SKIP, ClassKey, EndpointError, Verdict, search
from simrig.cli import main
from simrig.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
TRACE_HEADER = {"format": "simrig-trace", "version": 1,
                "config": {"max_num_reqs": 4, "max_num_batched_tokens": 32, "max_model_len": 64}}
ONE_STEP = {"step": 0, "new_requests": [{"id": "a", "prompt_len": 3}, {"id": "b", "prompt_len": 5}],
            "num_scheduled_tokens": {"a": 3, "b": 5}}


def write_trace(path: Path, header_extra: dict | None = None) -> Path:
    path.write_text(json.dumps({**TRACE_HEADER, **(header_extra or {})}) + "\n"
                    + json.dumps(ONE_STEP) + "\n")
    return path


def oracle(verdicts: list[str]):
    calls: list[int] = []

    def test(i: int) -> Verdict:
        calls.append(i)
        return Verdict(verdicts[i])
    return test, calls


# ------------------------------------------------------------------ the search
@pytest.mark.parametrize("first_bad", range(1, 9))
def test_introduced_finds_the_first_bad_point_in_log_steps(first_bad):
    verdicts = [GOOD] * first_bad + [BAD] * (9 - first_bad)
    test, calls = oracle(verdicts)
    res = search([f"p{i}" for i in range(9)], test, INTRODUCED)
    assert (res.first_new, res.last_old, res.ambiguous) == (f"p{first_bad}", f"p{first_bad - 1}", [])
    assert len(calls) <= 2 + 3  # both ends, then ceil(log2(7)) middles
    assert calls[:2] == [0, 8] and len(set(calls)) == len(calls)


def test_fixed_finds_the_first_good_point():
    test, _ = oracle([BAD, BAD, BAD, GOOD, GOOD])
    res = search(list("abcde"), test, FIXED)
    assert (res.first_new, res.last_old) == ("d", "c")
    assert "fixed in d (first good; last bad c)" == res.sentence()


def test_a_skipped_middle_is_replaced_by_its_nearest_neighbour():
    verdicts = [GOOD, GOOD, SKIP, GOOD, BAD, BAD]
    test, calls = oracle(verdicts)
    res = search(list("abcdef"), test, INTRODUCED)
    assert calls[2] == 2 and verdicts[calls[3]] != SKIP  # the skip was tested, then a neighbour
    assert (res.first_new, res.last_old, res.ambiguous) == ("e", "d", [])


def test_only_skipped_points_left_is_ambiguous():
    test, _ = oracle([GOOD, SKIP, SKIP, BAD])
    res = search(list("abcd"), test, INTRODUCED)
    assert res.ambiguous == [1, 2] and res.candidates == ["b", "c", "d"]
    assert res.sentence().startswith("introduced in one of b, c, d")


@pytest.mark.parametrize("verdicts, needle", [
    ([BAD, BAD], "--good g: shows the class, but it must not show it"),
    ([GOOD, GOOD], "--bad b: does not show the class, but it must show it"),
    ([SKIP, BAD], "--good g: cannot be judged"),
])
def test_ends_without_their_claimed_verdict_are_errors(verdicts, needle):
    test, _ = oracle(verdicts)
    with pytest.raises(EndpointError, match=needle):
        search(["g", "b"], test, INTRODUCED, ("--good g", "--bad b"))


# ------------------------------------------------------------------ class keys
def test_class_keys_parse_match_and_come_from_headers(tmp_path):
    key = ClassKey.parse("key_error:gather:unknown_scheduled_id:KeyError")
    assert key.text == "key_error:gather:unknown_scheduled_id:KeyError"
    assert key.matches({"kind": "key_error", "stage": "gather", "field": "unknown_scheduled_id",
                        "exception_type": "KeyError", "verdict": "expected"})
    assert not key.matches({"kind": "key_error", "stage": "gather", "field": "unknown_scheduled_id",
                            "exception_type": "IndexError"})
    assert ClassKey.parse("dtype_drift:prepare:idx_mapping").matches(
        {"kind": "dtype_drift", "stage": "prepare", "field": "idx_mapping", "exception_type": float("nan")})
    for bad in ("dtype_drift", "a:b", ":prepare:x", "a:b:c:d:e", "a b:c:d"):
        with pytest.raises(UsageError, match="--class"):
            ClassKey.parse(bad)
    from simrig.trace_io.trace import read_trace

    declared = write_trace(tmp_path / "e.jsonl", {"expect": [{"kind": "dtype_drift", "stage": "prepare",
                                                              "field": "idx_mapping"}]})
    assert ClassKey.from_header(read_trace(declared)[0], "e").text == "dtype_drift:prepare:idx_mapping"
    shrunk = write_trace(tmp_path / "s.jsonl", {"source": {"kind": "shrunk", "signature": [
        "dtype_drift", "dummy", "logits_indices", ""]}})
    assert ClassKey.from_header(read_trace(shrunk)[0], "s").text == "dtype_drift:dummy:logits_indices"
    with pytest.raises(UsageError, match="declares no finding class"):
        ClassKey.from_header(read_trace(write_trace(tmp_path / "n.jsonl"))[0], "n")


# ------------------------------------------------------------------ the overlay
def test_the_overlay_serves_overlaid_modules_and_only_those(tmp_path):
    installed, commit = tmp_path / "site", tmp_path / "commit"
    for root, value in ((installed, "release"), (commit, "commit")):
        pkg = root / "fakevllm" / "gpu"
        pkg.mkdir(parents=True)
        (root / "fakevllm" / "__init__.py").write_text(f"WHO = {value!r}\n")
        (pkg / "__init__.py").write_text("")
        (pkg / "runner.py").write_text(f"WHO = {value!r}\n")
    (installed / "fakevllm" / "gpu" / "gone.py").write_text("WHO = 'release'\n")
    code = ("import fakevllm, fakevllm.gpu.runner as r\n"
            "try:\n    import fakevllm.gpu.gone\n    gone = 'imported'\n"
            "except ModuleNotFoundError as e:\n    gone = 'missing'\n"
            "print(fakevllm.WHO, r.WHO, gone)\n")
    (tmp_path / "probe.py").write_text(code)
    log = tmp_path / "served.log"
    env = {**os.environ, "PYTHONPATH": f"{installed}:{tmp_path}", "SIMRIG_OVERLAY": str(commit),
           "SIMRIG_OVERLAY_PATHS": "fakevllm/gpu", "SIMRIG_OVERLAY_LOG": str(log)}
    run = subprocess.run([sys.executable, "-m", "simrig.vllm_runtime.overlay", "-m", "probe"],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    assert run.stdout.split() == ["release", "commit", "missing"], run.stderr
    assert "fakevllm.gpu.runner\t" in log.read_text()
    env.pop("SIMRIG_OVERLAY")  # no overlay: the command runs on the installed package alone
    plain = subprocess.run([sys.executable, "-m", "simrig.vllm_runtime.overlay", "-m", "probe"],
                           capture_output=True, text=True, env=env, cwd=ROOT)
    assert plain.stdout.split() == ["release", "release", "imported"], plain.stderr


# ------------------------------------------------------------------ git
def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x.invalid"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()


def test_commits_touching_the_overlay_are_kept_and_overlays_are_content_keyed(tmp_path):
    repo = tmp_path / "repo"
    (repo / "vllm" / "gpu").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    commits = []
    for i, (path, text) in enumerate([("vllm/gpu/a.py", "x = 1\n"), ("README", "docs\n"),
                                      ("vllm/gpu/a.py", "x = 2\n"), ("README", "more\n"),
                                      ("vllm/gpu/a.py", "x = 1\n")]):
        (repo / path).write_text(text)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"c{i}")
        commits.append(_git(repo, "rev-parse", "HEAD"))
    paths = ("vllm/gpu",)
    assert gitrepo.commits_between(repo, commits[0], commits[4]) == commits
    assert gitrepo.touching(repo, commits, paths) == [commits[0], commits[2], commits[4]]
    assert gitrepo.overlay_key(repo, commits[0], paths) == gitrepo.overlay_key(repo, commits[4], paths)
    cache = tmp_path / "cache"
    folder, built = gitrepo.materialize(repo, commits[2], paths, cache)
    assert built and (folder / "vllm" / "gpu" / "a.py").read_text() == "x = 2\n"
    assert not (folder / "README").exists()
    again, built_again = gitrepo.materialize(repo, commits[3], paths, cache)  # same MRV2 files
    assert again == folder and not built_again
    assert gitrepo.changed_files(repo, commits[1], commits[2], paths) == [
        {"status": "M", "path": "vllm/gpu/a.py"}]
    assert "+x = 2" in gitrepo.diff(repo, commits[1], commits[2], paths)
    _git(repo, "tag", "v0.31.0", commits[1])
    assert gitrepo.nearest_release(repo, commits[3]) == "0.31.0"
    assert gitrepo.nearest_release(repo, commits[0]) is None


# ------------------------------------------------------------------ bad input
def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_bisect_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    trace = write_trace(tmp_path / "t.jsonl")
    out = ["--out", str(tmp_path / "rep")]
    assert "REPRODUCER" in _error(capsys, ["bisect", str(tmp_path / "none.jsonl"), "--good", "0.30.0",
                                           "--bad", "0.31.0", *out])
    assert "--class 'nope'" in _error(capsys, ["bisect", str(trace), "--good", "0.30.0", "--bad",
                                               "0.31.0", "--class", "nope", *out])
    assert "declares no finding class" in _error(capsys, ["bisect", str(trace), "--good", "0.30.0",
                                                          "--bad", "0.31.0", *out])
    (tmp_path / "plain").mkdir()
    assert "--repo" in _error(capsys, ["bisect", str(trace), "--class", "a:b:c", "--repo",
                                       str(tmp_path / "plain"), "--good", "x", "--bad", "y", *out])
    assert "0.29.0" in _error(capsys, ["bisect", str(trace), "--class", "a:b:c", "--good", "0.29.0",
                                       "--bad", "installed", *out])
    assert not (tmp_path / "rep").exists()


def test_repro_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    trace = write_trace(tmp_path / "t.jsonl")
    out = ["--pytest", str(tmp_path / "test_x.py")]
    assert "neither a trace file nor a class" in _error(capsys, ["repro", "garbage", *out])
    assert "--trace FILE or --report DIR" in _error(capsys, ["repro", "dtype_drift:dummy:x", *out])
    assert "no standalone property" in _error(
        capsys, ["repro", str(trace), "--class", "value_mismatch:gather:num_scheduled_tokens", *out])
    assert "not in simrig's dtype contract" in _error(
        capsys, ["repro", str(trace), "--class", "dtype_drift:prepare:no_such_field", *out])
    report = tmp_path / "rep"
    report.mkdir()
    pd.DataFrame([{"kind": "key_error", "stage": "gather", "field": "f", "exception_type": "KeyError",
                   "reproducer": str(trace)}]).to_csv(report / "classes.csv", index=False)
    assert "has no class" in _error(capsys, ["repro", "dtype_drift:dummy:logits_indices",
                                             "--report", str(report), *out])
    assert not (tmp_path / "test_x.py").exists()


@pytest.mark.parametrize("command", ["bisect", "repro"])
def test_help_ends_with_the_exit_statuses(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    tail = text.split("options:")[-1]
    assert "exit status: 0" in tail and tail.rstrip().endswith(("traceback", "stderr)", "raised"))


# ------------------------------------------------------------------ the standalone file
def test_the_standalone_file_imports_only_vllm_torch_numpy_pytest_and_stdlib(tmp_path, capsys):
    trace = write_trace(tmp_path / "t.jsonl")
    out = tmp_path / "test_logits.py"
    assert main(["repro", "dtype_drift:dummy:logits_indices", "--trace", str(trace),
                 "--pytest", str(out)]) == 0
    tree = ast.parse(out.read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots.add(node.module.split(".")[0])
    assert roots - set(sys.stdlib_module_names) == {"vllm", "torch", "numpy", "pytest"}
    namespace: dict = {}
    data = [n for n in tree.body if isinstance(n, ast.Assign)
            and n.targets[0].id in ("CONFIG", "CLASS", "STEPS")]
    exec(compile(ast.Module(body=data, type_ignores=[]), "data", "exec"), namespace)
    assert namespace["CLASS"]["declared"] == "torch.int64"  # from simrig's contract table
    assert namespace["STEPS"][0]["num_scheduled_tokens"] == {"a": 3, "b": 5}
    assert namespace["CONFIG"]["max_num_reqs"] == 4
    assert "def test_dtype_drift_dummy_logits_indices" in out.read_text()


@pytest.mark.parametrize("key, memcheck", [
    ("dtype_drift:prepare:idx_mapping", False),
    ("value_mismatch:prepare:positions", False),
    ("key_error:gather::KeyError", False),
    ("exception:prepare::KernelMemoryError", True),
    ("exception:prepare::KernelOverflowError", True),
    ("exception:prepare:", True),  # names no type: it may be the checker's
])
def test_a_point_runs_the_kernel_checker_only_for_a_class_it_may_raise(tmp_path, key, memcheck):
    from simrig.bisect.points import Judge
    from simrig.bisect.search import ClassKey

    trace = tmp_path / "t.jsonl"
    trace.write_text("{}\n")
    flags = Judge(trace, ClassKey.parse(key), stages=None, cache=tmp_path).judged_with()
    assert "--no-coverage" in flags
    assert ("--no-memcheck" not in flags) == memcheck
