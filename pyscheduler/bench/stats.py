"""CPU seconds of a PostgreSQL server and of a command around one run of the command
(docs/scaling.md): the server's postmaster with its reaped children (backends that
exited) and its live children, found by the server's port; the command's own CPU with
its children (getrusage). Run on the database server's machine, as a user that may read
its /proc entries:

    python bench/cpu_around.py 5432 -- pyscheduler bench checks --dsn "$DSN" --checks 200000 --skip python --skip slots
"""
import os
import resource
import subprocess
import sys

TICK = os.sysconf("SC_CLK_TCK")
def stat(pid):
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return f
    except OSError:
        return None
def server_cpu(port):
    pm = None
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                cmd = open(f"/proc/{e}/cmdline","rb").read().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"postgres") and str(port).encode() in cmd:
                pm = int(e)
    total = 0.0
    for e in os.listdir("/proc"):
        if e.isdigit():
            f = stat(e)
            if f and int(e) == pm:  # with its reaped children: backends that exited
                total += (int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])) / TICK
            elif f and int(f[1]) == pm:
                total += (int(f[11]) + int(f[12])) / TICK
    return total
port = sys.argv[1]; cmd = sys.argv[3:]
s0 = server_cpu(port); r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
out = subprocess.run(cmd, capture_output=True, text=True)
s1 = server_cpu(port); r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
print(out.stdout[-1500:])
print(f"server CPU {s1-s0:.2f} s; command CPU {(r1.ru_utime+r1.ru_stime)-(r0.ru_utime+r0.ru_stime):.2f} s")
