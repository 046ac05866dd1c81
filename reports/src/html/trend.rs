//! Each scenario's pass rate over recent runs, for the sparkline in its section.
//!
//! [`ScenarioTrend`] is what the page draws; [`trends_from_sibling_runs`] is one simple way
//! to fill it (the run directories next to this one, read from their `summary.json`). A
//! history module that knows named runs and baselines can fill it instead.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use trellis_records::RunInfo;

use crate::tables::RUNS_FILE;

/// One run's result for one scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrendPoint {
    pub run_id: String,
    /// RFC 3339, UTC; points are drawn in this order.
    pub started_at: String,
    pub passed: u64,
    /// Trajectories that ran (skipped ones are left out, as in every pass rate).
    pub ran: u64,
}

/// A scenario's results over earlier runs, oldest first (the current run is added by the
/// page itself).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScenarioTrend {
    pub points: Vec<TrendPoint>,
}

/// Trends by (suite, scenario).
pub type Trends = BTreeMap<(String, String), ScenarioTrend>;

/// Where a page's trends come from. They are loaded once the page knows which scenarios it
/// draws (at most a few hundred of a dataset's thousands), and only for those.
pub(crate) enum TrendSource<'a> {
    /// Given whole by the caller.
    Given(&'a Trends),
    /// The `limit` latest earlier runs in the directories next to `run_dir`.
    Siblings {
        run_dir: &'a Path,
        limit: usize,
    },
    None,
}

/// (suite, scenario) pairs a page draws. foldhash, as for the statistics' names: each row
/// of every summary read is looked up, and std's SipHash was an eighth of the reading.
pub(crate) type Wanted<'w> = HashSet<(&'w str, &'w str), foldhash::fast::FixedState>;

impl<'a> TrendSource<'a> {
    pub(crate) fn load(&self, info: &RunInfo, wanted: &Wanted<'_>) -> Cow<'a, Trends> {
        match *self {
            TrendSource::Given(trends) => Cow::Borrowed(trends),
            TrendSource::Siblings { run_dir, limit } => Cow::Owned(trends_from_sibling_runs(
                run_dir,
                &info.run_id,
                &info.started_at,
                limit,
                wanted,
            )),
            TrendSource::None => Cow::Owned(Trends::new()),
        }
    }
}

/// The `limit` most recent runs in the directories next to `run_dir` that started before
/// `started_at`, per scenario of `wanted`. A directory that is not a complete run (no
/// readable `summary.json`) is passed over: a trend is a convenience, never a reason to
/// fail.
///
/// Only runs of the same suite files count (as `run.json`'s `source` says; a run that does
/// not say is counted): an unrelated suite's runs draw no point, and reading their summaries
/// (hundreds of MB for a large dataset's) made a one-trajectory run take seconds.
///
/// Runs are taken latest first, by the run id (its directory's name, else its `run.json`'s),
/// and only the `limit` latest are read. Each sibling's `summary.json` is read, not its
/// Parquet tables: the end of every run reads this, and a runs directory only grows (the
/// trajectories table of one 20,000-case run took longer to read than the rest of a small
/// run's reports), and only as far as its scenario rows (see [`read_summary`]).
pub(crate) fn trends_from_sibling_runs(
    run_dir: &Path,
    run_id: &str,
    started_at: &str,
    limit: usize,
    wanted: &Wanted<'_>,
) -> Trends {
    let Some(parent) = run_dir.parent().filter(|_| limit > 0 && !wanted.is_empty()) else {
        return Trends::new();
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Trends::new();
    };
    let current = (started_at, run_id);
    let ours = suite_files(crate::history::RunMeta::read(run_dir).ok().flatten());
    // The `limit` latest earlier runs, by (started_at, run_id).
    let mut latest: BTreeMap<(String, String), Vec<ScenarioRow>> = BTreeMap::new();
    // Every summary is read into this one buffer: ten of a 20,000-scenario suite's were 22
    // MB each, and each newly allocated buffer was 5,400 page faults.
    let mut text = Vec::new();
    // A runs directory only grows, and reading every sibling's summary made the end of a
    // run next to 1,000 others 60 ms longer. Directories named by their run id (what
    // `runs/` holds) sort by when they started without being read; others are dated by
    // their `run.json`'s run id. They are read latest first, and once `limit` earlier runs
    // are kept, the older ones are passed over. A directory whose run id says nothing of
    // when it started is read; and every one once a name read turns out not to be its
    // run's id (a directory named as an older run than it holds can be passed over).
    //
    // Other directories (`--out results/main`) are dated, unread, by when their `run.json`
    // was last written: a run writes it as it starts, so its start is no later than that.
    // Taken in that order, one whose file is older than the oldest kept run's start is
    // passed over unread (reading every such sibling's `run.json` made the end of a run
    // next to 300 of them 3 ms longer).
    let mut dated: Vec<(Dated, PathBuf, Option<crate::history::RunMeta>)> = Vec::new();
    for dir in entries.filter_map(Result::ok).map(|e| e.path()) {
        if let Some(key) = dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(run_id_key)
        {
            dated.push((Dated::Named(key), dir, None));
            continue;
        }
        if let Some(written) = written_at(&dir) {
            dated.push((Dated::WrittenBy(written), dir, None));
            continue;
        }
        let meta = crate::history::RunMeta::read(&dir).ok().flatten();
        match meta.as_ref().and_then(|m| run_id_key(&m.run_id)) {
            Some(key) => dated.push((Dated::Named(key), dir, meta)),
            None if same_suites(ours.as_ref(), meta) => {
                consider(&dir, current, limit, wanted, &mut latest, &mut text);
            }
            None => {}
        }
    }
    dated.sort_unstable_by(|a, b| b.0.at().cmp(a.0.at()));
    // A run id is made before its run starts (its `started_at` is a few ms later), so runs
    // are compared by their ids' times: once `limit` runs are kept, a directory whose id is
    // older than the oldest kept one's is passed over, and so is every one after it.
    let mut names_hold = true;
    for (dated_by, dir, meta) in dated {
        let oldest_kept = || {
            latest
                .first_key_value()
                .and_then(|((_, oldest), _)| run_id_key(oldest))
        };
        let key = match dated_by {
            Dated::WrittenBy(written) => {
                // Started no later than its `run.json` was written: older than every kept
                // run, it cannot be one of the latest.
                if latest.len() >= limit
                    && oldest_kept().is_some_and(|oldest| written.as_str() < oldest.0.as_str())
                {
                    continue;
                }
                let meta = crate::history::RunMeta::read(&dir).ok().flatten();
                if same_suites(ours.as_ref(), meta) {
                    consider(&dir, current, limit, wanted, &mut latest, &mut text);
                }
                continue;
            }
            Dated::Named(key) => key,
        };
        if names_hold && latest.len() >= limit && oldest_kept().is_some_and(|oldest| key < oldest) {
            break;
        }
        let meta = meta.or_else(|| crate::history::RunMeta::read(&dir).ok().flatten());
        if !same_suites(ours.as_ref(), meta) {
            continue;
        }
        if let Some(read) = consider(&dir, current, limit, wanted, &mut latest, &mut text) {
            names_hold &= read.1 == key.1;
        }
    }
    let mut trends = Trends::new();
    for ((started, id), scenarios) in latest {
        let mut counts: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
        for row in scenarios {
            let slot = counts.entry((row.suite, row.scenario)).or_default();
            slot.0 += row.counts.passed;
            slot.1 += row.counts.trajectories.saturating_sub(row.counts.skipped);
        }
        for (key, (passed, ran)) in counts {
            trends.entry(key).or_default().points.push(TrendPoint {
                run_id: id.clone(),
                started_at: started.clone(),
                passed,
                ran,
            });
        }
    }
    trends
}

/// How a sibling directory is placed among the runs before it is read.
enum Dated {
    /// By the run id its name is: `(started_at, run_id)` as [`run_id_key`] reads it.
    Named((String, String)),
    /// By when its `run.json` was last written (RFC 3339, UTC, to the millisecond): no
    /// earlier than its run started.
    WrittenBy(String),
}

impl Dated {
    /// The time it is ordered by, latest first.
    fn at(&self) -> &str {
        match self {
            Dated::Named((started, _)) => started,
            Dated::WrittenBy(written) => written,
        }
    }
}

/// When `dir`'s `run.json` was last written, if it has one the file system dates.
fn written_at(dir: &Path) -> Option<String> {
    let modified = std::fs::metadata(dir.join(crate::history::RUN_META_FILE))
        .ok()?
        .modified()
        .ok()?;
    Some(humantime::format_rfc3339_millis(modified).to_string())
}

/// The suite files a run loaded, as its `run.json` says (`None`: it does not say).
fn suite_files(meta: Option<crate::history::RunMeta>) -> Option<HashSet<String>> {
    Some(meta?.source?.files.into_iter().map(|f| f.path).collect())
}

/// Whether a run of `theirs` ran any suite file of `ours`; a run that does not say (or
/// this one does not) is taken to.
fn same_suites(ours: Option<&HashSet<String>>, theirs: Option<crate::history::RunMeta>) -> bool {
    match (ours, suite_files(theirs)) {
        (Some(ours), Some(theirs)) => theirs.iter().any(|f| ours.contains(f)),
        _ => true,
    }
}

/// What a trend needs of a `summary.json`: the run, and its scenario rows that the page
/// draws.
struct TrendStats {
    run_id: String,
    started_at: String,
    scenarios: Vec<ScenarioRow>,
}

/// One scenario × agent of a summary.
struct ScenarioRow {
    suite: String,
    scenario: String,
    counts: RowCounts,
}

/// A scenario row as it is read: its names borrowed from the file where they need no
/// unescaping, so that the rows the page does not draw cost no allocation.
#[derive(Deserialize)]
struct RowIn<'f> {
    #[serde(borrow)]
    suite: Cow<'f, str>,
    #[serde(borrow)]
    scenario: Cow<'f, str>,
    counts: RowCounts,
}

#[derive(Deserialize)]
struct RowCounts {
    trajectories: u64,
    passed: u64,
    skipped: u64,
}
/// Reads the run in `dir` into `latest` (the `limit` latest runs before `current`, by
/// `(started_at, run_id)`) if it is a whole run; returns its `(started_at, run_id)` if it
/// has a summary.
fn consider(
    dir: &Path,
    current: (&str, &str),
    limit: usize,
    wanted: &Wanted<'_>,
    latest: &mut BTreeMap<(String, String), Vec<ScenarioRow>>,
    text: &mut Vec<u8>,
) -> Option<(String, String)> {
    // A watch rerun, watch's `latest` mirror or one shard of a run is not a whole run: its
    // pass counts would draw a scenario's trend from part of the suite.
    if dir.file_name() == Some(std::ffi::OsStr::new(crate::history::WATCH_LATEST))
        || !dir.join(RUNS_FILE).is_file()
        || crate::history::is_part_of_run(dir)
    {
        return None;
    }
    // A re-scoring of an earlier run's transcripts is not a run of its own: the same
    // conversations would count twice.
    if crate::history::RunMeta::read(dir)
        .ok()
        .flatten()
        .is_some_and(|m| m.rejudged_from.is_some())
    {
        return None;
    }
    let TrendStats {
        run_id: id,
        started_at: started,
        scenarios,
    } = read_summary(&dir.join(crate::SUMMARY_FILE), wanted, text)?;
    let key = (started, id);
    if key.1 == current.1 || (key.0.as_str(), key.1.as_str()) >= current {
        return Some(key);
    }
    latest.insert(key.clone(), scenarios);
    if latest.len() > limit {
        latest.pop_first();
    }
    Some(key)
}

/// `(started_at, run_id)` as a run directory named by its run id says: `20261122T035000.123Z-1a2b`
/// (or the older `20261122T035000Z-1a2b`) was made at `2026-11-22T03:50:00.123Z` (or `…:00Z`),
/// a few ms before its run started.
fn run_id_key(name: &str) -> Option<(String, String)> {
    let (stamp, salt) = name.split_once("Z-")?;
    let (seconds, millis) = match stamp.split_once('.') {
        Some((seconds, millis)) => (seconds, Some(millis)),
        None => (stamp, None),
    };
    let (date, time) = seconds.split_once('T')?;
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(date, 8)
        || !digits(time, 6)
        || millis.is_some_and(|m| !digits(m, 3))
        || salt.len() != 4
        || !salt.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return None;
    }
    let started = format!(
        "{}-{}-{}T{}:{}:{}{}Z",
        &date[..4],
        &date[4..6],
        &date[6..],
        &time[..2],
        &time[2..4],
        &time[4..],
        millis.map(|m| format!(".{m}")).unwrap_or_default()
    );
    Some((started, name.to_string()))
}

/// Reads what a trend needs of the `summary.json` at `path`, keeping the scenario rows of
/// `wanted`: a line at a time as Trellis writes it ([`read_summary_rows`]), else whole
/// ([`read_summary_whole`]).
fn read_summary(path: &Path, wanted: &Wanted<'_>, text: &mut Vec<u8>) -> Option<TrendStats> {
    use std::io::Seek as _;
    let file = std::fs::File::open(path).ok()?;
    match read_summary_rows(&file, wanted, text) {
        Some(read) => read,
        // The same file from its start: not opened again.
        None => {
            (&file).rewind().ok()?;
            read_summary_whole(&file, wanted, text)
        }
    }
}

/// The longest head (everything before the scenario rows: the run's metadata and
/// aggregates) [`read_summary_rows`] takes; a longer one is not a summary as written here.
const MAX_HEAD: usize = 1 << 20;

/// Reads a summary as `summary.json` is written (`crate::json::RowsFormatter`): its head up
/// to the line that opens `"scenarios": [`, then one scenario row per line, each starting
/// with its suite and scenario; `None` when the file is laid out otherwise (an earlier
/// version, or written by hand), for [`read_summary_whole`] to read.
///
/// A row whose names are not wanted is passed over from its first bytes, unparsed, and the
/// file is read through a small buffer: a page drawing a few scenarios next to runs of a
/// 20,000-scenario suite parsed every row of each (about 25 ms and a 22 MB buffer apiece),
/// so a one-scenario `--filter` run next to five of them took 150 ms to write its results
/// instead of 2.
fn read_summary_rows(
    file: &std::fs::File,
    wanted: &Wanted<'_>,
    head: &mut Vec<u8>,
) -> Option<Option<TrendStats>> {
    use std::io::{BufRead as _, Read as _};
    let mut reader = std::io::BufReader::with_capacity(1 << 16, file);
    head.clear();
    loop {
        let start = head.len();
        // At most what is left of the head's room, so that a summary on one line (written
        // compact) is not read whole twice.
        let room = (MAX_HEAD - start) as u64;
        if (&mut reader).take(room).read_until(b'\n', head).ok()? == 0 || head.len() >= MAX_HEAD {
            return None;
        }
        if head[start..].trim_ascii() == br#""scenarios": ["# {
            head.truncate(start);
            break;
        }
    }
    // The head is an object cut after `stats`' aggregates: closed, it gives the run.
    let cut = head.trim_ascii_end();
    let cut = cut.strip_suffix(b",").unwrap_or(cut).len();
    head.truncate(cut);
    head.extend_from_slice(b"}}");
    #[derive(Deserialize)]
    struct Head {
        stats: HeadStats,
    }
    #[derive(Deserialize)]
    struct HeadStats {
        run_id: String,
        started_at: String,
    }
    let Head {
        stats: HeadStats { run_id, started_at },
    } = serde_json::from_slice(head).ok()?;
    let mut scenarios = Vec::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).ok()? == 0 {
            // Cut short in its rows: not a whole summary, however it is read.
            return Some(None);
        }
        let row = line.trim_ascii();
        let row = row.strip_suffix(b",").unwrap_or(row);
        if row == b"]" {
            break;
        }
        if !(row.starts_with(b"{") && row.ends_with(b"}")) {
            return None;
        }
        if let Some(names) = plain_names(row)
            && !wanted.contains(&names)
        {
            continue;
        }
        let row: RowIn<'_> = serde_json::from_slice(row).ok()?;
        if wanted.contains(&(row.suite.as_ref(), row.scenario.as_ref())) {
            scenarios.push(ScenarioRow {
                suite: row.suite.into_owned(),
                scenario: row.scenario.into_owned(),
                counts: row.counts,
            });
        }
    }
    Some(Some(TrendStats {
        run_id,
        started_at,
        scenarios,
    }))
}

/// A scenario row's suite and scenario as written at its start
/// (`{"suite":"…","scenario":"…",`), when neither has an escape to undo; `None` otherwise,
/// and the row is parsed to know.
fn plain_names(row: &[u8]) -> Option<(&str, &str)> {
    let rest = row.strip_prefix(br#"{"suite":""#)?;
    let (suite, rest) = plain_string(rest)?;
    let rest = rest.strip_prefix(br#","scenario":""#)?;
    let (scenario, rest) = plain_string(rest)?;
    rest.starts_with(b",").then_some((suite, scenario))
}

/// The text of a JSON string up to its closing quote, and what follows the quote; `None`
/// when an escape comes first.
fn plain_string(text: &[u8]) -> Option<(&str, &[u8])> {
    let end = text.iter().position(|&b| b == b'"' || b == b'\\')?;
    if text[end] != b'"' {
        return None;
    }
    Some((std::str::from_utf8(&text[..end]).ok()?, &text[end + 1..]))
}

/// Reads what a trend needs of a `summary.json` whatever its layout (the whole text from
/// `file`'s position, through serde), keeping the scenario rows of `wanted`.
///
/// The scenario rows come before the branches, nodes and criteria in `stats`, and reading
/// stops once they are read: a 20,000-row dataset's summary is 43 MB, of which the rows
/// are the first 17, and the end of every run next to such runs read each of them whole
/// (80 ms and 45 MB each, for a run that took 10 ms). The stop is an error the reading
/// returns once the value is in hand; a file that ends before it is not a summary.
fn read_summary_whole(
    mut file: &std::fs::File,
    wanted: &Wanted<'_>,
    text: &mut Vec<u8>,
) -> Option<TrendStats> {
    use std::io::Read as _;
    // Read whole, not through a reader: serde_json parses a reader's bytes one call at a
    // time, which took three times the instructions of the whole file read and parsed.
    text.clear();
    file.read_to_end(text).ok()?;
    let mut found = None;
    let mut reader = serde_json::Deserializer::from_slice(text);
    let read = SummarySeed {
        wanted,
        found: &mut found,
    }
    .deserialize(&mut reader);
    // A summary without `stats` (or without its run) reads to its end without finding it.
    if read.is_ok() {
        return None;
    }
    found
}

/// The text of the error that stops reading a summary once its trend is read.
const STOP: &str = "the trend has what it needs";

/// The whole `summary.json`: only its `stats` is read.
struct SummarySeed<'s, 'w> {
    wanted: &'s Wanted<'w>,
    found: &'s mut Option<TrendStats>,
}

impl<'de> DeserializeSeed<'de> for SummarySeed<'_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for SummarySeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a summary.json object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key == "stats" {
                return map.next_value_seed(StatsSeed {
                    wanted: self.wanted,
                    found: self.found,
                });
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
}

/// `stats`: its run id, its start and its scenario rows; then the reading stops.
struct StatsSeed<'s, 'w> {
    wanted: &'s Wanted<'w>,
    found: &'s mut Option<TrendStats>,
}

impl<'de> DeserializeSeed<'de> for StatsSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for StatsSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("the summary's stats object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (mut run_id, mut started_at, mut scenarios) = (None, None, None);
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "run_id" => run_id = Some(map.next_value::<String>()?),
                "started_at" => started_at = Some(map.next_value::<String>()?),
                "scenarios" => scenarios = Some(map.next_value_seed(RowsSeed(self.wanted))?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            if run_id.is_some() && started_at.is_some() && scenarios.is_some() {
                if let (Some(run_id), Some(started_at), Some(scenarios)) =
                    (run_id.take(), started_at.take(), scenarios.take())
                {
                    *self.found = Some(TrendStats {
                        run_id,
                        started_at,
                        scenarios,
                    });
                }
                return Err(de::Error::custom(STOP));
            }
        }
        Ok(())
    }
}

/// `stats.scenarios`, keeping the rows of the scenarios wanted.
struct RowsSeed<'s, 'w>(&'s Wanted<'w>);

impl<'de> DeserializeSeed<'de> for RowsSeed<'_, '_> {
    type Value = Vec<ScenarioRow>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Vec<ScenarioRow>, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for RowsSeed<'_, '_> {
    type Value = Vec<ScenarioRow>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("the summary's scenario rows")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<ScenarioRow>, A::Error> {
        let mut rows = Vec::new();
        while let Some(row) = seq.next_element::<RowIn<'de>>()? {
            if self
                .0
                .contains(&(row.suite.as_ref(), row.scenario.as_ref()))
            {
                rows.push(ScenarioRow {
                    suite: row.suite.into_owned(),
                    scenario: row.scenario.into_owned(),
                    counts: row.counts,
                });
            }
        }
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A finished run of `run_id` started at `started_at` in `parent/name`.
    fn run(parent: &Path, name: &str, run_id: &str, started_at: &str) {
        let dir = parent.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(RUNS_FILE), b"").unwrap();
        let summary = serde_json::json!({"stats": {
            "run_id": run_id,
            "started_at": started_at,
            "scenarios": [{"suite": "s", "scenario": "c",
                "counts": {"trajectories": 1, "passed": 1, "skipped": 0}}],
        }});
        std::fs::write(dir.join(crate::SUMMARY_FILE), summary.to_string()).unwrap();
    }

    /// The run ids on the trend of a run started 2026-11-04 next to these finished runs, each
    /// `(directory name, run id, started_at)`; a name of `None` is the run's id.
    fn trend_runs(runs: &[(Option<&str>, &str, &str)]) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        for (name, run_id, started_at) in runs {
            run(dir.path(), name.unwrap_or(run_id), run_id, started_at);
        }
        let current = "20261104T000000.000Z-eeee";
        let current_dir = dir.path().join(current);
        let wanted = [("s", "c")].into_iter().collect::<Wanted>();
        trends_from_sibling_runs(&current_dir, current, "2026-11-04T00:00:00Z", 2, &wanted)
            .remove(&("s".to_string(), "c".to_string()))
            .map(|t| t.points.into_iter().map(|p| p.run_id).collect())
            .unwrap_or_default()
    }

    #[test]
    fn the_latest_earlier_runs_whether_named_by_their_id_or_not() {
        let trend = trend_runs(&[
            (None, "20261101T000000.000Z-aaaa", "2026-11-01T00:00:00Z"),
            (None, "20261102T000000Z-bbbb", "2026-11-02T00:00:00Z"),
            (
                Some("baseline"),
                "20261102T120000.000Z-dddd",
                "2026-11-02T12:00:00Z",
            ),
            (None, "20261103T000000.000Z-cccc", "2026-11-03T00:00:00Z"),
            // Started after the current run: not an earlier one.
            (None, "20261105T000000.000Z-ffff", "2026-11-05T00:00:00Z"),
        ]);
        assert_eq!(
            trend,
            ["20261102T120000.000Z-dddd", "20261103T000000.000Z-cccc"]
        );
    }

    #[test]
    fn a_directory_named_as_a_later_run_is_placed_by_the_run_it_holds() {
        let trend = trend_runs(&[
            (None, "20261101T000000.000Z-aaaa", "2026-11-01T00:00:00Z"),
            (None, "20261102T000000.000Z-bbbb", "2026-11-02T00:00:00Z"),
            // Named as the latest, holding the oldest.
            (
                Some("20261103T120000.000Z-0000"),
                "20261031T000000.000Z-9999",
                "2026-10-31T00:00:00Z",
            ),
            (None, "20261103T000000.000Z-cccc", "2026-11-03T00:00:00Z"),
        ]);
        assert_eq!(
            trend,
            ["20261102T000000.000Z-bbbb", "20261103T000000.000Z-cccc"]
        );
    }

    #[test]
    fn reading_stops_once_the_latest_are_kept_though_runs_start_after_their_ids() {
        // Each run started 4 ms after its id was made, as runs do. The oldest one's summary
        // claims a later start than any: it is drawn only if it is read, and it is not read.
        let trend = trend_runs(&[
            (
                None,
                "20261101T000000.000Z-aaaa",
                "2026-11-03T06:00:00.000Z",
            ),
            (
                None,
                "20261102T000000.000Z-bbbb",
                "2026-11-02T00:00:00.004Z",
            ),
            (
                None,
                "20261103T000000.000Z-cccc",
                "2026-11-03T00:00:00.004Z",
            ),
        ]);
        assert_eq!(
            trend,
            ["20261102T000000.000Z-bbbb", "20261103T000000.000Z-cccc"]
        );
    }

    /// Directories not named by their run id (`--out results/main`) are dated by their
    /// `run.json`'s time before they are read: one written before the oldest kept run
    /// started is passed over unread; one written later is read and placed by the run it
    /// holds, whenever that started.
    #[test]
    fn directories_named_otherwise_are_read_latest_written_first_and_old_ones_not_at_all() {
        use std::time::{Duration, SystemTime, UNIX_EPOCH};
        let dir = tempfile::tempdir().unwrap();
        let at = |rfc3339: &str| {
            let date = humantime::parse_rfc3339(rfc3339).unwrap();
            assert!(date > UNIX_EPOCH + Duration::from_secs(1));
            date
        };
        let named = |name: &str, run_id: &str, started_at: &str, written: SystemTime| {
            run(dir.path(), name, run_id, started_at);
            let d = dir.path().join(name);
            crate::history::RunMeta {
                run_id: run_id.to_owned(),
                ..crate::history::RunMeta::default()
            }
            .write(&d)
            .unwrap();
            let file = std::fs::File::options()
                .write(true)
                .open(d.join(crate::history::RUN_META_FILE))
                .unwrap();
            file.set_modified(written).unwrap();
        };
        // Kept: the two latest earlier runs, one named otherwise and written later on.
        run(
            dir.path(),
            "20261103T000000.000Z-cccc",
            "20261103T000000.000Z-cccc",
            "2026-11-03T00:00:00.004Z",
        );
        named(
            "main",
            "20261102T000000.000Z-bbbb",
            "2026-11-02T00:00:00.004Z",
            at("2026-11-20T00:00:00Z"),
        );
        // Written before the kept runs started, its summary claiming a later start than
        // any: drawn only if it is read, and it is not read.
        named(
            "old-branch",
            "20261101T000000.000Z-aaaa",
            "2026-11-03T06:00:00.000Z",
            at("2026-11-01T00:00:05Z"),
        );
        // Written late (copied, renamed), started early: read, and placed by its start.
        named(
            "copied",
            "20261031T000000.000Z-9999",
            "2026-10-31T00:00:00.004Z",
            at("2026-11-25T00:00:00Z"),
        );
        let current = "20261104T000000.000Z-eeee";
        let wanted = [("s", "c")].into_iter().collect::<Wanted>();
        let trend: Vec<String> = trends_from_sibling_runs(
            &dir.path().join(current),
            current,
            "2026-11-04T00:00:00Z",
            2,
            &wanted,
        )
        .remove(&("s".to_string(), "c".to_string()))
        .map(|t| t.points.into_iter().map(|p| p.run_id).collect())
        .unwrap_or_default();
        assert_eq!(
            trend,
            ["20261102T000000.000Z-bbbb", "20261103T000000.000Z-cccc"]
        );
    }

    #[test]
    fn only_runs_of_the_same_suite_files_are_read_and_drawn() {
        use crate::history::{RunMeta, RunSource, SourceFileMeta};
        let dir = tempfile::tempdir().unwrap();
        let meta = |run_id: &str, file: &str| RunMeta {
            run_id: run_id.to_owned(),
            source: Some(RunSource {
                files: vec![SourceFileMeta {
                    path: file.to_owned(),
                    blake3: String::new(),
                }],
                ..RunSource::default()
            }),
            ..RunMeta::default()
        };
        let current = "20261104T000000.000Z-eeee";
        let current_dir = dir.path().join("now");
        std::fs::create_dir_all(&current_dir).unwrap();
        meta(current, "/s/shop.kdl").write(&current_dir).unwrap();
        // Custom names, dated by their run.json: the same suite, an unrelated one (the latest,
        // and with the scenario's name too), and one that does not say.
        for (name, run_id, file) in [
            ("same", "20261101T000000.000Z-aaaa", Some("/s/shop.kdl")),
            (
                "other",
                "20261103T000000.000Z-bbbb",
                Some("/elsewhere/big.kdl"),
            ),
            ("unsaid", "20261102T000000.000Z-cccc", None),
        ] {
            run(
                dir.path(),
                name,
                run_id,
                &format!("2026-11-0{}T00:00:00Z", &run_id[7..8]),
            );
            let d = dir.path().join(name);
            match file {
                Some(file) => meta(run_id, file).write(&d).unwrap(),
                None => RunMeta {
                    run_id: run_id.to_owned(),
                    ..RunMeta::default()
                }
                .write(&d)
                .unwrap(),
            }
        }
        let wanted = [("s", "c")].into_iter().collect::<Wanted>();
        let trend: Vec<String> =
            trends_from_sibling_runs(&current_dir, current, "2026-11-04T00:00:00Z", 5, &wanted)
                .remove(&("s".to_string(), "c".to_string()))
                .map(|t| t.points.into_iter().map(|p| p.run_id).collect())
                .unwrap_or_default();
        assert_eq!(
            trend,
            ["20261101T000000.000Z-aaaa", "20261102T000000.000Z-cccc"]
        );
    }

    /// A summary is read up to its scenario rows, and of those only the ones wanted are kept;
    /// names with escapes read as names without.
    #[test]
    fn a_summary_is_read_as_far_as_its_wanted_scenario_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("summary.json");
        let row = |suite: &str, scenario: &str, passed: u64| {
            serde_json::json!({"suite": suite, "scenario": scenario, "agent": "a",
                "counts": {"trajectories": 2, "passed": passed, "failed": 0, "skipped": 0},
                "latency": {"p50_ms": 1.5}})
        };
        let rows = serde_json::json!([row("s", "a", 1), row("s", "b\"q", 2), row("t", "a", 0)]);
        // Everything after the rows is cut off mid-value: it is never read.
        let text = format!(
            "{{\"schema_version\": 1, \"meta\": {{\"x\": [1, {{}}]}}, \"stats\": {{\
             \"run_id\": \"r\", \"started_at\": \"2026\", \"scenarios\": {rows}, \
             \"branches\": [{{\"suite\": \"s\", \"brok"
        );
        std::fs::write(&path, &text).unwrap();
        let wanted = [("s", "b\"q"), ("t", "a"), ("u", "v")]
            .into_iter()
            .collect::<Wanted>();
        let read = read_summary(&path, &wanted, &mut Vec::new()).unwrap();
        assert_eq!(
            (read.run_id.as_str(), read.started_at.as_str()),
            ("r", "2026")
        );
        let kept: Vec<(&str, &str, u64)> = read
            .scenarios
            .iter()
            .map(|r| (r.suite.as_str(), r.scenario.as_str(), r.counts.passed))
            .collect();
        assert_eq!(kept, [("s", "b\"q", 2), ("t", "a", 0)]);

        // Cut before the rows end, or without its run: not a summary.
        std::fs::write(&path, &text[..text.find("\"t\"").unwrap()]).unwrap();
        assert!(read_summary(&path, &wanted, &mut Vec::new()).is_none());
        std::fs::write(&path, r#"{"stats": {"scenarios": [], "started_at": "x"}}"#).unwrap();
        assert!(read_summary(&path, &wanted, &mut Vec::new()).is_none());
        std::fs::write(&path, r#"{"meta": {}}"#).unwrap();
        assert!(read_summary(&path, &wanted, &mut Vec::new()).is_none());
    }

    /// A summary as `summary.json` is written is read a line at a time, unwanted rows
    /// passed over unparsed, to what reading it whole gives: names with escapes, non-ASCII
    /// text and a row whose names start like a wanted one's included. A summary laid out
    /// otherwise (compact, on one line) is read whole.
    #[test]
    fn a_summary_as_written_is_read_by_its_lines_as_it_reads_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("summary.json");
        let names = [
            ("s", "plain"),
            ("s", "plain-not"),
            ("s", "q\"uote"),
            ("s", "back\\slash"),
            ("sü", "café ☕"),
            ("t", "plain"),
        ];
        let mut stats = crate::stats::RunStats {
            run_id: "20261104T000000.000Z-aaaa".into(),
            started_at: "2026-11-04T00:00:00.000Z".into(),
            suites: vec!["s".into(), "t".into()],
            ..Default::default()
        };
        for (i, (suite, scenario)) in names.iter().enumerate() {
            let row = serde_json::json!({"suite": suite, "scenario": scenario, "agent": "a",
                "counts": {"trajectories": 4, "passed": i, "failed": 0, "errors": 0,
                    "skipped": 1, "invalid": 0},
                "repeats": {"samples": 4, "passed": i, "skipped": 1, "pass_rate": null,
                    "interval": null, "at_k": [], "flaky": false},
                "latency": {"turns": 4, "p50_ms": 1.5, "p95_ms": 2.0, "max_ms": 3.0,
                    "mean_ms": 1.75}});
            stats
                .scenarios
                .push(serde_json::from_value(row).expect("a scenario row"));
        }
        let summary = crate::Summary {
            schema_version: 2,
            meta: Some(crate::history::RunMeta {
                run_id: stats.run_id.clone(),
                labels: [("scenarios".to_owned(), "[".to_owned())].into(),
                ..Default::default()
            }),
            stats,
        };
        crate::write_json(&path, &summary).unwrap();
        let open = || std::fs::File::open(&path).unwrap();
        let kept = |read: &TrendStats| -> Vec<(String, String, u64)> {
            read.scenarios
                .iter()
                .map(|r| (r.suite.clone(), r.scenario.clone(), r.counts.passed))
                .collect()
        };
        for wanted in [
            vec![("s", "plain"), ("sü", "café ☕"), ("s", "q\"uote")],
            vec![("s", "back\\slash"), ("t", "plain"), ("x", "none")],
            names.to_vec(),
        ] {
            let wanted = wanted.into_iter().collect::<Wanted>();
            let by_lines = read_summary_rows(&open(), &wanted, &mut Vec::new())
                .expect("laid out as written")
                .expect("a whole summary");
            let whole = read_summary_whole(&open(), &wanted, &mut Vec::new()).unwrap();
            assert_eq!(kept(&by_lines), kept(&whole));
            assert_eq!(
                kept(&by_lines).len(),
                wanted.iter().filter(|w| w.0 != "x").count()
            );
            assert_eq!(
                (by_lines.run_id.as_str(), by_lines.started_at.as_str()),
                (whole.run_id.as_str(), whole.started_at.as_str())
            );
        }

        // Compact: not the layout, so read whole, to the same rows.
        let wanted = names.iter().copied().collect::<Wanted>();
        let compact = serde_json::to_string(&summary).unwrap();
        std::fs::write(&path, &compact).unwrap();
        assert!(read_summary_rows(&open(), &wanted, &mut Vec::new()).is_none());
        assert_eq!(
            kept(&read_summary(&path, &wanted, &mut Vec::new()).unwrap()).len(),
            6
        );

        // Cut short in its rows: no trend, whichever way it is read.
        crate::write_json(&path, &summary).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, &text[..text.find("café").unwrap()]).unwrap();
        assert!(read_summary(&path, &wanted, &mut Vec::new()).is_none());
    }

    #[test]
    fn run_ids_give_their_start() {
        assert_eq!(
            run_id_key("20261122T035000.123Z-1a2b"),
            Some((
                "2026-11-22T03:50:00.123Z".into(),
                "20261122T035000.123Z-1a2b".into()
            ))
        );
        assert_eq!(
            run_id_key("20261122T035000Z-1a2b").map(|k| k.0),
            Some("2026-11-22T03:50:00Z".into())
        );
        for name in [
            "baseline",
            "20261122T035000.12Z-1a2b",
            "20261122T035000Z-1a2",
            "2026112T035000Z-1a2b",
        ] {
            assert_eq!(run_id_key(name), None, "{name}");
        }
    }
}
