"""A self-contained, interactive HTML report of a result file or dataset.

One page, nothing fetched from elsewhere (Plotly's JavaScript is embedded once):

- the best configurations in a table that fits the page and sorts by any
  column (click its header), with the dimensions held at one value named above
  it and the step time's 80% band beside it;
- step time against peak memory for the feasible candidates (zoom, hover for
  the configuration), the Pareto front drawn over them; clicking a point shows
  its configuration and breakdown, clicking a second compares the two;
- where the time goes for the best configurations, from the same tier as the
  ranking: the closed form's parts (``results.schema.STEP_PARTS``, EP traffic and
  DualPipe's overlap credit included) plus the event engine's correction
  (``step_time_s - step_time_analytic_s``) where the row was simulated, so each
  bar ends at the step time the ranking used;
- sensitivity: for each strategy dimension, the best step time each value
  reaches, and how far apart those are.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

import polars as pl

from paraspace.results import serving_schema
from paraspace.results.rank import SERVING_FRONT, is_serving, pareto, ranked, scan
from paraspace.results.schema import STEP_PARTS
from paraspace.results.writer import check_replaceable, check_writable, partial_path, publish, writing

GIB = 1024**3
#: how every report page begins (``_head``), and so how ``write`` knows a file it may replace
PAGE_START = "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>paraspace report: "
#: the event engine's correction to the closed form, drawn after the parts
SIM_DELTA = "simulation_s"
#: candidates drawn in the scatter (a seeded sample beyond this), besides the front and the best
SCATTER_POINTS = 4000
#: the metric columns the table and the details show, after the varying dimensions
TABLE_METRICS = ("step_time_s", "step_time_lo_s", "step_time_hi_s", "tokens_per_s_per_gpu", "mfu", "mem_peak_GiB",
                 "simulated", "feasible")
PLOT_CONFIG = {"displaylogo": False, "responsive": True}


#: what a table cell or a hover shows for a value that does not exist (null or NaN), as the terminal tables do
MISSING = "-"


def _cell(value: Any) -> str:
    if value is None:
        return MISSING
    if isinstance(value, float):
        return MISSING if math.isnan(value) else f"{value:.4g}"
    return str(value)


def _number(value: Any) -> str:
    """A metric in a hover: four significant digits, ``MISSING`` for null or NaN."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return MISSING if isinstance(value, float) and math.isnan(value) else f"{value:.4g}"
    return _cell(value)


def _table(frame: pl.DataFrame, table_id: str) -> str:
    """A sortable table: the header cells carry the column index for the page's sort script."""
    head = "".join(f'<th data-col="{i}" title="sort by {html.escape(c)}">{html.escape(c)}</th>'
                   for i, c in enumerate(frame.columns))
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>"
                   for row in frame.iter_rows())
    return (f'<div class="scroll"><table class="sortable" id="{table_id}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{rows}</tbody></table></div>")


def _with_derived(frame: pl.LazyFrame) -> pl.LazyFrame:
    cols = frame.collect_schema().names()
    extra = [(pl.col("mem_peak_bytes") / GIB).alias("mem_peak_GiB")]
    if "step_time_analytic_s" in cols:
        extra.append((pl.col("step_time_s") - pl.col("step_time_analytic_s")).alias(SIM_DELTA))
    return frame.with_columns(extra)


def varying(frame: pl.LazyFrame, strategy: list[str]) -> tuple[list[str], str]:
    """The strategy dimensions that take several values among ``frame``'s rows (the feasible
    ones, where there are any), and a note of those held at one value, with the value they
    hold there ("tp = 8, ..."; "none")."""
    present = [d for d in strategy if d in frame.collect_schema().names()]
    counts = frame.select([pl.col(d).n_unique().alias(d) for d in present]).collect().row(0, named=True)
    held = [d for d in present if counts[d] <= 1]
    values = frame.select([pl.col(d).first() for d in held]).collect().row(0, named=True) if held else {}
    return [d for d in present if counts[d] > 1], ", ".join(f"{d} = {v}" for d, v in values.items()) or "none"


def _figure_html(fig: Any, div_id: str) -> str:
    import plotly.io as pio

    return pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOT_CONFIG)


def _hover(frame: pl.DataFrame, dims: list[str], x: str, y: str) -> list[str]:
    return ["<br>".join([f"row {r['row_id']}: {x} {_number(r[x])}, {y} {_number(r[y])}",
                         *(f"{d} = {_cell(r[d])}" for d in dims)])
            for r in frame.iter_rows(named=True)]


def front_figure(feasible: pl.LazyFrame, front: pl.DataFrame, best: pl.DataFrame, dims: list[str],
                 axes: tuple[str, str], titles: tuple[str, str]) -> Any:
    """The feasible candidates (a seeded sample beyond SCATTER_POINTS), the front and the best, on ``axes``."""
    import plotly.graph_objects as go

    x, y = axes
    n = feasible.select(pl.len()).collect().item()
    sample = feasible.collect() if n <= SCATTER_POINTS else feasible.collect().sample(SCATTER_POINTS, seed=0)
    fig = go.Figure()
    for frame, name, style in ((sample, "feasible candidates", {"color": "#9aa5b1", "size": 5, "opacity": 0.5}),
                               (front, "Pareto front", {"color": "#d9534f", "size": 8}),
                               (best, "best", {"color": "#1f77b4", "size": 9, "symbol": "diamond"})):
        fig.add_trace(go.Scattergl(
            x=frame[x].to_list(), y=frame[y].to_list(), mode="markers" if name != "Pareto front"
            else "lines+markers", name=name, marker=style, customdata=frame["row_id"].to_list(),
            hovertext=_hover(frame, dims, x, y), hoverinfo="text"))
    fig.update_layout(xaxis_title=titles[0], yaxis_title=titles[1], height=460,
                      margin={"l": 60, "r": 20, "t": 40, "b": 50},
                      legend={"orientation": "h", "y": 1.08, "x": 0}, clickmode="event+select")
    return fig


def breakdown_figure(best: pl.DataFrame) -> Any:
    import plotly.graph_objects as go

    labels = [f"row {r}" for r in best["row_id"]]
    parts = [p for p in STEP_PARTS if p in best.columns] + ([SIM_DELTA] if SIM_DELTA in best.columns else [])
    import plotly.express as px

    palette = px.colors.qualitative.Alphabet  # 26 distinct colours: one per part
    fig = go.Figure()
    for part, colour in zip(parts, palette):
        fig.add_trace(go.Bar(y=labels, x=best[part].to_list(), name=part.removesuffix("_s"), orientation="h",
                             marker_color=colour, hovertemplate=f"{part}: %{{x:.4g}} s<extra>%{{y}}</extra>"))
    fig.update_layout(barmode="relative", height=80 + 36 * max(best.height, 1), xaxis_title="seconds per step",
                      yaxis={"autorange": "reversed"}, margin={"l": 80, "r": 20, "t": 70, "b": 50},
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0})
    return fig


def sensitivity(feasible: pl.LazyFrame, dims: list[str], metric: str = "step_time_s",
                higher_is_better: bool = False) -> tuple[Any, pl.DataFrame]:
    """Per varying dimension, the best ``metric`` each of its values reaches; a bar of the
    spread (the best of the best values over the worst of them)."""
    import plotly.graph_objects as go

    rows = []
    label = f"best {metric} per value"
    for dim in dims:
        agg = pl.col(metric).max() if higher_is_better else pl.col(metric).min()
        per_value = feasible.group_by(dim).agg(agg.alias("best")).sort(dim).collect()
        best = per_value["best"].drop_nulls()
        if best.is_empty() or best.min() <= 0:
            continue
        rows.append({"dimension": dim, "spread": float(best.max() / best.min()),
                     label: ", ".join(f"{v}: {t:.4g}" for v, t in per_value.iter_rows() if t is not None)})
    table = pl.DataFrame(rows, schema={"dimension": pl.String, "spread": pl.Float64, label: pl.String}
                         ).sort("spread", descending=True)
    fig = go.Figure(go.Bar(x=table["spread"].to_list(), y=table["dimension"].to_list(), orientation="h",
                           hovertext=table[label].to_list(), hoverinfo="text+x"))
    fig.update_layout(height=80 + 28 * max(table.height, 1), xaxis_title=f"best {metric}: best value / worst value",
                      yaxis={"autorange": "reversed"}, margin={"l": 140, "r": 20, "t": 20, "b": 50})
    return fig, table


def details(frame: pl.DataFrame, dims: list[str], metrics: tuple[str, ...] = (*TABLE_METRICS, *STEP_PARTS, SIM_DELTA)
            ) -> dict[str, dict[str, Any]]:
    """Per row_id, what the click panel shows: the dimensions and ``metrics`` (a training
    row's metrics and breakdown by default)."""
    keep = [c for c in (*dims, *metrics) if c in frame.columns]
    return {str(r["row_id"]): {k: (None if isinstance(r[k], float) and math.isnan(r[k]) else r[k]) for k in keep}
            for r in frame.select(["row_id", *keep]).iter_rows(named=True)}


def plotted_details(frame: pl.LazyFrame, fig: Any, dims: list[str], **metrics: Any) -> dict[str, dict[str, Any]]:
    """``details`` of the sampled points the front figure draws first (its first trace), so
    that any point on the page can be clicked, not only the best rows and the front's."""
    ids = [int(x) for x in fig.data[0].customdata]
    return details(frame.filter(pl.col("row_id").is_in(ids)).collect(), dims, **metrics) if ids else {}


def compare_html(a: dict[str, Any], b: dict[str, Any], ids: tuple[str, str]) -> str:
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(_cell(a[k]))}</td><td>{html.escape(_cell(b[k]))}</td>"
                   "</tr>" for k in a if a[k] != b[k])
    return (f'<table><thead><tr><th></th><th>row {ids[0]}</th><th>row {ids[1]}</th></tr></thead>'
            f"<tbody>{rows}</tbody></table>")


SCRIPT = """
document.querySelectorAll('table.sortable th').forEach(th => th.addEventListener('click', () => {
  const table = th.closest('table'), body = table.tBodies[0], col = +th.dataset.col;
  const up = th.dataset.dir !== 'up'; th.dataset.dir = up ? 'up' : 'down';
  const key = tr => { const t = tr.cells[col].textContent, x = parseFloat(t); return isNaN(x) ? t : x; };
  [...body.rows].sort((p, q) => { const a = key(p), b = key(q); return (a > b ? 1 : a < b ? -1 : 0) * (up ? 1 : -1); })
    .forEach(tr => body.appendChild(tr));
}));
const picked = [];
function show(id) {
  const row = ROWS[id]; if (!row) return;
  picked.push(id); if (picked.length > 2) picked.shift();
  const esc = s => String(s).replace(/[&<>]/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;'}[c]));
  const fmt = v => v === null ? '-' : typeof v === 'number' ? (Number.isInteger(v) ? v : v.toPrecision(4)) : v;
  let out = '<h3>row ' + esc(id) + '</h3><table>' + Object.entries(row).map(([k, v]) =>
    '<tr><th>' + esc(k) + '</th><td>' + esc(fmt(v)) + '</td></tr>').join('') + '</table>';
  if (picked.length === 2 && picked[0] !== picked[1]) {
    const [a, b] = picked.map(i => ROWS[i]);
    out += '<h3>row ' + esc(picked[0]) + ' against row ' + esc(picked[1]) + ' (what differs)</h3><table>' +
      Object.keys(a).filter(k => a[k] !== b[k]).map(k => '<tr><th>' + esc(k) + '</th><td>' + esc(fmt(a[k])) +
      '</td><td>' + esc(fmt(b[k])) + '</td></tr>').join('') + '</table>';
  }
  document.getElementById('picked').innerHTML = out;
}
document.getElementById('pareto').on('plotly_click', ev => show(String(ev.points[0].customdata)));
"""

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1100px;padding:0 1em;color:#222}
.scroll{overflow-x:auto;max-width:100%} table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap} th{background:#f3f3f3}
table.sortable th{cursor:pointer} .note{color:#555;font-size:14px} #picked{margin-top:.5em}
.columns{display:flex;gap:1.5em;flex-wrap:wrap} .columns>div{flex:1;min-width:320px}
"""


def build(path: str | Path, strategy: list[str], n_top: int = 10) -> str:
    """The report's HTML; ``strategy`` names the strategy columns (from the dimension table)."""
    frame = _with_derived(scan(path))
    if is_serving(frame):
        return build_serving(path, frame, n_top)
    feasible = frame.filter(pl.col("feasible"))
    n_rows = frame.select(pl.len()).collect().item()
    n_feasible = feasible.select(pl.len()).collect().item()
    n_simulated = frame.select(pl.col("simulated").sum()).collect().item() if "simulated" in \
        frame.collect_schema().names() else 0
    dims, held_note = varying(feasible if n_feasible else frame, strategy)
    best = ranked(frame).head(n_top).collect()
    front = _with_derived(pareto(path).lazy()).collect()
    fig_front = front_figure(feasible, front, best, dims, ("step_time_s", "mem_peak_GiB"),
                             ("step time (s)", "peak memory per device (GiB)"))
    fig_parts = breakdown_figure(best)
    fig_sens, sens = sensitivity(feasible if n_feasible else frame, dims)
    # the numbers first (they must be on screen), then the dimensions that vary
    band = (pl.format("{}-{}", pl.col("step_time_lo_s").round(3), pl.col("step_time_hi_s").round(3))
            .alias("80% band (s)")) if "step_time_lo_s" in best.columns else None
    metrics = [pl.col("step_time_s"), *([band] if band is not None else []),
               *(pl.col(c) for c in ("tokens_per_s_per_gpu", "mfu") if c in best.columns),
               pl.col("mem_peak_GiB").round(1), *(pl.col(c) for c in ("simulated", "feasible") if c in best.columns)]
    shown = best.select(["row_id", *metrics, *dims]).with_row_index("rank", offset=1)
    rows_json = details(pl.concat([best, front], how="diagonal_relaxed").unique("row_id"), dims)
    rows_json.update(plotted_details(frame, fig_front, dims))
    compare = ""
    if best.height >= 2:
        ids = (str(best["row_id"][0]), str(best["row_id"][1]))
        compare = ("<h2>The two best, side by side</h2><p class=note>What differs between them; click two points "
                   "in the chart above to compare any pair.</p>" + compare_html(rows_json[ids[0]], rows_json[ids[1]], ids))
    title = html.escape(str(path))
    return f"""{_head(title)}
<h1>paraspace report</h1>
<p>{title}: {n_rows:,} candidates, {n_feasible:,} fit in memory, {n_simulated:,} simulated by the event engine
(ranked by their simulated step time; the rest by the closed form).</p>
<h2>Best configurations</h2>
<p class=note>Held at one value: {html.escape(held_note)}. Click a column header to sort.</p>
{_table(shown, "best")}
<h2>Step time vs memory</h2>
<p class=note>Zoom with the mouse; hover for a configuration; click a point for its details, a second to compare.</p>
<div class=columns><div>{_figure_html(fig_front, "pareto")}</div><div id="picked"><p class=note>No point selected.</p></div></div>
<h2>Where the time goes</h2>
<p class=note>The closed form's parts; "simulation" is the event engine's correction on simulated rows, so each bar
ends at the step time the ranking used. DualPipe's overlap credit is negative.</p>
{_figure_html(fig_parts, "breakdown")}
{compare}
<h2>Sensitivity</h2>
<p class=note>For each dimension, the best step time of each of its values; the bar is the slowest value's best over
the fastest's.</p>
{_figure_html(fig_sens, "sensitivity")}
{_table(sens, "sensitivity-table")}
<script>const ROWS = {json.dumps(rows_json)};{SCRIPT}</script>
</body></html>
"""


def _head(title: str) -> str:
    import plotly.offline

    return f"""{PAGE_START}{title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style>
<script>{plotly.offline.get_plotlyjs()}</script></head>
<body>"""


#: what a serving report's table shows after the varying dimensions
SERVING_METRICS = ("ttft_s", "ttft_p90_s", "tpot_s", "tpot_p90_s", "output_tokens_per_s_per_gpu",
                   "output_tokens_per_s_per_user", "mem_peak_GiB", "simulated", "feasible", "infeasible_reason")


def build_serving(path: str | Path, frame: pl.LazyFrame, n_top: int) -> str:
    """A serving result's page: the best deployments, the throughput-per-GPU against
    throughput-per-user front (the serving trade-off), and sensitivity per dimension."""
    strategy = [c.name for c in serving_schema.STRATEGY if c.name != "row_id"]
    feasible = frame.filter(pl.col("feasible"))
    n_rows = frame.select(pl.len()).collect().item()
    n_feasible = feasible.select(pl.len()).collect().item()
    dims, held_note = varying(feasible if n_feasible else frame, strategy)
    best = ranked(frame).head(n_top).collect()
    front = pareto(path).with_columns((pl.col("mem_peak_bytes") / GIB).alias("mem_peak_GiB"))
    gpu, user = SERVING_FRONT
    fig_front = front_figure(feasible, front, best, dims, (user, gpu),
                             ("output tokens per second per user", "output tokens per second per GPU"))
    fig_sens, sens = sensitivity(feasible if n_feasible else frame, dims, gpu, higher_is_better=True)
    shown = best.select(["row_id", *(c for c in SERVING_METRICS if c in best.columns), *dims]
                        ).with_row_index("rank", offset=1)
    rows_json = details(pl.concat([best, front.select(best.columns)]).unique("row_id"), dims, metrics=SERVING_METRICS)
    rows_json.update(plotted_details(frame, fig_front, dims, metrics=SERVING_METRICS))
    title = html.escape(str(path))
    return f"""{_head(title)}
<h1>paraspace serving report</h1>
<p>{title}: {n_rows:,} deployments, {n_feasible:,} fit, sustain the load and meet the SLA.</p>
<h2>Best deployments</h2>
<p class=note>By output tokens per second per GPU, then TTFT. Held at one value: {html.escape(held_note)}.
Click a column header to sort.</p>
{_table(shown, "best")}
<h2>Throughput per GPU against throughput per user</h2>
<p class=note>Each point a feasible deployment; the front is what no other deployment beats on both. Hover for the
deployment; click for its details, a second to compare.</p>
<div class=columns><div>{_figure_html(fig_front, "pareto")}</div><div id="picked"><p class=note>No point selected.</p></div></div>
<h2>Sensitivity</h2>
{_figure_html(fig_sens, "sensitivity")}
{_table(sens, "sensitivity-table")}
<script>const ROWS = {json.dumps(rows_json)};{SCRIPT}</script>
</body></html>
"""


def write(path: str | Path, out: str | Path, strategy: list[str], n_top: int = 10) -> Path:
    """The report of ``path`` written to ``out`` atomically (``results.writer.publish``); an
    existing ``out`` is replaced only where it is an earlier report (one that begins with
    ``PAGE_START``)."""
    out = Path(out)
    kind = {"starts_with": PAGE_START.encode(), "kind": "paraspace report"}
    check_writable(out, **kind)
    page = build(path, strategy, n_top)
    check_replaceable(out, **kind)  # again: something else may have been written there meanwhile
    staged = partial_path(out)
    try:
        with writing(out):
            staged.write_bytes(page.encode())
            publish(staged, out)
    finally:
        staged.unlink(missing_ok=True)
    return out
