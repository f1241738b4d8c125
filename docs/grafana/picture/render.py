# Draws the dashboard JSON's panels from a real Prometheus (its query_range API), with uPlot,
# in Grafana's dark theme and grid, to one HTML page for a headless screenshot.
import json, re, sys, urllib.parse, urllib.request

# render.py DASHBOARD PROMETHEUS T0 T1 OUT.html UPLOT_DIST PAGE.html
DASH, PROM, T0, T1, OUT, UPLOT, PAGE = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
    sys.argv[5], sys.argv[6], sys.argv[7]
STEP = 5
dash = json.load(open(DASH))

def query(expr):
    q = urllib.parse.urlencode({"query": expr, "start": T0, "end": T1, "step": STEP})
    with urllib.request.urlopen(f"{PROM}/api/v1/query_range?{q}") as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise SystemExit(f"query failed: {expr}: {body}")
    return body["data"]["result"]

def legend(fmt, labels):
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt or "").strip() or \
        "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items() if k != "__name__") + "}"

panels, empty = [], []
for p in dash["panels"]:
    if p["type"] == "row":
        panels.append({"type": "row", "title": p["title"], "grid": p["gridPos"]})
        continue
    series = []
    for t in p.get("targets", []):
        for r in query(t["expr"]):
            pts = {int(float(ts)): float(v) for ts, v in r["values"] if v not in ("NaN", "+Inf", "-Inf")}
            if not pts:
                continue
            series.append({"name": legend(t.get("legendFormat"), r["metric"]), "points": pts})
    if not series:
        empty.append(p["title"])
    series.sort(key=lambda s: s["name"])
    panels.append({"type": "timeseries", "title": p["title"], "grid": p["gridPos"],
                   "unit": p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short"),
                   "series": series})

xs = list(range(T0, T1 + 1, STEP))
data = {"xs": xs, "panels": panels, "title": dash["title"], "minutes": round((T1 - T0) / 60)}
uplot_js = open(f"{UPLOT}/uPlot.iife.min.js").read()
uplot_css = open(f"{UPLOT}/uPlot.min.css").read()
html = open(PAGE).read().replace("/*UPLOT_CSS*/", uplot_css).replace("/*UPLOT_JS*/", uplot_js) \
    .replace("/*DATA*/", "const DATA = " + json.dumps(data) + ";")
open(OUT, "w").write(html)
print("panels without data:", empty if empty else "none")
