"""pyscheduler: time-based work on PostgreSQL.

Four capabilities on one SQL core: a delay queue (Chronos), leased tasks
(Scylla), recurring schedules (Schedulinator) and future checks ("Are we
there yet?"). The SQL functions in schema ``pyscheduler`` are the product;
this package holds the thin daemons and the command line.
"""

__version__ = "0.1.0"
