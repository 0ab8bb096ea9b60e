"""``simrig repro`` for sampling classes: a request's rows through vLLM's own sampling functions,
no runner.

``top_p_file.py`` (a top-p row through ``apply_top_k_top_p``) and ``prompt_logprobs_file.py`` (a
final prefill chunk with placeholder drafts through ``PromptLogprobsWorker``) write the file's
text; it imports only vLLM, torch, numpy and the standard library. ``simrig.repro`` picks them by
class. See docs/bisect.md, 'From finding to fix'.
"""
