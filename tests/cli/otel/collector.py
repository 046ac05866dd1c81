"""A minimal OTLP/HTTP trace collector for tests/cli/otel.rs: decodes each `POST /v1/traces`
with the `opentelemetry-proto` package's ExportTraceServiceRequest (the protobuf classes the
OpenTelemetry Python SDK itself encodes with) and prints one JSON line per span on stdout:
{trace_id, span_id, parent_span_id, name, kind, start, end, status, attributes, service}.

Prints its port first. Runs until stdin closes.
"""

import gzip
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

lock = threading.Lock()


def value(any_value):
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    v = getattr(any_value, kind)
    if kind == "array_value":
        return [value(x) for x in v.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.values}
    if kind == "bytes_value":
        return v.hex()
    return v


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_response(415)
            self.end_headers()
            return
        encoding = self.headers.get("Content-Encoding")
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding is not None:
            self.send_response(415)
            self.end_headers()
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        lines = []
        for rs in request.resource_spans:
            resource = {kv.key: value(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for span in ss.spans:
                    lines.append(json.dumps({
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "name": span.name,
                        "kind": span.kind,
                        "start": span.start_time_unix_nano,
                        "end": span.end_time_unix_nano,
                        "status": span.status.code,
                        "events": [e.name for e in span.events],
                        "attributes": {kv.key: value(kv.value) for kv in span.attributes},
                        "service": resource.get("service.name"),
                        "auth": self.headers.get("Authorization"),
                        "encoding": encoding,
                    }))
        with lock:
            for line in lines:
                print(line, flush=True)
        data = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
threading.Thread(target=server.serve_forever, daemon=True).start()
sys.stdin.read()
server.shutdown()
