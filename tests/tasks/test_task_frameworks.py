"""Task functions submitted in a framework's transaction (docs/python-api.md, "Frameworks", whose
recipes tests/shared/test_python_docs.py runs): a savepoint rolled back takes its task with it, the
enclosing transaction's stays, with Django (in a process of its own: its settings are global)
and with the SQLAlchemy ORM."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import psycopg
from sqlalchemy import Integer, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from pyscheduler.tasks import TaskApp


def declare(dsn: str) -> tuple[TaskApp, object]:
    app = TaskApp(dsn)

    @app.task(queue="orders", name="orders.ship")
    def ship(order: int) -> int:
        return order

    return app, ship


DJANGO = '''
import sys
import django
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict

p = conninfo_to_dict(sys.argv[1])
settings.configure(DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": p["dbname"],
                                          "USER": p.get("user", ""), "HOST": p.get("host", ""),
                                          "PORT": p.get("port", "")}})
django.setup()
from django.db import connection, transaction
from pyscheduler.tasks import TaskApp

app = TaskApp(sys.argv[1])

@app.task(queue="orders", name="orders.ship")
def ship(order: int) -> int:
    return order

with transaction.atomic():
    ship.options(conn=connection.connection).submit(order=1)
    try:
        with transaction.atomic():  # a savepoint
            ship.options(conn=connection.connection).submit(order=2)
            raise RuntimeError("rolled back to the savepoint")
    except RuntimeError:
        pass
    ship.options(conn=connection.connection).submit(order=3)
connection.close()
print([d.result for d in app.drain()])
app.close()
'''


def test_django_a_savepoint_rolled_back_takes_its_task_with_it(dsn, tmp_path):
    script = tmp_path / "django_app.py"
    script.write_text(textwrap.dedent(DJANGO))
    result = subprocess.run([sys.executable, str(script), dsn], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[1, 3]"


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orm_orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)


def test_sqlalchemy_orm_the_task_commits_with_the_objects_or_not_at_all(dsn, conn):
    app, ship = declare(dsn)
    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn))
    Base.metadata.create_all(engine)
    try:
        with Session(engine) as session:
            with session.begin():
                session.add(Order(id=1))
                session.flush()
                ship.options(conn=session.connection().connection.driver_connection).submit(order=1)
                nested = session.begin_nested()  # a savepoint
                session.add(Order(id=2))
                ship.options(conn=session.connection().connection.driver_connection).submit(order=2)
                nested.rollback()
            try:
                with session.begin():
                    session.add(Order(id=3))
                    ship.options(conn=session.connection().connection.driver_connection).submit(order=3)
                    raise RuntimeError("rolled back")
            except RuntimeError:
                pass
        assert [d.result for d in app.drain()] == [1]
        assert [r["id"] for r in conn.execute("SELECT id FROM orm_orders")] == [1]
    finally:
        engine.dispose()
        app.close()
