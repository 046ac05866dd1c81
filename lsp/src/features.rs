//! The answers to what the editor asks about a position or a document: completion, hover,
//! definition, references, rename, formatting and document symbols.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use lsp_types::*;
use trellis_dsl::lang::{self, ProtocolSpec, ValueType};

use crate::analysis::{self, Index, Place};
use crate::server::{FileView, ProjectAt, Server, to_path, to_uri};
use crate::syntax::{self, Node};

impl Server {
    pub(crate) fn completion(
        &self,
        p: CompletionParams,
    ) -> Result<Option<CompletionResponse>, String> {
        let pos = p.text_document_position;
        let Some(path) = to_path(&pos.text_document.uri) else {
            return Ok(None);
        };
        let Some(view) = self.view(&path) else {
            return Ok(None);
        };
        let offset = view.lines.offset(&view.text, pos.position);
        // Words typed in a comment are prose, not nodes.
        if syntax::in_comment(&view.text, offset) {
            return Ok(None);
        }
        let protocols = &self.config.protocols;
        let mut items = Vec::new();
        match analysis::place(&view.nodes, &view.text, offset) {
            Place::NodeName { parent, chain } => {
                let specs: Vec<&'static lang::NodeSpec> = match parent {
                    None => lang::top_level().to_vec(),
                    Some(parent) => {
                        let chain_specs = analysis::specs_of(&chain, protocols);
                        if chain_specs.len() < chain.len() {
                            Vec::new()
                        } else {
                            match chain_specs.last() {
                                Some(spec) if spec.name == "agent" => {
                                    analysis::agent_settings_left(parent, spec, protocols)
                                }
                                Some(spec) => analysis::child_specs(parent, spec, protocols),
                                None => Vec::new(),
                            }
                        }
                    }
                };
                // A node that may be written once in its block is not offered again there
                // (the one being typed, under the cursor, does not count).
                let specs: Vec<_> = match parent {
                    None => specs,
                    Some(parent) => specs
                        .into_iter()
                        .filter(|s| {
                            s.repeatable
                                || !parent.children().any(|c| {
                                    c.name == s.name
                                        && !(c.name_span.start..=c.name_span.end).contains(&offset)
                                })
                        })
                        .filter(|s| parent.name != "scenario" || scenario_takes(parent, s, offset))
                        .collect(),
                };
                for spec in specs {
                    items.push(CompletionItem {
                        label: spec.name.to_string(),
                        kind: Some(CompletionItemKind::KEYWORD),
                        detail: Some(spec.usage()),
                        documentation: Some(Documentation::String(spec.help.to_string())),
                        ..Default::default()
                    });
                }
            }
            Place::Entry { node, chain } => {
                let specs = analysis::specs_of(&chain, protocols);
                // Right after `KEY=` (`=` triggers completion): the property's values,
                // quoted; property names there made `protocol=url=`.
                let key = view.text[..offset].strip_suffix('=').and_then(|before| {
                    let key = before
                        .rsplit(|c: char| c.is_whitespace() || matches!(c, '{' | ';' | '"'))
                        .next()
                        .unwrap_or_default();
                    (!key.is_empty()).then_some(key)
                });
                if let Some(key) = key {
                    if let (Some(spec), true) = (specs.last(), specs.len() == chain.len()) {
                        let ty = analysis::property_names(node, spec, protocols)
                            .into_iter()
                            .find(|(name, _, _)| *name == key)
                            .map(|(_, _, ty)| ty);
                        let (_, index) = self.project_index(&path);
                        items = value_items(&chain, key, spec.name, ty, &index, protocols, &path);
                        for item in &mut items {
                            // `#true` and `#false` are written bare.
                            if !item.label.starts_with('#') {
                                item.insert_text =
                                    Some(format!("\"{}\"", syntax::escape(&item.label)));
                            }
                        }
                    }
                    return Ok(Some(CompletionResponse::Array(items)));
                }
                if let (Some(spec), true) = (specs.last(), specs.len() == chain.len()) {
                    let written: HashSet<&str> = node
                        .entries
                        .iter()
                        .filter_map(|e| e.key.as_ref().map(|(k, _)| k.as_str()))
                        .collect();
                    // `expect ` with nothing after it yet: the inline criteria.
                    let at_first = node
                        .arg(0)
                        .is_none_or(|a| a.span.start <= offset && offset <= a.span.end);
                    // A first argument not written yet, of a kind with known values
                    // (`hitl approve|reject`, `stream #true` as a node, `agent "ID"`): its
                    // values, quoted as for `KEY=`.
                    if spec.name != "expect"
                        && node.arg(0).is_none()
                        && let Some(arg) = spec.args.first()
                        && matches!(
                            arg.ty,
                            ValueType::OneOf(_) | ValueType::Boolean | ValueType::Ref(_)
                        )
                    {
                        let (_, index) = self.project_index(&path);
                        let values = value_items(
                            &chain,
                            spec.name,
                            spec.name,
                            Some(arg.ty),
                            &index,
                            protocols,
                            &path,
                        );
                        for mut item in values {
                            if !item.label.starts_with('#') {
                                item.insert_text =
                                    Some(format!("\"{}\"", syntax::escape(&item.label)));
                            }
                            items.push(item);
                        }
                    }
                    if spec.name == "expect" && at_first {
                        for criterion in spec.child_specs() {
                            items.push(CompletionItem {
                                label: criterion.name.to_string(),
                                kind: Some(CompletionItemKind::KEYWORD),
                                detail: Some(criterion.usage()),
                                documentation: Some(Documentation::String(
                                    criterion.help.to_string(),
                                )),
                                ..Default::default()
                            });
                        }
                    }
                    for (name, help, ty) in analysis::property_names(node, spec, protocols) {
                        if written.contains(name) {
                            continue;
                        }
                        items.push(CompletionItem {
                            label: format!("{name}="),
                            kind: Some(CompletionItemKind::PROPERTY),
                            detail: Some(ty.describe()),
                            documentation: Some(Documentation::String(help.to_string())),
                            insert_text: Some(format!("{name}=")),
                            ..Default::default()
                        });
                    }
                }
            }
            Place::Value { node, chain, value } => {
                let before = &view.text[value.content.start.min(offset)..offset];
                if let Some(open) = before.rfind("{{")
                    && !before[open..].contains("}}")
                {
                    let columns = self.row_columns(&path, &chain);
                    items = template_items(&chain, &before[open + 2..], &columns);
                } else {
                    let specs = analysis::specs_of(&chain, protocols);
                    if let (Some(spec), true) = (specs.last(), specs.len() == chain.len()) {
                        let ty = analysis::value_type(node, spec, value, protocols);
                        let (_, index) = self.project_index(&path);
                        // The setting's name is its property's key, or the node's own name
                        // for a setting written as a child node.
                        let setting = node
                            .entries
                            .iter()
                            .find(|e| e.value.as_ref().is_some_and(|v| v.span == value.span))
                            .and_then(|e| e.key.as_ref().map(|(k, _)| k.as_str()))
                            .unwrap_or(spec.name);
                        items =
                            value_items(&chain, setting, spec.name, ty, &index, protocols, &path);
                        // The whole string's text is replaced: editors pick the word to
                        // replace by their own rules, which stop at `/` and `-`, and accepting
                        // `shared/agents.kdl` after `shared/ag` gave `shared/shared/agents.kdl`.
                        // A string not closed yet runs to the line's end as lexed: only
                        // what is before the cursor is its text so far.
                        let closed = value.span.end > value.content.end;
                        let end = if closed {
                            value.content.end
                        } else {
                            offset.clamp(value.content.start, value.content.end)
                        };
                        let range = view.lines.range(&view.text, value.content.start..end);
                        if range.start.line == range.end.line {
                            for item in &mut items {
                                let plain = item
                                    .insert_text
                                    .take()
                                    .unwrap_or_else(|| item.label.clone());
                                item.filter_text = Some(plain.clone());
                                // A file name holding a quote, in a quoted string.
                                let new_text = syntax::written_in(&view.text, value, &plain);
                                item.text_edit =
                                    Some(CompletionTextEdit::Edit(TextEdit { range, new_text }));
                            }
                        }
                    }
                }
            }
        }
        Ok(Some(CompletionResponse::Array(items)))
    }

    pub(crate) fn hover(&self, p: HoverParams) -> Result<Option<Hover>, String> {
        let pos = p.text_document_position_params;
        let Some(path) = to_path(&pos.text_document.uri) else {
            return Ok(None);
        };
        let Some(view) = self.view(&path) else {
            return Ok(None);
        };
        let offset = view.lines.offset(&view.text, pos.position);
        if syntax::in_comment(&view.text, offset) {
            return Ok(None);
        }
        let protocols = &self.config.protocols;
        let chain = syntax::chain(&view.nodes, offset);
        let Some(&node) = chain.last() else {
            return Ok(None);
        };
        let specs = analysis::specs_of(&chain, protocols);
        let markdown = |value: String, span: std::ops::Range<usize>| Hover {
            contents: HoverContents::Markup(MarkupContent {
                kind: MarkupKind::Markdown,
                value,
            }),
            range: Some(view.lines.range(&view.text, span)),
        };
        if node.name_span.start <= offset && offset <= node.name_span.end {
            if let (Some(spec), true) = (specs.last(), specs.len() == chain.len()) {
                return Ok(Some(markdown(
                    analysis::describe(spec, Some(node), protocols),
                    node.name_span.clone(),
                )));
            }
            return Ok(None);
        }
        for entry in &node.entries {
            if let Some((key, span)) = &entry.key
                && span.start <= offset
                && offset <= span.end
                && let (Some(spec), true) = (specs.last(), specs.len() == chain.len())
            {
                let found = analysis::property_names(node, spec, protocols)
                    .into_iter()
                    .find(|(name, _, _)| name == key);
                if let Some((name, help, ty)) = found {
                    return Ok(Some(markdown(
                        format!("`{name}=`: {}\n\n{help}", ty.describe()),
                        span.clone(),
                    )));
                }
            }
            let Some(value) = &entry.value else { continue };
            if !(value.span.start <= offset && offset <= value.span.end) {
                continue;
            }
            // The criterion of an inline `expect reply …`.
            if let (Some(spec), true) = (specs.last(), specs.len() == chain.len())
                && spec.name == "expect"
                && node.arg(0).is_some_and(|a| a.span == value.span)
                && let Some(criterion) = spec.child(&value.text)
            {
                return Ok(Some(markdown(
                    analysis::describe(criterion, None, protocols),
                    value.span.clone(),
                )));
            }
            // A template variable.
            let inner = &view.text[value.content.clone()];
            let at = offset.saturating_sub(value.content.start);
            if let Some((var, within)) = template_var_at(inner, at) {
                let text = template_origin(&chain, &var);
                // The variable itself, as its diagnostics mark it, not the whole string.
                let start = value.content.start;
                return Ok(Some(markdown(
                    text,
                    start + within.start..start + within.end,
                )));
            }
            let (views, index) = self.project_index(&path);
            if let Some((kind, id)) = index.at(&trellis_dsl::canonical(&path), offset) {
                let key = (kind.clone(), id.clone());
                let Some(def) = index.defs(&key).next() else {
                    let id = index.written_in(&trellis_dsl::canonical(&path), &kind, &id);
                    return Ok(Some(markdown(
                        format!("{kind} `{id}`: not defined in this project"),
                        value.span.clone(),
                    )));
                };
                let id = index.written_in(&trellis_dsl::canonical(&path), &kind, &id);
                let head = views
                    .get(&*def.file)
                    .map(|v| {
                        let text = &v.text[def.node.clone()];
                        text.lines().next().unwrap_or_default().to_string()
                    })
                    .unwrap_or_default();
                let place = views
                    .get(&*def.file)
                    .map(|v| v.lines.position(&v.text, def.node.start))
                    .map(|p| format!("{}:{}", def.file.display(), p.line + 1))
                    .unwrap_or_default();
                return Ok(Some(markdown(
                    format!("```kdl\n{head}\n```\n{kind} `{id}`, defined at {place}"),
                    value.span.clone(),
                )));
            }
        }
        Ok(None)
    }

    pub(crate) fn definition(
        &self,
        p: GotoDefinitionParams,
    ) -> Result<Option<GotoDefinitionResponse>, String> {
        let pos = p.text_document_position_params;
        let Some(path) = to_path(&pos.text_document.uri) else {
            return Ok(None);
        };
        let Some(ProjectAt {
            views,
            index,
            file,
            offset,
        }) = self.project_at(&path, pos.position)
        else {
            return Ok(None);
        };
        let Some(view) = views.get(&file) else {
            return Ok(None);
        };
        // `include "PATH"`: the file.
        let chain = syntax::chain(&view.nodes, offset);
        if let Some(node) = chain
            .first()
            .filter(|n| n.name == "include" && chain.len() == 1)
            && let Some(arg) = node.arg(0)
            && arg.span.start <= offset
            && offset <= arg.span.end
        {
            let target = file.parent().unwrap_or(Path::new("/")).join(&arg.text);
            return Ok(to_uri(&target)
                .map(|uri| GotoDefinitionResponse::Scalar(Location::new(uri, Range::default()))));
        }
        let Some(key) = index.at(&file, offset) else {
            return Ok(None);
        };
        let locations: Vec<Location> = index
            .defs(&key)
            .filter_map(|o| location(&views, &o.file, o.content.clone()))
            .collect();
        Ok(Some(GotoDefinitionResponse::Array(locations)))
    }

    pub(crate) fn references(&self, p: ReferenceParams) -> Result<Option<Vec<Location>>, String> {
        let pos = p.text_document_position;
        let Some(path) = to_path(&pos.text_document.uri) else {
            return Ok(None);
        };
        let Some(ProjectAt {
            views,
            index,
            file,
            offset,
        }) = self.project_at(&path, pos.position)
        else {
            return Ok(None);
        };
        // On an `include`: every include of the same file.
        let included = index.includes().find(|(_, o)| {
            o.content.start <= offset && offset <= o.content.end && *o.file == *file
        });
        if let Some((target, _)) = included {
            return Ok(Some(
                index
                    .includes()
                    .filter(|(t, _)| t == target)
                    .filter_map(|(_, o)| location(&views, &o.file, o.content.clone()))
                    .collect(),
            ));
        }
        let Some(key) = index.at(&file, offset) else {
            return Ok(None);
        };
        let mut out = Vec::new();
        if p.context.include_declaration {
            out.extend(index.defs(&key).cloned());
        }
        out.extend(index.refs(&key).cloned());
        Ok(Some(
            out.iter()
                .filter_map(|o| location(&views, &o.file, o.content.clone()))
                .collect(),
        ))
    }

    pub(crate) fn prepare_rename(
        &self,
        p: TextDocumentPositionParams,
    ) -> Result<Option<PrepareRenameResponse>, String> {
        let Some(path) = to_path(&p.text_document.uri) else {
            return Ok(None);
        };
        let Some(ProjectAt {
            views,
            index,
            file,
            offset,
        }) = self.project_at(&path, p.position)
        else {
            return Ok(None);
        };
        let Some(key) = index.at(&file, offset) else {
            return Err("only the id of an agent, persona, tool, provider, judge, panel, simulator, scenario or dataset, or a capture's name, can be renamed".into());
        };
        let occurrence = index
            .defs(&key)
            .chain(index.refs(&key))
            .find(|o| o.content.start <= offset && offset <= o.content.end && *o.file == *file);
        Ok(occurrence.and_then(|o| {
            let view = views.get(&file)?;
            Some(PrepareRenameResponse::Range(
                view.lines.range(&view.text, o.content.clone()),
            ))
        }))
    }

    pub(crate) fn rename(&self, p: RenameParams) -> Result<Option<WorkspaceEdit>, String> {
        let pos = p.text_document_position;
        let Some(path) = to_path(&pos.text_document.uri) else {
            return Ok(None);
        };
        if p.new_name.is_empty() {
            return Err("an id cannot be empty".to_owned());
        }
        // As `check` takes ids: shown on terminals, in CI logs and in reports.
        if let Some(c) = p.new_name.chars().find(|c| c.is_control()) {
            return Err(format!(
                "{:?} cannot be an id: it holds a control character (U+{:04X}), which no id \
                 holds",
                p.new_name,
                u32::from(c)
            ));
        }
        if p.new_name.contains(['"', '\\']) {
            return Err(format!(
                "`{}` cannot be an id: ids are written in quotes and hold no `\"` or `\\`",
                p.new_name
            ));
        }
        let Some(ProjectAt {
            views,
            index,
            file,
            offset,
        }) = self.project_at(&path, pos.position)
        else {
            return Ok(None);
        };
        let Some(key) = index.at(&file, offset) else {
            return Ok(None);
        };
        // `SUITE/ID` names another suite's scenario: a scenario's own id holds no `/` (an
        // agent's or a tool's may, as `check` accepts it).
        if key.0 == "scenario" && p.new_name.contains('/') {
            return Err(format!(
                "`{}` cannot be a scenario id: `/` separates a suite from its scenario in `needs`",
                p.new_name
            ));
        }
        // Read as `vars.NAME` in templates: an attribute's name, of letters of any script
        // (the templates read `vars.état`, as `check` accepts it), digits and `_`.
        if key.0 == analysis::CAPTURE
            && !(p
                .new_name
                .starts_with(|c: char| c.is_alphabetic() || c == '_')
                && p.new_name.chars().all(|c| c.is_alphanumeric() || c == '_'))
        {
            return Err(format!(
                "`{}` cannot be a capture's name: templates read it as `vars.NAME`, which \
                 takes letters, digits and `_`, not starting with a digit",
                p.new_name
            ));
        }
        // A scenario's id is its suite's: another suite's scenario of that name is not in
        // the way. A capture's is its scenario's.
        let new_key = match trellis_dsl::graph::split_reference(&key.1) {
            Some((suite, _)) if key.0 == "scenario" => format!("{suite}/{}", p.new_name),
            _ if key.0 == analysis::CAPTURE => match key.1.rsplit_once('/') {
                Some((scenario, _)) => format!("{scenario}/{}", p.new_name),
                None => p.new_name.clone(),
            },
            _ => p.new_name.clone(),
        };
        // The same name: nothing to change.
        if new_key == key.1 {
            return Ok(Some(WorkspaceEdit::default()));
        }
        if index.defined(&(key.0.clone(), new_key)) {
            let article = if key.0.starts_with(['a', 'e', 'i', 'o', 'u']) {
                "an"
            } else {
                "a"
            };
            let whose = if key.0 == analysis::CAPTURE {
                "the scenario"
            } else {
                "the project"
            };
            return Err(format!(
                "{whose} already has {article} {} `{}`",
                key.0, p.new_name
            ));
        }
        // A use rename cannot edit: the suite would be left reading a name no longer
        // captured.
        if let Some(o) = index.unplaced(&key).next() {
            let line = views
                .get(&*o.file)
                .map(|v| v.lines.position(&v.text, o.content.start).line + 1)
                .unwrap_or_default();
            return Err(format!(
                "`vars.{}` is also read in a string written with escapes ({}:{line}), which \
                 rename cannot edit: write that string without escapes (a raw string, \
                 `#\"…\"#`), or rename by hand",
                key.1.rsplit('/').next().unwrap_or_default(),
                o.file.display()
            ));
        }
        let quoted = format!("\"{}\"", p.new_name);
        let mut changes: HashMap<Url, Vec<TextEdit>> = HashMap::new();
        for o in index.defs(&key).chain(index.refs(&key)) {
            if let Some(loc) = location(&views, &o.file, o.content.clone()) {
                // An id written bare (`agent demo`) stays bare only if the new name can be.
                let text = if o.bare && !is_bare_identifier(&p.new_name) {
                    quoted.clone()
                } else {
                    p.new_name.clone()
                };
                changes
                    .entry(loc.uri)
                    .or_default()
                    .push(TextEdit::new(loc.range, text));
            }
        }
        Ok(Some(WorkspaceEdit {
            changes: Some(changes),
            ..Default::default()
        }))
    }

    /// `trellis fmt` of the buffer: one edit replacing the whole text, none when it is
    /// already formatted or does not parse (its diagnostics say why).
    pub(crate) fn format(
        &self,
        p: DocumentFormattingParams,
    ) -> Result<Option<Vec<TextEdit>>, String> {
        let Some(path) = to_path(&p.text_document.uri) else {
            return Ok(None);
        };
        let Some(view) = self.view(&path) else {
            return Ok(None);
        };
        let name = path.display().to_string();
        let file = trellis_dsl::SourceFile::new(path, name, view.text.clone());
        match trellis_dsl::format::format_source(&file) {
            Ok((text, _)) if text != *view.text => {
                let end = view.lines.position(&view.text, view.text.len());
                Ok(Some(vec![TextEdit::new(
                    Range::new(Position::new(0, 0), end),
                    text,
                )]))
            }
            Ok(_) | Err(trellis_dsl::format::FormatError::Invalid(_)) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    pub(crate) fn symbols(
        &self,
        p: DocumentSymbolParams,
    ) -> Result<Option<DocumentSymbolResponse>, String> {
        let Some(path) = to_path(&p.text_document.uri) else {
            return Ok(None);
        };
        let Some(view) = self.view(&path) else {
            return Ok(None);
        };
        let symbols = view
            .nodes
            .iter()
            .filter(|n| !n.commented && lang::top(&n.name).is_some())
            .filter_map(|n| symbol(n, &view, 0))
            .collect();
        Ok(Some(DocumentSymbolResponse::Nested(symbols)))
    }
}

#[allow(deprecated)] // `DocumentSymbol::deprecated` must still be written.
fn symbol(node: &Node, view: &FileView, depth: usize) -> Option<DocumentSymbol> {
    let kind = match node.name.as_str() {
        "suite" => SymbolKind::MODULE,
        "scenario" => SymbolKind::CLASS,
        "branch" => SymbolKind::METHOD,
        "agent" => SymbolKind::INTERFACE,
        "tool" => SymbolKind::FUNCTION,
        "persona" | "provider" | "judge" | "panel" | "simulator" => SymbolKind::OBJECT,
        "include" => SymbolKind::FILE,
        "dataset" => SymbolKind::ARRAY,
        _ => return None,
    };
    let name = node
        .arg(0)
        .map(|a| a.text.clone())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| node.name.clone());
    let children: Vec<DocumentSymbol> = if depth < 64 {
        node.children()
            .filter(|c| matches!(c.name.as_str(), "branch" | "tool"))
            .filter_map(|c| symbol(c, view, depth + 1))
            .collect()
    } else {
        Vec::new()
    };
    Some(DocumentSymbol {
        name,
        detail: Some(node.name.clone()),
        kind,
        tags: None,
        deprecated: None,
        range: view.lines.range(&view.text, node.span.clone()),
        selection_range: view.lines.range(
            &view.text,
            node.arg(0)
                .map_or(node.name_span.clone(), |a| a.span.clone()),
        ),
        children: (!children.is_empty()).then_some(children),
    })
}

/// `../…` files offered after `include "`, at most: a parent directory holding a large tree
/// (a home directory) must not make every completion slow.
const INCLUDES_BESIDE: usize = 200;

/// Completions for a value of type `ty` (ids, enumerated words, protocols, builtins, files).
/// The values offered for a setting (`setting`: a property's key, or the node's own name
/// for an argument) of node `node_name`, the innermost of `chain`.
fn value_items(
    chain: &[&Node],
    setting: &str,
    node_name: &str,
    ty: Option<ValueType>,
    index: &Index,
    protocols: &[&'static ProtocolSpec],
    file: &Path,
) -> Vec<CompletionItem> {
    let word = |label: &str, detail: &str, kind: CompletionItemKind| CompletionItem {
        label: label.to_string(),
        kind: Some(kind),
        detail: Some(detail.to_string()),
        ..Default::default()
    };
    let mut items = Vec::new();
    if chain.is_empty() {
        return items;
    }
    match ty {
        Some(ValueType::Ref(kind)) => {
            // A scenario does not need itself (`needs` inside it names others).
            let own_scenario = chain
                .iter()
                .find(|n| n.name == "scenario")
                .and_then(|n| n.arg(0))
                .filter(|_| node_name == "needs")
                .map(|a| a.text.as_str());
            let file = trellis_dsl::canonical(file);
            let k = crate::analysis::namespace(kind);
            for (id, _) in index.ids(k) {
                // Another suite's scenario is written `SUITE/ID`.
                let id = index.written_in(&file, k, id);
                if k == "scenario" && Some(id) == own_scenario {
                    continue;
                }
                // A panel's members are judges, not panels (`check` refuses a panel there).
                if node_name == "judges" && index.is_panel(id) {
                    continue;
                }
                items.push(word(id, k, CompletionItemKind::REFERENCE));
            }
        }
        Some(ValueType::OneOf(words)) => {
            for w in words {
                items.push(word(w, "", CompletionItemKind::ENUM_MEMBER));
            }
        }
        Some(ValueType::Boolean) => {
            for w in ["#true", "#false"] {
                items.push(word(w, "", CompletionItemKind::KEYWORD));
            }
        }
        _ => {}
    }
    // Values the table types as plain strings but the loader knows: the setting's name is
    // its property's key, or the node's own name for a setting written as a child node.

    // An agent declaration (a scenario's `agent "ID"` names one instead).
    if let Some(agent) = chain.first().filter(|n| n.name == "agent") {
        if setting == "protocol" {
            for p in protocols {
                items.push(CompletionItem {
                    label: p.name.to_string(),
                    kind: Some(CompletionItemKind::ENUM_MEMBER),
                    detail: Some("protocol".into()),
                    documentation: Some(Documentation::String(p.help.to_string())),
                    ..Default::default()
                });
            }
        }
        if setting == "builtin"
            && let Some(p) = analysis::protocol_of(agent, protocols)
        {
            for b in p.builtins {
                items.push(word(b, "builtin agent", CompletionItemKind::VALUE));
            }
        }
    }
    if node_name == "include" {
        let dir = file.parent().unwrap_or(Path::new("/"));
        // Hidden files and directories, which a directory's load leaves out, are not offered.
        for entry in walkdir::WalkDir::new(dir)
            .max_depth(4)
            .into_iter()
            .filter_entry(|e| e.depth() == 0 || !e.file_name().as_encoded_bytes().starts_with(b"."))
            .filter_map(Result::ok)
        {
            let p = entry.path();
            if p.extension().is_some_and(|e| e == "kdl")
                && !trellis_dsl::parse::editor_lock(p)
                && trellis_dsl::canonical(p) != trellis_dsl::canonical(file)
                && let Ok(rel) = p.strip_prefix(dir)
            {
                items.push(word(
                    &rel.to_string_lossy(),
                    "file",
                    CompletionItemKind::FILE,
                ));
            }
        }
        // And beside it: a suite per topic including a `shared/` directory next to its own
        // (`include "../shared/agents.kdl"`), the usual layout. Not from the filesystem's
        // root, whose walk would take the whole machine.
        if let Some(up) = dir.parent().filter(|up| up.parent().is_some()) {
            let mut beside: Vec<String> = walkdir::WalkDir::new(up)
                .max_depth(3)
                .into_iter()
                .filter_entry(|e| {
                    e.depth() == 0
                        || (!e.file_name().as_encoded_bytes().starts_with(b".") && e.path() != dir)
                })
                .filter_map(Result::ok)
                .filter(|e| {
                    e.path().extension().is_some_and(|x| x == "kdl")
                        && !trellis_dsl::parse::editor_lock(e.path())
                })
                .filter_map(|e| {
                    let rel = e.path().strip_prefix(up).ok()?;
                    Some(format!("../{}", rel.to_string_lossy()))
                })
                .take(INCLUDES_BESIDE)
                .collect();
            beside.sort();
            items.extend(
                beside
                    .iter()
                    .map(|path| word(path, "file", CompletionItemKind::FILE)),
            );
        }
    }
    items.dedup_by(|a, b| a.label == b.label);
    items
}

/// Whether `scenario`'s block takes `spec` at `offset`, as `check` reads it: `row-id` only
/// in a `for-each` scenario, `history` and `initial-message` only before its first step.
fn scenario_takes(scenario: &Node, spec: &lang::NodeSpec, offset: usize) -> bool {
    match spec.name {
        "row-id" => scenario.setting("for-each").is_some(),
        "history" | "initial-message" => !scenario.children().any(|c| {
            c.span.end <= offset && lang::steps::STEPS.iter().any(|step| step.name == c.name)
        }),
        _ => true,
    }
}

/// Rows read for their columns from a file that declares none (JSON): the columns of the
/// first rows, not of a file of millions read at every keystroke.
const ROWS_FOR_COLUMNS: usize = 200;

impl Server {
    /// The file of the dataset the scenario `chain` is in runs over (`for-each`).
    fn for_each_file(&self, path: &Path, chain: &[&Node]) -> Option<PathBuf> {
        let id = chain
            .iter()
            .find(|n| n.name == "scenario")
            .and_then(|s| s.setting("for-each"))?;
        let (views, index) = self.project_index(path);
        let key = ("dataset".to_string(), id.text.clone());
        let def = index.defs(&key).next()?;
        views
            .get(&*def.file)
            .and_then(|view| view.nodes.iter().find(|n| n.span == def.node))
            .and_then(|node| node.setting("path"))
            .map(|p| def.file.parent().unwrap_or(Path::new("/")).join(&p.text))
    }

    /// The columns of the dataset the scenario `chain` is in runs over (`for-each`), as
    /// `row.` offers them: the file's declared ones (a CSV header) or those of its first
    /// rows. None when the dataset or its file cannot be found or read (`check` says why).
    fn row_columns(&self, path: &Path, chain: &[&Node]) -> Vec<String> {
        // In a dataset's own `filter`: its file, beside this one.
        let own = chain
            .iter()
            .find(|n| n.name == "dataset")
            .and_then(|d| d.setting("path"))
            .map(|p| path.parent().unwrap_or(Path::new("/")).join(&p.text));
        let file = match own {
            Some(file) => Some(file),
            None => self.for_each_file(path, chain),
        };
        let Some(file) = file else {
            return Vec::new();
        };
        let Ok(Some(reader)) = trellis_dsl::dataset::reader_for(&file) else {
            return Vec::new();
        };
        if let Ok(Some(columns)) = reader.declared_columns(&file) {
            return columns;
        }
        let mut columns: Vec<String> = Vec::new();
        let mut rows = 0usize;
        // A file that fails part way still gave the columns of the rows before.
        let _ = reader.read(&file, &mut |_, fields| {
            for k in fields.iter().flat_map(|f| f.keys()) {
                if !columns.contains(k) {
                    columns.push(k.clone());
                }
            }
            rows += 1;
            if rows < ROWS_FOR_COLUMNS {
                std::ops::ControlFlow::Continue(())
            } else {
                std::ops::ControlFlow::Break(())
            }
        });
        columns
    }
}

/// Template variables in scope at a string of the scenario `chain` is in: `typed` is what
/// the template holds so far after its `{{`; `columns`, those of its dataset's rows.
fn template_items(chain: &[&Node], typed: &str, columns: &[String]) -> Vec<CompletionItem> {
    let typed = typed.trim_start();
    let scenario = chain.iter().find(|n| n.name == "scenario");
    // A dataset's `filter`: `row` is its only variable.
    let in_dataset = chain.iter().any(|n| n.name == "dataset");
    let mut roots: Vec<(String, Vec<String>, &str)> = if in_dataset {
        vec![(
            "row".into(),
            columns.to_vec(),
            "the row the filter decides on",
        )]
    } else {
        vec![
            ("env".into(), Vec::new(), "environment variables"),
            (
                "scenario".into(),
                ["id", "name", "description", "difficulty", "tags", "status"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                "the scenario",
            ),
        ]
    };
    if let Some(s) = scenario {
        let keys = s
            .children()
            .filter(|c| c.name == "user-context")
            .flat_map(|c| c.children().map(|k| k.name.clone()))
            .collect();
        roots.push(("user_context".into(), keys, "the scenario's `user-context`"));
        let mut vars = matrix_names(s);
        vars.extend(captures_before(chain));
        roots.push((
            "vars".into(),
            vars,
            "values captured by `capture`, and the `matrix` values of the instance",
        ));
        if s.setting("for-each").is_some() {
            roots.push((
                "row".into(),
                columns.to_vec(),
                "the dataset row this instance runs with (`for-each`)",
            ));
        }
        if s.setting("persona").is_some() {
            roots.push((
                "persona".into(),
                ["id", "type", "description", "instructions"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                "the scenario's persona",
            ));
        }
    }
    let mut items = Vec::new();
    if let Some((root, _)) = typed.rsplit_once('.').filter(|(r, _)| !r.contains(' ')) {
        if let Some((_, names, _)) = roots.iter().find(|(r, _, _)| r == root.trim()) {
            for n in names {
                items.push(CompletionItem {
                    label: n.clone(),
                    kind: Some(CompletionItemKind::FIELD),
                    detail: Some(format!("{root}.{n}")),
                    ..Default::default()
                });
            }
        }
        return items;
    }
    for (root, _, help) in roots {
        items.push(CompletionItem {
            label: root,
            kind: Some(CompletionItemKind::VARIABLE),
            detail: Some(help.to_string()),
            ..Default::default()
        });
    }
    items
}

/// The names of a scenario's `matrix { NAME VALUE…; … }`: `vars.NAME` in its instances.
fn matrix_names(scenario: &Node) -> Vec<String> {
    scenario
        .children()
        .filter(|c| c.name == "matrix")
        .flat_map(|m| m.children().map(|v| v.name.clone()))
        .collect()
}

/// The captures made before the node `chain` ends in, on its way there: those of each
/// block it is in (the scenario, the branches) written before the step it goes on into. A
/// capture in another branch, or after, is not set there (`check` refuses reading it).
fn captures_before(chain: &[&Node]) -> Vec<String> {
    let mut out = Vec::new();
    for pair in chain.windows(2) {
        let (block, within) = (pair[0], pair[1]);
        if !matches!(block.name.as_str(), "scenario" | "branch") {
            continue;
        }
        for c in block.children() {
            if c.name == "capture"
                && c.span.end <= within.span.start
                && let Some(name) = c.arg(0)
            {
                out.push(name.text.clone());
            }
        }
    }
    out
}

fn captures(node: &Node, out: &mut Vec<String>, depth: usize) {
    for c in node.children() {
        if c.name == "capture"
            && let Some(name) = c.arg(0)
        {
            out.push(name.text.clone());
        }
        if depth < 64 && c.name == "branch" {
            captures(c, out, depth + 1);
        }
    }
}

/// The dotted variable (`user_context.order_id`) of a template around byte `at` of `text`.
fn template_var_at(text: &str, at: usize) -> Option<(String, std::ops::Range<usize>)> {
    let at = at.min(text.len());
    let open = text[..at].rfind("{{")?;
    if text[open..at].contains("}}") {
        return None;
    }
    let is_var = |c: char| c.is_alphanumeric() || c == '_' || c == '.';
    let start = text[..at]
        .char_indices()
        .rev()
        .take_while(|(_, c)| is_var(*c))
        .last()
        .map_or(at, |(i, _)| i);
    let end = text[at..]
        .char_indices()
        .find(|(_, c)| !is_var(*c))
        .map_or(text.len(), |(i, _)| at + i);
    let written = &text[start..end];
    let var = written.trim_matches('.');
    let start = start + (written.len() - written.trim_start_matches('.').len());
    (!var.is_empty()).then(|| (var.to_string(), start..start + var.len()))
}

/// Where a template variable's value comes from, for a hover.
fn template_origin(chain: &[&Node], var: &str) -> String {
    let (root, rest) = var.split_once('.').unwrap_or((var, ""));
    match root {
        "user_context" => format!(
            "`{var}`: the scenario's `user-context`{}",
            if rest.is_empty() {
                String::new()
            } else {
                format!(" key `{rest}`")
            }
        ),
        "vars" => {
            let scenario = chain.iter().find(|n| n.name == "scenario");
            let mut names = Vec::new();
            if let Some(s) = scenario {
                if matrix_names(s).iter().any(|n| n == rest) {
                    return format!(
                        "`{var}`: the `matrix` value `{rest}` of the instance (one instance \
                         per combination of the matrix's values)"
                    );
                }
                captures(s, &mut names, 0);
            }
            if names.iter().any(|n| n == rest) {
                format!("`{var}`: captured by `capture \"{rest}\"` earlier in the conversation")
            } else {
                format!(
                    "`{var}`: a value captured by `capture`; no `capture \"{rest}\"` in this scenario"
                )
            }
        }
        "env" => {
            format!("`{var}`: the environment variable `{rest}` of the process running Trellis")
        }
        "row" => format!(
            "`{var}`: the column `{rest}` of the dataset row this instance runs with \
             (`for-each`)"
        ),
        "scenario" => format!("`{var}`: the scenario's `{rest}`"),
        "persona" => format!("`{var}`: the scenario's persona's `{rest}`"),
        _ => format!("`{var}`"),
    }
}

fn location(
    views: &HashMap<PathBuf, Rc<FileView>>,
    file: &Path,
    span: std::ops::Range<usize>,
) -> Option<Location> {
    let view = views.get(file)?;
    Some(Location::new(
        to_uri(file)?,
        view.lines.range(&view.text, span),
    ))
}

/// Whether `name` can be written without quotes in KDL 2: an identifier that is not a
/// keyword and reads as no number (else a rename writes it quoted).
fn is_bare_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !matches!(name, "true" | "false" | "null" | "inf" | "nan")
}
