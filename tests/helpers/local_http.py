"""A real OpenAI-compatible HTTP endpoint on 127.0.0.1 for client tests (stdlib, one thread).

Subclass and implement ``respond(body, headers) -> (status, json_obj, extra_headers)`` (``self.path``
is the request's path); the server records every request body and the peak number in flight.
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LocalJSONServer:
    def __init__(self):
        self.bodies, self.headers, self.lock = [], [], threading.Lock()
        self.in_flight = self.peak = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.bodies.append(body)
                    outer.headers.append(dict(self.headers))
                    outer.in_flight += 1
                    outer.peak = max(outer.peak, outer.in_flight)
                try:
                    outer.path = self.path
                    status, obj, extra = outer.respond(body, self.headers)
                    data = json.dumps(obj).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in (extra or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                finally:
                    with outer.lock:
                        outer.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def respond(self, body, headers):
        raise TypeError(f"{type(self).__name__} must implement respond(body, headers)")

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
