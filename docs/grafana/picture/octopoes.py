# A stand-in Octopoes for the picture: GET /{org}/objects pages of Hostname objects.
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse, parse_qs
N = {"org1": 4000, "org2": 3000, "org3": 2000}
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        u = urlparse(self.path); parts = u.path.strip("/").split("/"); q = parse_qs(u.query)
        if len(parts) == 2 and parts[1] == "objects":
            org = parts[0]; n = N.get(org, 0)
            off = int(q.get("offset", ["0"])[0]); lim = int(q.get("limit", ["1000"])[0])
            items = []
            for i in range(off, min(n, off + lim)):
                ref = f"Hostname|internet|{org}-h{i}.example.com"
                items.append({"object_type": "Hostname", "primary_key": ref, "user_id": None,
                    "scan_profile": {"scan_profile_type": "declared", "reference": ref, "level": 2, "user_id": None},
                    "name": ref.rsplit("|", 1)[1]})
            body = json.dumps({"count": n, "items": items}).encode()
            self.send_response(200)
        elif len(parts) == 2 and parts[1] == "health":
            body = b'{"service":"octopoes","healthy":true}'; self.send_response(200)
        else:
            body = b'{"detail":"Not Found"}'; self.send_response(404)
        self.send_header("content-type", "application/json"); self.send_header("content-length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
