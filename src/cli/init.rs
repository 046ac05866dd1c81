//! `trellis init [DIR] --protocol P`: writes a project that passes at once, offline, against
//! the protocol's built-in reference agent, and that the user turns to their own agent by
//! editing one line.
//!
//! The files come from the templates under `src/cli/init/`, embedded in the binary:
//! `protocols/NAME/agents.kdl` and `protocols/NAME/smoke.kdl` for each protocol of the
//! registry (so adding a protocol means adding its project there; a test fails until it
//! exists), and `project/` (the CI workflow and the README) for all. `%REPOSITORY%`,
//! `%PROTOCOL%` and `%BUILTIN%` in them are replaced when written. The protocols `--protocol`
//! accepts, and the builtin agent each project runs against, are the registry's.
//!
//! Nothing that exists is overwritten without `--force`: every file that would be is listed
//! and nothing is written (exit 2). Two exceptions: `.gitignore`, where `runs/` is appended
//! to an existing one (once), as `cargo init` does with its `target/`; and an existing
//! `README.md`, which is left as it is while the project's goes to `suites/README.md`.

use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use clap::Args;
use clap::builder::{PossibleValue, PossibleValuesParser};
use include_dir::{Dir, include_dir};
use trellis_dsl::lang::ProtocolSpec;
use trellis_engine::protocol::registry;

use super::console::{errln, outln};
use super::{EXIT_FAILED, EXIT_INVALID, EXIT_OK};

/// The project templates (see the module docs).
static TEMPLATES: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/src/cli/init");

/// Where the generated workflow installs trellis from, and the docs the files link to.
const REPOSITORY: &str = env!("CARGO_PKG_REPOSITORY");

/// The line `.gitignore` gets, so run results stay out of git.
const IGNORED_RUNS: &str = "/runs/";

#[derive(Debug, Args)]
pub struct InitArgs {
    /// The project's directory; created when missing.
    #[arg(value_name = "DIR", default_value = ".")]
    dir: PathBuf,
    /// The protocol the agent under test speaks. The project runs against that protocol's
    /// built-in reference agent until `suites/agents.kdl` points it at yours. Required:
    /// without it, init lists the protocols and exits 2.
    #[arg(long, value_name = "PROTOCOL", value_parser = protocol_names())]
    protocol: Option<String>,
    /// Overwrite the project's files where they already exist (`.gitignore` is only ever
    /// appended to).
    #[arg(long)]
    force: bool,
}

/// The registry's protocols, each with its description, as `--protocol` takes them (clap
/// then lists them in `--help` and suggests the nearest one for a typo).
fn protocol_names() -> PossibleValuesParser {
    PossibleValuesParser::new(
        registry::specs()
            .into_iter()
            .map(|spec| PossibleValue::new(spec.name).help(spec.help)),
    )
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
enum InitError {
    #[error("which protocol does the agent under test speak? Say it with --protocol")]
    #[diagnostic(
        code(trellis::init::no_protocol),
        help(
            "one of {list}; `trellis init --help` says what each is. For example: trellis \
             init --protocol connexity"
        )
    )]
    NoProtocol { list: String },

    #[error(
        "{} of the project already {} in {}:\n{}",
        if files.len() == 1 { "a file" } else { "files" },
        if files.len() == 1 { "exists" } else { "exist" },
        shown(dir),
        files.iter().map(|f| format!("  {f}")).collect::<Vec<_>>().join("\n")
    )]
    #[diagnostic(
        code(trellis::init::exists),
        help(
            "nothing was written; init another directory (`trellis init DIR`), move these \
             files away, or pass --force to overwrite them"
        )
    )]
    Exists { dir: PathBuf, files: Vec<String> },

    #[error("{} is not a directory", shown(path))]
    #[diagnostic(
        code(trellis::init::not_a_directory),
        help("give a directory (created when missing) for the project")
    )]
    NotADirectory { path: PathBuf },

    #[error("cannot write {}", shown(path))]
    #[diagnostic(code(trellis::init::io))]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("this trellis has no project template for protocol `{protocol}` ({file})")]
    #[diagnostic(
        code(trellis::init::no_template),
        help("a bug: every protocol of the registry should have one under src/cli/init/")
    )]
    NoTemplate { protocol: String, file: String },
}

impl InitError {
    fn exit_code(&self) -> u8 {
        match self {
            InitError::Io { .. } | InitError::NoTemplate { .. } => EXIT_FAILED,
            InitError::NoProtocol { .. }
            | InitError::Exists { .. }
            | InitError::NotADirectory { .. } => EXIT_INVALID,
        }
    }
}

/// A path as the user reads it: `.` as "the current directory".
fn shown(path: &Path) -> String {
    if path == Path::new(".") {
        "the current directory".to_owned()
    } else {
        path.display().to_string()
    }
}

/// One file of the project: where it goes (relative to DIR), its text, and what it is for
/// the summary.
struct ProjectFile {
    path: &'static str,
    text: String,
    what: &'static str,
}

pub fn init(args: InitArgs) -> u8 {
    match run(&args) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            let code = e.exit_code();
            errln!("{:?}", miette::Report::new(e));
            code
        }
    }
}

fn run(args: &InitArgs) -> Result<(), InitError> {
    let Some(spec) = args
        .protocol
        .as_deref()
        .and_then(|name| registry::specs().into_iter().find(|s| s.name == name))
    else {
        return Err(InitError::NoProtocol {
            list: protocol_list(),
        });
    };
    let mut files = project(spec)?;
    let dir = &args.dir;
    if dir.exists() && !dir.is_dir() {
        return Err(InitError::NotADirectory { path: dir.clone() });
    }
    // A repository's own README stays as it is (init runs in `.` by default, which is
    // usually a repository's root): the project's goes next to the suites instead.
    if !args.force
        && dir.join("README.md").symlink_metadata().is_ok()
        && let Some(readme) = files.iter_mut().find(|f| f.path == "README.md")
    {
        readme.path = "suites/README.md";
        readme.what = "what these files are, and the commands (README.md is yours: left as it was)";
    }
    // Every file that would be overwritten, listed at once, before anything is written.
    let existing: Vec<&ProjectFile> = files
        .iter()
        .filter(|f| dir.join(f.path).symlink_metadata().is_ok())
        .collect();
    if !args.force && !existing.is_empty() {
        return Err(InitError::Exists {
            dir: dir.clone(),
            files: existing.iter().map(|f| f.path.to_owned()).collect(),
        });
    }
    let mut written = Vec::with_capacity(files.len() + 1);
    for file in &files {
        let path = dir.join(file.path);
        write(&path, &file.text, args.force)?;
        let replaced = existing.iter().any(|e| e.path == file.path);
        written.push((file.path, file.what, replaced));
    }
    let gitignore = match ignore_runs(&dir.join(".gitignore"))? {
        Gitignore::Created => "run results (runs/) stay out of git",
        Gitignore::Appended => "runs/ added: run results stay out of git",
        Gitignore::AlreadyIgnored => "already keeps runs/ out of git; left as it was",
    };
    written.push((".gitignore", gitignore, false));
    report(args, spec, &written);
    Ok(())
}

/// The protocols' names, for the error without `--protocol`.
fn protocol_list() -> String {
    registry::specs()
        .iter()
        .map(|s| s.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The project's files for `spec`, their markers replaced.
fn project(spec: &ProtocolSpec) -> Result<Vec<ProjectFile>, InitError> {
    let template = |file: String| {
        TEMPLATES
            .get_file(&file)
            .and_then(|f| f.contents_utf8())
            .ok_or_else(|| InitError::NoTemplate {
                protocol: spec.name.to_owned(),
                file,
            })
    };
    let builtin = spec.builtins.first().ok_or_else(|| InitError::NoTemplate {
        protocol: spec.name.to_owned(),
        file: "a builtin agent in the protocol's spec".to_owned(),
    })?;
    let fill = |text: &str| {
        text.replace("%REPOSITORY%", REPOSITORY)
            .replace("%PROTOCOL%", spec.name)
            .replace("%BUILTIN%", builtin)
    };
    let name = spec.name;
    Ok(vec![
        ProjectFile {
            path: "suites/agents.kdl",
            text: fill(template(format!("protocols/{name}/agents.kdl"))?),
            what: "the agent under test: swap its `agent` line to test yours",
        },
        ProjectFile {
            path: "suites/smoke.kdl",
            text: fill(template(format!("protocols/{name}/smoke.kdl"))?),
            what: "the scenarios it must get right",
        },
        ProjectFile {
            path: ".github/workflows/trellis.yml",
            text: fill(template("project/trellis.yml".to_owned())?),
            what: "CI: the suites against a pinned baseline, the report uploaded",
        },
        ProjectFile {
            path: "README.md",
            text: fill(template("project/README.md".to_owned())?),
            what: "what these files are, and the commands",
        },
    ])
}

/// Writes `text` to `path`, creating its directory. Without `replace` the file must not
/// exist when it is created (one that appeared since the check is not clobbered either).
fn write(path: &Path, text: &str, replace: bool) -> Result<(), InitError> {
    let io_error = |source| InitError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io_error)?;
    }
    super::import::write_text(path, text, replace).map_err(io_error)
}

enum Gitignore {
    Created,
    Appended,
    AlreadyIgnored,
}

/// Makes `.gitignore` ignore `runs/`: created, or appended to unless a line already does.
fn ignore_runs(path: &Path) -> Result<Gitignore, InitError> {
    let io_error = |source| InitError::Io {
        path: path.to_path_buf(),
        source,
    };
    let entry = format!("# Trellis run results (`trellis run`)\n{IGNORED_RUNS}\n");
    match std::fs::read_to_string(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            write(path, &entry, false)?;
            Ok(Gitignore::Created)
        }
        Err(e) => Err(io_error(e)),
        Ok(text) => {
            let ignored = text
                .lines()
                .map(str::trim)
                .any(|line| matches!(line, "runs" | "runs/" | "/runs" | "/runs/"));
            if ignored {
                return Ok(Gitignore::AlreadyIgnored);
            }
            let separator = if text.is_empty() || text.ends_with('\n') {
                ""
            } else {
                "\n"
            };
            std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .and_then(|mut file| file.write_all(format!("{separator}{entry}").as_bytes()))
                .map_err(io_error)?;
            Ok(Gitignore::Appended)
        }
    }
}

/// What was written, and the command to run next.
fn report(args: &InitArgs, spec: &ProtocolSpec, written: &[(&str, &str, bool)]) {
    let builtin = spec.builtins.first().copied().unwrap_or_default();
    outln!(
        "Wrote the project in {} for protocol `{}`, against the built-in agent `{builtin}`:",
        shown(&args.dir),
        spec.name
    );
    let width = written.iter().map(|(p, _, _)| p.len()).max().unwrap_or(0);
    for (path, what, replaced) in written {
        let replaced = if *replaced { " (replaced)" } else { "" };
        outln!("  {path:width$}  {what}{replaced}");
    }
    if let Some(root) = enclosing_repository(&args.dir) {
        let sub = relative_to(&args.dir, &root);
        // `working-directory` applies to `run` steps only: the cache and upload steps'
        // `path`s stay relative to the root, and without the prefix the runs cache never
        // holds the baseline, so every build pins its own run and can never fail.
        outln!(
            "note: {} is inside the git repository {}, where GitHub reads workflows only from \
             .github/workflows at the root: move trellis.yml there, give its job \
             `defaults: {{ run: {{ working-directory: {sub} }} }}`, and prefix the `path:` of \
             its cache and upload steps with `{sub}/` (`runs` becomes `{sub}/runs`, \
             `${{{{ env.RUN_DIR }}}}` becomes `{sub}/${{{{ env.RUN_DIR }}}}`): `uses:` steps do \
             not take `working-directory`",
            shown(&args.dir),
            root.display(),
        );
    }
    let cd = if args.dir == Path::new(".") {
        String::new()
    } else {
        format!(
            "cd {} && ",
            super::console::shell_quote(&args.dir.to_string_lossy())
        )
    };
    outln!("Next: {cd}trellis run");
}

/// The root of the git repository `dir` is inside of, when it is not that root itself.
fn enclosing_repository(dir: &Path) -> Option<PathBuf> {
    let dir = std::fs::canonicalize(dir).ok()?;
    if dir.join(".git").exists() {
        return None;
    }
    dir.ancestors()
        .skip(1)
        .find(|a| a.join(".git").exists())
        .map(Path::to_path_buf)
}

/// `dir` relative to `root` (which contains it), for the note about the workflow.
fn relative_to(dir: &Path, root: &Path) -> String {
    std::fs::canonicalize(dir)
        .ok()
        .and_then(|d| d.strip_prefix(root).ok().map(Path::to_path_buf))
        .map_or_else(|| dir.display().to_string(), |d| d.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every protocol of the registry has a project, with a builtin agent to run against,
    /// and every marker is replaced.
    #[test]
    fn every_protocol_has_a_project() {
        // The workflow installs from it and the files link to its docs.
        assert!(REPOSITORY.starts_with("https://"), "{REPOSITORY:?}");
        for spec in registry::specs() {
            let files = project(spec).unwrap_or_else(|e| panic!("{}: {e}", spec.name));
            let agents = &files[0].text;
            let builtin = format!("builtin=\"{}\"", spec.builtins[0]);
            assert!(
                agents.contains(&format!("protocol=\"{}\"", spec.name))
                    && agents.contains(&builtin),
                "{}: suites/agents.kdl does not declare its agent against {builtin}",
                spec.name
            );
            for file in &files {
                assert!(
                    !file.text.contains("%REPOSITORY%")
                        && !file.text.contains("%PROTOCOL%")
                        && !file.text.contains("%BUILTIN%"),
                    "{}: {} keeps a marker",
                    spec.name,
                    file.path
                );
            }
        }
    }
}
