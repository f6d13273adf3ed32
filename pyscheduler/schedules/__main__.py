"""``python -m pyscheduler.schedules run ...``: the schedule daemons without loading the other capabilities."""

import logging
import os
import warnings

from .cli import group

if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("PYSCHEDULER_LOG_LEVEL", "INFO").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    warnings.filterwarnings("ignore", module="platformdirs")
    group(prog_name="pyscheduler schedules")
