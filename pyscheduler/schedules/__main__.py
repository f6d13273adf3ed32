"""``python -m pyscheduler.schedules run ...``: the schedule daemons without loading the other capabilities."""

from ..cliroot import run_alone
from .cli import group

if __name__ == "__main__":
    run_alone(group)
