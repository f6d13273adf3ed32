"""The one Redis connector: every Redis user (the schedules' executors, relay, CLI and
benches, the endpoint's /readyz probe, the dashboard) gets its client from ``connect``.

``redis://`` and ``rediss://`` URLs give a ``redis.Redis``; ``redis+cluster://HOST:PORT[,...]``
(``rediss+cluster://`` for TLS) a ``LazyCluster``, made at its first command. Either connects
at its first command, so a server down at start is an outage like one later (docs/operations.md,
"Outages"); ``UNREACHABLE`` are the errors that mean it does not answer.
"""

from __future__ import annotations

import threading
import time
from urllib.parse import unquote, urlsplit

import redis
import redis.cluster
from redis.commands.core import Script
from redis.connection import Encoder
from redis.exceptions import ClusterDownError, ClusterError, RedisClusterException, SlotNotCoveredError

# Redis errors that mean "unreachable" (degraded mode), not a bug in a script. On a
# cluster also: the slot's master failed and no replica took over yet (CLUSTERDOWN,
# MASTERDOWN), the slot is not served (SlotNotCovered), redirections that did not settle
# (ClusterError "TTL exhausted", during a resharding), no seed node answers
# (RedisClusterException "cannot be connected").
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, ClusterDownError,
               SlotNotCoveredError, ClusterError, RedisClusterException)


def connect(url: str, timeout: float = 5.0) -> "redis.Redis | LazyCluster":
    """A client for ``url`` that connects at its first command, not here: a server down when a
    daemon starts is an outage like one later (UNREACHABLE: degraded mode, backoff), never a
    crash at start. ``redis+cluster://[user:password@]HOST:PORT[,HOST:PORT...]``
    (``rediss+cluster://`` for TLS) -> a ``LazyCluster`` seeded with those nodes; anything
    else -> ``redis.Redis.from_url``."""
    if is_cluster_url(url):
        parts = urlsplit(url)
        auth, _, hosts = parts.netloc.rpartition("@")
        user, _, password = auth.partition(":")
        nodes = []
        for hostport in hosts.split(","):
            host, _, port = hostport.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"redis+cluster URL: expected HOST:PORT[,HOST:PORT...], got {hostport!r}")
            nodes.append(redis.cluster.ClusterNode(host.strip("[]"), int(port)))
        kwargs: dict = {}
        if user:
            kwargs["username"] = unquote(user)
        if password:
            kwargs["password"] = unquote(password)
        if parts.scheme.startswith("rediss"):
            kwargs["ssl"] = True
        return LazyCluster(startup_nodes=nodes, socket_timeout=timeout, socket_connect_timeout=timeout,
                           health_check_interval=30, **kwargs)
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                health_check_interval=30)


class LazyCluster:
    """A ``RedisCluster`` made at the first command instead of by ``connect``. RedisCluster's
    constructor asks the seed nodes for the slot map and raises when none answers, so a
    cluster down when a daemon started crashed the daemon (and again at every restart: issue
    27) where a single node's client, which connects at its first command, made it wait the
    outage out. Made at the first use, a cluster that does not answer fails that command
    like any other outage (RedisClusterException, UNREACHABLE), and is tried again at a
    later one; not within ``RETRY_S`` of a failed try (the callers meanwhile get its error:
    an executor probing its 16 shards makes one try, not 16). Scripts are registered without
    a server (their SHA needs only the encoder); everything else is the cluster client's."""

    RETRY_S = 0.5

    def __init__(self, **kwargs):
        self._kwargs = kwargs
        self._client: redis.cluster.RedisCluster | None = None
        self._failed: tuple[float, str] | None = None  # (when, why) of the last failed try
        self._lock = threading.Lock()
        self._encoder = Encoder(kwargs.get("encoding", "utf-8"), kwargs.get("encoding_errors", "strict"),
                                kwargs.get("decode_responses", False))  # as RedisCluster's own

    @property
    def client(self) -> redis.cluster.RedisCluster:
        """The cluster client, made now if it was not (raises UNREACHABLE when no seed node answers)."""
        client = self._client
        if client is not None:
            return client
        with self._lock:
            if self._client is None:
                now = time.monotonic()
                if self._failed is not None and now - self._failed[0] < self.RETRY_S:
                    raise RedisClusterException(self._failed[1])
                try:
                    self._client = redis.cluster.RedisCluster(**self._kwargs)
                except UNREACHABLE as exc:
                    self._failed = (now, str(exc) or type(exc).__name__)
                    raise
                self._failed = None
            return self._client

    def __getattr__(self, name: str):  # what this class does not define: the cluster client's
        return getattr(self.client, name)

    def get_encoder(self) -> Encoder:
        return self._encoder

    def register_script(self, script: str) -> Script:
        return Script(self, script)  # runs through __getattr__ (evalsha, script_load) when called

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


CLUSTER_CLIENTS = (redis.cluster.RedisCluster, LazyCluster)


def is_cluster_url(url: str | None) -> bool:
    return bool(url) and url.split("://", 1)[0].lower() in ("redis+cluster", "rediss+cluster")
