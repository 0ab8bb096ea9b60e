"""The parts every report page is made of, in one look: its sections in reading order
(``sections``), its curves over time (``trends``), and the words for what changed since the
previous run (``changes_text``), shared by the HTML page, the Markdown summary and the terminal.

It may import pandas, matplotlib and the standard library only, nothing of simrig outside
this room, so ``report`` and ``history`` both build on it."""
