# Evaluates every query of the Grafana dashboard JSON on a real Prometheus, as Grafana's
# Prometheus data source does (GET /api/v1/query_range, start/end aligned to the step), and
# writes the dashboard and the answers to one JS file the page loads.
#
#   python3 fetch_data.py DASHBOARD.json PROM_URL FROM_UNIX TO_UNIX STEP_SECS OUT.js
import json, sys, urllib.parse, urllib.request

dash_path, prom, t0, t1, step, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
dash = json.load(open(dash_path))
start, end = t0 - t0 % step, t1 - t1 % step


def query_range(expr):
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{q}", timeout=60) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise SystemExit(f"query failed: {expr}: {body}")
    return body["data"]["result"]


results, empty = {}, []
for p in dash["panels"]:
    if p.get("type") == "row":
        continue
    answers = []
    for t in p.get("targets", []):
        series = []
        for r in query_range(t["expr"]):
            pts = [[int(float(ts)) * 1000, None if v in ("NaN", "+Inf", "-Inf") else float(v)] for ts, v in r["values"]]
            if any(v is not None for _, v in pts):
                series.append({"metric": r["metric"], "values": pts})
        answers.append({"refId": t.get("refId"), "series": series})
    results[str(p["id"])] = answers
    if not any(a["series"] for a in answers):
        empty.append(p["title"])

doc = {"dashboard": dash, "from": start * 1000, "to": end * 1000, "step": step, "results": results}
with open(out, "w") as f:
    f.write("window.DASH_DATA = " + json.dumps(doc) + ";\n")
print("panels without data:", ", ".join(empty) if empty else "none")
