"""A real LSP client (pygls) driving `trellis lsp` over stdio, for tests/cli/lsp.rs.

Usage: client.py TRELLIS_BINARY PROJECT_DIR SCRIPT.json

The script is a list of steps; each step is one request or notification, and what it
returned (or the diagnostics published after it) is printed as one JSON line, so the Rust
test asserts on real answers of the real binary.
"""
import asyncio
import json
import sys
from pathlib import Path

from lsprotocol import types as t
from pygls.lsp.client import LanguageClient


def uri(path):
    return Path(path).resolve().as_uri()


async def main(binary, project, script):
    client = LanguageClient("trellis-test", "1")
    diagnostics = {}
    # The document version each file's last diagnostics were for (None: not an open buffer's).
    diagnostic_versions = {}
    # How many times each file's diagnostics were published.
    publish_counts = {}
    published = asyncio.Event()

    @client.feature(t.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def on_diagnostics(params):
        diagnostics[params.uri] = params.diagnostics
        diagnostic_versions[params.uri] = params.version
        publish_counts[params.uri] = publish_counts.get(params.uri, 0) + 1
        published.set()

    await client.start_io(binary, "lsp")
    root = uri(project)
    result = await client.initialize_async(
        t.InitializeParams(
            capabilities=t.ClientCapabilities(workspace=t.WorkspaceClientCapabilities(
                did_change_watched_files=t.DidChangeWatchedFilesClientCapabilities(
                    dynamic_registration=True))),
            root_uri=root,
            workspace_folders=[t.WorkspaceFolder(uri=root, name="project")],
        )
    )
    out = {"step": "initialize", "server": result.server_info.name,
           "completion": result.capabilities.completion_provider is not None,
           "rename": result.capabilities.rename_provider is not None}
    print(json.dumps(out), flush=True)
    client.initialized(t.InitializedParams())
    versions = {}

    for step in script:
        kind = step["do"]
        doc = uri(Path(project) / step["file"]) if "file" in step else None
        pos = t.Position(line=step.get("line", 0), character=step.get("character", 0))
        ident = t.TextDocumentIdentifier(uri=doc) if doc else None
        if kind in ("open", "change", "write"):
            published.clear()
            versions[doc] = versions.get(doc, 0) + 1
            if kind == "write":
                # Changed on disk behind the editor, which tells the server.
                (Path(project) / step["file"]).write_text(step["text"])
                client.workspace_did_change_watched_files(t.DidChangeWatchedFilesParams(
                    changes=[t.FileEvent(uri=doc, type=t.FileChangeType.Changed)]))
            elif kind == "open":
                text = step.get("text")
                if text is None:
                    text = (Path(project) / step["file"]).read_text()
                client.text_document_did_open(t.DidOpenTextDocumentParams(
                    text_document=t.TextDocumentItem(uri=doc, language_id="kdl",
                                                     version=versions[doc], text=text)))
            else:
                client.text_document_did_change(t.DidChangeTextDocumentParams(
                    text_document=t.VersionedTextDocumentIdentifier(uri=doc, version=versions[doc]),
                    content_changes=[t.TextDocumentContentChangeWholeDocument(text=step["text"])]))
            # Every file of the project gets its list; wait until they stop coming.
            await asyncio.wait_for(published.wait(), 20)
            while True:
                published.clear()
                try:
                    await asyncio.wait_for(published.wait(), 0.5)
                except asyncio.TimeoutError:
                    break
            got = {}
            for u, ds in diagnostics.items():
                got[Path(u.removeprefix("file://")).name] = [
                    {"line": d.range.start.line, "character": d.range.start.character,
                     "severity": int(d.severity) if d.severity else None,
                     "code": d.code, "message": d.message} for d in ds]
            versions_seen = {Path(u.removeprefix("file://")).name: v
                             for u, v in diagnostic_versions.items()}
            counts = {Path(u.removeprefix("file://")).name: n for u, n in publish_counts.items()}
            print(json.dumps({"step": kind, "diagnostics": got, "versions": versions_seen,
                              "published": counts}), flush=True)
        elif kind == "complete":
            r = await client.text_document_completion_async(
                t.CompletionParams(text_document=ident, position=pos))
            items = r if isinstance(r, list) else (r.items if r else [])
            edits = {}
            for i in items:
                e = i.text_edit
                if isinstance(e, t.TextEdit):
                    edits[i.label] = {"text": e.new_text,
                                      "start": [e.range.start.line, e.range.start.character],
                                      "end": [e.range.end.line, e.range.end.character]}
            inserts = {i.label: i.insert_text for i in items if i.insert_text is not None}
            print(json.dumps({"step": kind, "labels": [i.label for i in items],
                              "edits": edits, "inserts": inserts}), flush=True)
        elif kind == "hover":
            r = await client.text_document_hover_async(
                t.HoverParams(text_document=ident, position=pos))
            span = None
            if r and r.range:
                span = [[r.range.start.line, r.range.start.character],
                        [r.range.end.line, r.range.end.character]]
            print(json.dumps({"step": kind, "text": r.contents.value if r else None,
                              "range": span}), flush=True)
        elif kind == "definition":
            r = await client.text_document_definition_async(
                t.DefinitionParams(text_document=ident, position=pos))
            locs = r if isinstance(r, list) else ([r] if r else [])
            print(json.dumps({"step": kind, "locations": [
                {"file": Path(l.uri.removeprefix("file://")).name, "line": l.range.start.line,
                 "character": l.range.start.character} for l in locs]}), flush=True)
        elif kind == "references":
            r = await client.text_document_references_async(t.ReferenceParams(
                text_document=ident, position=pos,
                context=t.ReferenceContext(include_declaration=True)))
            print(json.dumps({"step": kind, "locations": [
                {"file": Path(l.uri.removeprefix("file://")).name, "line": l.range.start.line}
                for l in (r or [])]}), flush=True)
        elif kind == "rename":
            try:
                r = await client.text_document_rename_async(t.RenameParams(
                    text_document=ident, position=pos, new_name=step["to"]))
            except Exception as refusal:  # the server's error answer: the refusal's message
                print(json.dumps({"step": kind, "refused": str(refusal)}), flush=True)
                continue
            edits, texts = {}, {}
            for u, es in ((r.changes or {}) if r else {}).items():
                edits[Path(u.removeprefix("file://")).name] = len(es)
                texts[Path(u.removeprefix("file://")).name] = sorted(e.new_text for e in es)
            print(json.dumps({"step": kind, "edits": edits, "texts": texts}), flush=True)
        elif kind == "format":
            r = await client.text_document_formatting_async(t.DocumentFormattingParams(
                text_document=ident, options=t.FormattingOptions(tab_size=4, insert_spaces=True)))
            print(json.dumps({"step": kind, "edits": [
                {"line": e.range.start.line, "end": e.range.end.line, "text": e.new_text}
                for e in (r or [])]}), flush=True)
        elif kind == "symbols":
            r = await client.text_document_document_symbol_async(
                t.DocumentSymbolParams(text_document=ident))
            def walk(s):
                return {"name": s.name, "kind": int(s.kind),
                        "children": [walk(c) for c in (s.children or [])]}
            print(json.dumps({"step": kind, "symbols": [walk(s) for s in (r or [])]}), flush=True)
        else:
            raise SystemExit(f"unknown step {kind}")

    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    print(json.dumps({"step": "exit"}), flush=True)


if __name__ == "__main__":
    binary, project, script = sys.argv[1:4]
    asyncio.run(main(binary, project, json.loads(Path(script).read_text())))
