"""The web view: pages that show jobs live in a browser, served by the HTTP app and by `conclave web`.

`routes.py` holds the pages, signing in and out, the JSON snapshot, the event stream and cancel; `auth.py`
the one check every data request passes (Host and Origin, a bearer token or a session header);
`sessions.py` the one-time sign-in codes and the sessions; `body_limit.py` the cap on every request body
(the HTTP app's too); `snapshot.py` builds what a page shows from the job store; `static/` the HTML, one
script and one stylesheet, shipped in the wheel (no CDN, no build step).
"""
