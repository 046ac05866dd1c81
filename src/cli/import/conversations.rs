//! `trellis import conversations FILE.jsonl`: a suite whose scenarios start from recorded
//! conversations (one per line, OpenAI-style `{"messages": […]}`), the reverse of a
//! scenario's `history`. The suite reads the file itself as a `dataset` and opens one
//! scenario per line with `history "{{ row.messages }}"`, so a fresh export replaces the
//! file and the suite runs the new conversations unchanged.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::Value;

use super::super::console::errln;
use super::super::{EXIT_INVALID, EXIT_OK};
use super::multiagent::{check_text, write_checked};
use super::{is_simple_id, kdl_string};

#[derive(Debug, Args)]
pub struct ConversationsImportArgs {
    /// JSON Lines: one conversation per line, an object with `messages` (an OpenAI-style
    /// message list) and optionally `id` (the instance's id when every line has its own).
    source: PathBuf,
    /// The suite file to write (default: standard output). The dataset path in it is
    /// relative to this file.
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// Replace the suite file if it exists.
    #[arg(long)]
    replace: bool,
    /// The id of the agent every scenario runs against.
    #[arg(long, value_name = "ID", default_value = "agent")]
    agent_id: String,
    /// Run against the Connexity agent served at this URL (`POST URL`).
    #[arg(long, value_name = "URL", group = "endpoint")]
    agent_url: Option<String>,
    /// Run against a builtin Connexity agent (default: `booking`).
    #[arg(long, value_name = "NAME", group = "endpoint")]
    agent_builtin: Option<String>,
}

/// What the file holds: how many conversations, and whether every one has its own `id`.
struct Survey {
    conversations: usize,
    ids_unique: bool,
    ending_with_user: usize,
}

fn survey(path: &Path) -> Result<Survey, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut ids: HashSet<String> = HashSet::new();
    let mut ids_unique = true;
    let mut conversations = 0;
    let mut ending_with_user = 0;
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let at = format!("{} line {}", path.display(), i + 1);
        let line = line.map_err(|e| format!("{at}: {e}"))?;
        let line = trellis_dsl::dataset::without_bom(i, &line);
        if line.trim().is_empty() {
            continue;
        }
        let value: Value =
            serde_json::from_str(line).map_err(|e| format!("{at}: not JSON: {e}"))?;
        let Value::Object(object) = value else {
            return Err(format!(
                "{at}: not an object; write each conversation as {{\"messages\": […]}}"
            ));
        };
        let messages = object
            .get("messages")
            .cloned()
            .ok_or_else(|| format!("{at}: no `messages`"))?;
        let messages =
            trellis_dsl::dataset::messages(messages).map_err(|e| format!("{at}: {e}"))?;
        if messages
            .last()
            .and_then(|m| m.get("role"))
            .and_then(Value::as_str)
            == Some("user")
        {
            ending_with_user += 1;
        }
        conversations += 1;
        let id = match object.get("id") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        // `row-id` trims what it renders: ids that differ only in surrounding whitespace
        // would be one instance's id twice.
        ids_unique &= id.is_some_and(|id| {
            let id = id.trim();
            !id.is_empty() && !id.contains(['/', '[', ']', '\n']) && ids.insert(id.to_owned())
        });
    }
    Ok(Survey {
        conversations,
        ids_unique,
        ending_with_user,
    })
}

/// The dataset path as the suite writes it: relative to the suite's directory (`../…`
/// when the file lies elsewhere), so the two can move together; as given for standard
/// output.
fn dataset_path(source: &Path, out: Option<&Path>) -> String {
    let shown = |p: &Path| p.to_string_lossy().replace('\\', "/");
    let Some(out) = out else {
        return shown(source);
    };
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let (Ok(dir), Ok(file)) = (dir.canonicalize(), source.canonicalize()) else {
        return shown(source);
    };
    let common = dir
        .components()
        .zip(file.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut relative = PathBuf::new();
    for _ in dir.components().skip(common) {
        relative.push("..");
    }
    relative.extend(file.components().skip(common));
    shown(&relative)
}

pub fn import_conversations(args: &ConversationsImportArgs) -> u8 {
    if !is_simple_id(&args.agent_id) {
        errln!(
            "error: --agent-id `{}` must be letters, digits, `_` or `-`",
            args.agent_id
        );
        return EXIT_INVALID;
    }
    let survey = match survey(&args.source) {
        Ok(s) => s,
        Err(e) => {
            errln!("error: {e}");
            return EXIT_INVALID;
        }
    };
    if survey.conversations == 0 {
        errln!(
            "error: {} holds no conversation (one `{{\"messages\": […]}}` per line)",
            args.source.display()
        );
        return EXIT_INVALID;
    }
    if let Some(out) = &args.out
        && let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty())
        && let Err(e) = std::fs::create_dir_all(parent)
    {
        errln!("error: {}: {e}", parent.display());
        return EXIT_INVALID;
    }
    let endpoint = match &args.agent_url {
        Some(url) => format!("url={}", kdl_string(url)),
        None => format!(
            "builtin={}",
            kdl_string(args.agent_builtin.as_deref().unwrap_or("booking"))
        ),
    };
    let mut text = String::new();
    let _ = writeln!(
        text,
        "// Imported by `trellis import conversations` from {}: {} conversation{}, each\n\
         // the opening of one scenario (`history`). Continue them with steps (`user`,\n\
         // `simulate`, `branch`) and say what to check: a conversation that ends with a user\n\
         // message ({} here) gets the agent's answer to it as its first turn.",
        args.source.display(),
        survey.conversations,
        if survey.conversations == 1 { "" } else { "s" },
        survey.ending_with_user,
    );
    let _ = writeln!(
        text,
        "agent {} protocol=\"connexity\" {endpoint}",
        kdl_string(&args.agent_id)
    );
    let _ = writeln!(
        text,
        "dataset \"conversations\" path={}",
        kdl_string(&dataset_path(&args.source, args.out.as_deref()))
    );
    text.push_str("scenario \"conversation\" for-each=\"conversations\" {\n");
    if survey.ids_unique {
        text.push_str("    row-id \"{{ row.id }}\"\n");
    } else {
        text.push_str(
            "    // Not every line has its own `id`: instances are named by a hash of the line.\n",
        );
    }
    text.push_str(
        "    history \"{{ row.messages }}\"\n    criteria {\n        no-error\n    }\n}\n",
    );

    match &args.out {
        Some(out) => {
            if !args.replace && out.exists() {
                errln!(
                    "error: {} exists; pass --replace to replace it",
                    out.display()
                );
                return EXIT_INVALID;
            }
            match write_checked(out, &text, args.replace, true) {
                Err(e) => {
                    errln!("error: {e}");
                    return EXIT_INVALID;
                }
                Ok(written) if written.report(&args.source, 0) => return EXIT_OK,
                Ok(_) => {}
            }
            errln!(
                "imported {} conversation{} into {}",
                survey.conversations,
                if survey.conversations == 1 { "" } else { "s" },
                out.display()
            );
        }
        None => {
            // Checked where the suite would be read from: the current directory.
            if let Err(e) = check_text(&text.replace(
                &format!("path={}", kdl_string(&dataset_path(&args.source, None))),
                &format!(
                    "path={}",
                    kdl_string(
                        &std::path::absolute(&args.source)
                            .unwrap_or_else(|_| args.source.clone())
                            .to_string_lossy()
                    )
                ),
            )) {
                errln!("error: internal: the written suite does not check:\n{e}");
                return EXIT_INVALID;
            }
            print!("{}", super::edits::stamped(&text));
        }
    }
    EXIT_OK
}
