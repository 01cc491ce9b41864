"""A loopback HTTP server that answers the way the Hugging Face Hub does, for huggingface-hub.

It serves folders as repos: the model-info API (``/api/models/{repo}/revision/{rev}``) and file
downloads (``/{repo}/resolve/{rev}/{file}``, HEAD and GET, with Range). Repos can be marked gated
or missing to test the errors. Only 127.0.0.1 is bound; every request is logged for the tests.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, Path] = {}
        self.gated: set[str] = set()
        self.cut: dict[str, list[int]] = {}  # file name → for each coming GET, bytes sent before the connection drops
        self.log: list[tuple[str, str]] = []
        self.sha = COMMIT  # the commit the model-info API answers
        self.etags: dict[str, list[str | None]] = {}  # file name → for each coming request, the ETag to send
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def do_GET(self) -> None:
                self._serve(body=True)

            def _error(self, code: int, error_code: str, message: str) -> None:
                data = json.dumps({"error": message}).encode()
                self.send_response(code)
                self.send_header("X-Error-Code", error_code)
                self.send_header("X-Error-Message", message)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command == "GET":
                    self.wfile.write(data)

            def _serve(self, body: bool) -> None:
                path = self.path.split("?")[0]
                if "Range" in self.headers:
                    hub.log.append(("RANGE-HEADER", self.headers["Range"]))
                hub.log.append((self.command, path))
                if m := re.fullmatch(r"/api/models/([\w.-]+/[\w.-]+)(?:/revision/([^/]+))?", path):
                    repo, rev = m.group(1), m.group(2) or "main"
                    if self._check(repo, rev):
                        self._info(repo)
                elif m := re.fullmatch(r"/api/models/([\w.-]+/[\w.-]+)/tree/([^/]+)", path):
                    repo, rev = m.groups()
                    if self._check(repo, rev):
                        self._tree(repo)
                elif m := re.fullmatch(r"/([\w.-]+/[\w.-]+)/resolve/([^/]+)/(.+)", path):
                    repo, rev, name = m.groups()
                    if self._check(repo, rev):
                        self._file(repo, name, body)
                else:
                    self._error(404, "EntryNotFound", f"no route {path}")

            def _check(self, repo: str, rev: str) -> bool:
                token = "authorization" in {k.lower() for k in self.headers}
                if repo in hub.gated and not token:
                    self._error(401, "GatedRepo", f"Access to model {repo} is restricted. You must have access "
                                                  "to it and be authenticated to access it. Please log in.")
                elif repo in hub.gated:  # a token, but its user has not been granted access
                    self._error(403, "GatedRepo", f"Access to model {repo} is restricted and you are not in "
                                                  "the authorized list.")
                elif repo not in hub.repos:
                    self._error(404, "RepoNotFound", f"Repository {repo} not found")
                elif rev not in ("main", COMMIT):
                    self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                else:
                    return True
                return False

            def _info(self, repo: str) -> None:
                files = sorted(p.name for p in hub.repos[repo].iterdir() if p.is_file())
                self._json({"id": repo, "modelId": repo, "sha": hub.sha, "private": False,
                            "siblings": [{"rfilename": f} for f in files]})

            def _tree(self, repo: str) -> None:
                files = sorted(p for p in hub.repos[repo].iterdir() if p.is_file())
                self._json([{"type": "file", "path": p.name, "size": p.stat().st_size,
                             "oid": hashlib.sha1(p.read_bytes()).hexdigest()} for p in files])

            def _json(self, obj: object) -> None:
                data = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _file(self, repo: str, name: str, body: bool) -> None:
                file = hub.repos[repo] / name
                if "/" in name or not file.is_file():
                    self._error(404, "EntryNotFound", f"{name} does not exist at {COMMIT}")
                    return
                data = file.read_bytes()
                start = 0
                if rng := re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "")):
                    start = int(rng.group(1))
                    hub.log.append(("RANGE", f"{name}@{start}"))
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", COMMIT)
                etag = hub.etags[name].pop(0) if hub.etags.get(name) else None
                self.send_header("ETag", '"' + (etag or hashlib.sha256(data).hexdigest()) + '"')
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if body and hub.cut.get(name):  # cut off part-way: some bytes, then hang up
                    self.wfile.write(data[start:start + hub.cut[name].pop(0)])
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    self.close_connection = True
                elif body:
                    self.wfile.write(data[start:])

        return Handler
