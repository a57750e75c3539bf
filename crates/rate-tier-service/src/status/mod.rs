//! The status page of the debug listener: `GET /status`, HTML that reads
//! without JavaScript, and its JSON twin `GET /status.json`, which a small
//! script of the page (`/status.js`, served by the binary like its style
//! sheet) reads every few seconds to refresh it.
//!
//! What it shows, from what the service already counts:
//! - each domain's rules (kind, limit, unit, shadow, unlimited) with their
//!   hits, refusals and near-limit answers over the last minute and, per
//!   minute, over the last hour ([`History`], a sample of the rules'
//!   counters every [`SAMPLE_EVERY`]);
//! - the keys nearest their limit in the last minute ([`Near`]): a tag (a
//!   keyed hash, its key random per process) unless the operator asked for
//!   them in clear (`--status-keys-in-clear`);
//! - the store, its breaker and its mean latency over the last minute;
//! - the last config loads, an invalid one with its file and line.
//!
//! With `--admin-token-file` every status route asks for the token: as a
//! bearer token, or as the password of HTTP Basic (any user name), which a
//! browser asks for and then sends with the page's own refreshes.

mod page;

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rate_tier_storage::StorageExt;
use serde::Serialize;

use crate::config::{Config, RuleLimit};
use crate::decide::Decider;

pub(crate) use page::{html, script};

/// How often the rules' counters are sampled for the last hour's chart.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// The chart's span, in minutes.
const HOUR_MINUTES: usize = 60;
/// At most this many keys are kept as near their limit.
const NEAR_KEPT: usize = 32;
/// At most this many are shown.
const NEAR_SHOWN: usize = 10;
/// A key is near its limit "right now" for this long after it was seen.
const NEAR_FOR_SECS: u64 = 60;
/// The config loads kept.
const RELOADS_KEPT: usize = 10;
const MINUTE_MS: u64 = 60_000;

/// A rule's counts: envoyproxy/ratelimit's per-rule stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Counts {
    pub(crate) hits: u64,
    pub(crate) over_limit: u64,
    pub(crate) near_limit: u64,
}

impl Counts {
    fn since(self, earlier: Counts) -> Counts {
        Counts {
            hits: self.hits.saturating_sub(earlier.hits),
            over_limit: self.over_limit.saturating_sub(earlier.over_limit),
            near_limit: self.near_limit.saturating_sub(earlier.near_limit),
        }
    }
}

/// A rule, by domain and path (its metrics labels): `domain\npath`, one
/// allocation shared by every sample.
type RuleId = Arc<str>;

fn rule_id(domain: &str, path: &str) -> String {
    format!("{domain}\n{path}")
}

/// The counters at one instant, in ms since the service started.
#[derive(Debug, Default)]
struct Sample {
    at: u64,
    rules: HashMap<RuleId, Counts>,
    /// The store's decisions and their summed latency, in µs.
    decisions: u64,
    latency_us: u64,
}

/// The samples of the last hour, and one before it as its baseline: every
/// sample of the last [`RECENT_MS`], the first of each minute before. So a
/// count is exact over the last minute, and its minute in the chart is
/// off by less than a minute; the memory is about 75 samples per rule.
/// Counters start at 0 with the process: before the first sample, every
/// count is 0.
#[derive(Debug, Default)]
pub(crate) struct History {
    samples: VecDeque<Sample>,
    /// Each rule's id, shared by the samples that hold it.
    ids: HashSet<RuleId>,
}

/// Samples younger than this are all kept.
const RECENT_MS: u64 = 2 * MINUTE_MS;

impl History {
    /// `rules` at `at` (ms), with `decisions` and `latency_us` so far.
    fn push(
        &mut self,
        at: u64,
        rules: impl Iterator<Item = (String, Counts)>,
        decisions: u64,
        latency_us: u64,
    ) {
        let rules = rules
            .map(|(id, counts)| (self.intern(id), counts))
            .collect();
        self.samples.push_back(Sample {
            at,
            rules,
            decisions,
            latency_us,
        });
        let recent_from = at.saturating_sub(RECENT_MS);
        let mut kept: VecDeque<Sample> =
            VecDeque::with_capacity(self.samples.len());
        for sample in self.samples.drain(..) {
            let same_minute = kept
                .back()
                .is_some_and(|k| k.at / MINUTE_MS == sample.at / MINUTE_MS);
            if sample.at < recent_from && same_minute {
                continue;
            }
            kept.push_back(sample);
        }
        self.samples = kept;
        let keep_from =
            at.saturating_sub((HOUR_MINUTES as u64 + 1) * MINUTE_MS);
        while self.samples.get(1).is_some_and(|s| s.at <= keep_from) {
            self.samples.pop_front();
        }
        // Ids no sample holds any more (a rule gone with a reload).
        self.ids.retain(|id| Arc::strong_count(id) > 1);
    }

    /// At the start: every counter at 0, before any traffic, so that the
    /// first minute counts everything.
    fn starting() -> History {
        let mut history = History::default();
        history.push(0, std::iter::empty(), 0, 0);
        history
    }

    fn intern(&mut self, id: String) -> RuleId {
        if let Some(known) = self.ids.get(id.as_str()) {
            return known.clone();
        }
        let id: RuleId = id.into();
        self.ids.insert(id.clone());
        id
    }

    /// The newest sample taken at or before `at`.
    fn at(&self, at: u64) -> Option<&Sample> {
        self.samples.iter().rev().find(|s| s.at <= at)
    }

    fn counts_at(&self, rule: &str, at: u64) -> Counts {
        self.at(at)
            .and_then(|s| s.rules.get(rule).copied())
            .unwrap_or_default()
    }

    /// Per minute of the clock over the last hour, oldest first, the
    /// current minute (of `now`, in ms) last with the counts `live` now.
    /// A minute's count runs from the first sample taken in it to the
    /// first taken in the next.
    fn hour(&self, rule: &str, now: u64, live: Counts) -> Vec<Counts> {
        let start_of = |minute: u64| {
            self.samples
                .iter()
                .find(|s| s.at >= minute * MINUTE_MS)
                .map_or(live, |s| {
                    s.rules.get(rule).copied().unwrap_or_default()
                })
        };
        let current = now / MINUTE_MS;
        (0..HOUR_MINUTES as u64)
            .rev()
            .map(|ago| match current.checked_sub(ago) {
                Some(minute) => start_of(minute + 1).since(start_of(minute)),
                // Before the service started.
                None => Counts::default(),
            })
            .collect()
    }
}

/// A key seen near its limit.
#[derive(Debug, Clone)]
struct NearKey {
    domain: String,
    rule: String,
    key: String,
    remaining: u64,
    limit: u64,
    refused: bool,
    seen: u64,
}

impl NearKey {
    /// How much of its limit is left, as a fraction (cross-multiplied to
    /// compare without floats): lower is nearer.
    fn nearer_than(&self, other: &NearKey) -> bool {
        u128::from(self.remaining) * u128::from(other.limit.max(1))
            < u128::from(other.remaining) * u128::from(self.limit.max(1))
    }
}

/// The keys near their limit: at most [`NEAR_KEPT`], whatever the traffic.
#[derive(Debug, Default)]
pub(crate) struct Near {
    keys: Vec<NearKey>,
}

impl Near {
    fn saw(&mut self, seen: NearKey) {
        if let Some(kept) = self.keys.iter_mut().find(|k| {
            k.key == seen.key && k.rule == seen.rule && k.domain == seen.domain
        }) {
            *kept = seen;
            return;
        }
        if self.keys.len() < NEAR_KEPT {
            self.keys.push(seen);
            return;
        }
        // Full: the stalest goes if it is older than a minute, else the
        // farthest from its limit if the new one is nearer.
        let stalest = self.keys.iter().enumerate().min_by_key(|(_, k)| k.seen);
        if let Some((i, k)) = stalest
            && k.seen + NEAR_FOR_SECS < seen.seen
        {
            self.keys[i] = seen;
            return;
        }
        let farthest = self
            .keys
            .iter()
            .enumerate()
            .max_by(|(_, a), (_, b)| {
                if a.nearer_than(b) {
                    std::cmp::Ordering::Less
                } else if b.nearer_than(a) {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Equal
                }
            })
            .map(|(i, _)| i);
        if let Some(i) = farthest
            && seen.nearer_than(&self.keys[i])
        {
            self.keys[i] = seen;
        }
    }

    /// Those seen in the last minute, nearest first.
    fn now(&self, now: u64) -> Vec<NearKey> {
        let mut recent: Vec<NearKey> = self
            .keys
            .iter()
            .filter(|k| k.seen + NEAR_FOR_SECS >= now)
            .cloned()
            .collect();
        recent.sort_by(|a, b| {
            if a.nearer_than(b) {
                std::cmp::Ordering::Less
            } else if b.nearer_than(a) {
                std::cmp::Ordering::Greater
            } else {
                b.seen.cmp(&a.seen)
            }
        });
        recent.truncate(NEAR_SHOWN);
        recent
    }
}

/// One config load.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Reload {
    /// Seconds since the Unix epoch.
    pub(crate) at_unix_secs: u64,
    /// `success`, `error` (the config in use stays) or `kept_empty` (no
    /// config file: the config in use stays).
    pub(crate) result: &'static str,
    /// Why it was refused: the file and line, and the reason.
    pub(crate) error: Option<String>,
    /// The domains and rules of a config put in use.
    pub(crate) domains: usize,
    pub(crate) rules: usize,
}

impl Reload {
    fn now(result: &'static str) -> Reload {
        Reload {
            at_unix_secs: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            result,
            error: None,
            domains: 0,
            rules: 0,
        }
    }

    pub(crate) fn loaded(config: &Config) -> Reload {
        Reload {
            domains: config.domains().count(),
            rules: config.rule_count(),
            ..Reload::now("success")
        }
    }

    pub(crate) fn refused(result: &'static str, error: String) -> Reload {
        Reload {
            error: Some(error),
            ..Reload::now(result)
        }
    }
}

/// What the status page shows, gathered as the service runs. Its memory is
/// bounded by the config (one count per rule and sample) and constants.
#[derive(Debug)]
pub(crate) struct Board {
    started: Instant,
    keys_in_clear: bool,
    /// The tags' key: random per process, never shown.
    tagger: std::hash::RandomState,
    history: Mutex<History>,
    near: Mutex<Near>,
    reloads: Mutex<VecDeque<Reload>>,
    decisions: AtomicU64,
    latency_us: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Board {
    pub(crate) fn new(keys_in_clear: bool) -> Board {
        Board {
            started: Instant::now(),
            keys_in_clear,
            tagger: std::hash::RandomState::new(),
            history: Mutex::new(History::starting()),
            near: Mutex::default(),
            reloads: Mutex::default(),
            decisions: AtomicU64::new(0),
            latency_us: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A store decision that took `took`.
    pub(crate) fn store_latency(&self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.decisions.fetch_add(1, Ordering::Relaxed);
        self.latency_us.fetch_add(us, Ordering::Relaxed);
    }

    /// A key of `rule` answered near its limit, or refused. Skipped when
    /// another thread holds the list: the page shows a sample, and a
    /// decision never waits for it.
    pub(crate) fn near(
        &self,
        domain: &str,
        rule: &str,
        partition: &str,
        remaining: u64,
        limit: u64,
        refused: bool,
    ) {
        // Nothing is built for a decision that finds the list taken.
        let Ok(mut near) = self.near.try_lock() else {
            return;
        };
        let key = if self.keys_in_clear {
            partition.to_owned()
        } else {
            self.tag(domain, partition)
        };
        near.saw(NearKey {
            domain: domain.to_owned(),
            rule: rule.to_owned(),
            key,
            remaining,
            limit,
            refused,
            seen: self.now(),
        });
    }

    /// A key's tag: the same for one key all along the process, and no way
    /// back to the key without the process's random key.
    fn tag(&self, domain: &str, partition: &str) -> String {
        format!("tag:{:016x}", self.tagger.hash_one((domain, partition)))
    }

    pub(crate) fn reloaded(&self, reload: Reload) {
        let mut reloads = lock(&self.reloads);
        if reloads.len() == RELOADS_KEPT {
            reloads.pop_front();
        }
        reloads.push_back(reload);
    }

    /// Samples the counters of `config`'s rules.
    pub(crate) fn sample(&self, config: &Config) {
        lock(&self.history).push(
            self.now_ms(),
            live(config),
            self.decisions.load(Ordering::Relaxed),
            self.latency_us.load(Ordering::Relaxed),
        );
    }

    /// The page's content now.
    pub(crate) fn status(&self, decider: &Decider) -> Status {
        let (now, now_ms) = (self.now(), self.now_ms());
        let config = decider.config();
        let history = lock(&self.history);
        let mut domains: Vec<DomainStatus> = Vec::new();
        for rule in config.rules() {
            let id = rule_id(&rule.domain, &rule.path);
            let counts = rule.stats.get().map(counts).unwrap_or_default();
            let hour = history.hour(&id, now_ms, counts);
            let (kind, unlimited) = match rule.limit {
                RuleLimit::Quota(_) => ("rate", false),
                RuleLimit::Never => ("blocked", false),
                RuleLimit::Unlimited => ("unlimited", true),
            };
            let status = RuleStatus {
                path: rule.path.clone(),
                name: rule.name.clone(),
                kind,
                requests_per_unit: rule.requests_per_unit,
                unit: rule.unit.name(),
                shadow: rule.shadow,
                unlimited,
                last_minute: counts.since(
                    history.counts_at(&id, now_ms.saturating_sub(MINUTE_MS)),
                ),
                last_hour: HourCounts {
                    hits: hour.iter().map(|c| c.hits).collect(),
                    over_limit: hour.iter().map(|c| c.over_limit).collect(),
                    near_limit: hour.iter().map(|c| c.near_limit).collect(),
                },
            };
            match domains.iter_mut().find(|d| d.name == rule.domain) {
                Some(domain) => domain.rules.push(status),
                None => domains.push(DomainStatus {
                    name: rule.domain.clone(),
                    rules: vec![status],
                }),
            }
        }
        domains.sort_by(|a, b| a.name.cmp(&b.name));
        let (decisions, latency_us) = (
            self.decisions.load(Ordering::Relaxed),
            self.latency_us.load(Ordering::Relaxed),
        );
        let (before_decisions, before_latency) = history
            .at(now_ms.saturating_sub(MINUTE_MS))
            .map_or((0, 0), |s| (s.decisions, s.latency_us));
        drop(history);
        let recent = decisions.saturating_sub(before_decisions);
        let store = StoreStatus {
            kind: decider.store().kind(),
            breaker: decider.metrics().breaker().map(|s| s.as_str()),
            decisions_last_minute: recent,
            mean_latency_ms_last_minute: (recent > 0).then(|| {
                latency_us.saturating_sub(before_latency) as f64
                    / recent as f64
                    / 1000.0
            }),
        };
        let near_limit = lock(&self.near)
            .now(now)
            .into_iter()
            .map(|k| NearStatus {
                domain: k.domain,
                rule: k.rule,
                key: k.key,
                remaining: k.remaining,
                limit: k.limit,
                refused: k.refused,
                seen_secs_ago: now.saturating_sub(k.seen),
            })
            .collect();
        let reloads = lock(&self.reloads).iter().rev().cloned().collect();
        Status {
            uptime_secs: now,
            refresh_secs: SAMPLE_EVERY.as_secs().min(5),
            keys_in_clear: self.keys_in_clear,
            store,
            domains,
            near_limit,
            reloads,
        }
    }
}

/// Samples the rules' counters every [`SAMPLE_EVERY`], from now until
/// `stop` completes.
pub(crate) async fn sample_until(
    decider: std::sync::Arc<Decider>,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut every = tokio::time::interval(SAMPLE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop = std::pin::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            _ = every.tick() => decider.status().sample(&decider.config()),
        }
    }
}

/// The live counts of `config`'s rules.
fn live(config: &Config) -> impl Iterator<Item = (String, Counts)> + '_ {
    config.rules().iter().filter_map(|rule| {
        let stats = rule.stats.get()?;
        Some((rule_id(&rule.domain, &rule.path), counts(stats)))
    })
}

fn counts(stats: &crate::metrics::RuleStats) -> Counts {
    Counts {
        hits: stats.total_hits.get(),
        over_limit: stats.over_limit.get(),
        near_limit: stats.near_limit.get(),
    }
}

/// `/status.json`.
#[derive(Debug, Serialize)]
pub(crate) struct Status {
    pub(crate) uptime_secs: u64,
    /// How often the page refreshes itself.
    pub(crate) refresh_secs: u64,
    /// Whether `near_limit` shows keys as sent (`--status-keys-in-clear`)
    /// rather than as tags.
    pub(crate) keys_in_clear: bool,
    pub(crate) store: StoreStatus,
    pub(crate) domains: Vec<DomainStatus>,
    pub(crate) near_limit: Vec<NearStatus>,
    /// Newest first.
    pub(crate) reloads: Vec<Reload>,
}

#[derive(Debug, Serialize)]
pub(crate) struct StoreStatus {
    pub(crate) kind: &'static str,
    /// `closed`, `half-open` or `open`: Redis with its local fallback only.
    pub(crate) breaker: Option<&'static str>,
    pub(crate) decisions_last_minute: u64,
    pub(crate) mean_latency_ms_last_minute: Option<f64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct DomainStatus {
    pub(crate) name: String,
    pub(crate) rules: Vec<RuleStatus>,
}

#[derive(Debug, Serialize)]
pub(crate) struct RuleStatus {
    pub(crate) path: String,
    pub(crate) name: String,
    /// `rate` (GCRA), `blocked` (`requests_per_unit: 0`) or `unlimited`.
    pub(crate) kind: &'static str,
    pub(crate) requests_per_unit: u32,
    pub(crate) unit: &'static str,
    pub(crate) shadow: bool,
    pub(crate) unlimited: bool,
    pub(crate) last_minute: Counts,
    pub(crate) last_hour: HourCounts,
}

/// Per minute, oldest first, the last one ending now.
#[derive(Debug, Serialize)]
pub(crate) struct HourCounts {
    pub(crate) hits: Vec<u64>,
    pub(crate) over_limit: Vec<u64>,
    pub(crate) near_limit: Vec<u64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct NearStatus {
    pub(crate) domain: String,
    pub(crate) rule: String,
    /// A tag, or the key as sent with `--status-keys-in-clear`.
    pub(crate) key: String,
    pub(crate) remaining: u64,
    pub(crate) limit: u64,
    pub(crate) refused: bool,
    pub(crate) seen_secs_ago: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> String {
        rule_id("edge", "remote_address")
    }

    fn push(history: &mut History, at: u64, hits: u64) {
        let counts = Counts {
            hits,
            ..Counts::default()
        };
        history.push(at, [(rule(), counts)].into_iter(), 0, 0);
    }

    #[test]
    fn the_hour_is_per_minute_from_the_samples() {
        let mut history = History::default();
        // 10 hits a minute for 5 minutes, sampled every 10 s.
        for at in (0..=300).step_by(10) {
            push(&mut history, at * 1000, at / 6);
        }
        let hour = history.hour(
            &rule(),
            300_000,
            Counts {
                hits: 50,
                ..Counts::default()
            },
        );
        assert_eq!(hour.len(), 60);
        let hits: Vec<u64> = hour.iter().map(|c| c.hits).collect();
        // Minutes 0 to 4, then the current one, which has no hit yet.
        assert_eq!(&hits[54..], &[10, 10, 10, 10, 10, 0]);
        assert!(hits[..54].iter().all(|&h| h == 0), "{hits:?}");
        // Live counts move the last minute at once.
        let hour = history.hour(
            &rule(),
            300_000,
            Counts {
                hits: 57,
                ..Counts::default()
            },
        );
        assert_eq!(hour[59].hits, 7);
    }

    #[test]
    fn the_history_keeps_an_hour_and_its_baseline() {
        let mut history = History::default();
        for at in (0..=10_000).step_by(10) {
            push(&mut history, at * 1000, at);
        }
        // Every sample of the last 2 minutes (13), the first of each minute
        // before (60), back to one before the hour's start (6,340 s).
        let oldest = history.samples.front().map(|s| s.at);
        assert_eq!(oldest, Some(6_300_000));
        assert_eq!(history.samples.len(), 73);
        assert_eq!(history.ids.len(), 1, "one id shared by every sample");
        let hour = history.hour(
            &rule(),
            10_000_000,
            Counts {
                hits: 10_000,
                ..Counts::default()
            },
        );
        // Whole minutes of 60, then the current one's 40 s so far.
        assert!(hour[..59].iter().all(|c| c.hits == 60), "{hour:?}");
        assert_eq!(hour[59].hits, 40);
    }

    fn key(name: &str, remaining: u64, seen: u64) -> NearKey {
        NearKey {
            domain: "edge".into(),
            rule: "remote_address".into(),
            key: name.into(),
            remaining,
            limit: 10,
            refused: remaining == 0,
            seen,
        }
    }

    #[test]
    fn near_keys_are_bounded_and_the_nearest_stay() {
        let mut near = Near::default();
        for i in 0..1000u64 {
            near.saw(key(&format!("k{i}"), 1 + i % 9, 5));
        }
        assert_eq!(near.keys.len(), NEAR_KEPT);
        near.saw(key("refused", 0, 5));
        let shown = near.now(5);
        assert_eq!(shown.len(), NEAR_SHOWN);
        assert_eq!(shown[0].key, "refused");
        assert!(shown.iter().skip(1).all(|k| k.remaining == 1), "{shown:?}");
        // A minute later, none is near "now"; new ones take the stale places.
        assert!(near.now(5 + NEAR_FOR_SECS + 1).is_empty());
        near.saw(key("later", 8, 100));
        assert_eq!(near.now(100)[0].key, "later");
    }

    #[test]
    fn a_key_is_shown_as_a_tag_unless_asked_in_clear() {
        let board = Board::new(false);
        board.near("edge", "remote_address", "10.0.0.7", 1, 10, false);
        let kept = lock(&board.near).keys[0].key.clone();
        assert!(kept.starts_with("tag:") && !kept.contains("10.0.0.7"));
        assert_eq!(kept, board.tag("edge", "10.0.0.7"));
        assert_ne!(kept, board.tag("edge", "10.0.0.8"));
        let board = Board::new(true);
        board.near("edge", "remote_address", "10.0.0.7", 1, 10, false);
        assert_eq!(lock(&board.near).keys[0].key, "10.0.0.7");
    }
}
