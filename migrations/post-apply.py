"""yoyo post-apply step: reload every function file in sql/ (CREATE OR REPLACE).

pyscheduler's migrate command runs it on every migrate, also when no
migration was pending, so the functions in the database always match the code.
"""
from yoyo import step

from pyscheduler.migrate import load_functions

steps = [step(load_functions)]
