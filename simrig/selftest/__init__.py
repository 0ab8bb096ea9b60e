"""Self-test: would simrig catch the regressions that matter?

The catalogue of seeded vLLM regressions (mutants), the mutant runs (each
mutant in its own interpreter), the child that applies one and hunts with the
bundled traces, and the child's fuzz phase. The self-test may import
everything else in simrig; nothing else imports it.
"""
