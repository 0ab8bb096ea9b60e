"""PCP partition: which tokens each rank holds, and each rank's batch judged by it.

``pcp_layout.py`` (DualChunkSwap written token by token from vLLM's
documentation: split, whole requests, rows, order, width) and ``pcp.py``
(each rank-local batch and every DCP peer against the reference model's
global batch; the manager's gathered view). It may import the core step
model, the observations, ``findings`` and ``reference``; never ``vllm``, the
adapters' rooms, ``report``, ``campaign`` or ``selftest``.
"""
