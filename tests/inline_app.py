"""A bare WSGI app for the InlineWorker tests (tests/test_workers.py): it answers with
the serving process, the client's port and the body it read; `/boom` raises, `/sleep`
sleeps."""

import json
import os
import time


def app(environ, start_response):
    if environ["PATH_INFO"] == "/boom":
        raise RuntimeError("boom")
    if environ["PATH_INFO"] == "/sleep":  # a slow request of any kind: `s` seconds, at most 3
        query = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
        time.sleep(min(3.0, float(query.get("s", "0"))))
    if environ["PATH_INFO"].startswith("/v1/tools/invocations/"):
        # A long poll: it waits `wait` seconds (at most 3) before it answers.
        query = dict(p.split("=", 1) for p in environ["QUERY_STRING"].split("&") if "=" in p)
        time.sleep(min(3.0, float(query.get("wait", "0"))))
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    answer = json.dumps(
        {
            "pid": os.getpid(),
            "port": int(environ["REMOTE_PORT"]),
            "path": environ["PATH_INFO"],
            "body": body.decode(),
        }
    ).encode()
    start_response(
        "200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(answer)))]
    )
    return [answer]
