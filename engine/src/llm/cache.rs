//! The on-disk LLM response cache (`--llm-cache DIR`, `--llm-cache-mode`).
//!
//! Content addressed: the key is the SHA-256 of the canonical request (provider id and kind,
//! model, messages, temperature, max tokens, structured-output schema) plus the repetition
//! index, so `repeat 5` still draws five samples and a rerun reuses the same five. Only
//! successful answers are stored. An entry is a small JSON file, `DIR/ab/abcd….json`, holding
//! the request it answers (to read by hand) and the completion.
//!
//! Concurrent runs may share a directory: an entry is written to a temporary file in the same
//! directory and renamed into place, so a reader sees a whole entry or none, and two writers
//! of one key both write the same answer's shape (the last rename wins).

use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::meter::{LlmMeter, Role};
use super::provider::ProviderClient;
use super::{CacheUse, Completion, LlmCall, LlmError, LlmOutcome, LlmRequest};

/// `--llm-cache-mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CacheMode {
    /// Serve hits, call the provider on a miss and store the answer.
    #[default]
    ReadWrite,
    /// Never read or write the cache.
    Off,
    /// Serve hits; a miss is an error naming the call (CI: prove a run needs no LLM).
    ReplayOnly,
}

impl CacheMode {
    pub const ALL: [(&'static str, CacheMode); 3] = [
        ("read-write", CacheMode::ReadWrite),
        ("off", CacheMode::Off),
        ("replay-only", CacheMode::ReplayOnly),
    ];
}

impl FromStr for CacheMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .find(|(name, _)| *name == s)
            .map(|(_, mode)| *mode)
            .ok_or_else(|| format!("`{s}` is not a cache mode: read-write, off or replay-only"))
    }
}

/// One stored answer.
#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    request: Value,
    completion: Completion,
}

/// Rewrites an entry's text before it is written: the run's own secrets, which this layer
/// does not know (agents' header values, `crate::secrets` above it).
pub type Redactor = std::sync::Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The response cache of a run: a directory and a mode, or nothing.
#[derive(Clone, Default)]
pub struct LlmCache {
    dir: Option<PathBuf>,
    mode: CacheMode,
    redactor: Option<Redactor>,
}

impl std::fmt::Debug for LlmCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmCache")
            .field("dir", &self.dir)
            .field("mode", &self.mode)
            .field("redactor", &self.redactor.is_some())
            .finish()
    }
}

impl LlmCache {
    /// A cache in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>, mode: CacheMode) -> Self {
        LlmCache {
            dir: Some(dir.into()),
            mode,
            redactor: None,
        }
    }

    /// The same cache, writing entries through `redactor` too. A judge's prompt quotes the
    /// agent's replies and a simulator's the conversation, so an agent that echoes the
    /// header secret it was sent puts that secret in the request an entry stores: entries
    /// are kept, shared and committed, and are redacted as every record of the run is.
    pub fn redacting(mut self, redactor: Redactor) -> Self {
        self.redactor = Some(redactor);
        self
    }

    /// Why the cache cannot do its job, checked before a run: a read-write cache whose
    /// directory cannot be made or written (every entry would be lost and every call paid
    /// again on the next run, said nowhere but in each call's record), a replay-only one
    /// whose directory is not one.
    pub fn unusable(&self) -> Option<String> {
        let dir = self.dir.as_deref()?;
        match self.mode {
            CacheMode::Off => None,
            CacheMode::ReplayOnly => (!dir.is_dir()).then(|| {
                if dir.exists() {
                    format!("{} is not a directory", dir.display())
                } else {
                    format!("{} does not exist", dir.display())
                }
            }),
            CacheMode::ReadWrite if dir.exists() && !dir.is_dir() => {
                Some(format!("{} is not a directory", dir.display()))
            }
            CacheMode::ReadWrite => std::fs::create_dir_all(dir)
                .and_then(|()| tempfile::NamedTempFile::new_in(dir).map(drop))
                .err()
                .map(|e| format!("{} cannot be written: {e}", dir.display())),
        }
    }

    /// No cache: every call goes to the provider.
    pub fn disabled() -> Self {
        LlmCache::default()
    }

    pub fn mode(&self) -> CacheMode {
        self.mode
    }

    /// Removes the stored answer to `request`, if any: one its caller could not use (a
    /// judge's answer that does not parse), which replayed would be the same error on every
    /// later run. Read-write mode only: replay-only never changes the cache.
    pub async fn forget(&self, client: &ProviderClient, request: &LlmRequest, repetition: u32) {
        if self.mode != CacheMode::ReadWrite {
            return;
        }
        let (Some(dir), Some((_, key))) =
            (self.dir.as_deref(), Self::key(client, request, repetition))
        else {
            return;
        };
        // Gone already, or never written: nothing to forget either way.
        let _ = tokio::fs::remove_file(entry_path(dir, &key)).await;
    }

    /// The canonical request of a call (`None` when no model is known) and its key.
    pub fn key(
        client: &ProviderClient,
        request: &LlmRequest,
        repetition: u32,
    ) -> Option<(Value, String)> {
        let wire = client.resolved(request)?;
        // Where the request goes is part of it: a provider pointed at another server (a
        // bigger local model under the same id and model name) replayed the old server's
        // answers. Without the query (a key may be in it; entries hold the canonical
        // request) or a user and password.
        let url = client.url();
        let endpoint = format!(
            "{}://{}{}{}",
            url.scheme(),
            url.host_str().unwrap_or_default(),
            url.port().map(|p| format!(":{p}")).unwrap_or_default(),
            url.path()
        );
        let mut fields = json!({
            "version": 2,
            "endpoint": endpoint,
            "provider": client.id(),
            "kind": client.kind().as_str(),
            "model": wire.model,
            "messages": wire.messages,
            "temperature": wire.temperature,
            "max_tokens": wire.max_tokens,
            "json_schema": wire.json_schema,
            "repetition": repetition,
        });
        if request.attempt > 0
            && let Some(o) = fields.as_object_mut()
        {
            o.insert("attempt".to_owned(), json!(request.attempt));
        }
        let canonical = canonical(&fields);
        let digest = Sha256::digest(canonical.to_string().as_bytes());
        Some((canonical, hex::encode(digest)))
    }

    /// Answers `request` from the cache or through `client`, per the mode, and counts the
    /// call under `role` on `meter`, which may refuse to send it (`--max-llm-calls`). `call`
    /// names the call in a replay-only miss (`judge "…" on booking/book#0`).
    pub async fn complete(
        &self,
        client: &ProviderClient,
        request: &LlmRequest,
        repetition: u32,
        call: &str,
        deadline: Option<Instant>,
        (meter, role): (&LlmMeter, Role),
    ) -> LlmOutcome {
        let (Some(dir), Some((canonical, key))) = (
            self.dir.as_deref().filter(|_| self.mode != CacheMode::Off),
            Self::key(client, request, repetition),
        ) else {
            return send(client, request, deadline, meter, role, None).await;
        };
        let path = entry_path(dir, &key);
        let started = Instant::now();
        match read_entry(&path).await {
            Ok(Some(entry)) => {
                let completion = entry.completion;
                let record = LlmCall {
                    provider: client.id().to_owned(),
                    model: client.model_for(request).unwrap_or_default().to_owned(),
                    input_tokens: completion.input_tokens,
                    output_tokens: completion.output_tokens,
                    cost: client
                        .cost(completion.priced_input(), completion.output_tokens)
                        .map(|_| 0.0),
                    latency_ms: started.elapsed().as_secs_f64() * 1000.0,
                    cache: CacheUse::Hit,
                    ..LlmCall::default()
                };
                meter.record(role, &record);
                return LlmOutcome {
                    result: Ok(completion),
                    call: record,
                };
            }
            Ok(None) => {}
            // A damaged entry is replaced in read-write mode; replay-only cannot replace it.
            Err(e) if self.mode == CacheMode::ReplayOnly => {
                return failed(client, request, LlmError::Cache(e), meter, role);
            }
            Err(_) => {}
        }
        if self.mode == CacheMode::ReplayOnly {
            return failed(
                client,
                request,
                LlmError::CacheMiss {
                    call: call.to_owned(),
                    key,
                },
                meter,
                role,
            );
        }
        let mut outcome = send(client, request, deadline, meter, role, Some(CacheUse::Miss)).await;
        if let Ok(completion) = &outcome.result {
            let entry = Entry {
                request: canonical,
                completion: completion.clone(),
            };
            // A model that echoes the provider's key (a prompt that carried it, a debug
            // answer) must not leave it in a directory teams share and commit: the entry is
            // written with the key redacted, as every record of the run is, and so are the
            // run's other secrets.
            // Each string of the entry, not its JSON text: a model's answer that quotes the
            // key JSON-escaped (`\/` for `/`) is escaped once more in the entry's text, where
            // no spelling of the key matches it.
            let written = serde_json::to_value(&entry).and_then(|mut value| {
                redact_strings(&mut value, &|text: &str| {
                    let keyless = client.redact(text);
                    match self.redactor.as_ref().and_then(|redact| redact(&keyless)) {
                        Some(redacted) => redacted,
                        None => keyless,
                    }
                });
                serde_json::to_string(&value)
            });
            if let Err(e) = write_entry(path, written).await {
                // The answer is good; a cache that cannot be written costs a rerun, no more.
                outcome.call.error = Some(format!("LLM cache not written: {e}"));
            }
        }
        outcome
    }
}

/// Replaces every string of `value` (object keys too) by what `redact` makes of it.
fn redact_strings(value: &mut serde_json::Value, redact: &dyn Fn(&str) -> String) {
    use serde_json::Value;
    match value {
        Value::String(s) => {
            let redacted = redact(s);
            if redacted != *s {
                *s = redacted;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| redact_strings(v, redact)),
        Value::Object(map) => {
            let renamed: Vec<(String, String)> = map
                .keys()
                .filter_map(|k| {
                    let r = redact(k);
                    (r != *k).then(|| (k.clone(), r))
                })
                .collect();
            for (old, new) in renamed {
                if let Some(v) = map.remove(&old) {
                    map.insert(new, v);
                }
            }
            map.values_mut().for_each(|v| redact_strings(v, redact));
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// Sends `request`, each of its HTTP requests once the run's LLM budget admits it, and
/// counts it under `role` (as a cache miss with `cache`). A request the budget refuses,
/// first or retry, ends the call as refused; the requests sent before it count.
async fn send(
    client: &ProviderClient,
    request: &LlmRequest,
    deadline: Option<Instant>,
    meter: &LlmMeter,
    role: Role,
    cache: Option<CacheUse>,
) -> LlmOutcome {
    let tab = meter.tab();
    let mut outcome = client.complete_within(request, deadline, Some(&tab)).await;
    outcome.call.refused = matches!(outcome.result, Err(LlmError::Budget(_)));
    if let Some(cache) = cache {
        outcome.call.cache = cache;
    }
    meter.record_admitted(role, &outcome.call, tab);
    outcome
}

/// A call that ended before anything was sent, counted under `role`.
fn failed(
    client: &ProviderClient,
    request: &LlmRequest,
    error: LlmError,
    meter: &LlmMeter,
    role: Role,
) -> LlmOutcome {
    let outcome = unsent(client, request, error, Some(CacheUse::Miss));
    meter.record(role, &outcome.call);
    outcome
}

/// The outcome of a call that ended with `error` before anything was sent.
fn unsent(
    client: &ProviderClient,
    request: &LlmRequest,
    error: LlmError,
    cache: Option<CacheUse>,
) -> LlmOutcome {
    let mut call = LlmCall {
        provider: client.id().to_owned(),
        model: client.model_for(request).unwrap_or_default().to_owned(),
        error: Some(error.to_string()),
        refused: matches!(error, LlmError::Budget(_)),
        ..LlmCall::default()
    };
    if let Some(cache) = cache {
        call.cache = cache;
    }
    LlmOutcome {
        call,
        result: Err(error),
    }
}

fn entry_path(dir: &Path, key: &str) -> PathBuf {
    let shard = key.get(..2).unwrap_or("00");
    dir.join(shard).join(format!("{key}.json"))
}

async fn read_entry(path: &Path) -> Result<Option<Entry>, String> {
    match tokio::fs::read(path).await {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("damaged entry {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

async fn write_entry(
    path: PathBuf,
    entry: Result<String, serde_json::Error>,
) -> Result<(), String> {
    let entry = entry.map_err(|e| e.to_string())?;
    tokio::task::spawn_blocking(move || {
        let dir = path.parent().ok_or("entry path has no directory")?;
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut file =
            tempfile::NamedTempFile::new_in(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        std::io::Write::write_all(&mut file, entry.as_bytes()).map_err(|e| e.to_string())?;
        file.as_file().sync_all().map_err(|e| e.to_string())?;
        file.persist(&path)
            .map_err(|e| format!("{}: {}", path.display(), e.error))?;
        Ok(())
    })
    .await
    .map_err(|e| format!("cache writer failed: {e}"))?
}

/// `value` with every object's keys in sorted order, whatever order `serde_json` keeps them
/// in, so equal requests serialise to equal bytes.
fn canonical(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for k in keys {
                if let Some(v) = map.get(k) {
                    out.insert(k.clone(), canonical(v));
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_by_name() {
        assert_eq!("replay-only".parse(), Ok(CacheMode::ReplayOnly));
        assert!("replay".parse::<CacheMode>().is_err());
    }

    #[test]
    fn canonical_form_ignores_key_order() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":2,"x":[{"d":1,"c":2}]}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":[{"c":2,"d":1}],"y":2},"b":1}"#).unwrap();
        assert_eq!(canonical(&a).to_string(), canonical(&b).to_string());
    }
}
