"""A third-party agent instrumented with the OpenTelemetry Python SDK, for tests/cli/otel.rs.

It speaks plain JSON over HTTP (`POST /chat` {"message": …} → {"reply": …}) and never shows
its tool calls on the wire: they are only in its spans, GenAI `execute_tool` spans under an
`invoke_agent` span that continues the caller's `traceparent`. Spans go to
OTEL_EXPORTER_OTLP_ENDPOINT through the SDK's own OTLP/HTTP protobuf exporter and batch
processor (OTEL_BSP_SCHEDULE_DELAY decides how late they arrive).

"weather in CITY" looks the city up, then fetches weather and time in parallel (two
threads, overlapping spans); "refund ORDER" calls `refund`; anything else calls no tool.
A message starting "quiet" is answered without any span.
Prints its port on the first line of stdout.
"""

import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry import context, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagate import extract
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent"}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("weather-agent")


def tool(name, call_id, args, result, seconds, together=None):
    with tracer.start_as_current_span(f"execute_tool {name}") as span:
        span.set_attribute("gen_ai.operation.name", "execute_tool")
        span.set_attribute("gen_ai.tool.name", name)
        span.set_attribute("gen_ai.tool.call.id", call_id)
        span.set_attribute("gen_ai.tool.call.arguments", json.dumps(args))
        if together is not None:
            together.wait()  # both parallel calls have started: their spans overlap
        time.sleep(seconds)
        span.set_attribute("gen_ai.tool.call.result", json.dumps(result))
        return result


def answer(message):
    words = message.split()
    if "weather" in words and "in" in words:
        city = words[words.index("in") + 1].strip("?.!")
        tool("lookup_city", "c1", {"city": city}, {"id": city.lower()}, 0.01)
        ctx = trace.set_span_in_context(trace.get_current_span())
        together = threading.Barrier(2)

        def parallel(name, call_id, result):
            token = context.attach(ctx)
            try:
                return tool(name, call_id, {"city": city}, result, 0.02, together)
            finally:
                context.detach(token)

        # Two threads of this request's own: the calls really run at the same time.
        with ThreadPoolExecutor(max_workers=2) as pool:
            weather = pool.submit(parallel, "get_weather", "c2", {"sky": "sunny"})
            clock = pool.submit(parallel, "get_time", "c3", {"time": "12:00"})
            return f"It is {weather.result()['sky']} in {city} at {clock.result()['time']}."
    if words and words[0] == "refund":
        tool("refund", "c9", {"order": words[1]}, {"ok": True}, 0.01)
        return f"Refunded {words[1]}."
    return "Hello!"


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        # AGENT_NO_PROPAGATION=1: an agent that does not continue the caller's trace (its
        # spans arrive in traces of their own).
        parent = None if os.environ.get("AGENT_NO_PROPAGATION") else extract(dict(self.headers))
        message = body.get("message", "")
        if message.startswith("quiet"):
            # A turn the agent traces nothing of (a cached answer, say).
            reply = "Shh."
        else:
            with tracer.start_as_current_span(
                "invoke_agent weather-agent", context=parent, kind=trace.SpanKind.SERVER
            ) as span:
                span.set_attribute("gen_ai.operation.name", "invoke_agent")
                span.set_attribute("gen_ai.agent.name", "weather-agent")
                reply = answer(message)
        data = json.dumps({"reply": reply}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
threading.Thread(target=server.serve_forever, daemon=True).start()
try:
    sys.stdin.read()  # runs until the test closes stdin (or kills it)
finally:
    server.shutdown()
    provider.shutdown()
