//! Cluster mode's master (`cluster_member: master`, Aralez 0.95): every configuration the
//! master's `POST /conf` accepts goes on to each of `worker_nodes` (their admin APIs, with the
//! master key), and the answer lists each worker's result. A configuration the master refuses
//! reaches no worker. A worker that could not take it (down, unreachable) is sent it again
//! with backoff (1 s, doubling to 60 s) until it does; every [`CHECK_EVERY`] the master also
//! reads each worker's `config_digest` from its `/status?digest`, and a worker that no longer has
//! what was pushed (it restarted from its file) is sent it again. `GET /status` on the master
//! shows each worker: the digest it reports, what was pushed and when, and how that went.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use tokio::time::Instant;

use crate::discovery::{text_digest, Reloader};
use crate::upstream::call;
use crate::utc::rfc3339;

/// The header a master's pushes carry, naming the master (its host name and admin API's URL):
/// a worker logs who pushed, and a master that receives one applies it without passing it on
/// (a master listed among its own workers, or two masters listing each other).
pub const PUSHED_BY_MASTER: &str = "x-aralez-pushed-by-master";

/// How long one push (or one status read) may take.
const EXCHANGE_DEADLINE: Duration = Duration::from_secs(5);
/// How often each worker's digest is checked.
pub const CHECK_EVERY: Duration = Duration::from_secs(5);
const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(60);
/// The most of a master's name a worker logs.
pub const SHOWN_MASTER_NAME: usize = 200;
/// A worker's answer is read up to this many bytes.
const MAX_ANSWER: usize = 64 * 1024;

/// A configuration to push.
#[derive(Debug)]
struct Pushed {
    yaml: Bytes,
    save: bool,
    digest: String,
}

#[derive(Debug, Default)]
struct WorkerState {
    /// The digest the worker took last (what was pushed, confirmed by a 2xx).
    taken: Option<String>,
    /// The digest its `/status` reported last.
    reported: Option<String>,
    last_push: Option<SystemTime>,
    last_result: Option<String>,
    backoff: Duration,
    next_try: Option<Instant>,
    /// Checks that found another digest than the one it took from this master, since it last
    /// kept this master's for [`STEADY_CHECKS`] checks.
    replaced: u32,
    /// Checks in a row that found this master's digest.
    ours_in_a_row: u32,
}

/// Checks in a row that must find a worker on this master's configuration before its count of
/// replacements starts again. Two masters whose checks fall at the same moment each find their
/// own configuration every other check: counted "in a row", neither ever said so.
const STEADY_CHECKS: u32 = 3;

impl WorkerState {
    /// A check found another configuration than the one pushed: the count to warn of, when due.
    /// Once is a worker that restarted from its own file; again is another writer: a second
    /// master listing it, or `POST /conf` sent to it directly.
    fn note_replaced(&mut self) -> Option<u32> {
        self.ours_in_a_row = 0;
        self.replaced += 1;
        (self.replaced == 2 || self.replaced % 60 == 0).then_some(self.replaced)
    }

    fn note_ours(&mut self) {
        self.ours_in_a_row += 1;
        if self.ours_in_a_row >= STEADY_CHECKS {
            self.replaced = 0;
        }
    }
}

#[derive(Debug)]
struct Worker {
    url: String,
    state: Mutex<WorkerState>,
}

impl Worker {
    fn state(&self) -> std::sync::MutexGuard<'_, WorkerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `text` as a header value: its visible ASCII, other characters as `?`.
fn header_text(text: &str) -> http::HeaderValue {
    let visible: String = text
        .chars()
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .collect();
    http::HeaderValue::from_str(&visible).unwrap_or(http::HeaderValue::from_static("a master"))
}

/// A worker's answer as one line of the master's log and answers: its line breaks and control
/// characters escaped (a worker's text split the master's log lines, and could forge some), at
/// most [`SHOWN_ANSWER`] characters.
fn one_line(text: &str) -> String {
    let mut chars = text.trim_end().escape_debug();
    let mut line: String = chars.by_ref().take(SHOWN_ANSWER).collect();
    if chars.next().is_some() {
        line.push_str("...");
    }
    line
}

/// The most of a worker's answer shown.
const SHOWN_ANSWER: usize = 2048;

/// The master's side of cluster mode.
#[derive(Debug)]
pub struct Cluster {
    workers: Vec<Worker>,
    master_key: String,
    /// What each push says of this master ([`PUSHED_BY_MASTER`]'s value).
    name: http::HeaderValue,
    /// The configuration pushed last; what every worker must have.
    current: Mutex<Option<Arc<Pushed>>>,
    /// Held from a `POST /conf`'s apply on the master to its push: two at once could apply in
    /// one order and be pushed in the other, leaving the workers on what the master no longer
    /// serves.
    turn: tokio::sync::Mutex<()>,
}

impl Cluster {
    pub fn new(worker_nodes: &[String], master_key: &str, name: &str) -> Cluster {
        let worker = |url: &String| Worker {
            url: url.clone(),
            state: Mutex::new(WorkerState::default()),
        };
        Cluster {
            workers: worker_nodes.iter().map(worker).collect(),
            master_key: master_key.to_string(),
            name: header_text(name),
            current: Mutex::new(None),
            turn: tokio::sync::Mutex::new(()),
        }
    }

    /// Taken by a `POST /conf` before it applies, held until its push is done.
    pub async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.turn.lock().await
    }

    fn current(&self) -> Option<Arc<Pushed>> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Sends `yaml` (accepted here) to every worker at once; one line per worker, and whether
    /// all took it.
    pub async fn push_all(&self, yaml: &str, save: bool) -> (bool, Vec<String>) {
        let pushed = self.set_current(yaml, save);
        let pushes = self.workers.iter().map(|w| self.push(w, &pushed));
        let results = futures_util::future::join_all(pushes).await;
        let lines = self
            .workers
            .iter()
            .zip(&results)
            .map(|(w, r)| format!("{}: {}", w.url, r.as_deref().unwrap_or_else(|e| e)))
            .collect();
        (results.iter().all(Result::is_ok), lines)
    }

    /// Follows the master's own file: a change to upstreams.yaml that the master applies, by
    /// its watcher or a SIGHUP, goes to every worker as `POST /conf` does: the text it applied
    /// (a later write it refused is not it), without `?save`. Edits to the file were applied on
    /// the master only, and `/status` still called the workers current. conf.d is each
    /// instance's own: a change there alone is not passed on (each worker merges its own), nor
    /// is an emptied file (a worker refuses an empty configuration).
    pub async fn follow_file_reloads(self: Arc<Self>, reloader: Arc<Reloader>) {
        let mut tick = tokio::time::interval(FIRST_RETRY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen = reloader.config_digest();
        let mut passed_on = reloader.applied_file_text();
        loop {
            tick.tick().await;
            let serving = reloader.config_digest();
            let changed = serving != seen;
            seen = serving;
            // A configuration `POST /conf` gave is pushed by it; a text unknown (written over
            // while it was read) waits for the next change.
            let Some(text) = reloader.applied_file_text() else {
                continue;
            };
            // The workers have what was pushed last (or, before any push, their own file,
            // taken as the master's at its start): a file that says that is conf.d's change
            // alone. Asked only when the serving configuration changed, a file served again
            // within a second of a `POST /conf` (a SIGHUP) went unseen; compared with the last
            // text passed on, a file back to it after a push was taken for conf.d's change.
            let workers_have = match self.current() {
                Some(pushed) => pushed.digest == text_digest(&text),
                None => passed_on.as_ref() == Some(&text),
            };
            if workers_have {
                if changed {
                    tracing::info!("conf.d changed on the master: not passed on (each worker merges its own conf.d)");
                }
                continue;
            }
            let said_before = passed_on.as_ref() == Some(&text);
            passed_on = Some(text.clone());
            if text.trim().is_empty() {
                if !said_before {
                    tracing::warn!("upstreams.yaml was emptied on the master: not passed on (the workers keep theirs)");
                }
                continue;
            }
            tracing::info!("upstreams.yaml applied on the master: passing it on to the workers");
            self.set_current(&text, false);
            for worker in &self.workers {
                let mut state = worker.state();
                state.taken = None;
                state.next_try = Some(Instant::now());
            }
        }
    }

    /// What is pushed from now on.
    fn set_current(&self, yaml: &str, save: bool) -> Arc<Pushed> {
        let pushed = Arc::new(Pushed {
            yaml: Bytes::copy_from_slice(yaml.as_bytes()),
            save,
            digest: text_digest(yaml),
        });
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(pushed.clone());
        pushed
    }

    /// One push to one worker; its state follows the outcome.
    async fn push(&self, worker: &Worker, pushed: &Pushed) -> Result<String, String> {
        let path = if pushed.save { "/conf?save" } else { "/conf" };
        let outcome = self
            .exchange(&worker.url, Method::POST, path, pushed.yaml.clone())
            .await;
        let outcome = match outcome {
            Ok((status, body)) if status.is_success() => {
                Ok(format!("{} {}", status.as_u16(), one_line(&body)))
            }
            Ok((status, body)) => Err(format!("{} {}", status.as_u16(), one_line(&body))),
            Err(e) => Err(format!("unreachable ({e}); will retry")),
        };
        let mut state = worker.state();
        state.last_push = Some(SystemTime::now());
        match &outcome {
            Ok(_) => {
                state.taken = Some(pushed.digest.clone());
                state.reported = Some(pushed.digest.clone());
                state.backoff = Duration::ZERO;
                state.next_try = None;
            }
            Err(_) => {
                state.taken = None;
                state.backoff = (state.backoff * 2).clamp(FIRST_RETRY, LAST_RETRY);
                state.next_try = Some(Instant::now() + state.backoff);
            }
        }
        state.last_result = Some(match &outcome {
            Ok(text) | Err(text) => text.clone(),
        });
        if let Err(e) = &outcome {
            tracing::warn!(worker = %worker.url, "cluster: push failed: {e}");
        }
        outcome
    }

    /// One request to a worker's admin API, with the master key; its status and body text.
    async fn exchange(
        &self,
        base: &str,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<(StatusCode, String), String> {
        let target = call::Target::parse(base)?;
        let req = Request::builder()
            .method(method)
            .uri(target.path(path))
            .header("x-api-key", &self.master_key)
            .header(PUSHED_BY_MASTER, self.name.clone())
            .body(Full::new(body))
            .map_err(|e| e.to_string())?;
        // The key opens the worker's `/conf`: an `https://` worker must prove who it is (the
        // system trust store, which `SSL_CERT_FILE` / `SSL_CERT_DIR` replace) before it is sent.
        let answer = call::send(&target, req, true, EXCHANGE_DEADLINE, MAX_ANSWER).await?;
        Ok((answer.status, answer.text()))
    }

    /// Reads a worker's `config_digest`; a worker that lost what it took must take it again.
    async fn check(&self, worker: &Worker, pushed: &Pushed) {
        let answer = self
            .exchange(&worker.url, Method::GET, "/status?digest", Bytes::new())
            .await;
        let Ok((StatusCode::OK, body)) = answer else {
            return;
        };
        let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let reported = json["config_digest"].as_str().map(str::to_string);
        let mut state = worker.state();
        let ours = reported.as_deref() == Some(pushed.digest.as_str());
        if !ours && state.taken.is_some() {
            state.taken = None;
            state.next_try = Some(Instant::now());
            if let Some(times) = state.note_replaced() {
                tracing::warn!(worker = %worker.url, "cluster: the worker's configuration was replaced by another than this master's {times} times without staying this master's for {STEADY_CHECKS} checks: another master lists it, or something else posts to its /conf; this master pushes its own again");
            }
        } else if ours {
            state.note_ours();
        }
        state.reported = reported;
    }

    /// The master's background work, for as long as the process runs: retries and checks.
    pub async fn keep_workers_current(self: Arc<Self>) {
        let mut tick = tokio::time::interval(FIRST_RETRY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_check = Instant::now();
        loop {
            tick.tick().await;
            let Some(pushed) = self.current() else {
                continue;
            };
            let checking = last_check.elapsed() >= CHECK_EVERY;
            if checking {
                last_check = Instant::now();
            }
            // All at once: one worker that takes the whole deadline to answer held every other
            // worker's push and check behind it (13 s for a file edit to reach them).
            let rounds = self.workers.iter().map(|worker| async {
                let due = {
                    let state = worker.state();
                    state.taken.is_none() && state.next_try.is_none_or(|at| Instant::now() >= at)
                };
                if due {
                    let _ = self.push(worker, &pushed).await;
                } else if checking {
                    self.check(worker, &pushed).await;
                }
            });
            futures_util::future::join_all(rounds).await;
        }
    }

    /// Each worker for `/status`.
    pub fn status_json(&self) -> serde_json::Value {
        let pushed = self.current().map(|p| p.digest.clone());
        let workers: Vec<serde_json::Value> = self
            .workers
            .iter()
            .map(|w| {
                let state = w.state();
                serde_json::json!({
                    "url": w.url,
                    "config_digest": state.reported,
                    "pushed_digest": pushed,
                    "current": pushed.is_some() && state.taken == pushed,
                    "last_push": state.last_push.map(rfc3339),
                    "last_result": state.last_result,
                })
            })
            .collect();
        serde_json::Value::Array(workers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replaced, then found ours, in turn: two masters whose checks fall together.
    #[test]
    fn turns_taken_every_other_check_are_said() {
        let mut state = WorkerState::default();
        assert_eq!(state.note_replaced(), None);
        state.note_ours();
        assert_eq!(state.note_replaced(), Some(2));
    }

    /// Checks that find each master's configuration by turns say it at the second turn.
    #[test]
    fn turns_taken_at_every_check_are_said() {
        let mut state = WorkerState::default();
        assert_eq!(state.note_replaced(), None);
        assert_eq!(state.note_replaced(), Some(2));
    }

    /// A worker that restarted from its file now and then is not another writer.
    #[test]
    fn a_replacement_after_a_steady_spell_counts_from_one() {
        let mut state = WorkerState::default();
        assert_eq!(state.note_replaced(), None);
        for _ in 0..STEADY_CHECKS {
            state.note_ours();
        }
        assert_eq!(state.note_replaced(), None);
    }
}
