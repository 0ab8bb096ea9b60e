"""Sharding campaigns, replays and the self-test across Ray workers.

``cluster.py`` connects to Ray, ``collector.py`` holds the actors every shard streams
to, ``fuzz_shards.py`` and ``replay_shards.py`` shard a campaign and a replay into one
merged report (``merge.py``), ``tasks.py`` maps the self-test's mutants. Ray is an
optional extra: nothing here imports it at module level.

See docs/ray.md, 'The distributed package'.
"""
