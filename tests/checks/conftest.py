"""The checks tests' fixtures: half-second slots, runners in threads stopped at the end."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.support.checks import Running


@pytest.fixture
def slots(db):
    """Half-second slots."""
    db.call("set_check_settings", resolution=timedelta(milliseconds=500))
    return db


@pytest.fixture
def running():
    r = Running()
    yield r
    r.close()
