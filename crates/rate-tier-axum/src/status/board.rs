//! [`StatusBoard`]: what the status page shows, counted as the limiter runs.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};

use tower_rate_tier::clock::{Clock, MonotonicClock, SharedClock};
use tower_rate_tier::observe::{Checked, Outcome};
use tower_rate_tier::{LimitEvent, Observer, UserId};

use super::near::{Answer, Near, NearUser};
use super::ring::{Ring, SLOT_US};

/// The tier reloads kept.
const RELOADS_KEPT: usize = 10;
/// At most this many tier names and as many limit names are counted: they
/// come from the configuration, this only bounds a configuration that
/// makes names without end.
const NAMES_KEPT: usize = 256;
/// An error's text is kept up to this many bytes.
const ERROR_KEPT: usize = 512;

/// A tier's checks by what they got.
struct TierRings {
    allowed: Ring,
    refused: Ring,
    shadow_limited: Ring,
    waited: Ring,
    other: Ring,
}

impl TierRings {
    fn new() -> TierRings {
        TierRings {
            allowed: Ring::new(),
            refused: Ring::new(),
            shadow_limited: Ring::new(),
            waited: Ring::new(),
            other: Ring::new(),
        }
    }

    fn counts(&self, now: u64) -> (TierCounts, TierHour) {
        let minute = |ring: &Ring| ring.minute(Some(now));
        let counts = TierCounts {
            allowed: minute(&self.allowed),
            refused: minute(&self.refused),
            shadow_limited: minute(&self.shadow_limited),
            waited: minute(&self.waited),
            other: minute(&self.other),
        };
        let hour = TierHour {
            allowed: self.allowed.hour(now),
            refused: self.refused.hour(now),
            shadow_limited: self.shadow_limited.hour(now),
            waited: self.waited.hour(now),
            other: self.other.hour(now),
        };
        (counts, hour)
    }
}

/// A limit's refusals.
struct LimitRings {
    refused: Ring,
    shadow_limited: Ring,
}

/// A limit's refusals in one minute.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(super) struct LimitCounts {
    pub(super) refused: u64,
    /// Would-be refusals of a limit in shadow mode.
    pub(super) shadow_limited: u64,
}

/// A limit's refusals per minute over the last hour, oldest first.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct LimitHour {
    pub(super) refused: Vec<u64>,
    pub(super) shadow_limited: Vec<u64>,
}

/// A tier's checks in one minute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub(super) struct TierCounts {
    /// Passed, charged to their buckets (waits included).
    pub(super) allowed: u64,
    /// Refused by a limit: limited, banned, or a cost above a burst.
    pub(super) refused: u64,
    /// Passed, where a limit in shadow mode would have refused.
    pub(super) shadow_limited: u64,
    /// Passed after waiting for their slot.
    pub(super) waited: u64,
    /// Answered by a policy or an error rather than a bucket (no identity,
    /// an unknown tier, a failed store or identity lookup, a cost of 0).
    pub(super) other: u64,
}

/// A tier's checks per minute over the last hour, oldest first.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct TierHour {
    pub(super) allowed: Vec<u64>,
    pub(super) refused: Vec<u64>,
    pub(super) shadow_limited: Vec<u64>,
    pub(super) waited: Vec<u64>,
    pub(super) other: Vec<u64>,
}

impl TierHour {
    /// No check in the hour (the last minute included).
    pub(super) fn is_empty(&self) -> bool {
        [
            &self.allowed,
            &self.refused,
            &self.shadow_limited,
            &self.waited,
            &self.other,
        ]
        .iter()
        .all(|minutes| minutes.iter().all(|&n| n == 0))
    }
}

/// Counters by configured name, read-mostly: a name is added once, then
/// every count takes the read lock.
struct Named<T>(RwLock<Vec<(&'static str, Box<T>)>>);

impl<T> Named<T> {
    fn new() -> Named<T> {
        Named(RwLock::new(Vec::new()))
    }

    fn with(&self, name: &'static str, make: fn() -> T, f: impl FnOnce(&T)) {
        let find = |names: &[(&'static str, Box<T>)]| {
            names
                .iter()
                .position(|(n, _)| std::ptr::eq(*n, name) || *n == name)
        };
        {
            let names = self.0.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(i) = find(&names) {
                return f(&names[i].1);
            }
        }
        let mut names = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let i = match find(&names) {
            Some(i) => i,
            None if names.len() < NAMES_KEPT => {
                names.push((name, Box::new(make())));
                names.len() - 1
            }
            None => return,
        };
        f(&names[i].1);
    }

    fn each<R>(&self, mut f: impl FnMut(&'static str, &T) -> R) -> Vec<R> {
        let names = self.0.read().unwrap_or_else(PoisonError::into_inner);
        names.iter().map(|(name, t)| f(name, t)).collect()
    }
}

/// A replacement of the tiers, put in force or refused.
#[derive(Debug, Clone)]
pub(super) struct Reload {
    pub(super) at_us: u64,
    /// The tiers now in force; empty when refused.
    pub(super) tiers: Vec<String>,
    /// The tiers whose buckets started fresh (their kind changed).
    pub(super) fresh: Vec<String>,
    /// Why it was refused.
    pub(super) error: Option<String>,
}

/// The store's last failure.
#[derive(Debug, Clone)]
pub(super) struct StoreFailure {
    pub(super) at_us: u64,
    pub(super) storage: &'static str,
    pub(super) error: String,
}

/// What the status page shows, gathered as the limiter runs: register it
/// on the limiter with
/// [`RateTierBuilder::observe`](tower_rate_tier::RateTierBuilder::observe),
/// which gives it every check and every event (nothing else to register),
/// and serve it with [`status_router`](super::status_router).
///
/// Per tier and per minute over the last hour, the checks allowed, refused
/// (limited, banned, or a cost above a burst), shadow-limited, waited and
/// answered otherwise (a policy, an error); per limit, its refusals; the
/// store's errors; the users nearest their limit in the last minute; the
/// last reloads of the tiers. Counts are kept per 10 seconds: the last
/// minute is the current 10 s and the five before.
///
/// Its memory is bounded whatever the traffic: an hour of counters per
/// tier and limit of the configuration, at most 32 users near their limit,
/// the last 10 reloads. A check costs a clock reading, a read lock and an
/// atomic update; a user is put on the "near their limit" list only when
/// no other thread holds it (the list is a sample, and a request never
/// waits for it).
///
/// Users are shown as tags ([`UserId::redacted`], e.g. `#3fa2c1d0`: the
/// same for one user until the process restarts, and no way back to the
/// id) unless [`keys_in_clear`](StatusBoard::keys_in_clear) asks otherwise.
///
/// A reload refused by
/// [`RateTier::reload`](tower_rate_tier::RateTier::reload) or
/// [`RateTier::try_reload`](tower_rate_tier::RateTier::try_reload) reaches
/// the board as its event; an app that refuses tiers before it asks for a
/// reload may give the board the event itself, as below.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tower_rate_tier::clock::FakeClock;
/// use tower_rate_tier::{ConfigError, LimitEvent, Observer, Quota, RateTier};
/// use rate_tier_axum::status::StatusBoard;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let clock = FakeClock::new();
/// let board = Arc::new(StatusBoard::with_clock(clock.clone()));
/// let limiter = RateTier::builder()
///     .clock(clock.clone())
///     .tier("free", Quota::per_minute(2))
///     .observe(board.clone())
///     .build();
/// for _ in 0..3 {
///     let _ = limiter.check("key_ana", "free", 1).await.unwrap();
/// }
/// let error = ConfigError::UnknownDefaultTier("gold".into());
/// board.event(&LimitEvent::TiersRefused { error });
/// let json = board.json(&limiter);
/// assert!(json.contains(r#""allowed":2,"refused":1"#), "{json}");
/// assert!(!json.contains("key_ana"), "users are tags: {json}");
/// assert!(json.contains("gold"), "the refused reload: {json}");
///
/// // A minute later, the last minute is empty.
/// clock.advance(Duration::from_secs(61));
/// assert!(board.json(&limiter).contains(r#""allowed":0,"refused":0"#));
/// # }
/// ```
pub struct StatusBoard {
    clock: SharedClock,
    started_us: u64,
    keys_in_clear: bool,
    tiers: Named<TierRings>,
    /// Checks that no configured tier applied to.
    untiered: TierRings,
    limits: Named<LimitRings>,
    storage_errors: Ring,
    last_storage_error: Mutex<Option<StoreFailure>>,
    near: Mutex<Near>,
    reloads: Mutex<VecDeque<Reload>>,
}

impl fmt::Debug for StatusBoard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatusBoard")
            .field("clock", &self.clock)
            .field("keys_in_clear", &self.keys_in_clear)
            .finish_non_exhaustive()
    }
}

impl Default for StatusBoard {
    /// [`StatusBoard::new`].
    fn default() -> Self {
        StatusBoard::new()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `text`, cut to at most [`ERROR_KEPT`] bytes on a character boundary.
fn kept(text: String) -> String {
    if text.len() <= ERROR_KEPT {
        return text;
    }
    let mut end = ERROR_KEPT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

impl StatusBoard {
    /// An empty board on the default clock
    /// ([`MonotonicClock`], the limiter's default).
    ///
    /// ```
    /// let board = rate_tier_axum::status::StatusBoard::new();
    /// # let _ = board;
    /// ```
    pub fn new() -> StatusBoard {
        StatusBoard::with_clock(MonotonicClock)
    }

    /// An empty board on `clock`: a
    /// [`FakeClock`](tower_rate_tier::clock::FakeClock) in tests, shared
    /// with the limiter, moves both.
    ///
    /// ```
    /// use tower_rate_tier::clock::FakeClock;
    /// let board = rate_tier_axum::status::StatusBoard::with_clock(FakeClock::new());
    /// # let _ = board;
    /// ```
    pub fn with_clock(clock: impl Clock) -> StatusBoard {
        let started_us = clock.now_us();
        StatusBoard {
            clock: std::sync::Arc::new(clock),
            started_us,
            keys_in_clear: false,
            tiers: Named::new(),
            untiered: TierRings::new(),
            limits: Named::new(),
            storage_errors: Ring::new(),
            last_storage_error: Mutex::new(None),
            near: Mutex::default(),
            reloads: Mutex::default(),
        }
    }

    /// Shows the users nearest their limit by their id
    /// ([`UserId::as_str`]) instead of a tag: for a page only people
    /// allowed to see the ids (API keys, addresses) can reach.
    ///
    /// ```
    /// use rate_tier_axum::status::StatusBoard;
    /// let board = StatusBoard::new().keys_in_clear(true);
    /// # let _ = board;
    /// ```
    #[must_use]
    pub fn keys_in_clear(mut self, in_clear: bool) -> StatusBoard {
        self.keys_in_clear = in_clear;
        self
    }

    pub(super) fn shows_keys_in_clear(&self) -> bool {
        self.keys_in_clear
    }

    pub(super) fn now_us(&self) -> u64 {
        self.clock.now_us()
    }

    pub(super) fn uptime_secs(&self, now_us: u64) -> u64 {
        now_us.saturating_sub(self.started_us) / 1_000_000
    }

    fn tier(&self, tier: Option<&'static str>, f: impl FnOnce(&TierRings)) {
        match tier {
            Some(name) => self.tiers.with(name, TierRings::new, f),
            None => f(&self.untiered),
        }
    }

    fn limit(&self, name: &'static str, f: impl FnOnce(&LimitRings)) {
        let make = || LimitRings {
            refused: Ring::new(),
            shadow_limited: Ring::new(),
        };
        self.limits.with(name, make, f);
    }

    fn near(
        &self,
        user_id: &UserId,
        tier: &'static str,
        limit: Option<&'static str>,
        remaining: u64,
        of: Option<u32>,
        answer: Answer,
    ) {
        // Another thread holds the list: this one is not kept.
        let Ok(mut near) = self.near.try_lock() else {
            return;
        };
        let user = if self.keys_in_clear {
            user_id.as_str().to_owned()
        } else {
            user_id.redacted()
        };
        near.saw(NearUser {
            user,
            tier,
            limit,
            remaining,
            of,
            answer,
            seen_us: self.clock.now_us(),
        });
    }

    fn reloaded(&self, reload: Reload) {
        let mut reloads = lock(&self.reloads);
        if reloads.len() == RELOADS_KEPT {
            reloads.pop_front();
        }
        reloads.push_back(reload);
    }

    /// Every tier counted, with its last minute and hour, at slot `now`:
    /// the tiers that had checks, and none for checks without a tier.
    pub(super) fn tier_counts(
        &self,
        now: u64,
    ) -> Vec<(Option<&'static str>, TierCounts, TierHour)> {
        let mut tiers: Vec<_> = self.tiers.each(|name, rings| {
            let (counts, hour) = rings.counts(now);
            (Some(name), counts, hour)
        });
        let (counts, hour) = self.untiered.counts(now);
        if !hour.is_empty() {
            tiers.push((None, counts, hour));
        }
        tiers
    }

    /// Each limit with refusals in the last hour, by name, at slot `now`.
    pub(super) fn limit_counts(
        &self,
        now: u64,
    ) -> Vec<(&'static str, LimitCounts, LimitHour)> {
        let mut limits = self.limits.each(|name, rings| {
            let counts = LimitCounts {
                refused: rings.refused.minute(Some(now)),
                shadow_limited: rings.shadow_limited.minute(Some(now)),
            };
            let hour = LimitHour {
                refused: rings.refused.hour(now),
                shadow_limited: rings.shadow_limited.hour(now),
            };
            (name, counts, hour)
        });
        limits.retain(|(_, _, hour)| {
            hour.refused
                .iter()
                .chain(&hour.shadow_limited)
                .any(|&n| n > 0)
        });
        limits.sort_by_key(|(name, ..)| *name);
        limits
    }

    /// The store's errors in the last minute and per minute of the hour,
    /// and its last failure.
    pub(super) fn storage_errors(
        &self,
        now: u64,
    ) -> (u64, Vec<u64>, Option<StoreFailure>) {
        (
            self.storage_errors.minute(Some(now)),
            self.storage_errors.hour(now),
            lock(&self.last_storage_error).clone(),
        )
    }

    pub(super) fn near_now(&self, now_us: u64) -> Vec<NearUser> {
        lock(&self.near).now(now_us)
    }

    /// Newest first.
    pub(super) fn reloads(&self) -> Vec<Reload> {
        lock(&self.reloads).iter().rev().cloned().collect()
    }

    #[cfg(test)]
    fn near_kept(&self) -> usize {
        lock(&self.near).kept()
    }
}

impl Observer for StatusBoard {
    fn checked(&self, check: &Checked) {
        let slot = self.clock.now_us() / SLOT_US;
        self.tier(check.tier, |rings| {
            let ring = match check.outcome {
                Outcome::Allowed => &rings.allowed,
                Outcome::Limited
                | Outcome::Banned
                | Outcome::CostExceedsBurst => &rings.refused,
                Outcome::ShadowLimited => &rings.shadow_limited,
                _ => &rings.other,
            };
            ring.add(slot);
        });
    }

    fn event(&self, event: &LimitEvent) {
        let slot = || self.clock.now_us() / SLOT_US;
        match event {
            LimitEvent::Limited {
                user_id,
                tier,
                limit,
                of,
                ..
            } => {
                self.limit(limit, |rings| rings.refused.add(slot()));
                let of = Some(*of).filter(|&of| of > 0);
                self.near(user_id, tier, Some(limit), 0, of, Answer::Refused);
            }
            LimitEvent::CostExceedsBurst { limit, .. } => {
                self.limit(limit, |rings| rings.refused.add(slot()));
            }
            LimitEvent::ShadowLimited { limit, .. } => {
                self.limit(limit, |rings| rings.shadow_limited.add(slot()));
            }
            LimitEvent::Waited { tier, .. } => {
                self.tier(Some(tier), |rings| rings.waited.add(slot()));
            }
            LimitEvent::Banned { user_id, tier, .. } => {
                self.near(user_id, tier, None, 0, None, Answer::Banned);
            }
            LimitEvent::NearLimit {
                user_id,
                tier,
                limit,
                remaining,
                of,
            } => self.near(
                user_id,
                tier,
                Some(limit),
                *remaining,
                Some(*of),
                Answer::Near,
            ),
            LimitEvent::StorageError { storage, error, .. } => {
                self.storage_errors.add(slot());
                // A failing store fails every request: the last one is
                // enough, and no request waits to write it.
                if let Ok(mut last) = self.last_storage_error.try_lock() {
                    *last = Some(StoreFailure {
                        at_us: self.clock.now_us(),
                        storage,
                        error: kept(error.clone()),
                    });
                }
            }
            LimitEvent::TiersReloaded { tiers, fresh } => {
                self.reloaded(Reload {
                    at_us: self.clock.now_us(),
                    tiers: tiers.clone(),
                    fresh: fresh.clone(),
                    error: None,
                });
            }
            LimitEvent::TiersRefused { error } => self.reloaded(Reload {
                at_us: self.clock.now_us(),
                tiers: Vec::new(),
                fresh: Vec::new(),
                error: Some(kept(error.to_string())),
            }),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use tower_rate_tier::clock::FakeClock;

    use super::*;

    #[test]
    fn a_user_is_a_tag_unless_asked_in_clear() {
        let ana = UserId::from("key_ana");
        let board = StatusBoard::with_clock(FakeClock::new());
        board.near(&ana, "free", Some("free"), 1, Some(10), Answer::Near);
        assert_eq!(board.near_now(0)[0].user, ana.redacted());
        let board = board.keys_in_clear(true);
        board.near(&ana, "free", Some("free"), 1, Some(10), Answer::Near);
        assert!(board.near_now(0).iter().any(|u| u.user == "key_ana"));
        assert_eq!(board.near_kept(), 2);
    }

    #[test]
    fn names_are_counted_up_to_a_bound() {
        let board = StatusBoard::with_clock(FakeClock::new());
        for i in 0..NAMES_KEPT + 10 {
            let name: &'static str =
                Box::leak(format!("t{i}").into_boxed_str());
            board.tier(Some(name), |rings| rings.allowed.add(0));
        }
        assert_eq!(board.tier_counts(0).len(), NAMES_KEPT);
    }

    #[test]
    fn a_long_error_is_cut_on_a_character() {
        let long = "é".repeat(ERROR_KEPT);
        let cut = kept(long);
        assert!(cut.len() <= ERROR_KEPT + '…'.len_utf8());
        assert!(cut.ends_with('…'));
    }
}
