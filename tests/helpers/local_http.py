"""Local HTTP endpoints on 127.0.0.1 for client tests (stdlib).

- :class:`LocalJSONServer`: a real OpenAI-compatible endpoint. Subclass and implement
  ``respond(body, headers) -> (status, json_obj, extra_headers)`` (``self.path`` is the request's
  path); the server records every request body and the peak number in flight.
- :class:`RawServer`: answers with scripted raw bytes, to play a misbehaving server
  (:func:`http_response` builds them).
"""

import json
import socketserver
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


def http_response(status_line: str, body: bytes, headers=(), length=None) -> bytes:
    head = [status_line, "Content-Type: application/json", f"Content-Length: {len(body) if length is None else length}",
            *headers, "", ""]
    return "\r\n".join(head).encode() + body


class RawServer:
    """A TCP server that answers the n-th request with ``script[n]`` raw bytes (the last one repeats)
    and then closes the connection; it can lie about lengths, garble status lines, and so on."""

    def __init__(self, script):
        self.script, self.requests = list(script), 0
        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                length = 0
                while True:
                    line = self.rfile.readline()
                    if line in (b"\r\n", b"\n", b""):
                        break
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                self.rfile.read(length)
                n = outer.requests
                outer.requests += 1
                self.wfile.write(outer.script[min(n, len(outer.script) - 1)])
                self.wfile.flush()

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
