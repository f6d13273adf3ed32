"""``pyscheduler bench peers``: pyscheduler side by side with other PostgreSQL job queues
(procrastinate, graphile-worker, pg-boss) and its delay relay with a naive one.

cli.py (the command), tasks.py (job queues, rounds), runner.py (the runner protocol
and pyscheduler's runners; the peers' are in bench/peers/), delay.py and
naive_relay.py (the delay part), report.py (markdown tables and charts).
"""
