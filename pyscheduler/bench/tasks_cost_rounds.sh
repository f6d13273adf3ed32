#!/bin/bash
# Interleaved before/after rounds of bench/tasks_cost.py (docs/benchmarks.md, "What a task
# costs the database"): each run on a fresh database migrated by the code under test.
#
#   bench/tasks_cost_rounds.sh BASE NEW SERVER_DSN [ROUNDS] [tasks_cost.py options...]
#
# BASE, NEW: two checkouts (e.g. `git worktree add --detach /tmp/base main` and this one);
# SERVER_DSN: a superuser DSN of a server of its own (its database is only used to create
# and drop the scratch ones). Prints one line per run: sql and worker modes for BASE then
# NEW in every round (MODES="sql worker single vacuum" for more), then graphile-worker's
# shape once.
set -euo pipefail
base=$1 new=$2 server=$3 rounds=${4:-3}
shift $(( $# < 4 ? $# : 4 ))
extra=("$@")
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python}

run() {  # run LABEL CHECKOUT MODE: one tasks_cost.py run on a fresh database
    local db="tasks_cost_$$_$RANDOM" dsn
    dsn=$("$python" -c "import sys; from psycopg.conninfo import make_conninfo; print(make_conninfo(sys.argv[1], dbname=sys.argv[2]))" "$server" "$db")
    psql -qX "$server" -c "CREATE DATABASE $db"
    PYTHONPATH=$2 "$python" -c "import sys; from pyscheduler import migrate; migrate.migrate(sys.argv[1])" "$dsn" >/dev/null 2>&1
    echo "$1 $(PYTHONPATH=$2 "$python" "$here/tasks_cost.py" "$3" "$dsn" ${extra[@]+"${extra[@]}"} 2>/dev/null | tail -1)"
    psql -qX "$server" -c "DROP DATABASE $db"
}

for r in $(seq "$rounds"); do
    echo "round $r: $(uptime)"
    for mode in ${MODES:-sql worker}; do
        run base "$base" "$mode" "$@"
        run new "$new" "$mode" "$@"
    done
done
run graphile "$new" graphile
echo "end: $(uptime)"
