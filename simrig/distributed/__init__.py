"""Sharding campaigns, replays and the self-test across Ray workers.

    driver (simrig fuzz/replay/selftest --workers N [--ray ADDRESS])
      │  cluster.py   ray.init: a local Ray on this machine, or an existing cluster
      │  collector.py Collector actor: shards stream every new finding class, heartbeats
      │               SharedDatabase actor: one Hypothesis example database for all shards
      ├─ fuzz_shards.py    seed x mode x PCP-slice shards, each the existing Campaign
      │                    (shard.py: what runs on a worker), merged into one report
      ├─ merge.py          class tallies, frames and contract counts of many workers as one
      ├─ replay_shards.py  trace x PCP size x segment units through the one replay loop
      └─ tasks.py          ordered map of a picklable function (selftest mutants)

Ray is an optional extra (``simrig[ray]``): nothing here imports it at module
level, and a missing Ray is a one-line usage error. Import rules: this package
may import the core (step, replay, harness, progress, errors), trace_io, sources, findings,
report and campaign; never ``vllm`` directly (only through the adapters, and
only on workers), ``selftest`` or ``commands``. The self-test command hands its
own child runner to ``tasks.map_in_order`` instead.
"""
