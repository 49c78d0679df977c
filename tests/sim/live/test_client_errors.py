"""``edgepop replay``'s gateway client: a refusal names the gateway's reason, and the flag to check for auth."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from edgepop.errors import UserError
from sim.live.client import fetch_deployment


class _Refusing(BaseHTTPRequestHandler):
    status = 401

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = json.dumps({"success": False, "errors": [{"code": 10000, "message": "Authentication error"}]}).encode()
        self.send_response(self.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("status, hint", [(401, "(check --token)"), (429, "")])
def test_a_refused_operations_call_names_the_gateways_reason(status, hint):
    handler = type("H", (_Refusing,), {"status": status})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(UserError) as err:
            fetch_deployment(url, token="wrong-token")
    finally:
        server.shutdown()
        server.server_close()
    text = str(err.value)
    assert text.startswith(f"{url}: /edgepop/deployment answered {status}: Authentication error")
    assert text.endswith(hint) if hint else "--token" not in text  # (only auth refusals point at the token)
