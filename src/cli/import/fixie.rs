//! `trellis import fixie URL|FILE`: turns a Fixie agent's few-shots into a suite.
//!
//! Each few-shot becomes a scenario. Its `Ask Func[NAME]: ARGS` lines are `call` steps and
//! the `Func[NAME] says: RESULT` line that answers each one becomes `expect reply equals=…`;
//! what cannot be checked by calling a function (the `Q:` query, the `A:` answer, questions
//! to other agents) stays in the scenario as comments, so the suite still reads like the
//! few-shot it came from. Values are written as KDL strings by the `kdl` crate and are
//! escaped for templates too, since `call` inputs and criterion values are templates: the
//! suite sends and expects exactly the few-shot's text.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;
use trellis_engine::protocol::fixie::{
    FewShotLine, FixieClient, Handshake, parse_few_shot, validate_function_name,
};
use trellis_engine::transport::http::{CallLimits, HttpTransport, RetryPolicy};

use super::super::{EXIT_FAILED, EXIT_INVALID, EXIT_OK};
use super::{comment, is_simple_id, kdl_string, literal_template, write_file};

/// The agent URL written when the few-shots come from a file and no `--url` is given: the
/// port the Fixie SDK's `agent.serve()` examples listen on.
const PLACEHOLDER_URL: &str = "http://127.0.0.1:8181";
/// Scenario names are the few-shot's query, cut to this many characters.
const NAME_CHARS: usize = 80;

#[derive(Debug, Args)]
pub struct FixieImportArgs {
    /// The agent's base URL (its handshake `GET URL/` is fetched), or a file holding a
    /// saved handshake (JSON or YAML).
    source: String,
    /// Write the suite to this file instead of standard output.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Replace `--out` if it exists.
    #[arg(long)]
    force: bool,
    /// The agent URL written in the suite. Default: the source URL, or a placeholder
    /// (http://127.0.0.1:8181) when the source is a file.
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// The id of the suite and of its agent. Default: the `--out` file's name without its
    /// extension (so suites imported side by side, or next to the example `fixie` suite, do
    /// not collide), or `fixie` when writing to standard output or when that name is not an
    /// id.
    #[arg(long, value_name = "ID")]
    name: Option<String>,
    /// A request header for the handshake, also written to the suite's agent (for agents
    /// that want credentials); repeatable.
    ///
    /// Example: --header 'Authorization: Bearer TOKEN'
    #[arg(long = "header", value_name = "NAME: VALUE", value_parser = parse_header)]
    headers: Vec<(String, String)>,
}

/// `NAME: VALUE` (or `NAME=VALUE`).
fn parse_header(text: &str) -> Result<(String, String), String> {
    let (name, value) = text
        .split_once(':')
        .or_else(|| text.split_once('='))
        .ok_or_else(|| format!("`{text}` is not `NAME: VALUE`"))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("`{text}` has no header name"));
    }
    Ok((name.to_owned(), value.trim().to_owned()))
}

pub fn import_fixie(args: &FixieImportArgs) -> u8 {
    if let Some(out) = &args.out
        && out.exists()
        && !args.force
    {
        super::super::console::errln!(
            "error: {} exists; pass --force to replace it",
            out.display()
        );
        return EXIT_INVALID;
    }
    let name = match &args.name {
        Some(name) if !is_simple_id(name) => {
            super::super::console::errln!(
                "error: --name `{name}` must be letters, digits, `_` or `-`"
            );
            return EXIT_INVALID;
        }
        Some(name) => name.clone(),
        None => default_name(args.out.as_deref()),
    };
    let is_url = args.source.starts_with("http://") || args.source.starts_with("https://");
    let handshake = if is_url {
        fetch(&args.source, &args.headers)
    } else {
        read_file(Path::new(&args.source))
    };
    let handshake = match handshake {
        Ok(handshake) => handshake,
        Err(message) => {
            super::super::console::errln!("error: {message}");
            return EXIT_FAILED;
        }
    };
    let agent_url = match (&args.url, is_url) {
        (Some(url), _) => url.clone(),
        (None, true) => args.source.clone(),
        (None, false) => {
            super::super::console::errln!(
                "note: the suite's agent URL is a placeholder ({PLACEHOLDER_URL}); pass --url \
                 or edit it"
            );
            PLACEHOLDER_URL.to_owned()
        }
    };
    let suite = write_suite(
        &handshake,
        &SuiteOptions {
            name: &name,
            source: &args.source,
            agent_url: &agent_url,
            headers: &args.headers,
        },
    );
    // The suite is built from untrusted text: never hand out a file that is not KDL.
    if let Err(e) = suite.parse::<kdl::KdlDocument>() {
        super::super::console::errln!(
            "error: internal: the generated suite is not valid KDL ({e}); please report"
        );
        return EXIT_FAILED;
    }
    if !args.headers.is_empty() {
        super::super::console::errln!(
            "note: the suite holds the --header values as given; write secrets as \
             \"{{{{ env.VAR }}}}\" templates instead"
        );
    }
    let written = match &args.out {
        Some(path) => write_file(path, &suite, args.force),
        None => std::io::stdout()
            .write_all(suite.as_bytes())
            .map_err(|e| format!("standard output: {e}")),
    };
    match written {
        Ok(()) => {
            if let Some(path) = &args.out {
                super::super::console::errln!(
                    "wrote {} ({}); check it with `trellis check {}`",
                    path.display(),
                    super::super::console::count(
                        handshake.few_shots.len() as u64,
                        "few-shot",
                        "few-shots"
                    ),
                    path.display()
                );
            }
            EXIT_OK
        }
        Err(e) => {
            super::super::console::errln!("error: could not write the suite: {e}");
            EXIT_FAILED
        }
    }
}

fn fetch(url: &str, headers: &[(String, String)]) -> Result<Handshake, String> {
    let client = FixieClient::new(
        url,
        headers.to_vec(),
        CallLimits::default(),
        RetryPolicy {
            retries: 2,
            after_send: false,
        },
        HttpTransport::new(),
    )
    .map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime
        .block_on(client.handshake())
        .map_err(|fault| fault.message)
}

fn read_file(path: &Path) -> Result<Handshake, String> {
    let body = std::fs::read(path).map_err(|e| {
        // `127.0.0.1:8181` or `localhost:8181/agent` was meant as the agent's address.
        let looks_like_address = e.kind() == std::io::ErrorKind::NotFound
            && path
                .to_str()
                .and_then(|p| p.split('/').next())
                .and_then(|host| host.rsplit_once(':'))
                .is_some_and(|(_, port)| port.parse::<u16>().is_ok());
        if looks_like_address {
            format!(
                "{}: {e}; to fetch the handshake from a running agent, give its URL: \
                 http://{}",
                path.display(),
                path.display()
            )
        } else {
            format!("{}: {e}", path.display())
        }
    })?;
    Handshake::parse(&body).map_err(|e| format!("{}: {e}", path.display()))
}

/// The suite's id when `--name` is not given: the output file's stem when it is an id.
fn default_name(out: Option<&Path>) -> String {
    out.and_then(Path::file_stem)
        .and_then(|stem| stem.to_str())
        .filter(|stem| is_simple_id(stem))
        .unwrap_or("fixie")
        .to_owned()
}

/// What the suite is called and where its agent is.
pub struct SuiteOptions<'a> {
    /// Id of the suite and of its agent.
    pub name: &'a str,
    /// Where the few-shots came from, for the header comment.
    pub source: &'a str,
    pub agent_url: &'a str,
    /// `header` nodes of the agent, values written literally.
    pub headers: &'a [(String, String)],
}

/// The suite for `handshake`, as KDL text.
pub fn write_suite(handshake: &Handshake, options: &SuiteOptions<'_>) -> String {
    let mut out = String::new();
    comment(
        &mut out,
        "",
        &format!(
            "Imported by `trellis import fixie` from {}.\n\
             Each few-shot is a scenario: its `Ask Func[…]` / `Func[…] says` pairs are `call` \
             steps\nthat expect the result the few-shot shows. What cannot be checked by \
             calling a\nfunction (the query, the answer, other agents) is kept as comments.",
            options.source
        ),
    );
    if let Some(prompt) = handshake
        .base_prompt
        .as_deref()
        .filter(|p| !p.trim().is_empty())
    {
        comment(&mut out, "", &format!("Base prompt: {prompt}"));
    }
    let _ = write!(
        out,
        "\nagent {} protocol=\"fixie\" url={}",
        kdl_string(options.name),
        kdl_string(options.agent_url)
    );
    if options.headers.is_empty() {
        out.push_str("\n\n");
    } else {
        out.push_str(" {\n");
        for (name, value) in options.headers {
            let _ = writeln!(
                out,
                "    header {} {}",
                kdl_string(name),
                kdl_string(&literal_template(value))
            );
        }
        out.push_str("}\n\n");
    }
    let _ = writeln!(
        out,
        "suite {} {{\n    description {}\n    tags \"fixie\" \"imported\"\n}}",
        kdl_string(options.name),
        kdl_string(&format!(
            "Few-shots of the Fixie agent at {}",
            options.source
        ))
    );
    for (index, few_shot) in handshake.few_shots.iter().enumerate() {
        out.push('\n');
        write_scenario(&mut out, index + 1, few_shot, options.name);
    }
    out
}

/// One few-shot: a scenario when it has a function to call, else a comment.
fn write_scenario(out: &mut String, number: usize, few_shot: &str, agent: &str) {
    let lines = parse_few_shot(few_shot);
    let mut answered = vec![false; lines.len()];
    let mut body = String::new();
    let mut calls = 0;
    for (i, line) in lines.iter().enumerate() {
        match line {
            FewShotLine::AskFunc { function, input } => {
                if let Err(e) = validate_function_name(function) {
                    comment(
                        &mut body,
                        "    ",
                        &format!("Ask Func[{function}]: {input}\n(not called: {e})"),
                    );
                    continue;
                }
                calls += 1;
                let _ = writeln!(
                    body,
                    "    call {} {}",
                    kdl_string(function),
                    kdl_string(&literal_template(input))
                );
                match result_of(&lines, i, function) {
                    Some(j) => {
                        if let Some(FewShotLine::FuncSays { result, .. }) = lines.get(j) {
                            let _ = writeln!(
                                body,
                                "    expect reply equals={}",
                                kdl_string(&literal_template(result))
                            );
                        }
                        if let Some(flag) = answered.get_mut(j) {
                            *flag = true;
                        }
                    }
                    None => comment(
                        &mut body,
                        "    ",
                        &format!("no `Func[{function}] says` follows: the result is not checked"),
                    ),
                }
            }
            FewShotLine::FuncSays { .. } if answered.get(i).copied().unwrap_or(false) => {}
            FewShotLine::FuncSays { function, .. } => comment(
                &mut body,
                "    ",
                &format!(
                    "{}\n(no `Ask Func[{function}]` before it: nothing to call)",
                    describe(line)
                ),
            ),
            other => comment(&mut body, "    ", &describe(other)),
        }
    }
    let query = lines.iter().find_map(|line| match line {
        FewShotLine::Query(q) => Some(q.as_str()),
        _ => None,
    });
    if calls == 0 {
        let mut text = format!("Few-shot {number} calls no function, so it is not a scenario:");
        for line in &lines {
            text.push('\n');
            text.push_str(&describe(line));
        }
        comment(out, "", &text);
        return;
    }
    let _ = writeln!(
        out,
        "scenario {} {{",
        kdl_string(&format!("few-shot-{number}"))
    );
    let _ = writeln!(out, "    agent {}", kdl_string(agent));
    if let Some(query) = query {
        let first = query.lines().next().unwrap_or_default();
        let mut name: String = first.chars().take(NAME_CHARS).collect();
        if first.chars().nth(NAME_CHARS).is_some() {
            name.push('…');
        }
        let _ = writeln!(out, "    name {}", kdl_string(&name));
    }
    out.push('\n');
    out.push_str(&body);
    out.push_str("}\n");
}

/// The `Func[function] says` line answering the `Ask` at `ask`: the first one after it,
/// unless the function is asked again first.
fn result_of(lines: &[FewShotLine], ask: usize, function: &str) -> Option<usize> {
    for (j, line) in lines.iter().enumerate().skip(ask + 1) {
        match line {
            FewShotLine::FuncSays { function: f, .. } if f == function => return Some(j),
            FewShotLine::AskFunc { function: f, .. } if f == function => return None,
            _ => {}
        }
    }
    None
}

/// A few-shot line as it was written.
fn describe(line: &FewShotLine) -> String {
    match line {
        FewShotLine::Query(q) => format!("Q: {q}"),
        FewShotLine::Answer(a) => format!("A: {a}"),
        FewShotLine::AskFunc { function, input } => format!("Ask Func[{function}]: {input}"),
        FewShotLine::FuncSays { function, result } => {
            format!("Func[{function}] says: {result}")
        }
        FewShotLine::AskAgent { agent, input } => format!("Ask Agent[{agent}]: {input}"),
        FewShotLine::AgentSays { agent, result } => format!("Agent[{agent}] says: {result}"),
        FewShotLine::Other(text) => text.clone(),
    }
}
