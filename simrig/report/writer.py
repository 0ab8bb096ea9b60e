"""Reports: pandas tables to parquet + CSV, summary.json, one self-contained HTML.

``write_report`` writes the report folder under a temporary name next to OUT and
swaps it into place (``staging_dir``, ``swap_into_place``), so an interrupted run never
leaves a half-written report; ``write_coverage_dir`` writes the coverage-only folder of
the pytest plugin's ``--simrig-coverage DIR``. Rows come sorted by the caller
(``simrig.replay.sort_rows``).

See docs/replay.md for the files and their columns.
"""

from __future__ import annotations

import errno
import html as _html
import json
import os
import shutil
import tempfile
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from simrig.coverage.session import coverage_report_parts
from simrig.errors import UsageError
from simrig.findings.classes import classes_from_rows, verdict_counts
from simrig.report.html import _CSS, banner, coverage_section, jsonable, render_html
from simrig.triton_interpreter import registry
from simrig.views.summary_md import summary_markdown

if TYPE_CHECKING:
    from simrig.coverage.collect import CoverageData


REPORT_FILES = ("steps.parquet", "steps.csv", "findings.parquet", "findings.csv",
                "contract.parquet", "contract.csv", "classes.parquet", "classes.csv",
                "summary.json", "report.html")

def simrig_version() -> str:
    try:
        return version("simrig")
    except PackageNotFoundError:
        return "unknown"


def default_out_dir(kind: str = "replay", root: str | Path = "reports") -> Path:
    """``reports/<kind>-<UTC time>-<4 hex>``: two runs started in the same second
    never share a default folder."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(root) / f"{kind}-{stamp}-{os.urandom(2).hex()}"


def check_out_dir(out_dir: str | Path) -> Path:
    """Fail before a run if OUT cannot take a report: it may be missing, empty,
    or an earlier report (replaced whole); anything else is refused, and so is
    a folder where nothing can be written (probed, since ``os.access`` does not
    see read-only mounts or immutable folders)."""
    out = Path(out_dir)
    if out.exists():
        if not out.is_dir():
            raise UsageError(f"--out: {out} exists and is not a directory")
        if any(out.iterdir()) and not (out / "summary.json").is_file():
            raise UsageError(f"--out: {out} is a non-empty directory that is not a simrig report")
    _probe_writable(out, "--out")
    return out


def check_out_file(path: str | Path, flag: str = "--out") -> Path:
    """Fail before a run if the output file ``path`` cannot be written (it is
    written through a temporary file beside it, then renamed)."""
    out = Path(path)
    if out.is_dir():
        raise UsageError(f"{flag}: {out} is a directory, not a file")
    _probe_writable(out, flag)
    return out


def _probe_writable(out: Path, flag: str) -> None:
    """Make and remove a folder where ``out`` will be written; ``os.access``
    alone does not see read-only mounts or immutable folders."""
    parent = out.absolute().parent
    while not parent.exists():  # the nearest folder that exists is where mkdir will write
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{flag}: {parent} is not a directory")
    try:
        probe = tempfile.mkdtemp(prefix=f".tmp-{out.name}-probe-", dir=parent)
        os.rmdir(probe)
    except OSError as exc:
        raise UsageError(f"{flag}: cannot write in {parent} ({exc.strerror or exc})") from None


def staging_dir(out: str | Path, purpose: str = "staging") -> Path:
    """A fresh folder beside OUT, unique to this run (never shared with another
    run writing the same OUT), readable as a report will be."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-{purpose}-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; a report is not
    return tmp


def write_report(out_dir: str | Path, steps: pd.DataFrame, findings: pd.DataFrame,
                 contract: pd.DataFrame, summary: dict[str, Any],
                 extra_tables: dict[str, pd.DataFrame] | None = None,
                 title: str = "simrig replay report", classes: pd.DataFrame | None = None,
                 occurrences: pd.DataFrame | None = None,
                 headline: str = "", page_dir: str | Path | None = None) -> Path:
    """Write the report directory atomically; returns its path::

        OUT/
          steps.parquet     steps.csv       one row per step x stage x rank
          findings.parquet  findings.csv    Finding.row() + pcp_size
          contract.parquet  contract.csv    (stage, field, kind, dtype) -> count
          classes.parquet   classes.csv     one row per finding class (report.classes)
          <extra>.parquet   <extra>.csv     campaign tables (extra_tables)
          summary.json                      counts, versions, device, timings
          report.html                       verdict, finding classes, time share, plots, contract


    ``classes`` (report.classes.class_frame) heads the page; ``occurrences``
    (default: ``findings``) are shown collapsed under their class. The banner
    comes from the class verdicts, the same numbers summary.json carries
    under ``classes``; ``headline`` is one line of facts under it. ``page_dir``: where the
    page will finally live when that is not ``out_dir`` (a campaign writes its report in a
    staging folder first), for the page's links into the checkout."""
    out = check_out_dir(out_dir)
    extra_tables = dict(extra_tables or {})
    classes = classes if classes is not None else classes_from_rows(findings)
    clash = set(extra_tables) & {"steps", "findings", "contract", "classes", "summary", "report"}
    if clash:
        raise ValueError(f"extra_tables: reserved name(s) {sorted(clash)}")
    tmp = staging_dir(out, "report")
    try:
        summary = {"simrig_version": simrig_version(),
                   "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   "interpreter_patches": registry.summary(),  # this process's; a caller's own wins
                   **summary, "classes": verdict_counts(classes)}
        tables = {"steps": steps, "findings": findings, "contract": contract, "classes": classes,
                  **extra_tables}
        for name, frame in tables.items():
            frame.to_parquet(tmp / f"{name}.parquet", index=False)
            frame.to_csv(tmp / f"{name}.csv", index=False)
        (tmp / "summary.json").write_text(json.dumps(jsonable(summary), indent=2, sort_keys=True) + "\n")
        (tmp / "report.html").write_text(render_html(
            title, summary, steps, findings, contract, extra_tables, classes=classes,
            occurrences=findings if occurrences is None else occurrences, headline=headline,
            page_dir=Path(page_dir) if page_dir is not None else out),
            encoding="utf-8")
        swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def swap_into_place(tmp: Path, out: Path, attempts: int = 50) -> None:
    """Rename the finished directory to OUT; an earlier report there is moved
    aside first and removed only once the new one is in place.

    Two runs finishing into the same OUT at once both succeed: whichever
    rename lands last is the report there, and neither loses its files
    mid-swap (a rename that finds OUT taken again simply retries)."""
    for _ in range(attempts):
        try:
            if out.is_dir() and not any(out.iterdir()):
                out.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise
        try:
            os.replace(tmp, out)  # OUT absent (or an empty folder): done
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        old = Path(tempfile.mkdtemp(prefix=f".old-{out.name}-", dir=out.parent))
        try:
            os.replace(out, old / out.name)
        except FileNotFoundError:
            pass  # another run moved it aside first; try again
        try:
            os.replace(tmp, out)
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        finally:
            shutil.rmtree(old, ignore_errors=True)
    raise OSError(errno.EBUSY, "another run keeps replacing the report", str(out))


def write_summary_md(path: str | None, command: str, summary: dict[str, Any], classes: Any,
                     headline: str, report: str) -> None:
    """``--summary-md FILE``: the run's Markdown summary, written whole (temporary file, rename)."""
    if not path:
        return
    text = summary_markdown(command, banner(summary)[0], headline, summary, classes, report)
    target = Path(path).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{target.name}-", dir=target.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, target)


def write_coverage_dir(out: str, data: CoverageData, title: str = "simrig coverage") -> str:
    """Coverage tables (parquet + CSV), summary.json and a one-page coverage.html
    in ``out`` (the pytest plugin's ``--simrig-coverage DIR``)."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    tables, summary = coverage_report_parts(data)
    for name, frame in tables.items():
        frame.to_parquet(folder / f"{name}.parquet", index=False)
        frame.to_csv(folder / f"{name}.csv", index=False)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body><h1>{_html.escape(title)}</h1>"
            + coverage_section(summary["coverage"], tables) + "</body></html>")
    (folder / "coverage.html").write_text(page, encoding="utf-8")
    return str(folder)
