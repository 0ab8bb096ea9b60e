"""What the first screen of a report shows, measured in a real browser (headless Chromium).

    python scripts/first_screen.py PAGE.html... [--shots DIR] [--readme-shot PNG]

For each page: a screenshot of its first screen (1400 x 1000 px) under ``--shots`` and,
on stdout, one JSON object per page: ``texts``, every piece of text a person sees in the
first 1,000 px (text inside a collapsed <details> has no box, so it is not there), and
``sections``, the ids of the page's sections that start above the fold.

How: Chromium loads a copy of the page with a small script appended; after the load event
the script measures every text node with ``getClientRects`` and writes what lies above
1,000 px into an element of its own; ``--dump-dom`` hands the document back. The copy
differs from the page only after its last element, so nothing above moves.
``--readme-shot PNG`` also writes the first page's screenshot there (the README's image).
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

WIDTH, FOLD = 1400, 1000
MARK = "simrig-first-screen"
_PROBE = """
<script>
window.addEventListener('load', function () {
  var fold = %(fold)d, texts = [], sections = [];
  var walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walk.nextNode()) {
    var node = walk.currentNode, text = node.textContent.replace(/\\s+/g, ' ').trim();
    var el = node.parentElement;
    if (!text || el.closest('script,style,#%(mark)s')) continue;
    if (el.checkVisibility && !el.checkVisibility({visibilityProperty: true, opacityProperty: true})) continue;
    var shut = el.closest('details:not([open])');  // a collapsed section shows its summary only
    if (shut && !el.closest('summary')) continue;
    var range = document.createRange();
    range.selectNodeContents(node);
    var rects = range.getClientRects();
    for (var i = 0; i < rects.length; i++) {
      var r = rects[i];
      if (r.width > 0 && r.height > 0 && r.top + window.scrollY < fold) { texts.push(text); break; }
    }
  }
  document.querySelectorAll('section[id]').forEach(function (s) {
    var r = s.getBoundingClientRect();
    if (r.height > 0 && r.top + window.scrollY < fold) sections.push(s.id);
  });
  var out = document.createElement('pre');
  out.id = '%(mark)s';
  out.textContent = JSON.stringify({texts: texts, sections: sections});
  document.body.appendChild(out);
});
</script>
"""


def chromium() -> str | None:
    """The Chromium binary (SIMRIG_CHROMIUM, else the first on PATH), or None."""
    chosen = os.environ.get("SIMRIG_CHROMIUM")
    if chosen:
        return chosen
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _run(browser: str, args: list[str], profile: str, timeout: float = 120) -> str:
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}",
           f"--window-size={WIDTH},{FOLD}", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def first_screen(page: Path, shot: Path | None = None, browser: str | None = None) -> dict[str, Any]:
    """{"texts": [...], "sections": [...]} of ``page``'s first 1,000 px; a PNG at ``shot``."""
    browser = browser or chromium()
    if browser is None:
        raise FileNotFoundError("no chromium on PATH (apt-get install -y chromium)")
    page = Path(page).resolve()
    with tempfile.TemporaryDirectory(prefix="first-screen-") as tmp:
        probe = Path(tmp) / page.name
        text = page.read_text(encoding="utf-8")
        script = _PROBE % {"fold": FOLD, "mark": MARK}
        probe.write_text(text.replace("</body>", script + "</body>") if "</body>" in text
                         else text + script, encoding="utf-8")
        dom = _run(browser, ["--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                   str(Path(tmp) / "profile"))
        if shot is not None:
            shot.parent.mkdir(parents=True, exist_ok=True)
            _run(browser, ["--virtual-time-budget=10000", f"--screenshot={shot.resolve()}", page.as_uri()],
                 str(Path(tmp) / "profile"))
    found = re.search(rf"<pre id=\"{MARK}\">(.*?)</pre>", dom, re.S)
    if found is None:
        raise RuntimeError(f"{page}: the browser did not run the measuring script")
    return json.loads(html.unescape(found.group(1)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pages", nargs="+", type=Path)
    p.add_argument("--shots", type=Path, default=Path("build/first-screen"),
                   help="folder for the screenshots (default build/first-screen)")
    p.add_argument("--readme-shot", type=Path, default=None,
                   help="also copy the first page's screenshot here (e.g. docs/img/report.png)")
    args = p.parse_args(argv)
    for i, page in enumerate(args.pages):
        shot = args.shots / f"{i}-{page.parent.name}-{page.stem}.png"
        seen = first_screen(page, shot)
        print(json.dumps({"page": str(page), "screenshot": str(shot), **seen}))
        if i == 0 and args.readme_shot is not None:
            args.readme_shot.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shot, args.readme_shot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
