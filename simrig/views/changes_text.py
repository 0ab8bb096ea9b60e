"""The changes since the previous run of a suite on its vLLM release (or on any release,
``--across-releases``), in words (``summary["since_previous"]``, computed by
``simrig.history.changes.since_previous``): one text for the page, the Markdown summary
and the terminal."""

from __future__ import annotations

from typing import Any

RATE_NOISE = 0.10  # a rate (steps/s, examples/s) that moved less than this is not news


def change_lines(changes: dict[str, Any] | None) -> list[str]:
    """The changes as short plain-text lines, most important first (the page, the Markdown
    summary and the terminal all say the same)."""
    if not changes:
        return []
    status = changes.get("status")
    if status == "off":
        return ["history recording is off (SIMRIG_HISTORY=none): nothing to compare with"]
    if status == "first":
        others = changes.get("other_releases") or []
        return [f"first run of {run_scope(changes)}: nothing to compare with"
                + (f" (its runs on vLLM {', '.join(others)} are compared only with --across-releases)"
                   if others else "")]
    if status != "compared":
        return [f"the history store could not be read: {changes.get('why', '?')}"]
    lines = []
    new_now = [a["signature"] for a in changes.get("appeared", []) if a["verdict"] == "new"]
    if changes.get("appeared_count"):
        lines.append(f"{changes['appeared_count']} class(es) new since then"
                     + (f", {len(new_now)} of them failing" if new_now else ""))
    fixed = [g for g in changes.get("gone", []) if g["why"] == "fixed"]
    if changes.get("gone_count"):
        lines.append(f"{changes['gone_count']} class(es) gone: "
                     + ("fixed (the same traces replayed in full)" if fixed else
                        "not reached this time (a different draw proves nothing fixed)"))
    for c in changes.get("verdict_changed", []):
        lines.append(f"{c['signature']}: {c['before']} -> {c['now']}")
    moved = [m for m in changes.get("metrics", []) if _moved(m)]
    if moved:
        lines.append("; ".join(_metric_text(m) for m in moved))
    if not lines:
        lines.append("nothing changed: the same classes and the same numbers")
    return lines


def _moved(m: dict[str, Any]) -> bool:
    """Whether a metric changed enough to say so: rates by RATE_NOISE, the rest at all."""
    if not m["change"]:
        return False
    if m["name"].endswith("/s") and m["before"]:
        return abs(m["change"]) / abs(m["before"]) >= RATE_NOISE
    return True


def _metric_text(m: dict[str, Any]) -> str:
    arrow = "up" if m["change"] > 0 else "down"
    if "(%)" in m["name"]:
        pct = f" ({m['change']:+.2f} points)"
    elif m["before"] and "classes" not in m["name"] and "detected" not in m["name"]:
        pct = f" ({m['change'] / m['before']:+.0%})"
    else:
        pct = ""
    return f"{m['name']} {arrow} {_fmt(m['before'])} -> {_fmt(m['now'])}{pct}"


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def run_scope(changes: dict[str, Any]) -> str:
    """What a run is compared with: 'fuzz valid on vLLM 0.33.0' (its suite on its release),
    'fuzz valid on any vLLM release' (--across-releases)."""
    suite = changes.get("suite", "")
    if changes.get("any_release"):
        return f"{suite} on any vLLM release"
    return f"{suite} on vLLM {changes['vllm']}" if changes.get("vllm") else f"{suite} (vLLM version unknown)"


def previous_label(changes: dict[str, Any] | None) -> str:
    """'previous run of fuzz valid on vLLM 0.33.0: 2026-12-04 07:41 UTC (exit 0)' or ''
    (across releases, the previous run's release is named too)."""
    if not changes or changes.get("status") != "compared":
        return ""
    when = str(changes.get("previous_created_utc", ""))[:16].replace("T", " ")
    release = f"vLLM {changes.get('previous_vllm', '?')}, " if changes.get("any_release") else ""
    return (f"previous run of {run_scope(changes)}: {when} UTC ({release}"
            f"exit {changes.get('previous_exit_status', '?')})")
