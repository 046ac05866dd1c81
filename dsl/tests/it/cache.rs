//! The loader's cache (`trellis_dsl::load_cached`): after any sequence of edits to a
//! project's files, a load with it gives exactly what a load without it gives, and it takes
//! the files that did not change instead of parsing them again.

use std::path::Path;

use proptest::prelude::*;
use trellis_dsl::{Diagnostics, LoadCache, Project};

use super::fuzz::{bounded, config, mutated_suite, seeds};

/// A load's outcome as text: the project's model, or its diagnostics rendered. The files'
/// lazily filled column counts are left out: they are a cache of their own.
fn outcome(loaded: Result<Project, Diagnostics>) -> String {
    match loaded {
        Ok(mut project) => {
            let files: Vec<_> = project
                .files
                .drain(..)
                .map(|f| (f.path, f.name, f.text))
                .collect();
            format!("{files:?}\n{project:?}")
        }
        Err(diags) => format!("{diags}\n{}", diags.render_plain()),
    }
}

fn specs() -> Vec<&'static trellis_dsl::lang::ProtocolSpec> {
    trellis_engine::protocol::registry::specs()
}

/// Loads `dir` with and without `cache`; both must give the same.
fn same_with_cache(dir: &Path, cache: &mut LoadCache) -> Result<(), TestCaseError> {
    let fresh = outcome(trellis_dsl::load(&[dir], &specs()));
    let cached = outcome(trellis_dsl::load_cached(
        &[dir],
        &specs(),
        Default::default(),
        cache,
    ));
    prop_assert_eq!(fresh, cached);
    Ok(())
}

/// An edit of the project: file `0..4` (`a.kdl` … `d.kdl`) gets a new text, the text it had
/// before the last edit, or is removed.
#[derive(Clone, Debug)]
enum Edit {
    Write(usize, String),
    Undo(usize),
    Remove(usize),
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => (0..seeds().len()).prop_map(|i| seeds()[i].clone()),
        2 => mutated_suite(),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (0usize..4, text()).prop_map(|(f, t)| Edit::Write(f, t)),
        2 => (0usize..4).prop_map(Edit::Undo),
        1 => (0usize..4).prop_map(Edit::Remove),
    ]
}

#[test]
fn a_cached_load_is_the_load_after_any_edits() {
    proptest!(config(40), |(
        start in prop::collection::vec(text(), 3),
        edits in prop::collection::vec(edit(), 1..6),
    )| {
        let dir = tempfile::tempdir().unwrap();
        let name = |f: usize| dir.path().join(format!("{}.kdl", ["a", "b", "c", "d"][f]));
        let mut before: Vec<Option<String>> = vec![None; 4];
        for (f, t) in start.iter().enumerate() {
            std::fs::write(name(f), t).unwrap();
            before[f] = Some(t.clone());
        }
        let mut cache = LoadCache::default();
        let shown = format!("{start:?}\n{edits:?}");
        bounded(&shown, || -> Result<(), TestCaseError> {
            same_with_cache(dir.path(), &mut cache)?;
            for edit in &edits {
                match edit {
                    Edit::Write(f, t) => {
                        before[*f] = std::fs::read_to_string(name(*f)).ok();
                        std::fs::write(name(*f), t).unwrap();
                    }
                    Edit::Undo(f) => match before[*f].take() {
                        Some(t) => std::fs::write(name(*f), t).unwrap(),
                        None => {
                            let _ = std::fs::remove_file(name(*f));
                        }
                    },
                    Edit::Remove(f) => {
                        before[*f] = std::fs::read_to_string(name(*f)).ok();
                        let _ = std::fs::remove_file(name(*f));
                    }
                }
                same_with_cache(dir.path(), &mut cache)?;
            }
            Ok(())
        })?;
    });
}

const AGENTS: &str = "agent \"shop\" protocol=\"connexity\" builtin=\"booking\"\n";

fn scenario(id: &str) -> String {
    format!("scenario \"{id}\" {{\n    agent \"shop\"\n    user \"hi\"\n    expect no-error\n}}\n")
}

/// What each load took from the cache: every file that did not change, none of one that
/// did, none after the protocols changed, and the files after a removed one (their ids, and
/// so their spans, moved).
#[test]
fn unchanged_files_are_taken_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("a.kdl"), AGENTS).unwrap();
    std::fs::write(root.join("b.kdl"), scenario("one")).unwrap();
    std::fs::write(root.join("c.kdl"), scenario("two")).unwrap();
    let mut cache = LoadCache::default();
    let mut load = |protocols: &[&'static trellis_dsl::lang::ProtocolSpec]| {
        let loaded = trellis_dsl::load_cached(&[root], protocols, Default::default(), &mut cache);
        let scenarios = loaded
            .map(|p| p.suites.iter().map(|s| s.scenarios.len()).sum::<usize>())
            .map_err(|d| d.render_plain());
        (scenarios, cache.reused(), cache.len())
    };
    assert_eq!(load(&specs()), (Ok(2), 0, 3));
    assert_eq!(load(&specs()), (Ok(2), 3, 3));
    std::fs::write(root.join("b.kdl"), scenario("one") + &scenario("three")).unwrap();
    assert_eq!(load(&specs()), (Ok(3), 2, 3));
    // A file with a syntax error is not kept; the others still are.
    std::fs::write(root.join("c.kdl"), "scenario \"two\" {\n").unwrap();
    let (broken, reused, kept) = load(&specs());
    assert!(broken.is_err(), "{broken:?}");
    assert_eq!((reused, kept), (2, 2));
    std::fs::write(root.join("c.kdl"), scenario("two")).unwrap();
    assert_eq!(load(&specs()), (Ok(3), 2, 3));
    // Another registry of protocols decodes agents differently: nothing is taken.
    let fewer: Vec<_> = specs()
        .into_iter()
        .filter(|p| p.name == "connexity")
        .collect();
    assert_eq!(load(&fewer).1, 0);
    assert_eq!(load(&fewer).1, 3);
    std::fs::remove_file(root.join("a.kdl")).unwrap();
    let (without_agents, reused, kept) = load(&fewer);
    assert!(without_agents.is_err(), "{without_agents:?}");
    assert_eq!((reused, kept), (0, 2));
}
