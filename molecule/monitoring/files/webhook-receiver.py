#!/usr/bin/python3
"""A webhook endpoint for Alertmanager: appends each notification's JSON body, one per line, to a file."""

import http.server
import sys

LOG = sys.argv[2]


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(LOG, "ab") as handle:
            handle.write(body.replace(b"\n", b" ") + b"\n")
        self.send_response(200)
        self.end_headers()


http.server.HTTPServer(("", int(sys.argv[1])), Handler).serve_forever()
