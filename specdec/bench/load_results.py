"""Turn guidellm's JSON reports into `specdec bench-load`'s JSON: one row per configuration and point,
ratios to k = 0 at the same point, the A/A noise band and each configuration's comparison with k = 0.

Pure functions only (unit-tested on hand-built reports). Definitions, per point (one guidellm benchmark):

* ``output_tokens_per_s`` / ``requests_per_s``: successful requests' output tokens / count ÷ the
  benchmark's measured duration (guidellm's ``duration``: first request sent to last one done).
* ``streamed_tokens_per_s``: every output token streamed during the benchmark, the requests cut at the
  point's time cap (incomplete) included, ÷ the duration. Under a time cap the successful count moves in
  whole waves (16 streams of 13 s requests in 45 s: 32 or 48 done), this does not; the saturation ratio
  uses it.
* ``ttft_ms_*`` / ``itl_ms_*``: percentiles over successful requests of guidellm's per-request time to
  first token and inter-token latency ((last token − first token) ÷ (output tokens − 1)). p99 only
  from at least P99_MIN_REQUESTS requests.
* ``latency_s_*``: percentiles over successful requests of the whole request's time (sent to last token).
  Under a closed loop TTFT and ITL trade against each other (a scheduler that lets prefills in sooner
  has more sessions decoding at once); this is the figure that says which configuration served faster.
* ``errors``: errored + incomplete requests; ``rate_limited``: errors whose message carries HTTP 429
  (admission: the orchestrator's RESOURCE_EXHAUSTED).
* ``by_set``: on the mixed data set, the same TTFT, ITL and latency percentiles over each prompt set's
  requests alone (a request's set is found from its message). The mixed set's percentiles are of a
  two-mode mixture — grounded prompts of 200–340 tokens take 600–1,100 ms to the first token at one
  target thread, open prompts of 40–50 tokens 150–280 ms, and ITL differs as much under speculation —
  so its p50 jumps between the modes with the count of each kind a point happened to finish. The
  comparison with k = 0 reads latency and the low-rate gain per set when ``by_set`` is there
  (``compared_to_k0``), the mixed figures are kept beside them.
"""

from __future__ import annotations

import json
from typing import Any

from specdec.bench.load_plan import CONCURRENCY, K0, K0_AA, P99_MIN_REQUESTS, RATE, round_sig

#: Metrics compared between configurations; True: higher is better.
HIGHER_IS_BETTER = {
    "output_tokens_per_s": True,
    "streamed_tokens_per_s": True,
    "requests_per_s": True,
    "ttft_ms_p50": False,
    "ttft_ms_p90": False,
    "ttft_ms_p99": False,
    "itl_ms_p50": False,
    "itl_ms_p90": False,
    "itl_ms_p99": False,
    "latency_s_p50": False,
    "latency_s_p90": False,
    "latency_s_p99": False,
}
RATIO_DIGITS = 4
#: Per-request percentiles of ``by_set`` (name -> the request record's field); nearest rank at index
#: int(q * n) of the sorted values, as guidellm's own.
SET_FIELDS = {"ttft_ms": "time_to_first_token_ms", "itl_ms": "inter_token_latency_ms", "latency_s": "request_latency"}
SET_PERCENTILES = {"p50": 0.5, "p90": 0.9}
SET_METRICS = tuple(f"{name}_{p}" for name in SET_FIELDS for p in SET_PERCENTILES)
#: The prompt set the low-rate ITL gain is read on: the copy-heavy prompts, where drafts are accepted.
LOW_RATE_SET = "grounded"


def point_key(kind: str, value: float) -> str:
    """'concurrency@16', 'rate@0.52': the same key for every configuration at the same point."""
    return f"{kind}@{int(value)}" if kind == CONCURRENCY else f"{kind}@{round_sig(value)}"


def _point_of(strategy: dict[str, Any]) -> tuple[str, float]:
    kind = strategy.get("type_")
    if kind == "concurrent":
        return CONCURRENCY, float(strategy["streams"])
    if kind in ("poisson", "constant", "async"):
        return RATE, float(strategy["rate"])
    raise ValueError(f"unexpected guidellm strategy {kind!r} (bench-load runs concurrent and poisson)")


def _percentiles(metric: dict[str, Any], name: str, n_requests: int) -> dict[str, float | None]:
    stats = (metric or {}).get("successful") or {}
    pct = stats.get("percentiles") or {}
    out: dict[str, float | None] = {}
    for p in ("p50", "p90", "p99"):
        value = pct.get(p) if stats.get("count") else None
        if p == "p99" and n_requests < P99_MIN_REQUESTS:
            value = None
        out[f"{name}_{p}"] = round(float(value), 2) if value is not None else None
    return out


def _errors(requests: dict[str, Any]) -> dict[str, Any]:
    bad = list(requests.get("errored") or []) + list(requests.get("incomplete") or [])
    messages = [str((r.get("info") or {}).get("error") or "") for r in bad]
    return {
        "rate_limited": sum("429" in m for m in messages),
        "error_examples": sorted({m[:200] for m in messages if m})[:3],
    }


def nearest_rank(values: list[float], q: float) -> float:
    """The q-quantile of values as guidellm reports it: the sorted values at index int(q * n)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def request_set(request: dict[str, Any], sets_by_content: dict[str, str]) -> str | None:
    """The prompt set of one guidellm request record, from its last message's content (None: unknown)."""
    args = request.get("request_args") or {}
    if isinstance(args, str):  # guidellm 0.8 stores the request's arguments as a JSON string
        args = json.loads(args)
    body = args.get("body") or {}
    messages = body.get("messages") or []
    return sets_by_content.get(str(messages[-1].get("content"))) if messages else None


def by_set(requests: list[dict[str, Any]], sets_by_content: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Per prompt set: its successful requests' count and TTFT / ITL / latency p50 and p90."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for req in requests:
        name = request_set(req, sets_by_content)
        if name is not None:
            groups.setdefault(name, []).append(req)
    out: dict[str, dict[str, Any]] = {}
    for name, reqs in sorted(groups.items()):
        row: dict[str, Any] = {"requests": len(reqs)}
        for metric, field_name in SET_FIELDS.items():
            values = [float(r[field_name]) for r in reqs if r.get(field_name) is not None]
            for p, q in SET_PERCENTILES.items():
                row[f"{metric}_{p}"] = (
                    round(nearest_rank(values, q), 2 if metric != "latency_s" else 3) if values else None
                )
        out[name] = row
    return out


def parse_benchmark(bench: dict[str, Any], sets_by_content: dict[str, str] | None = None) -> dict[str, Any]:
    """One guidellm benchmark (a point) -> our row (with ``by_set`` when sets_by_content maps the prompts)."""
    kind, value = _point_of(bench["config"]["strategy"])
    metrics = bench["metrics"]
    totals = metrics.get("request_totals") or {}
    ok = int(totals.get("successful", 0))
    duration = float(bench.get("duration") or 0.0)
    counts = metrics.get("output_token_count") or {}
    out_tokens = float((counts.get("successful") or {}).get("total_sum") or 0.0)
    streamed = out_tokens + float((counts.get("incomplete") or {}).get("total_sum") or 0.0)
    row: dict[str, Any] = {
        "point": point_key(kind, value),
        "kind": kind,
        "value": value,
        "requests": ok,
        "errors": int(totals.get("errored", 0)) + int(totals.get("incomplete", 0)),
        "duration_s": round(duration, 3),
        "output_tokens": int(out_tokens),
        "output_tokens_per_s": round(out_tokens / duration, 3) if duration > 0 else 0.0,
        "streamed_tokens_per_s": round(streamed / duration, 3) if duration > 0 else 0.0,
        "requests_per_s": round(ok / duration, 4) if duration > 0 else 0.0,
        **_percentiles(metrics.get("time_to_first_token_ms"), "ttft_ms", ok),
        **_percentiles(metrics.get("inter_token_latency_ms"), "itl_ms", ok),
        **_percentiles(metrics.get("request_latency"), "latency_s", ok),
    }
    row.update(_errors(bench.get("requests") or {}))
    if sets_by_content:
        row["by_set"] = by_set((bench.get("requests") or {}).get("successful") or [], sets_by_content)
    return row


def parse_report(
    report: dict[str, Any], sets_by_content: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], str]:
    """A guidellm JSON report -> (rows, guidellm version)."""
    version = str((report.get("metadata") or {}).get("guidellm_version", "unknown"))
    return [parse_benchmark(b, sets_by_content) for b in report.get("benchmarks") or []], version


def saturation_rps(rows: list[dict[str, Any]]) -> float:
    """Requests/s at the highest concurrency point of the rows (k = 0's saturation throughput)."""
    closed = [r for r in rows if r["kind"] == CONCURRENCY]
    if not closed:
        raise ValueError("no concurrency point to take the saturation throughput from")
    return max(closed, key=lambda r: r["value"])["requests_per_s"]


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, RATIO_DIGITS)


def add_ratios(results: dict[str, dict[str, dict[str, Any]]], base: str = K0) -> None:
    """results[config][point] rows get `vs_k0`: {metric: this ÷ k = 0's at the same point} (in place)."""
    base_rows = results.get(base, {})
    for rows in results.values():
        for point, row in rows.items():
            ref = base_rows.get(point)
            if ref is not None:
                row["vs_k0"] = {m: _ratio(row.get(m), ref.get(m)) for m in HIGHER_IS_BETTER}
                for name, part in (row.get("by_set") or {}).items():
                    ref_part = (ref.get("by_set") or {}).get(name) or {}
                    part["vs_k0"] = {m: _ratio(part.get(m), ref_part.get(m)) for m in SET_METRICS}


def _largest_deviation(ratios: list[dict[str, Any]], metrics: Any) -> dict[str, float | None]:
    """Per metric, the largest |ratio − 1| over the ratio dicts that have it (None: none has it)."""
    band: dict[str, float | None] = {}
    for metric in metrics:
        devs = [abs(v[metric] - 1) for v in ratios if v.get(metric) is not None]
        band[metric] = round(max(devs), RATIO_DIGITS) if devs else None
    return band


def noise_band(results: dict[str, dict[str, dict[str, Any]]]) -> dict[str, float | None]:
    """Per metric, the largest |k0_aa ÷ k0 − 1| over the points both ran: the A/A noise band."""
    return _largest_deviation([r.get("vs_k0") or {} for r in results.get(K0_AA, {}).values()], HIGHER_IS_BETTER)


def set_names(configs: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """The prompt sets the rows of `configs` (config -> point -> row) split their requests by (``by_set``)."""
    return sorted({name for rows in configs.values() for r in rows.values() for name in (r.get("by_set") or {})})


def set_noise_band(results: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, float | None]]:
    """Per prompt set and metric, the largest |k0_aa ÷ k0 − 1| over the points both ran."""
    aa = results.get(K0_AA, {})
    return {
        name: _largest_deviation(
            [r["by_set"][name].get("vs_k0") or {} for r in aa.values() if name in (r.get("by_set") or {})], SET_METRICS
        )
        for name in set_names({K0_AA: aa})
    }


def _worse_by(metric: str, ratio: float) -> float:
    """How far a ratio to k = 0 is on the bad side (0 when equal or better)."""
    return max(0.0, (1 - ratio) if HIGHER_IS_BETTER[metric] else (ratio - 1))


LATENCY_METRICS = ("ttft_ms_p50", "ttft_ms_p90", "itl_ms_p50", "itl_ms_p90")


def _outside_band(
    point: str, ratios: dict[str, Any], band: dict[str, float | None], extra: dict[str, Any]
) -> list[dict[str, Any]]:
    """The latency metrics of one point that are worse than k = 0's by more than the A/A band."""
    return [
        {"point": point, **extra, "metric": metric, "ratio": ratios[metric]}
        for metric in LATENCY_METRICS
        if ratios.get(metric) is not None and _worse_by(metric, ratios[metric]) > (band.get(metric) or 0.0)
    ]


def latency_outside_band(rows: dict[str, dict[str, Any]], band: dict[str, float | None]) -> list[dict[str, Any]]:
    """Points where TTFT or ITL p50/p90 is worse than k = 0's by more than the A/A noise band."""
    return [v for point, row in rows.items() for v in _outside_band(point, row.get("vs_k0") or {}, band, {})]


def set_latency_outside_band(
    rows: dict[str, dict[str, Any]], bands: dict[str, dict[str, float | None]]
) -> list[dict[str, Any]]:
    """The same per prompt set: each set's percentiles against k = 0's of that set, and that set's band."""
    return [
        v
        for point, row in rows.items()
        for name, part in (row.get("by_set") or {}).items()
        for v in _outside_band(point, part.get("vs_k0") or {}, bands.get(name) or {}, {"set": name})
    ]


def compared_to_k0(
    results: dict[str, dict[str, dict[str, Any]]], config: str, band: dict[str, float | None]
) -> dict[str, Any]:
    """One configuration against k = 0: tokens/s at saturation, latency beyond the A/A band, low-rate ITL gain."""
    rows = results.get(config) or {}
    base = results.get(K0) or {}
    if not rows or not base:
        return {}
    closed = [p for p in rows if rows[p]["kind"] == CONCURRENCY and p in base]
    sat_point = max(closed, key=lambda p: rows[p]["value"]) if closed else None
    ratios = rows[sat_point]["vs_k0"] if sat_point else {}
    sat_ratio = ratios.get("streamed_tokens_per_s") or ratios.get("output_tokens_per_s")  # older rows: no streamed
    opened = sorted((p for p in rows if rows[p]["kind"] == RATE and p in base), key=lambda p: rows[p]["value"])
    low = opened[0] if opened else None
    low_itl = (rows[low]["vs_k0"] or {}).get("itl_ms_p50") if low else None
    out = {
        "saturation_point": sat_point,
        "saturation_tokens_ratio": sat_ratio,
        "latency_outside_band": latency_outside_band(rows, band),
        "low_rate_point": low,
        "low_rate_itl_p50_gain": round(1 / low_itl, 3) if low_itl else None,
    }
    if any(r.get("by_set") for r in rows.values()):
        out.update(_per_set(rows, low, set_noise_band(results), out))
    return out


def _per_set(
    rows: dict[str, dict[str, Any]], low: str | None, bands: dict[str, dict[str, float | None]], mixed: dict[str, Any]
) -> dict[str, Any]:
    """Latency and the low-rate gain read per prompt set; the mixed set's figures kept as mixed_*."""
    part = ((rows[low].get("by_set") or {}).get(LOW_RATE_SET) or {}) if low else {}
    low_itl = (part.get("vs_k0") or {}).get("itl_ms_p50")
    return {
        "read_on": "by_set",
        "set_noise_band": bands,
        "mixed_latency_outside_band": mixed["latency_outside_band"],
        "mixed_low_rate_itl_p50_gain": mixed["low_rate_itl_p50_gain"],
        "latency_outside_band": set_latency_outside_band(rows, bands),
        "low_rate_set": LOW_RATE_SET,
        "low_rate_itl_p50_gain": round(1 / low_itl, 3) if low_itl else None,
    }


#: Prometheus samples bench-load reads around each guidellm run (target and orchestrator /metrics);
#: "name:value" counts only the samples whose `outcome` label is value.
SERVER_SAMPLES = (
    "specdec_batch_size_sum",
    "specdec_batch_size_count",
    "specdec_spec_decode_k_sum",
    "specdec_spec_decode_k_count",
    "specdec_round_target_batch_size_sum",
    "specdec_round_target_batch_size_count",
)


def server_samples(text: str, names: tuple[str, ...] = SERVER_SAMPLES) -> dict[str, float]:
    """The samples `names` of one /metrics page, summed over their labels (k: over fixed and adaptive), or
    over one `outcome` with "name:outcome"."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for key in (sample.name, f"{sample.name}:{sample.labels.get('outcome', '')}"):
                if key in names:
                    out[key] = out.get(key, 0.0) + float(sample.value)
    return out


def server_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """What the servers saw during one guidellm run: mean sessions per target pass, mean k per round."""
    d = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in SERVER_SAMPLES}

    def mean(prefix: str) -> float | None:
        count = d[f"{prefix}_count"]
        return round(d[f"{prefix}_sum"] / count, 3) if count > 0 else None

    return {
        "target_passes": d["specdec_batch_size_count"],
        "mean_target_batch": mean("specdec_batch_size"),
        "rounds": d["specdec_spec_decode_k_count"],
        "mean_k": mean("specdec_spec_decode_k"),
        "mean_round_target_batch": mean("specdec_round_target_batch_size"),
    }
