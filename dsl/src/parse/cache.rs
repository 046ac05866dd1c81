//! What the loader keeps of one load of a project for the next: each file that parsed, with
//! what decoding it gave. An editor loads its project again on every keystroke, and watch
//! on every save; of a project's files usually one has changed, and parsing and decoding
//! the others again was most of that time (`docs/performance.md`, "The editor on a
//! project of many files").
//!
//! A file is taken from the cache only when everything its decoding read is the same: its
//! text, its path and the name its diagnostics show, the id its spans carry, and the
//! protocols agents may speak. Decoding reads nothing else (no other file, no file system,
//! no environment), so what it gave then is what it would give now. A file with a syntax
//! error is not kept: what it adds depends on how the parser recovered, and it is the one
//! being edited.

use super::*;

/// The loader's memory of the last load of one project: pass the same cache to
/// [`load_cached`] on every load of that project.
#[derive(Default)]
pub struct LoadCache {
    /// The protocols the kept files were decoded with, by name.
    protocols: Vec<&'static str>,
    /// By canonical path.
    files: HashMap<PathBuf, Kept>,
    /// How many files the last load took from the cache.
    reused: usize,
}

impl LoadCache {
    /// How many files are kept.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// How many files the last load took from the cache instead of parsing them.
    pub fn reused(&self) -> usize {
        self.reused
    }
}

/// One file as the last load read and decoded it.
struct Kept {
    file: SourceFile,
    id: FileId,
    decoded: Decoded,
}

/// What decoding one file gives, apart from the file itself.
#[derive(Clone)]
pub(super) struct Decoded {
    pub(super) items: FileItems,
    /// Its `include` nodes, followed once it is decoded.
    pub(super) includes: Vec<KdlNode>,
    /// The decoder's diagnostics of this file.
    pub(super) diags: Vec<Diagnostic>,
    /// What this file adds to the project's [`LoadInfo`].
    pub(super) info: LoadInfo,
    /// How many top-level nodes it has.
    pub(super) nodes: usize,
}

/// A cache in use by one load: files are taken from the last load's and put into this
/// one's, so that a file no longer loaded is forgotten.
pub(super) struct CacheRun {
    last: HashMap<PathBuf, Kept>,
    next: HashMap<PathBuf, Kept>,
    protocols: Vec<&'static str>,
    reused: usize,
}

impl CacheRun {
    pub(super) fn start(cache: &mut LoadCache, protocols: &[&'static lang::ProtocolSpec]) -> Self {
        let names: Vec<&'static str> = protocols.iter().map(|p| p.name).collect();
        let mut last = std::mem::take(&mut cache.files);
        if cache.protocols != names {
            last.clear();
        }
        CacheRun {
            last,
            next: HashMap::new(),
            protocols: names,
            reused: 0,
        }
    }

    pub(super) fn finish(self, cache: &mut LoadCache) {
        cache.files = self.next;
        cache.protocols = self.protocols;
        cache.reused = self.reused;
    }

    /// The texts kept, by canonical path: the threads that read a directory ahead do not
    /// parse a file whose text is one of these.
    pub(super) fn texts(&self) -> HashMap<PathBuf, Arc<str>> {
        self.last
            .iter()
            .map(|(path, kept)| (path.clone(), kept.file.text.clone()))
            .collect()
    }

    /// The file and what it decoded to, when the last load read the same text at `path`,
    /// shown as `name`, as file `id`.
    pub(super) fn take(
        &mut self,
        canonical: &Path,
        path: &Path,
        name: &str,
        id: FileId,
        text: &str,
    ) -> Option<(SourceFile, Decoded)> {
        let kept = self.last.get(canonical)?;
        if kept.id != id || kept.file.path != path || kept.file.name != name {
            return None;
        }
        if *kept.file.text != *text {
            return None;
        }
        let kept = self.last.remove(canonical)?;
        let out = (kept.file.clone(), kept.decoded.clone());
        self.reused += 1;
        self.next.insert(canonical.to_path_buf(), kept);
        Some(out)
    }

    /// Keeps a file that parsed, for the next load.
    pub(super) fn keep(
        &mut self,
        canonical: PathBuf,
        file: SourceFile,
        id: FileId,
        decoded: Decoded,
    ) {
        self.next.insert(canonical, Kept { file, id, decoded });
    }
}
