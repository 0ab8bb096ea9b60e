"""simrig repro's standalone files for every class kind, and the folders ready for vLLM.

The slow test writes one file per class kind (dtype, missing field, value mismatch, dispatch,
capture, exception, top-p) from a small schedule and runs them all with pytest in one child process on
the installed vLLM (0.33.0): each file of a class that vLLM 0.33.0 shows must fail with its
reviewer's message, each control (the same property where 0.33.0 keeps it) must pass. The
expected outcomes are vLLM's facts (docs/known-findings.md), not taken from a run.

The fast tests check that ``reports/upstream/`` holds one complete folder per discrepancy the
triage in docs/known-findings.md judges a bug and whose entries cover 0.33.0, consistent with
``reports/baselines/known-findings.json``.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from simrig.findings.known import in_range
from simrig.cli import main
from simrig.repro import upstream

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = ROOT / "reports" / "upstream"
KNOWN = json.loads((ROOT / "reports" / "baselines" / "known-findings.json").read_text())["findings"]
HEAD = '{"format":"simrig-trace","version":1,"config":%s,"source":{"kind":"hand-written"}%s}\n'


def _trace(path: Path, config: dict, steps: list[dict], adversarial: bool = False) -> Path:
    lines = [HEAD % (json.dumps(config), ',"adversarial":true' if adversarial else "")]
    lines += [json.dumps({"step": i, **s}) + "\n" for i, s in enumerate(steps)]
    path.write_text("".join(lines))
    return path


SMALL = {"max_num_reqs": 2, "max_num_batched_tokens": 16, "max_model_len": 64}
PREFILL = [{"new_requests": [{"id": "r0", "prompt_len": 8, "max_tokens": 4, "block_ids": [1]}],
            "num_scheduled_tokens": {"r0": 8}}]
DECODES = [{"new_requests": [{"id": x, "prompt_len": 4, "max_tokens": 8, "block_ids": [i + 1]}
                             for i, x in enumerate("abcd")],
            "num_scheduled_tokens": {x: 4 for x in "abcd"}},
           {"cached_requests": [{"id": x, "num_computed_tokens": 4} for x in "abcd"],
            "num_scheduled_tokens": {x: 1 for x in "abcd"}}]
GRAPHS = {"max_num_reqs": 4, "max_num_batched_tokens": 64, "max_model_len": 128,
          "cudagraph_mode": "FULL_AND_PIECEWISE", "capture_sizes": [1, 2, 4, 8]}
DUPLICATE = [{"new_requests": [{"id": "r0", "prompt_len": 4, "max_tokens": 4, "block_ids": [1]}],
              "num_scheduled_tokens": {"r0": 4}},
             {"new_requests": [{"id": "r0", "prompt_len": 4, "max_tokens": 4, "block_ids": [2]}],
              "num_scheduled_tokens": {"r0": 4}}]

TOP_P = "value_mismatch:postprocess:sampler.processed_logits"


def _sampled(sampling: dict) -> list[dict]:
    return [{"new_requests": [{"id": "r0", "prompt_len": 4, "max_tokens": 1, "sampling": sampling}],
             "num_scheduled_tokens": {"r0": 4}}]


# known-findings.json#70: at temperature 0.0758 the row is peaked, the Triton top-p kernel keeps it whole
PEAKED, SPREAD = _sampled({"temperature": 0.0758, "top_p": 0.0888, "seed": 3}), _sampled({"top_p": 0.5})

# (file name, class, config, steps, adversarial, outcome on 0.33.0, message it fails with)
CASES = [
    ("dtype", "dtype_drift:dummy:logits_indices", SMALL, PREFILL, False, "failed",
     "_dummy_run: InputBatch.logits_indices is torch.int32, the real batch's (execute_model) is torch.int64"),
    ("dtype_control", "dtype_drift:prepare:idx_mapping", SMALL, PREFILL, False, "passed", ""),
    ("missing", "missing_field:dummy:prefill_runs_as_decode_np", SMALL, PREFILL, False, "failed",
     "_dummy_run: InputBatch.prefill_runs_as_decode_np is None where the real batch"),
    ("missing_control", "missing_field:dummy:idx_mapping", SMALL, PREFILL, False, "passed", ""),
    ("value", "value_mismatch:dummy:positions", SMALL, PREFILL, False, "failed",
     "_dummy_run: InputBatch.positions[1] is 0, expected 1"),
    ("value_control", "value_mismatch:prepare:positions", SMALL, PREFILL, False, "passed", ""),
    ("dispatch", "value_mismatch:dispatch:cg_mode", {**GRAPHS, "pcp_size": 2, "shard_decode_requests": True},
     DECODES, False, "failed", "execute_model dispatched PIECEWISE"),
    ("dispatch_control", "value_mismatch:dispatch:cg_mode", GRAPHS, DECODES, False, "passed", ""),
    ("capture", "value_mismatch:capture:desc.num_active_loras",
     {**SMALL, "cudagraph_mode": "FULL_AND_PIECEWISE", "capture_sizes": [1, 2], "max_loras": 1,
      "cudagraph_specialize_lora": False}, PREFILL, False, "failed", "LoRA-free graph(s)"),
    ("capture_control", "dtype_drift:capture:idx_mapping",
     {**SMALL, "cudagraph_mode": "FULL_AND_PIECEWISE", "capture_sizes": [1, 2]}, PREFILL, False,
     "passed", ""),
    ("exception", "silent_acceptance:lifecycle:duplicate_new_id", SMALL, DUPLICATE, True, "failed",
     "the runner accepted the schedule silently"),
    ("exception_control", "key_error:gather:unknown_scheduled_id:KeyError", SMALL,
     [{"num_scheduled_tokens": {"ghost": 1}}], True, "passed", ""),
    ("top_p", TOP_P, SMALL, PEAKED, False, "failed",
     "keeps 4096 tokens holding 1.0000 of the mass, 1.0000 without its least likely one; "
     "vLLM's apply_top_k_top_p_pytorch keeps 1"),
    ("top_p_control", TOP_P, SMALL, SPREAD, False, "passed", ""),  # a row that is not peaked
]


@pytest.mark.slow
@pytest.mark.vllm
def test_each_class_kind_fails_where_vllm_shows_it_and_its_control_passes(tmp_path):
    for name, cls, config, steps, adversarial, _, _ in CASES:
        trace = _trace(tmp_path / f"{name}.jsonl", config, steps, adversarial)
        assert main(["repro", str(trace), "--class", cls, "--pytest", str(tmp_path / f"test_{name}.py")]) == 0
    report = tmp_path / "junit.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:simrig",
                           "-c", "/dev/null", "--rootdir", str(tmp_path), f"--junitxml={report}",
                           str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=1500)
    assert report.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    results = {}
    for case in ElementTree.parse(report).iter("testcase"):
        failure = case.find("failure")
        results[case.get("classname", "").rsplit(".", 1)[-1]] = (
            "passed" if failure is None else "failed", "" if failure is None else failure.get("message", ""))
    for name, cls, *_, outcome, message in CASES:
        got, text = results.get(f"test_{name}", ("missing", ""))
        assert got == outcome, f"{cls}: expected {outcome} on 0.33.0, got {got}: {text[:600]}"
        assert message in text, f"{cls}: {text[:600]}"
        if got == "failed":  # the property's assertion, not the file's own trouble
            assert text.startswith("AssertionError"), f"{cls}: {text[:600]}"


def test_the_generated_file_imports_no_simrig_and_drives_execute_model(tmp_path):
    trace = _trace(tmp_path / "t.jsonl", GRAPHS, DECODES)
    out = tmp_path / "test_x.py"
    assert main(["repro", str(trace), "--class", "value_mismatch:dispatch:cg_mode",
                 "--pytest", str(out)]) == 0
    text = out.read_text()
    roots = {a.name.split(".")[0] for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Import)
             for a in node.names}
    roots |= {node.module.split(".")[0] for node in ast.walk(ast.parse(text))
              if isinstance(node, ast.ImportFrom) and node.module}
    assert "simrig" not in roots and {"vllm", "torch", "numpy", "pytest"} <= roots
    assert "runner.execute_model(scheduler_output(step))" in text
    assert text.index("= a CPU runner") < text.index("STEPS = [") < text.index("= the property")


def test_the_top_p_file_imports_no_simrig_and_calls_vllms_top_k_top_p(tmp_path):
    out = tmp_path / "test_p.py"
    assert main(["repro", str(_trace(tmp_path / "p.jsonl", SMALL, PEAKED)), "--class", TOP_P,
                 "--pytest", str(out)]) == 0
    text = out.read_text()
    tree = ast.parse(text)
    roots = {a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    roots |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert roots == {"os", "zlib", "numpy", "torch", "vllm", "triton"}
    assert "REQUEST = {'id': 'r0', 'position': 3, 'temperature': 0.0758, 'top_p': 0.0888}" in text
    assert "out = apply_top_k_top_p(logits.clone(), None, p)" in text


@pytest.mark.parametrize("steps, says", [
    (_sampled({"top_p": 0.5, "top_k": 5}), "restates a temperature (not 0: greedy) and top_p only"),
    (_sampled({"top_p": 0.5, "temperature": 0.0}), "restates a temperature (not 0: greedy) and top_p only"),
    (_sampled({"temperature": 0.5}), "samples no row of a request with top_p < 1"),
    ([{**PEAKED[0], "num_scheduled_tokens": {"r0": 3}}], "samples no row of a request with top_p < 1"),
])
def test_a_top_p_class_it_cannot_state_is_one_line_and_exit_2(tmp_path, capsys, steps, says):
    trace = _trace(tmp_path / "p.jsonl", SMALL, steps)
    assert main(["repro", str(trace), "--class", TOP_P, "--pytest", str(tmp_path / "test_p.py")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


PROMPT_ROWS = "value_mismatch:postprocess:output.prompt_logprobs"
SPEC = {**SMALL, "max_model_len": 64, "num_speculative_tokens": 2}


def _prompt_logprobs_steps(computed: int, drafts: int) -> list[dict]:
    return [{"new_requests": [{"id": "r0", "prompt_len": 12, "num_computed_tokens": computed, "max_tokens": 4,
                               "sampling": {"prompt_logprobs": 1}}],
             "num_scheduled_tokens": {"r0": 12 - computed + drafts}, **(
                 {"spec_tokens": {"r0": drafts}, "rejected": {"r0": drafts}} if drafts else {})}]


def test_the_prompt_logprobs_file_imports_no_simrig_and_calls_vllms_worker(tmp_path):
    out = tmp_path / "test_pl.py"
    trace = _trace(tmp_path / "pl.jsonl", SPEC, _prompt_logprobs_steps(11, 2))
    assert main(["repro", str(trace), "--class", PROMPT_ROWS, "--pytest", str(out)]) == 0
    text = out.read_text()
    tree = ast.parse(text)
    roots = {a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    roots |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert roots == {"inspect", "os", "types", "numpy", "torch", "vllm"}
    request = re.sub(r"\s+", " ", text.split("REQUEST = ", 1)[1].split("}", 1)[0])
    assert request == "{'id': 'r0', 'prompt_len': 12, 'num_computed_tokens': 11, 'placeholder_drafts': 2, " \
                      "'prompt_logprobs': 1"
    assert "out = worker.compute_prompt_logprobs(" in text and "assert rows == due" in text


@pytest.mark.parametrize("computed, drafts, says", [
    (4, 0, "sends no request asking prompt logprobs with placeholder drafts"),  # no drafts at all
    (11, 0, "sends no request asking prompt logprobs with placeholder drafts"),
])
def test_a_prompt_logprobs_class_it_cannot_state_is_one_line_and_exit_2(tmp_path, capsys, computed, drafts, says):
    trace = _trace(tmp_path / "pl.jsonl", SPEC, _prompt_logprobs_steps(computed, drafts))
    assert main(["repro", str(trace), "--class", PROMPT_ROWS, "--pytest", str(tmp_path / "test_pl.py")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


# ------------------------------------------------------------------ reports/upstream
def _open_bugs() -> dict[int, str]:
    """Entries the triage table judges a bug, that cover 0.33.0: entry -> the row's finding."""
    text = (ROOT / "docs" / "known-findings.md").read_text().split("## Triage", 1)[1]
    bugs = {}
    for row in text.split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) >= 2 and cells[1] == "bug":
            for a, b in re.findall(r"#(\d+)(?:[–-]#(\d+))?", cells[0]):
                for i in range(int(a), int(b or a) + 1):
                    if in_range("0.33.0", KNOWN[i].get("vllm", "")):
                        bugs[i] = cells[0]
    return bugs


def _folders() -> list[Path]:
    return sorted(p for p in UPSTREAM.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def test_every_open_0_33_bug_has_one_complete_folder():
    covered: dict[int, str] = {}
    for folder in _folders():
        verdict = json.loads((folder / "verdict.json").read_text())
        files = {p.name for p in folder.iterdir()}
        assert {"ISSUE.md", "trace.jsonl", verdict["test"], "verdict.json"} <= files, folder.name
        for name in verdict["known_findings"]:
            index = int(name.rsplit("#", 1)[1])
            assert index not in covered, f"entry #{index} in {folder.name} and {covered[index]}"
            covered[index] = folder.name
    missing = {i: row for i, row in _open_bugs().items() if i not in covered}
    assert not missing, f"open 0.33.0 bugs without a reports/upstream/ folder: {missing}"


@pytest.mark.parametrize("folder", _folders(), ids=lambda p: p.name)
def test_a_folder_agrees_with_the_known_findings(folder):
    verdict = json.loads((folder / "verdict.json").read_text())
    kind, stage, name = verdict["class"].split(":")[:3]
    for entry in verdict["known_findings"]:
        k = KNOWN[int(entry.rsplit("#", 1)[1])]
        same_field = k["field"].split(".")[-1] == name.split(".")[-1] or any(
            k["field"].startswith(per_group) and name.startswith(per_group)
            for per_group in ("attn.block_tables.", "attn.filled_rows_past."))
        assert k["kind"] == kind and same_field, f"{entry} is not {verdict['class']}"
    ranges = [KNOWN[int(e.rsplit("#", 1)[1])].get("vllm", "") for e in verdict["known_findings"]]
    assert verdict["expected"] == {r: "fails" if any(in_range(r, s) for s in ranges) else "passes"
                                   for r in upstream.RELEASES}
    assert verdict["expected"]["0.33.0"] == "fails"
    issue = (folder / "ISSUE.md").read_text()
    for part in ("## What", "## Where (vLLM 0.33.0)", "## Evidence", "## Minimal schedule",
                 "## Reproducer", "## Suggested fix", verdict["test"]):
        assert part in issue, f"{folder.name}/ISSUE.md lacks {part}"
    assert re.search(r"vllm/[\w/]+\.py:\d+", issue), "ISSUE.md names no file:line"
    for release, got in verdict.get("measured", {}).items():
        assert got == verdict["expected"][release], f"{folder.name}: measured {got} on {release}"


def test_the_folders_test_file_is_what_repro_writes_from_its_trace(tmp_path):
    for folder in _folders():
        verdict = json.loads((folder / "verdict.json").read_text())
        out = tmp_path / folder.name
        assert main(["repro", str(folder / "trace.jsonl"), "--class", verdict["class"],
                     "--upstream", str(out)]) == 0
        assert (out / verdict["test"]).read_text() == (folder / verdict["test"]).read_text(), folder.name


def test_the_repro_docs_show_the_folders_verdicts():
    """docs/bisect.md carries upstream.verdict_table(); regenerate it with
    python -c "from simrig.repro.upstream import verdict_table as t; print(t())"."""
    assert upstream.verdict_table() in (ROOT / "docs" / "bisect.md").read_text()


def test_check_records_each_release_and_says_when_a_verdict_differs(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "test_f.py").write_text("def test_x():\n    assert False\n")
    (folder / "verdict.json").write_text(json.dumps(
        {"test": "test_f.py", "expected": {"0.30.0": "fails", "0.31.0": "fails", "0.33.0": "fails"}}))
    property_fails = (1, "E   AssertionError: execute_model: ...")
    rig_fails = (1, "E   Failed: the runner raised AttributeError: ..., before the property could be checked")
    results = {"py30": rig_fails, "py31": property_fails, "py33": (0, "")}  # pytest under each interpreter
    measured, ok = upstream.check_folder(folder, {"0.30.0": "py30", "0.31.0": "py31", "0.33.0": "py33"},
                                         lambda python, file: results[python])
    assert measured["0.31.0"] == "fails" and measured["0.33.0"] == "passes" and not ok
    assert measured["0.30.0"].startswith("error (pytest exit 1: Failed: the runner raised")
    assert json.loads((folder / "verdict.json").read_text())["measured"] == measured
    assert upstream.check_folder(folder, {"0.33.0": "py33"}, lambda p, f: property_fails)[1]


def test_check_on_a_bad_folder_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "verdict.json").write_text("{not json")
    assert main(["repro", str(tmp_path), "--check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "verdict.json: not readable JSON" in err[0]


@pytest.mark.parametrize("kind, stage, fld, suggested", [
    ("value_mismatch", "dummy", "positions", True),          # the file states it since execute_model drives
    ("value_mismatch", "dispatch", "cg_mode", True),
    ("dtype_drift", "profile", "logits_indices", True),
    ("dtype_drift", "gather", "idx_mapping", False),          # repro refuses it: exit 2
    ("dtype_drift", "partition", "logits_indices", False),
    ("value_mismatch", "prepare", "seq_lens", False),
])
def test_a_report_suggests_repro_exactly_for_the_classes_repro_writes(kind, stage, fld, suggested):
    from simrig.bisect.search import ClassKey
    from simrig.errors import UsageError
    from simrig.findings.classes import NEW, ClassStats, Where, repro_command
    from simrig.repro.pytest_file import property_of

    stats = ClassStats(kind, stage, fld, "", verdict=NEW, reproducer=Where("traces/samples/pcp2.jsonl"))
    command = repro_command(stats)
    assert bool(command) is suggested, command
    key = ClassKey(kind, stage, fld, "")
    if suggested:
        assert f"--class {kind}:{stage}:{fld}" in command
        assert property_of(key)
    else:
        with pytest.raises(UsageError):
            property_of(key)
