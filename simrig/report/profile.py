"""Where a run's time goes, by sampling: vLLM's own calls, Hypothesis, or the rig.

``simrig fuzz --profile`` (and ``replay --profile``) start a ``StackSampler``, a thread
that reads the main thread's stack every few milliseconds and files each sample under
one of ``OWNERS``; no tracer is installed, so the numbers are an ordinary run's. It
writes ``profile/summary.json``, ``profile/profile.txt`` and ``profile/stacks.collapsed``
(for flamegraph.pl and speedscope) next to the report.

See docs/benchmarks.md, 'Performance: where a campaign's time goes'.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

OWNERS = ("vllm", "hypothesis", "rig", "other")
STARTUP = "startup"
TOP = 15  # functions listed per owner

_PREFIXES = (("vllm/", "vllm"), ("simrig/", "rig"), ("strategies/", "rig"), ("hypothesis/", "hypothesis"))
# the adapter's one-off import of vLLM (simrig.adapters.runner.load)
_STARTUP_FUNCTIONS = {"_import_vllm", "load"}


def _transparent(short: str, qualname: str) -> bool:
    """The rig's pass-through around a kernel launch (the coverage sampler's hook)
    and its stand-ins inside Triton's interpreter (interpreter_speed,
    interpreter_types, interpreter_launch): the
    launch stays vLLM's, as it is without them."""
    return ((short == "simrig/triton_interpreter/interpreter.py" and qualname.startswith("sample_traced_launches"))
            or short in ("simrig/triton_interpreter/interpreter_speed.py", "simrig/triton_interpreter/interpreter_types.py",
                         "simrig/triton_interpreter/interpreter_launch.py")
            or (short == "simrig/trace_gate.py" and qualname == "launch"))


def _owner_of_file(filename: str) -> str | None:
    short = _short(filename)
    for prefix, owner in _PREFIXES:
        if short.startswith(prefix):
            return owner
    return None


class StackSampler:
    """Samples the thread that created it (or ``thread_id``) until ``stop``.

    A daemon thread reads the sampled thread's Python stack every ``interval_s``
    (``sys._current_frames``) and files each sample under the owner of its innermost
    frame that belongs to one::

        leaf ─► ... ─► first frame in vllm/        ─► "vllm"        (torch, triton and
                                                                     numpy below it too)
                       first frame in simrig/,     ─► "rig"         (harness, probes,
                       strategies/                                   stand-ins, checks)
                       first frame in hypothesis/  ─► "hypothesis"  (generation, shrinking)
                       none of them                ─► "other"       (interpreter start-up)

    A probe that vLLM calls back is the rig's; a kernel that vLLM launches is vLLM's (the
    coverage sampler's pass-through around each launch is skipped). The one-off vLLM
    import is "startup" and is left out of the shares. No tracer is installed: about one
    stack walk per sample.
    """

    def __init__(self, interval_s: float = 0.005, thread_id: int | None = None):
        if not interval_s > 0:
            raise ValueError(f"interval_s: must be > 0, got {interval_s!r}")
        self.interval_s = interval_s
        self.thread_id = thread_id if thread_id is not None else threading.get_ident()
        self.samples: Counter[tuple[str, tuple[str, ...]]] = Counter()  # (owner, stack) -> count
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.wall_s = 0.0
        self._started = 0.0

    def start(self) -> StackSampler:
        # The sampler needs the GIL to read a stack. At Python's default 5 ms switch
        # interval it mostly got it when the sampled thread let go of it, inside a
        # GIL-releasing call (a torch op, a copy), and such calls were overcounted
        # several times over; a switch interval a tenth of the sampling interval hands
        # it over soon after each wake-up, wherever the sampled thread is.
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, self.interval_s / 10))
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="simrig-profile", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        sys.setswitchinterval(self._switch_interval)
        self.wall_s = time.perf_counter() - self._started

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            frame = sys._current_frames().get(self.thread_id)
            if frame is not None:
                self.samples[self._sample(frame)] += 1

    @staticmethod
    def _sample(frame: Any) -> tuple[str, tuple[str, ...]]:
        names: list[str] = []
        owner: str | None = None
        startup = False
        while frame is not None:
            code = frame.f_code
            short = _short(code.co_filename)
            if owner is None and not _transparent(short, code.co_qualname):
                owner = _owner_of_file(code.co_filename)
            if short == "simrig/adapters/runner.py" and code.co_name in _STARTUP_FUNCTIONS:
                startup = True
            names.append(f"{code.co_qualname} ({short})")
            frame = frame.f_back
        names.reverse()
        return (STARTUP if startup else owner or "other"), tuple(names)

    # ------------------------------------------------------------ results
    def split(self) -> dict[str, Any]:
        """Samples and shares per owner (startup left out of the shares)."""
        by_owner: Counter[str] = Counter()
        for (owner, _), n in self.samples.items():
            by_owner[owner] += n
        counted = sum(n for o, n in by_owner.items() if o != STARTUP)
        return {"samples": counted, "startup_samples": by_owner.get(STARTUP, 0),
                "interval_s": self.interval_s,
                "shares": {o: round(by_owner.get(o, 0) / counted, 4) if counted else 0.0 for o in OWNERS}}

    def top(self, owner: str, limit: int = TOP) -> list[tuple[str, float]]:
        """Where an owner's samples are, by its innermost function on the stack
        (for vLLM: the vLLM function whose kernels or own lines were running),
        with the share of all counted samples."""
        innermost: Counter[str] = Counter()
        counted = self.split()["samples"]
        for (o, stack), n in self.samples.items():
            if o != owner:
                continue
            mine = [name for name in stack if _belongs(name, owner)]
            innermost[mine[-1] if mine else stack[-1]] += n
        return [(name, round(n / counted, 4) if counted else 0.0) for name, n in innermost.most_common(limit)]

    def write(self, folder: Path) -> Path:
        """``summary.json``, ``profile.txt`` and ``stacks.collapsed`` in ``folder``."""
        folder.mkdir(parents=True, exist_ok=True)
        split = self.split()
        tops = {o: self.top(o) for o in OWNERS if o != "other"}
        (folder / "summary.json").write_text(json.dumps({**split, "wall_s": round(self.wall_s, 3),
                                                         "top": tops}, indent=2) + "\n", encoding="utf-8")
        lines = [f"samples: {split['samples']:,} every {self.interval_s * 1e3:g} ms "
                 f"(+{split['startup_samples']:,} in vLLM's import, left out)",
                 "share: " + ", ".join(f"{o} {s:.1%}" for o, s in split["shares"].items()), ""]
        for owner, rows in tops.items():
            lines.append(f"top in {owner} (innermost {owner} function, share of all samples):")
            lines += [f"  {share:6.1%}  {name}" for name, share in rows]
            lines.append("")
        (folder / "profile.txt").write_text("\n".join(lines), encoding="utf-8")
        with open(folder / "stacks.collapsed", "w", encoding="utf-8") as out:
            for (owner, stack), n in sorted(self.samples.items(), key=lambda kv: -kv[1]):
                out.write(f"{owner};{';'.join(stack)} {n}\n")
        return folder


def _short(filename: str) -> str:
    """A path from its package down: vllm/..., hypothesis/..., simrig/..., strategies/..."""
    path = filename.replace("\\", "/")
    i = path.rfind("/site-packages/")
    if i >= 0:
        return path[i + len("/site-packages/"):]
    for marker in ("/simrig/", "/strategies/"):  # this checkout (an editable install)
        i = path.rfind(marker)
        if i >= 0:
            return path[i + 1:]
    return path.rsplit("/", 1)[-1]


def _belongs(name: str, owner: str) -> bool:
    where = name[name.rfind("(") + 1:-1]
    if owner == "vllm":
        return where.startswith("vllm/")
    if owner == "rig":
        return where.startswith(("simrig/", "strategies/"))
    if owner == "hypothesis":
        return where.startswith("hypothesis/")
    return True
