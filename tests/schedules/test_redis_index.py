"""The Redis index of schedules alone (real Redis): the Lua claim, settle, mirror,
stuck-claim recovery and the resync marker."""

from __future__ import annotations

import threading
import time

import redis

from pyscheduler.schedules.index import Index, idempotency_key


def now_ms(index: Index) -> int:
    sec, usec = index.r.time()
    return sec * 1000 + usec // 1000


def test_racing_claims_take_each_member_once(redis_url):
    index = Index(redis.Redis.from_url(redis_url))
    t = now_ms(index) - 1000
    index.mirror([(i, t + i % 500, None) for i in range(1, 20001)])
    got: list[list[tuple[int, int]]] = [[] for _ in range(4)]
    start = threading.Barrier(4)

    def claimer(k: int) -> None:
        ix = Index(redis.Redis.from_url(redis_url))
        start.wait()
        while True:
            res = ix.claim(300)
            if not res.claimed:
                return
            got[k] += [(c.id, c.expected_ms) for c in res.claimed]

    threads = [threading.Thread(target=claimer, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    everything = [x for part in got for x in part]
    assert len(everything) == 20000 and len(set(everything)) == 20000
    assert sum(1 for part in got if part) >= 2  # they really raced
    assert index.stats() == {"indexed": 20000, "claimed": 20000, "claims": 20000, "complete": False}


def test_settle_moves_score_and_mirror_never_brings_back_a_claimed_occurrence(redis_url):
    index = Index(redis.Redis.from_url(redis_url))
    t = now_ms(index) - 10
    index.mirror([(1, t, 5), (2, t, 5)])
    claimed = index.claim(10)
    assert [(c.id, c.expected_ms, c.version) for c in claimed.claimed] == [(1, t, "5"), (2, t, "5")]
    # a relay write while claimed changes nothing but marks the member: its schedule may have
    # changed after the next run was recorded, so the settle keeps it claimed and hands it
    # back to be settled with its due time read again
    assert index.mirror([(1, t, 6)]) == 0
    assert index.settle([(1, t, t + 60000), (2, t, None)]) == [(1, t)]
    assert index.members() == {1: -t}
    assert index.settle([(1, t, t + 60000)]) == []  # the due time read again
    assert index.members() == {1: t + 60000} and index.stats()["claims"] == 0
    # a slow relay write of the pre-claim state does not bring the fired occurrence back
    assert index.mirror([(1, t, None)]) == 0
    assert index.members() == {1: t + 60000}
    # a real change (update moved the next run) is written
    assert index.mirror([(1, t + 1000, None)]) == 1
    assert idempotency_key(1, t) == f"1:{t}"


def test_stuck_claims_found_by_age_with_the_global_next_check(redis_url):
    index = Index(redis.Redis.from_url(redis_url))
    t = now_ms(index) - 10
    index.mirror([(1, t, None)])
    assert len(index.claim(10).claimed) == 1
    assert index.recover(check_every_ms=60000, stuck_after_ms=5000) == []  # claim is young
    assert index.recover(check_every_ms=60000, stuck_after_ms=0) == []  # next check not due yet
    index.r.delete(index.k_next_check)
    time.sleep(0.002)
    assert index.recover(check_every_ms=60000, stuck_after_ms=0) == [1]
    assert index.members() == {1: t}
    again = index.claim(10).claimed
    assert [(c.id, c.expected_ms) for c in again] == [(1, t)]  # the same occurrence, same key
    # a refreshed claim is not stuck
    index.r.delete(index.k_next_check)
    assert index.refresh([(1, t)]) == 1
    assert index.recover(check_every_ms=60000, stuck_after_ms=5000) == []


def test_marker_and_resync_ids(redis_url):
    index = Index(redis.Redis.from_url(redis_url))
    first = index.begin_resync()
    assert first and index.begin_resync() == first  # executors join one resync
    assert index.claim(10).marker is None
    assert index.finish_resync(first) and index.begin_resync() is None
    assert index.claim(10).marker == first
    assert index.force_resync(seen_marker="other") is None  # someone resynced already
    second = index.force_resync(seen_marker=first)
    assert second and index.force_resync(seen_marker=first) is None
    assert index.begin_resync() == second
    index.r.flushall()
    assert index.begin_resync() not in (None, first, second)


def test_prune_forgets_last_and_version_of_inactive_members_only(redis_url):
    index = Index(redis.Redis.from_url(redis_url))
    t = now_ms(index) - 10
    index.mirror([(1, t, 5), (2, t, 5), (3, t, 5)])
    assert len(index.claim(10).claimed) == 3
    index.settle([(1, t, None), (2, t, t + 60000)])  # 1 ended, 2 moved on, 3 still claimed (firing)
    assert index.prune([1, 2, 3], older_than_ms=60000) == 0  # claimed too recently: a late relay write is still guarded
    assert index.prune([1, 2, 3], older_than_ms=0) == 2  # last and ver of 1; 2 is indexed, 3 claimed
    assert sorted(index.r.hkeys(index.k_last)) == [b"2", b"3"]
    assert sorted(index.r.hkeys(index.k_ver)) == [b"2", b"3"]
    assert index.hashed_ids() == {2, 3}
    # a pruned schedule that comes back (resumed, extended) is indexed as any new one
    assert index.mirror([(1, t + 5000, 6)]) == 1
    assert index.members()[1] == t + 5000


def test_lateness_observed_per_batch_equals_one_observation_each():
    from prometheus_client import CollectorRegistry, Histogram

    from pyscheduler.schedules.series import LATENESS, observe_ms

    values = [-5, 0, 4, 5, 10, 26, 99.5, 100, 2400, 61000, 10**7]
    samples = []
    for batched in (False, True):
        hist = Histogram("lateness", "", buckets=LATENESS._upper_bounds[:-1], registry=CollectorRegistry())
        if batched:
            observe_ms(hist, values)
        else:
            for v in values:
                hist.observe(max(0.0, v / 1000))
        samples.append({(s.name, s.labels.get("le")): s.value for m in hist.collect() for s in m.samples
                        if not s.name.endswith("_created")})
    assert samples[0] == samples[1]
