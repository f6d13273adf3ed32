"""Recurring schedules (seeds/schedulinator.md): PostgreSQL holds schedules and
executions; a Redis sorted set is the hot index; executors claim due members with
one Lua call, fire, record in batches and move the score to the next run.

``ScheduleClient`` (``AsyncScheduleClient``) creates and manages schedules from Python."""

from .client import UNBOUNDED, AsyncScheduleClient, Schedule, ScheduleClient, ScheduleRun

__all__ = ["UNBOUNDED", "AsyncScheduleClient", "Schedule", "ScheduleClient", "ScheduleRun"]
