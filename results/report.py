"""A self-contained HTML report of a result file or dataset.

One page, no external files: the top configurations, the step-time / memory
Pareto front, the step-time breakdown of the best configurations and a
sensitivity view (the best step time for each value of each strategy
dimension). Pictures are PNGs embedded as base64.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import polars as pl

from paraspace.results.rank import pareto, ranked, scan
from paraspace.results.schema import STEP_PARTS

#: the step-time parts drawn as stacked bars (they add up to step_time_analytic_s; the DualPipe credit
#: is negative and draws back from the end)
BREAKDOWN = STEP_PARTS
GIB = 1024**3


def _png(fig) -> str:  # noqa: ANN001 - a matplotlib figure
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _table(frame: pl.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in frame.columns)
    rows = []
    for row in frame.iter_rows():
        cells = "".join(f"<td>{html.escape(f'{v:.4g}' if isinstance(v, float) else str(v))}</td>" for v in row)
        rows.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def build(path: str | Path, strategy: list[str], n_top: int = 10) -> str:
    """The report's HTML; ``strategy`` names the strategy columns (from the dimension table)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = scan(path)
    best = ranked(frame).head(n_top).collect()
    feasible = frame.filter(pl.col("feasible"))
    n_rows = frame.select(pl.len()).collect().item()
    n_feasible = feasible.select(pl.len()).collect().item()
    front = pareto(path)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    sample = feasible.select("step_time_s", "mem_peak_bytes").collect()
    if sample.height > 20_000:
        sample = sample.sample(20_000, seed=0)
    ax.scatter(sample["step_time_s"], sample["mem_peak_bytes"] / GIB, s=4, alpha=0.3, color="#999999", label="feasible")
    ax.plot(front["step_time_s"], front["mem_peak_bytes"] / GIB, "o-", color="#d9534f", markersize=4, label="Pareto front")
    ax.set_xlabel("step time (s)")
    ax.set_ylabel("peak memory per device (GiB)")
    ax.legend()
    fig.tight_layout()
    pareto_png = _png(fig)

    fig, ax = plt.subplots(figsize=(7, 0.45 * max(best.height, 1) + 1.2))
    left = [0.0] * best.height
    for col in BREAKDOWN:
        ax.barh(range(best.height), best[col], left=left, label=col.removesuffix("_s"))
        left = [a + b for a, b in zip(left, best[col])]
    ax.set_yticks(range(best.height))
    ax.set_yticklabels([f"row {r}" for r in best["row_id"]], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("closed-form step time breakdown (s)")
    ax.legend(fontsize=7, ncol=4, loc="lower right")
    fig.tight_layout()
    breakdown_png = _png(fig)

    sensitivity = []
    for dim in strategy:
        per_value = (feasible.group_by(dim).agg(pl.col("step_time_s").min().alias("best_step_time_s"))
                     .sort(dim).collect())
        cells = ", ".join(f"{v}: {t:.3f} s" for v, t in per_value.iter_rows())
        sensitivity.append(f"<tr><th>{html.escape(dim)}</th><td>{html.escape(cells)}</td></tr>")

    shown = best.select(["row_id", *strategy, "step_time_s", "tokens_per_s_per_gpu", "mfu",
                         (pl.col("mem_peak_bytes") / GIB).alias("mem_peak_GiB"), "feasible"])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>paraspace report: {html.escape(str(path))}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}} th{{background:#f3f3f3}}</style></head>
<body>
<h1>paraspace report</h1>
<p>{html.escape(str(path))}: {n_rows:,} candidates, {n_feasible:,} fit in memory.</p>
<h2>Best configurations</h2>
{_table(shown)}
<h2>Step time vs memory</h2>
<img alt="Pareto front" src="{pareto_png}">
<h2>Where the time goes</h2>
<img alt="step time breakdown" src="{breakdown_png}">
<h2>Sensitivity: best step time for each value of each dimension</h2>
<table>{''.join(sensitivity)}</table>
</body></html>
"""


def write(path: str | Path, out: str | Path, strategy: list[str], n_top: int = 10) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(build(path, strategy, n_top))
    return out
