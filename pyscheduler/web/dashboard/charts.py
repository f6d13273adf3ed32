"""Small inline SVG charts (no script, no external file): bars per time bucket, latency
lines per bucket, and a line of samples. Everything interpolated is a number or a fixed word.
RANGES: the time ranges a page offers (1 h, 6 h, 24 h, 7 d) and the bucket of each."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from html import escape
from typing import Any

BAD = {"aborted", "cancelled", "failed", "missed", "error", "timeout", "max_checks", "horizon", "past"}
W, H = 240, 56
CAPABILITIES = ("tasks", "schedules", "checks", "delay")  # activity()'s
# range -> (since, bucket, the bucket in words)
RANGES = {"1h": (timedelta(hours=1), timedelta(minutes=5), "5 min"),
          "6h": (timedelta(hours=6), timedelta(minutes=15), "15 min"),
          "24h": (timedelta(days=1), timedelta(hours=1), "1 h"),
          "7d": (timedelta(days=7), timedelta(hours=6), "6 h")}


def summarise(activity: list[dict[str, Any]], now: datetime, hours: float = 1.0,
              bucket: timedelta = timedelta(minutes=5)) -> dict[str, Any]:
    """activity() rows -> per capability: totals per outcome, (ok, bad) per bucket, complete."""
    step = bucket.total_seconds()
    end = datetime.fromtimestamp((now.timestamp() // step) * step, timezone.utc)
    n = int(hours * 3600 // step)
    edges = [end - bucket * (n - 1 - i) for i in range(n)]
    index = {e: i for i, e in enumerate(edges)}
    out: dict[str, Any] = {"edges": edges, "index": index}
    for cap in CAPABILITIES:
        out[cap] = {"totals": {}, "buckets": [[0, 0] for _ in edges], "complete": True, "worst": None}
    for row in activity:
        cap = out[row["capability"]]
        cap["totals"][row["outcome"]] = cap["totals"].get(row["outcome"], 0) + row["n"]
        cap["complete"] = cap["complete"] and row["complete"]
        if row["worst"] is not None and (cap["worst"] is None or row["worst"] > cap["worst"]):
            cap["worst"] = row["worst"]
        i = index.get(row["bucket_start"].astimezone(timezone.utc))
        if i is not None:
            cap["buckets"][i][1 if row["outcome"] in BAD else 0] += row["n"]
    for cap in CAPABILITIES:
        c = out[cap]
        c["total"] = sum(c["totals"].values())
        c["bad"] = sum(v for k, v in c["totals"].items() if k in BAD)
        c["per_min"] = c["total"] / (hours * 60)
    return out


def _at(t: datetime, edges: list[datetime]) -> str:
    span = edges[-1] - edges[0] if edges else timedelta(0)
    return f"{t:%a %H:%M}" if span >= timedelta(days=1) else f"{t:%H:%M}"


def bars(buckets: list[list[int]], edges: list[datetime], per: str = "5 min") -> str:
    """Stacked bars: ok (below) and bad (above, red) per bucket of ``per``."""
    top = max((ok + bad for ok, bad in buckets), default=0) or 1
    bw = W / max(len(buckets), 1)
    parts = [f'<svg class="chart bars" viewBox="0 0 {W} {H + 12}" width="{W}" height="{H + 12}" role="img" '
             f'aria-label="ended per {per}">']
    for i, (ok, bad) in enumerate(buckets):
        x = i * bw + 1
        h_ok = H * ok / top
        h_bad = H * bad / top
        label = f"{_at(edges[i], edges)}Z: {ok} ok, {bad} failed"
        parts.append(f'<g><title>{escape(label)}</title>'
                     f'<rect class="ok" x="{x:.1f}" y="{H - h_ok:.1f}" width="{bw - 2:.1f}" height="{h_ok:.1f}"/>'
                     f'<rect class="bad" x="{x:.1f}" y="{H - h_ok - h_bad:.1f}" width="{bw - 2:.1f}" '
                     f'height="{h_bad:.1f}"/></g>')
    parts.append(f'<line class="axis" x1="0" y1="{H}" x2="{W}" y2="{H}"/>')
    if edges:
        parts.append(f'<text x="0" y="{H + 11}">{_at(edges[0], edges)}</text>'
                     f'<text x="{W}" y="{H + 11}" text-anchor="end">now</text>'
                     f'<text x="{W / 2}" y="{H + 11}" text-anchor="middle">max {top}/{per}</text>')
    parts.append("</svg>")
    return "".join(parts)


def latency(rows: list[dict[str, Any]], edges: list[datetime], index: dict[datetime, int]) -> str:
    """activity_latency() rows of one capability -> its p50 and p95 lines per bucket (seconds)."""
    per: list[dict[str, Any] | None] = [None] * len(edges)
    for row in rows:
        i = index.get(row["bucket_start"].astimezone(timezone.utc))
        if i is not None:
            per[i] = row
    top = max((r["p95"].total_seconds() for r in per if r), default=0) or 1
    bw = W / max(len(edges), 1)
    parts = [f'<svg class="chart latency" viewBox="0 0 {W} {H + 12}" width="{W}" height="{H + 12}" role="img" '
             f'aria-label="latency p50 and p95 per bucket">']
    for k in ("p50", "p95"):
        pts = [(i * bw + bw / 2, H - H * r[k].total_seconds() / top) for i, r in enumerate(per) if r]
        if len(pts) == 1:
            parts.append(f'<circle class="{k}" cx="{pts[0][0]:.1f}" cy="{pts[0][1]:.1f}" r="2"><title>{k}</title>'
                         f'</circle>')
        elif pts:
            coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            parts.append(f'<polyline class="{k}" points="{coords}"><title>{k}</title></polyline>')
    for i, r in enumerate(per):
        if r:
            label = (f"{_at(edges[i], edges)}Z: p50 {r['p50'].total_seconds():.3g} s, "
                     f"p95 {r['p95'].total_seconds():.3g} s ({r['n']})")
            parts.append(f'<rect class="hover" x="{i * bw:.1f}" y="0" width="{bw:.1f}" height="{H}">'
                         f'<title>{escape(label)}</title></rect>')
    parts.append(f'<line class="axis" x1="0" y1="{H}" x2="{W}" y2="{H}"/>')
    if edges:
        parts.append(f'<text x="0" y="{H + 11}">{_at(edges[0], edges)}</text>'
                     f'<text x="{W}" y="{H + 11}" text-anchor="end">now</text>'
                     f'<text x="{W / 2}" y="{H + 11}" text-anchor="middle">max p95 {top:.3g} s</text>')
    parts.append("</svg>")
    return "".join(parts)


def samples(points: list[tuple[datetime, dict[str, int]]], now: datetime,
            series: tuple[str, ...] = ("waiting", "ready", "overdue")) -> str:
    """Lines of sampled gauges over the last hour (the dashboard's own samples)."""
    start = now - timedelta(hours=1)
    pts = [(t, s) for t, s in points if t >= start]
    top = max((s[k] for _, s in pts for k in series), default=0) or 1
    parts = [f'<svg class="chart" viewBox="0 0 {W} {H + 12}" width="{W}" height="{H + 12}" role="img" '
             f'aria-label="last hour, sampled by this dashboard">']
    for k in series:
        coords = " ".join(f"{W * (t - start).total_seconds() / 3600:.1f},{H - H * s[k] / top:.1f}" for t, s in pts)
        if len(pts) == 1:
            x, y = coords.split(",")
            parts.append(f'<circle class="{k}" cx="{x}" cy="{y}" r="2"><title>{k}</title></circle>')
        elif pts:
            parts.append(f'<polyline class="{k}" points="{coords}"><title>{k}</title></polyline>')
    parts.append(f'<line class="axis" x1="0" y1="{H}" x2="{W}" y2="{H}"/>'
                 f'<text x="0" y="{H + 11}">-1 h</text><text x="{W}" y="{H + 11}" text-anchor="end">now</text>'
                 f'<text x="{W / 2}" y="{H + 11}" text-anchor="middle">max {top} ({len(pts)} samples)</text></svg>')
    return "".join(parts)
