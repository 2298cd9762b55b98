"""A stand-in for gpuhunt's published catalog: real HTTP on 127.0.0.1, the same paths and files.

    GET /v3/{provider}/version                -> "YYYYMMDD-N\\n"
    GET /v3/{provider}/{version}/catalog.zip  -> a zip holding {provider}.csv (gpuhunt's v2 columns)

Each provider can be made to misbehave the ways a real download does: an HTTP error, a body cut
short (Content-Length promises more than is sent, then the connection closes), bytes that are not a
zip, a zip without the CSV, a CSV that is not a gpuhunt catalog. `requests` records every path asked for.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import threading
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# gpuhunt's CATALOG_V2_FIELDS, in its order (the conformance test checks them against gpuhunt's own).
FIELDS = ["instance_name", "location", "price", "cpu", "memory", "gpu_count", "gpu_name", "gpu_memory", "spot",
          "disk_size", "gpu_vendor", "flags", "cpu_arch", "provider_data"]
# Published today: not older than any bundled row's date, so refreshed rows win over them.
PUBLISHED = dt.date.today()
VERSION = f"{PUBLISHED:%Y%m%d}-7"
MODES = ("ok", "http-500", "truncated", "not-a-zip", "no-member", "not-a-catalog", "bad-version")


def row(name: str, location: str, price: float, cpu: int, memory: float, *, gpu: str | None = None, count: int = 0,
        gpu_memory: float | None = None, spot: bool = False, vendor: str | None = None, flags: str = "",
        arch: str = "x86") -> dict[str, str]:
    return {
        "instance_name": name, "location": location, "price": str(price), "cpu": str(cpu), "memory": str(memory),
        "gpu_count": str(count), "gpu_name": gpu or "", "gpu_memory": "" if gpu_memory is None else str(gpu_memory),
        "spot": str(spot), "disk_size": "", "gpu_vendor": vendor or ("nvidia" if count else ""), "flags": flags,
        "cpu_arch": arch, "provider_data": "{}",
    }


def repriced(rows: Iterable[Mapping[str, str]], factor: float) -> list[dict[str, str]]:
    """The same rows at prices times `factor` (a later collection)."""
    return [{**r, "price": str(round(float(r["price"]) * factor, 6))} if _is_number(r["price"]) else dict(r) for r in rows]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def to_csv(rows: Iterable[Mapping[str, str]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow(r)
    return buffer.getvalue()


def zipped(provider: str, text: str, member: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(member or f"{provider}.csv", text)
    return buffer.getvalue()


@dataclass
class Published:
    text: str
    version: str = VERSION
    mode: str = "ok"


@dataclass
class FakeGpuhunt:
    """Serve `catalogs` (provider -> Published) until stop(); `base` is what GPUHUNT_CATALOG_URL takes."""

    catalogs: dict[str, Published] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def base(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v3"

    def publish(self, provider: str, rows: Iterable[Mapping[str, str]], version: str = VERSION) -> None:
        self.catalogs[provider] = Published(to_csv(rows), version)

    def set_mode(self, provider: str, mode: str) -> None:
        assert mode in MODES, mode
        self.catalogs[provider].mode = mode

    def start(self) -> FakeGpuhunt:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                fake.requests.append(self.path)
                parts = self.path.strip("/").split("/")
                published = fake.catalogs.get(parts[1]) if len(parts) >= 3 and parts[0] == "v3" else None
                if published is None:
                    return self._send(404, b"NoSuchKey")
                provider = parts[1]
                if parts[2:] == ["version"]:
                    if published.mode == "bad-version":
                        return self._send(200, b"../../etc\n")
                    return self._send(200, f"{published.version}\n".encode())
                if parts[2:] != [published.version, "catalog.zip"]:
                    return self._send(404, b"NoSuchKey")
                if published.mode == "http-500":
                    return self._send(500, b"InternalError")
                body = zipped(provider, published.text)
                if published.mode == "truncated":
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return None
                if published.mode == "not-a-zip":
                    body = b"<html>captive portal</html>"
                elif published.mode == "no-member":
                    body = zipped(provider, published.text, member="other.csv")
                elif published.mode == "not-a-catalog":
                    body = zipped(provider, "name,price\nx,1\n")
                return self._send(200, body, "application/zip")

            def _send(self, code: int, body: bytes, kind: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-gpuhunt", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


# A small catalog in the shape gpuhunt publishes, with each case the conversion has to handle.
AWS_ROWS = [
    row("g4dn.xlarge", "us-east-1", 0.5, 4, 16.0, gpu="T4", count=1, gpu_memory=16.0),
    row("g4dn.xlarge", "us-east-1", 0.19, 4, 16.0, gpu="T4", count=1, gpu_memory=16.0, spot=True),
    row("g4dn.xlarge", "us-east-2", 0.5, 4, 16.0, gpu="T4", count=1, gpu_memory=16.0),
    row("g4dn.xlarge", "us-west-2", 0.5, 4, 16.0, gpu="T4", count=1, gpu_memory=16.0),
    row("g4dn.xlarge", "eu-west-1", 0.56, 4, 16.0, gpu="T4", count=1, gpu_memory=16.0),
    row("g4dn.xlarge", "ap-south-1", 0.55, 4, 16.0, gpu="T4", count=1, gpu_memory=16.0),
    row("g6.xlarge", "us-east-1", 0.8048, 4, 16.0, gpu="L4", count=1, gpu_memory=24.0),
    row("g6.xlarge", "us-east-1", 0.33, 4, 16.0, gpu="L4", count=1, gpu_memory=24.0, spot=True),
    row("m5.large", "us-east-1", 0.096, 2, 8.0),
    row("m5.large", "ap-south-1", 0.101, 2, 8.0),
    row("g5g.xlarge", "us-east-1", 0.42, 4, 8.0, gpu="T4G", count=1, gpu_memory=16.0, arch="arm"),
    row("p5.4xlarge", "us-east-1", 6.88, 16, 256.0, gpu="H100", count=1, gpu_memory=80.0, spot=True),
    row("inf2.xlarge", "us-east-1", 0.76, 4, 16.0, gpu="Inferentia2", count=1, gpu_memory=32.0, vendor="aws"),
]
GCP_ROWS = [
    # One price in every zone of us-central1 -> one region row.
    row("g2-standard-4", "us-central1-a", 0.7068, 4, 16.0, gpu="L4", count=1, gpu_memory=24.0),
    row("g2-standard-4", "us-central1-b", 0.7068, 4, 16.0, gpu="L4", count=1, gpu_memory=24.0),
    row("g2-standard-4", "us-central1-a", 0.25, 4, 16.0, gpu="L4", count=1, gpu_memory=24.0, spot=True),
    row("g2-standard-4", "us-central1-b", 0.25, 4, 16.0, gpu="L4", count=1, gpu_memory=24.0, spot=True),
    # An N1 machine with an attached T4: gpuhunt names it by the machine alone.
    row("n1-standard-4", "us-central1-a", 0.54, 4, 15.0, gpu="T4", count=1, gpu_memory=16.0),
    row("n1-standard-4", "us-central1-a", 0.14, 4, 15.0, gpu="T4", count=1, gpu_memory=16.0, spot=True),
    # Spot prices that differ between zones -> a row per zone.
    row("e2-standard-4", "us-east1-b", 0.134, 4, 16.0),
    row("e2-standard-4", "us-east1-c", 0.134, 4, 16.0),
    row("e2-standard-4", "us-east1-b", 0.04, 4, 16.0, spot=True),
    row("e2-standard-4", "us-east1-c", 0.05, 4, 16.0, spot=True),
    row("e2-standard-4", "europe-west4-a", 0.1477, 4, 16.0),
    # A calendar-mode (reservation) price and a TPU: not for us.
    row("a3-highgpu-1g", "us-central1-a", 3.1, 26, 234.0, gpu="H100", count=1, gpu_memory=80.0,
        flags="gcp-dws-calendar-mode"),
    row("v5litepod-1", "us-central1-a", 1.2, 24, 48.0, gpu="v5litepod", count=1, gpu_memory=16.0, vendor="google"),
]
AZURE_ROWS = [
    row("Standard_NC4as_T4_v3", "eastus", 0.526, 4, 28.0, gpu="T4", count=1, gpu_memory=16.0),
    row("Standard_NC4as_T4_v3", "eastus", 0.1, 4, 28.0, gpu="T4", count=1, gpu_memory=16.0, spot=True),
    row("Standard_NC4as_T4_v3", "westus2", 0.526, 4, 28.0, gpu="T4", count=1, gpu_memory=16.0),
    row("Standard_NC4as_T4_v3", "westeurope", 0.602, 4, 28.0, gpu="T4", count=1, gpu_memory=16.0),
    row("Standard_D4s_v6", "eastus", 0.202, 4, 16.0),
    {**row("Standard_D2s_v6", "eastus", 0.1, 2, 8.0), "cpu": "two"},  # malformed: left out, counted
]


def publish_all(fake: FakeGpuhunt, version: str = VERSION) -> None:
    fake.publish("aws", AWS_ROWS, version)
    fake.publish("gcp", GCP_ROWS, version)
    fake.publish("azure", AZURE_ROWS, version)
