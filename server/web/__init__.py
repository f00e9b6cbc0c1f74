"""The web view: pages that show jobs live in a browser, served by the HTTP app and by `conclave web`.

`routes.py` holds the pages, the JSON snapshot, the event stream and cancel; `auth.py` the one check
every request passes (token or session cookie, Host and Origin, CSRF on POST); `snapshot.py` builds
what a page shows from the job store; `static/` the HTML, one script and one stylesheet, shipped in
the wheel (no CDN, no build step).
"""
