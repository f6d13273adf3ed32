"""Every benchmark of pyscheduler, in one home (docs/benchmarks.md has what each measured).

``pyscheduler bench <capability>`` runs tasks.py, delay.py, schedules.py or checks.py;
``pyscheduler bench flatness`` flatness.py; ``pyscheduler bench peers`` the peers/ package.
The other modules run as ``python -m pyscheduler.bench.<name> --help``. stats.py defines the
measures every bench uses (percentiles, CPU from /proc); sqlapi.py the SQL only benches use.
The pgbench scripts and the peers' own runners stay in the top-level bench/ folder.
"""
