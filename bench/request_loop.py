"""The child script the egress benches run inside a member's container: N sequential requests to a fake
provider, printing each one's time in ms as JSON (urllib follows HTTP_PROXY when it is set), the first
(a cold connection) left out. Plain text here, so a bench can import it before it chooses its tree."""

# the requests, timed into `times` (the first, cold, included); a script goes on from there
TIMED = r"""
import json, sys, time, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
body = json.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}).encode()
headers = {"content-type": "application/json", "x-api-key": "k", "anthropic-version": "2023-06-01"}
times = []
for _ in range(n + 1):
    started = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=30) as r:
        r.read()
    times.append((time.perf_counter() - started) * 1000)
"""
LOOP = TIMED + "print(json.dumps(times[1:]))\n"
