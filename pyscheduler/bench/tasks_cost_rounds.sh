#!/bin/bash
# Interleaved before/after rounds of pyscheduler.bench.tasks_cost (docs/benchmarks.md, "What
# a task costs the database"): each run on a fresh database migrated by the code under test.
#
#   pyscheduler/bench/tasks_cost_rounds.sh BASE NEW SERVER_DSN [ROUNDS] [tasks_cost options...]
#
# BASE, NEW: two checkouts (e.g. `git worktree add --detach /tmp/base main` and this one);
# SERVER_DSN: a superuser DSN of a server of its own (its database is only used to create
# and drop the scratch ones). Prints one line per run: sql and worker modes for BASE then
# NEW in every round (MODES="sql worker single vacuum" for more), then graphile-worker's
# shape once. Each checkout runs its own tasks_cost (a checkout from before issue 28: its
# bench/tasks_cost.py); PYTHONSAFEPATH keeps the current directory's pyscheduler out.
set -euo pipefail
base=$1 new=$2 server=$3 rounds=${4:-3}
shift $(( $# < 4 ? $# : 4 ))
extra=("$@")
python=${PYTHON:-python}

run() {  # run LABEL CHECKOUT MODE: one tasks_cost run on a fresh database
    local db="tasks_cost_$$_$RANDOM" dsn cost=(-m pyscheduler.bench.tasks_cost)
    [ -f "$2/pyscheduler/bench/tasks_cost.py" ] || cost=("$2/bench/tasks_cost.py")
    dsn=$("$python" -c "import sys; from psycopg.conninfo import make_conninfo; print(make_conninfo(sys.argv[1], dbname=sys.argv[2]))" "$server" "$db")
    psql -qX "$server" -c "CREATE DATABASE $db"
    PYTHONSAFEPATH=1 PYTHONPATH=$2 "$python" -c "import sys; from pyscheduler import migrate; migrate.migrate(sys.argv[1])" "$dsn" >/dev/null 2>&1
    echo "$1 $(PYTHONSAFEPATH=1 PYTHONPATH=$2 "$python" "${cost[@]}" "$3" "$dsn" ${extra[@]+"${extra[@]}"} 2>/dev/null | tail -1)"
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
